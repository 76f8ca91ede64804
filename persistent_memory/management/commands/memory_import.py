"""Import sessions from a JSON Lines export."""

from __future__ import annotations

import sys
from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from django.core.management.base import CommandError

from persistent_memory.management.base import MemoryCommand
from persistent_memory.operations.maintenance import InvalidRecord, as_counts, import_sessions


class Command(MemoryCommand):
    help = (
        "Import sessions from a memory_export file: values, history, conversations and remaining TTL "
        "exactly. Every line is checked before anything is written; existing sessions are refused unless "
        "--replace."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "file", metavar="FILE", help="A JSON Lines file from memory_export ('-' for stdin)."
        )
        parser.add_argument("--replace", action="store_true", help="Replace sessions that exist.")
        # (--owner, from MemoryCommand: every session goes to that owner instead of its own.)
        parser.add_argument(
            "-n", "--dry-run", action="store_true", help="Check the file and report; write nothing."
        )

    def run(
        self, *, file: str, replace: bool, dry_run: bool, owner: str | None, **options: Any
    ) -> dict[str, Any]:
        try:
            lines = (sys.stdin.read() if file == "-" else Path(file).read_text(encoding="utf-8")).splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise CommandError(f"Cannot read {file}: {exc}") from exc
        try:
            report = import_sessions(
                lines, replace=replace, dry_run=dry_run, owner=owner, progress=self.progress
            )
        except InvalidRecord as exc:
            raise CommandError(f"{file}: {exc}. Nothing was imported.") from exc
        return {"dry_run": dry_run, **as_counts(report)}

    def summary(self, counts: dict[str, Any]) -> str:
        verb = "Would import" if counts["dry_run"] else "Imported"
        return (
            f"{verb} {counts['imported']} of {counts['lines']} sessions ({counts['replaced']} replaced, "
            f"{counts['skipped_expired']} already expired and skipped)."
        )
