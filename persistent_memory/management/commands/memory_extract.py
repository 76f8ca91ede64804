"""Extract long-term memories from the sessions' recent messages."""

from __future__ import annotations

from argparse import ArgumentParser
from dataclasses import asdict
from typing import Any

from django.core.management.base import CommandError

from persistent_memory.management.base import MemoryCommand
from persistent_memory.memories.extraction import extract_sessions


class Command(MemoryCommand):
    help = (
        "Run the MEMORY_EXTRACTORS over the newest messages of every conversation and upsert "
        "what they find as memories (source 'extraction'; never changes a memory of another "
        "source). With --watch, again every SECONDS until interrupted. Serving processes extract "
        "in the background as messages are written; this catches up with what their in-memory "
        "queue lost (a restart, a full queue)."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "--last", type=int, default=50, metavar="N", help="Messages per conversation to read (50)."
        )
        parser.add_argument("--watch", type=float, metavar="SECONDS", help="Run again every SECONDS.")

    def run(self, *, owner: str | None, last: int, watch: float | None, **options: Any) -> dict[str, Any]:
        if last < 1:
            raise CommandError("--last must be 1 or more.")
        if watch is not None and watch <= 0:
            raise CommandError("--watch must be a positive number of seconds.")
        for _ in self.passes(watch):
            counts = asdict(extract_sessions(self.store, owner=owner, last_messages=last))
            if watch is not None:
                self.log(self.summary(counts))
        return counts

    def summary(self, counts: dict[str, Any]) -> str:
        return (
            f"Read {counts['messages']} messages of {counts['sessions']} sessions: "
            f"{counts['candidates']} candidates, {counts['written']} memories upserted, "
            f"{counts['refused']} refused, {counts['failed']} extractor failures."
        )
