"""Apply the history summarization rule now; with ``--conversations``, summarize the
conversations marked for a rolling summary."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import CommandError

from persistent_memory.conf import memory_settings
from persistent_memory.conversations.summarizing import SummarizeReport
from persistent_memory.management.base import MemoryCommand
from persistent_memory.operations.maintenance import as_counts, summarize_sessions


class Command(MemoryCommand):
    help = (
        "Summarize the history of every session (or the named ones) longer than the limit. "
        "Without --session or --all it does nothing when AUTO_SUMMARIZE is off. With "
        "--conversations, summarize the conversations marked for a rolling summary instead."
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
        parser.add_argument(
            "--conversations",
            action="store_true",
            help="Summarize the conversations marked for a rolling summary (CONTEXT_STRATEGY / SUMMARIZER).",
        )
        parser.add_argument(
            "--watch",
            type=float,
            metavar="SECONDS",
            help="With --conversations: look again every SECONDS until interrupted (Ctrl-C).",
        )
        parser.add_argument(
            "--limit",
            type=int,
            metavar="N",
            help="With --conversations: at most N conversations a pass (default: every marked one).",
        )

    def run(
        self,
        *,
        session: list[str] | None,
        owner: str | None,
        max_history: int | None,
        all: bool,
        dry_run: bool,
        conversations: bool,
        watch: float | None,
        limit: int | None,
        **options: Any,
    ) -> dict[str, Any]:
        if conversations:
            if session or all or owner is not None or max_history is not None:
                raise CommandError(
                    "--conversations goes without --session, --owner, --all and --max-history."
                )
            return self.summarize_conversations(watch=watch, limit=limit, dry_run=dry_run)
        if watch is not None or limit is not None:
            raise CommandError("--watch and --limit go with --conversations.")
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

    def summarize_conversations(
        self, *, watch: float | None, limit: int | None, dry_run: bool
    ) -> dict[str, Any]:
        """Passes of the summarizer over the marked conversations, and what they did."""
        if watch is not None and watch <= 0:
            raise CommandError("--watch takes a number of seconds above 0.")
        if limit is not None and limit < 1:
            raise CommandError("--limit must be 1 or more.")
        if dry_run and watch is not None:
            raise CommandError("--dry-run and --watch do not go together.")
        worker = self.store.summarizer_worker
        if not worker.enabled:
            self.log(
                "Rolling summaries are off (CONTEXT_STRATEGY is not 'rolling_summary' and no SUMMARIZER): "
                "nothing to do."
            )
            return self.counts(0, SummarizeReport(), pending=0, state=None)
        if dry_run:
            return self.counts(0, SummarizeReport(), pending=self.store.backend.unsummarized_count())
        worker.stop()  # this process's own thread: the command does the work, and counts it
        try:
            worker.summarizer  # noqa: B018 (a summarizer that cannot be built fails the command now)
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from exc
        total, passes = SummarizeReport(), 0
        for passes in self.passes(watch):
            report = worker.run_once(limit)
            total += report
            if watch is not None and report.taken:
                self.log(
                    f"pass {passes}: summarized {report.summarized}, skipped {report.skipped}, "
                    f"failed {report.failed}",
                    2,
                )
        return self.counts(passes, total, pending=self.store.backend.unsummarized_count())

    def counts(
        self, passes: int, report: SummarizeReport, *, pending: int, state: str | None = ""
    ) -> dict[str, Any]:
        counts = {"passes": passes, **report.as_counts(), "pending": pending}
        counts["state"] = self.store.summarizer_worker.health.state if state == "" else state
        return counts

    def failure(self, counts: dict[str, Any]) -> str:
        if "passes" in counts:
            return f"{counts['failed']} summaries failed (see the log and health/); they stay marked."
        return super().failure(counts)

    def summary(self, counts: dict[str, Any]) -> str:
        if "passes" in counts:
            waiting = " (the summarizers wait before trying again)" if counts["waiting"] else ""
            return (
                f"Summarized {counts['summarized']} conversations in {counts['passes']} passes "
                f"({counts['taken']} taken, {counts['skipped']} with nothing to do, {counts['failed']} "
                f"failed); {counts['pending']} still marked; summarizers: {counts['state']}{waiting}."
            )
        verb = "would summarize" if counts["dry_run"] else "summarized"
        return (
            f"Scanned {counts['scanned']} sessions, {verb} {counts['summarized']}, "
            f"{counts['folded']} history entries folded."
        )
