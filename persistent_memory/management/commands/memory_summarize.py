"""Apply the history summarization rule now."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import CommandError

from persistent_memory.conf import memory_settings
from persistent_memory.maintenance import as_counts, summarize_sessions
from persistent_memory.management.base import MemoryCommand


class Command(MemoryCommand):
    help = (
        "Summarize the history of every session (or the named ones) longer than the limit. "
        "Without --session or --all it does nothing when AUTO_SUMMARIZE is off."
    )

    takes_sessions = True

    def add_arguments(self, parser: ArgumentParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--max-history", type=int, metavar="N", help="The limit (default: MAX_HISTORY).")
        parser.add_argument(
            "--all", action="store_true", help="Every session, even when AUTO_SUMMARIZE is off."
        )
        parser.add_argument(
            "-n", "--dry-run", action="store_true", help="Report what would be folded; change nothing."
        )

    def run(
        self,
        *,
        session: list[str] | None,
        owner: str | None,
        max_history: int | None,
        all: bool,
        dry_run: bool,
        **options: Any,
    ) -> dict[str, Any]:
        if max_history is not None and max_history < 1:
            raise CommandError("--max-history must be 1 or more.")
        if session and all:
            raise CommandError("--session and --all do not go together.")
        if not session and not all and not memory_settings.AUTO_SUMMARIZE:
            self.log("AUTO_SUMMARIZE is off: nothing to do (pass --all to summarize every session anyway).")
            return {"dry_run": dry_run, "scanned": 0, "summarized": 0, "folded": 0}
        report = summarize_sessions(
            self.sessions(session, owner),
            owner=owner,
            max_history=max_history,
            dry_run=dry_run,
            progress=self.progress,
        )
        return {"dry_run": dry_run, **as_counts(report)}

    def summary(self, counts: dict[str, Any]) -> str:
        verb = "would summarize" if counts["dry_run"] else "summarized"
        return (
            f"Scanned {counts['scanned']} sessions, {verb} {counts['summarized']}, "
            f"{counts['folded']} history entries folded."
        )
