"""The in-process backend (``PERSISTENT_MEMORY["BACKEND"] = "memory"``): :class:`MemoryBackend`.

What lives here, top to bottom of the import graph:

- ``backend``: :class:`MemoryBackend`, the session table under one lock, sessions and
  values, the journal's replay; it creates and holds the parts below.
- ``conversations``, ``summaries``, ``checkpoints``: the parts, each given the backend as
  its session table (the protocol in ``sessions``), never importing ``backend``.
- ``sessions`` (a session and the session table's protocol), ``tree`` (a conversation's
  messages and window), ``once`` (idempotency keys), ``replay`` (the journal records'
  checks): leaves the others build on.

Import rules: nothing here imports ``backend`` but this ``__init__`` (lazily); the
leaves import no part. Modules here may import ``persistent_memory.backends`` (the
contracts: ``base``, ``conversations``, ``checkpoints``, ``parts``), ``conf``,
``owners``, ``exceptions``, ``validation``, ``history``, ``journal`` and
``conversations.messages``/``window``/``records``; never a service (the store, the
mirror, the API).
"""

from __future__ import annotations

import warnings
from importlib import import_module
from importlib.util import find_spec
from typing import Any

__all__ = ["MemoryBackend"]


def __getattr__(name: str) -> Any:
    # Lazy, so that importing memory.tree (the transcript, the mirror) loads no backend.
    if name.startswith("__") or find_spec(f"{__name__}.{name}") is not None:
        raise AttributeError(name)  # a module of the package: the import system loads it
    backend = import_module("persistent_memory.backends.memory.backend")
    if name == "MemoryBackend":
        return backend.MemoryBackend
    if hasattr(backend, name):
        warnings.warn(
            f"persistent_memory.backends.memory.{name} moved: import it from "
            f"persistent_memory.backends.memory.backend.",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(backend, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
