"""The in-process backend (``PERSISTENT_MEMORY["BACKEND"] = "memory"``): :class:`MemoryBackend`.

What lives here, top to bottom of the import graph:

- ``backend``: :class:`MemoryBackend`, the session table under one lock, sessions,
  values, history and the lanes (each write journaled, and replayable at a given time);
  it creates and holds the parts below.
- ``conversations``, ``summaries``, ``checkpoints``, ``listing``, ``maintenance`` (scans,
  the sweep, the dirty set), ``journaling`` (the journal opened, replayed and
  checkpointed) and ``whole`` (snapshots and restores): the parts, each given the backend
  as its session table (the protocols in ``sessions``), never importing ``backend``;
  ``admission`` (the owners' caps and the fair share of a full process), a rule the
  backend applies to its table.
- ``sessions`` (a session and the session table's protocol), ``tree`` (a conversation's
  messages and window), ``once`` (idempotency keys), ``replay`` (the journal records'
  checks), ``history`` (the operation history's rule): leaves the others build on.

Import rules: nothing here imports ``backend`` but this ``__init__`` (lazily); the
leaves import no part at run time. Modules here may import ``persistent_memory.backends`` (the
contracts: ``base``, ``conversations``, ``checkpoints``, ``parts``), ``conf``,
``owners``, ``exceptions``, ``validation``, ``journal`` and
``chat`` (the chat format's rules: ``messages``, ``window``, ``records``); never a
service (the store, the conversations, the mirror, the API).
"""

from __future__ import annotations

from persistent_memory.backends.parts import backend_package

__all__ = ["MemoryBackend"]

# Lazy, so that importing one of the package's modules loads no backend.
__getattr__ = backend_package(__name__, "MemoryBackend")
