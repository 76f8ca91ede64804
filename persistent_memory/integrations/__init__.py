"""Adapters for agent frameworks, one module each, behind an extra of its own
(``persistent_memory.integrations.langgraph``: ``pip install ...[langgraph]``).

May import: the store, the operations, the services and the layers below them; the
admin imports the LangGraph checkpointer to show a thread's checkpoints."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from persistent_memory.store import MemoryStore

T = TypeVar("T")


async def off_the_loop(store: MemoryStore, method: Callable[..., T], *args: Any) -> T:
    """``method(*args)`` for an async API: inline on the memory backend (a call there never
    waits for I/O); on Redis its script call awaited on this event loop, without a thread
    (see :mod:`persistent_memory.integrations.redis_bridge`)."""
    if store.backend.name == "memory":
        return method(*args)
    from persistent_memory.integrations.redis_bridge import run_bridged

    return await run_bridged(method, *args)
