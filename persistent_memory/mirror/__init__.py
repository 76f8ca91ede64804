"""The ORM mirror: copies the store's sessions into ``persistent_memory.models`` (for the
admin, search and a restart of the memory backend) and restores them from there.

What lives here: ``sessions`` (the :class:`Mirror` itself: the write-behind worker, a
sync of dirty sessions, the restore), ``conversations`` and ``checkpoints`` (their rows,
written and read back by a sync and a restore), ``rows`` (what they share to write
rows) and ``signals`` (``messages_mirrored`` and ``search_starting``, for the parts
above).

May import: ``backends.base`` (snapshots and the backend contract), ``models``,
``owners``, ``exceptions``, ``conf``; never the store, the services above it or a
concrete backend: the store hands the mirror its backend.
"""

from persistent_memory.mirror.sessions import Mirror, SyncResult

__all__ = ["Mirror", "SyncResult"]
