"""Injection: the memories relevant to a question, attached by the enrich lane as
``metadata.memories`` (with INJECT_MEMORIES on), and rendered as a chat message
(:func:`render_memories`, :func:`is_injected` and :data:`HEADER` live in
:mod:`persistent_memory.memories.rendering`, below the service and the message search,
which leaves such a message out; they are imported here, where users know them)."""

from __future__ import annotations

import logging
from typing import Any

from django.db import DatabaseError

from persistent_memory.conf import memory_settings
from persistent_memory.exceptions import PersistentMemoryError
from persistent_memory.memories.rendering import HEADER, is_injected, render_memories
from persistent_memory.memories.service import memories_for

logger = logging.getLogger("persistent_memory")

__all__ = [
    "HEADER",
    "INJECTED_FIELDS",
    "INJECTED_MESSAGE_FIELDS",
    "MEMORIES",
    "is_injected",
    "relevant_memories",
    "render_memories",
]

#: Where the enrich lane puts them in the question's metadata.
MEMORIES = "memories"
#: What each injected memory carries (JSON-safe: no datetimes).
INJECTED_FIELDS = ("kind", "id", "key", "type", "content", "score", "tokens")
#: What each injected message (something said in an earlier conversation) carries.
INJECTED_MESSAGE_FIELDS = (
    "kind",
    "id",
    "session_id",
    "conversation",
    "role",
    "name",
    "content",
    "score",
    "tokens",
)


def relevant_memories(owner: str, text: Any, session_id: str | None = None) -> list[dict[str, Any]] | None:
    """The owner's memories (and messages of earlier conversations, by
    MEMORY_SEARCH_KINDS) relevant to ``text`` within MEMORY_MAX_TOKENS, best first;
    None when injection is off or there is no text. The messages of ``session_id`` (the
    conversation the prompt holds already) are left out. A database that cannot answer
    costs the question its memories, never the lane."""
    if not memory_settings.INJECT_MEMORIES or not isinstance(text, str) or not text.strip():
        return None
    try:
        found = memories_for(owner).search(
            text[: memory_settings.MEMORY_MAX_CONTENT_CHARS],
            strategy=memory_settings.MEMORY_SEARCH_STRATEGY,
            max_tokens=memory_settings.MEMORY_MAX_TOKENS,
            exclude_session_id=session_id,
        )
    except (DatabaseError, PersistentMemoryError) as exc:
        logger.warning("memory: no memories injected for owner %r: %s", owner, exc)
        return None
    return [_injected(item) for item in found]


def _injected(item: dict[str, Any]) -> dict[str, Any]:
    if item["kind"] == "memory":
        return {name: item[name] for name in INJECTED_FIELDS}
    return {**{name: item[name] for name in INJECTED_MESSAGE_FIELDS}, "said_at": item["said_at"].isoformat()}
