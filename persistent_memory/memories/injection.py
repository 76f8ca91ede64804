"""Injection: the memories relevant to a question, attached by the enrich lane as
``metadata.memories`` (with INJECT_MEMORIES on), and rendered as a chat message."""

from __future__ import annotations

import logging
from typing import Any

from django.db import DatabaseError

from persistent_memory.conf import memory_settings
from persistent_memory.exceptions import PersistentMemoryError
from persistent_memory.memories.service import memories_for

logger = logging.getLogger("persistent_memory")

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

HEADER = "What you know about the user from earlier conversations:"


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


def _line(item: dict[str, Any]) -> str:
    """A memory as it says; a message with when and by whom it was said."""
    if item.get("kind") != "message":
        return f"- {item['content']}"
    speaker = item.get("name") or item.get("role", "")
    return f"- {str(item['said_at'])[:10]} {speaker}: {item['content']}"  # ISO text, or a datetime


def render_memories(memories: list[dict[str, Any]], *, role: str = "system") -> dict[str, str] | None:
    """One chat message listing ``memories`` (None for none): a system message, or a user
    message (``role="user"``) for providers that refuse the system role."""
    if role not in ("system", "user"):
        raise ValueError(f"role must be 'system' or 'user', not {role!r}.")
    if not memories:
        return None
    lines = "\n".join(_line(memory) for memory in memories)
    return {"role": role, "content": f"{HEADER}\n{lines}"}


def is_injected(message: dict[str, Any]) -> bool:
    """Whether ``message`` is a list of memories made by :func:`render_memories` (a client
    may store it with the conversation): what it says is known already, and extracting it
    again would copy every memory it lists."""
    content = message.get("content")
    return isinstance(content, str) and content.startswith(HEADER)
