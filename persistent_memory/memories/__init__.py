"""Long-term memories: facts about an owner kept in the project's database, searched
by recency, full text or meaning, and injected into the next request.

Everything goes through :func:`memories_for` (one owner's :class:`MemoryService`); the
REST API, the admin, the commands and the MCP tools never touch the model directly.
"""

from persistent_memory.memories.service import MemoryService, memories_for

__all__ = ["MemoryService", "memories_for"]
