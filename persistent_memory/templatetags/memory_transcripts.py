"""The admin's conversation transcripts as a template tag (see persistent_memory.admin.transcript)."""

from __future__ import annotations

from typing import Any

from django import template

from persistent_memory.admin.transcript import build
from persistent_memory.models import MemoryConversation

register = template.Library()


@register.inclusion_tag("admin/persistent_memory/transcript.html")
def conversation_transcript(conversation: MemoryConversation, limit: int | None = None) -> dict[str, Any]:
    """The current thread of ``conversation`` (its newest ``limit`` messages), as a transcript."""
    return {"transcript": build(conversation, limit=limit)}
