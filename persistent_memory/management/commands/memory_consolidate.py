"""Merge near-duplicate long-term memories already stored."""

from __future__ import annotations

from argparse import ArgumentParser
from dataclasses import asdict
from typing import Any

from django.core.management.base import CommandError

from persistent_memory.management.base import MemoryCommand
from persistent_memory.memories.upkeep import consolidate


class Command(MemoryCommand):
    help = (
        "Merge each owner's memories of one type whose vectors lie within --distance (default "
        "MEMORY_DEDUP_DISTANCE) into the oldest of them, which keeps its id and key, takes the newest "
        "content and keeps the replaced ones in its history. Never across owners or types; needs an "
        "EMBEDDER (run memory_embed first for memories without a current vector)."
    )
    uses_sessions = False

    def add_arguments(self, parser: ArgumentParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "-n", "--dry-run", action="store_true", help="Count what would merge; change nothing."
        )
        parser.add_argument("--distance", type=float, metavar="D", help="Cosine distance, 0 to 2.")

    def run(
        self, *, owner: str | None, dry_run: bool, distance: float | None, **options: Any
    ) -> dict[str, Any]:
        if distance is not None and not 0 <= distance < 2:
            raise CommandError("--distance must be from 0 to 2.")
        try:
            report = consolidate(owner=owner, distance=distance, dry_run=dry_run)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        return {"dry_run": dry_run, **asdict(report)}

    def summary(self, counts: dict[str, Any]) -> str:
        verb = "Would merge" if counts["dry_run"] else "Merged"
        return (
            f"Examined {counts['examined']} memories: {verb} {counts['merged']} "
            f"into {counts['groups']} others."
        )
