"""The Redis backend (``PERSISTENT_MEMORY["BACKEND"] = "redis"``): :class:`RedisBackend`.

What lives here, top to bottom of the import graph:

- ``backend``: :class:`RedisBackend`, sessions, values and the lanes, each one call of the
  function library that it builds and sends (``_command``, ``_run``, ``_call``); it
  creates and holds the parts below.
- ``conversations`` (conversations and summaries), ``checkpoints``, ``queues`` (the
  bucket queues), ``listing`` (the sessions listed: every id, every info, a page) and
  ``maintenance`` (scans, the sweep, forgetting a namespace): the parts, each given the
  calls it needs when the backend makes it.
- ``transport``: :class:`~.transport.RedisTransport`, the way to Redis (connection pools,
  packets and their WAIT, the cluster's redirects, the library loaded where it is
  missing, batches, redis-py's errors as the store's), held by the backend and given to
  the parts that send plain commands.
- ``functions`` (the function library and its loader, from ``lua/``), ``layout`` (the
  key names), ``topology`` (the client for one server, Sentinel or a cluster), ``ttl``.

Import rules: a part never imports ``backend``; ``transport`` imports only ``functions``
and ``topology`` of this package; ``functions``, ``layout``, ``topology`` and ``ttl``
import no other module of this package. Modules here may import
``persistent_memory.backends`` (the contracts: ``base``, ``conversations``,
``checkpoints``, ``parts``), ``backends.memory.tree``, ``conf``, ``owners``,
``exceptions`` and ``chat`` (the chat format's rules: ``messages``, ``window``); never
a service (the store, the conversations, the mirror, the API).
"""

from __future__ import annotations

from persistent_memory.backends.parts import backend_package

__all__ = ["RedisBackend"]

# Lazy, so that importing one of the package's modules loads no backend.
__getattr__ = backend_package(__name__, "RedisBackend")
