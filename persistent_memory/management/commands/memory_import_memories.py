"""Read long-term memories from JSON Lines."""

from __future__ import annotations

from argparse import ArgumentParser
from dataclasses import asdict
from typing import Any

from django.core.management.base import CommandError

from persistent_memory.management.base import MemoryCommand
from persistent_memory.memories.jsonl import import_lines


class Command(MemoryCommand):
    help = (
        "Upsert the memories of a JSON Lines file (as memory_export_memories writes) by owner and "
        "key, with source 'import'; with --owner, all into that owner's memories."
    )
    uses_sessions = False

    def add_arguments(self, parser: ArgumentParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("file", metavar="FILE", help="The JSON Lines file.")

    def run(self, *, file: str, owner: str | None, **options: Any) -> dict[str, Any]:
        try:
            with open(file, encoding="utf-8") as lines:
                return asdict(import_lines(lines, owner=owner))
        except OSError as exc:
            raise CommandError(f"Cannot read {file}: {exc}") from exc

    def summary(self, counts: dict[str, Any]) -> str:
        return f"Imported {counts['imported']} memories, {counts['refused']} lines refused."
