"""Cross-session memory for LLM pipelines, keyed by ``session_id``.

``get_store()`` returns the process's :class:`MemoryStore`, built from the
``PERSISTENT_MEMORY`` setting.
"""

from persistent_memory.store import MemoryStore, get_store, reset_store

__all__ = ["MemoryStore", "get_store", "reset_store"]
