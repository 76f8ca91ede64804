"""What an extractor proposes: a memory to upsert."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Candidate:
    """A memory an extractor found: upserted by ``key`` with source "extraction"."""

    key: str
    type: str
    content: str
    source_messages: list[str] = field(default_factory=list)
