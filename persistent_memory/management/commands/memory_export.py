"""Export sessions as JSON Lines, one session per line."""

from __future__ import annotations

import json
from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from django.core.management.base import CommandError

from persistent_memory.management.base import MemoryCommand
from persistent_memory.operations.maintenance import export_sessions


class Command(MemoryCommand):
    help = (
        "Export sessions (owner, values, history, conversations, remaining TTL) as JSON Lines, to a file or "
        "standard output."
    )
    takes_sessions = True

    def add_arguments(self, parser: ArgumentParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--output", "-o", metavar="FILE", help="Write here instead of standard output.")

    def handle(
        self, *args: Any, session: list[str] | None, owner: str | None, output: str | None, **options: Any
    ) -> None:
        if output is None and self.as_json:
            raise CommandError("--json prints counts: give --output FILE for the sessions.")
        self.warn_if_private()
        records = export_sessions(self.sessions(session, owner), owner=owner, progress=self.progress)
        if output is None:
            count = self._write(records, self.stdout.write)  # OutputWrapper ends each line
        else:
            try:
                with Path(output).open("w", encoding="utf-8") as handle:
                    count = self._write(records, lambda line: handle.write(line + "\n"))
            except OSError as exc:
                raise CommandError(f"Cannot write {output}: {exc}") from exc
        if self.as_json:
            self.stdout.write(json.dumps({"exported": count, "output": output}, sort_keys=True))
        elif output is not None:
            self.log(f"Exported {count:,} sessions to {output}.", style_func=self.style.SUCCESS)
        else:
            self.note(f"Exported {count:,} sessions.")  # on stderr: stdout is the export itself

    @staticmethod
    def _write(records: Any, write: Any) -> int:
        count = 0
        for record in records:
            write(json.dumps(record))
            count += 1
        return count
