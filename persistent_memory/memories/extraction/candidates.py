"""What an extractor proposes (a memory to upsert), and how it says it could not."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Candidate:
    """A memory an extractor found: upserted by ``key`` with source "extraction"."""

    key: str
    type: str
    content: str
    source_messages: list[str] = field(default_factory=list)


class ExtractionFailed(Exception):
    """An extractor could not extract (its endpoint failed, timed out...): logged without a
    traceback and counted, and the messages are left for ``memory_extract`` to try again."""
