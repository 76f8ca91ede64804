"""The Redis backend (``PERSISTENT_MEMORY["BACKEND"] = "redis"``): :class:`RedisBackend`.

What lives here, top to bottom of the import graph:

- ``backend``: :class:`RedisBackend`, sessions and values, and the call path (one FCALL a
  call, redirects, recovery); it creates and holds the parts below.
- ``conversations`` (conversations and summaries), ``checkpoints``, ``queues`` (the
  bucket queues): the parts, each given the calls it needs when the backend makes it.
- ``functions`` (the function library and its loader, from ``lua/``), ``layout`` (the
  key names), ``topology`` (the client for one server, Sentinel or a cluster), ``ttl``.

Import rules: a part never imports ``backend``; ``functions``, ``layout``, ``topology``
and ``ttl`` import no other module of this package. Modules here may import
``persistent_memory.backends`` (the contracts: ``base``, ``conversations``,
``checkpoints``, ``parts``), ``backends.memory.tree``, ``conf``, ``owners``,
``exceptions`` and ``conversations.messages``/``window``; never a service (the store,
the mirror, the API).
"""

from __future__ import annotations

import warnings
from importlib import import_module
from importlib.util import find_spec
from typing import Any

__all__ = ["RedisBackend"]


def __getattr__(name: str) -> Any:
    # Lazy, so that importing layout or topology loads no backend.
    if name.startswith("__") or find_spec(f"{__name__}.{name}") is not None:
        raise AttributeError(name)  # a module of the package: the import system loads it
    backend = import_module("persistent_memory.backends.redis.backend")
    if name == "RedisBackend":
        return backend.RedisBackend
    if hasattr(backend, name):
        warnings.warn(
            f"persistent_memory.backends.redis.{name} moved: import it from "
            f"persistent_memory.backends.redis.backend.",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(backend, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
