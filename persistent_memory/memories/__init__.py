"""Long-term memories: facts about an owner kept in the project's database, searched
by recency, full text or meaning, and injected into the next request.

Everything goes through :func:`memories_for` (one owner's :class:`MemoryService`); the
REST API, the admin, the commands and the MCP tools never touch the model directly.

May import: ``conversations``, ``checkpoints``, ``mirror`` (its rows are the message
search's index), ``models`` and the layers below; the store for type checkers only, and
the message search's catch-up the process's store when it runs. The store builds the
extraction worker.
"""

from persistent_memory.memories.service import MemoryService, memories_for

__all__ = ["MemoryService", "memories_for"]
