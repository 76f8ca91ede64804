"""Embed the long-term memories that have no vector of the configured EMBEDDER's model."""

from __future__ import annotations

from argparse import ArgumentParser
from dataclasses import asdict
from typing import Any

from django.core.management.base import CommandError

from persistent_memory.management.base import MemoryCommand
from persistent_memory.memories.upkeep import embed_memories


class Command(MemoryCommand):
    help = (
        "Embed the long-term memories without a vector of the EMBEDDER's current model (and the "
        "mirrored conversation messages, where MESSAGE_EMBEDDINGS gives them vectors): those "
        "written while the embedder failed, and all of them after a model change (their old "
        "vectors are left out of semantic search meanwhile). With --all, every memory again. "
        "On PostgreSQL, first adds pgvector's table where the server has the extension."
    )
    uses_sessions = False

    def add_arguments(self, parser: ArgumentParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--all", action="store_true", dest="everything", help="Embed every memory again.")
        parser.add_argument(
            "--batch-size", type=int, default=64, metavar="N", help="Texts per embedder call (default 64)."
        )

    def run(self, *, owner: str | None, everything: bool, batch_size: int, **options: Any) -> dict[str, Any]:
        if batch_size < 1:
            raise CommandError("--batch-size must be 1 or more.")
        try:
            report = embed_memories(
                owner=owner,
                everything=everything,
                batch_size=batch_size,
                progress=lambda done, total: self.progress(done, total, "memories"),
            )
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        return asdict(report)

    def summary(self, counts: dict[str, Any]) -> str:
        return (
            f"Embedded {counts['embedded']} memories ({counts['failed']} failed, {counts['pending']} still "
            f"without a current vector) and {counts['messages_embedded']} conversation messages "
            f"({counts['messages_failed']} failed); vectors are compared with {counts['vector_backend']}."
        )

    def failure(self, counts: dict[str, Any]) -> str:
        return (
            f"The embedder failed for {counts['failed']} memories (see the log and health/); "
            "run the command again."
        )
