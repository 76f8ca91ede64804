"""Cross-session memory for LLM pipelines, keyed by ``session_id``.

``get_store()`` returns the process's :class:`MemoryStore`, built from the
``PERSISTENT_MEMORY`` setting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from persistent_memory.store import MemoryStore, get_store, reset_store

__all__ = ["MemoryStore", "get_store", "reset_store"]


def __getattr__(name: str) -> Any:
    # Lazy (PEP 562): importing a submodule (a backend, the settings) must not import the
    # store and, through it, every service; the import graph reads top to bottom.
    if name in __all__:
        from persistent_memory import store

        return getattr(store, name)
    raise AttributeError(f"module 'persistent_memory' has no attribute {name!r}")
