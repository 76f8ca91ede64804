"""The chat message that lists memories: made by :func:`render_memories`, known again by
:func:`is_injected` (its first line is :data:`HEADER`), so that neither the message search
nor extraction reads what a prompt was told back as something said."""

from __future__ import annotations

from typing import Any

HEADER = "What you know about the user from earlier conversations:"


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
