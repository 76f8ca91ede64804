"""Write long-term memories as JSON Lines."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from persistent_memory.management.base import MemoryCommand
from persistent_memory.memories.jsonl import export_lines
from persistent_memory.models import LongTermMemory


class Command(MemoryCommand):
    help = (
        "Write every long-term memory (or one owner's) as JSON Lines to --output, or to stdout "
        "(then with no summary line after them)."
    )
    uses_sessions = False

    def add_arguments(self, parser: ArgumentParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--output", "-o", metavar="FILE", help="Write here (default: stdout).")

    def run(self, *, owner: str | None, output: str | None, **options: Any) -> dict[str, Any]:
        rows = LongTermMemory.objects.all() if owner is None else LongTermMemory.objects.filter(owner=owner)
        count = 0
        if output is None:
            self.as_json, self.verbosity = False, 0  # stdout carries the lines only
            for line in export_lines(rows):
                self.stdout.write(line, ending="")
                count += 1
            return {"exported": count}
        with open(output, "w", encoding="utf-8") as file:
            for line in export_lines(rows):
                file.write(line)
                count += 1
        return {"exported": count}

    def summary(self, counts: dict[str, Any]) -> str:
        return f"Exported {counts['exported']} memories."
