"""Sync the ORM mirror with the store: dirty sessions, named ones, or everything.

Sessions the mirror could not write (it keeps retrying them) are listed after the
counts with the database's reason, and make the command exit non-zero.
"""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import CommandError

from persistent_memory.management.base import MemoryCommand
from persistent_memory.mirror.sessions import SyncResult
from persistent_memory.models import MemorySession
from persistent_memory.owners import split_storage_id

#: Failing sessions listed at most (the admin's "mirror sync: failing" filter shows all).
ERRORS_SHOWN = 20


class Command(MemoryCommand):
    help = "Sync the ORM mirror with the store (sessions written since the last sync, by default)."

    takes_sessions = True

    def add_arguments(self, parser: ArgumentParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "--all", action="store_true", help="Resync every session; mark the missing ones gone."
        )
        parser.add_argument(
            "--watch",
            type=float,
            metavar="SECONDS",
            help="Sync again every SECONDS until interrupted (Ctrl-C).",
        )

    def run(
        self, *, session: list[str] | None, owner: str | None, all: bool, watch: float | None, **options: Any
    ) -> dict[str, Any]:
        mirror = self.store.mirror
        if not mirror.enabled:
            raise CommandError("The mirror is off (PERSISTENT_MEMORY['MIRROR_MODE'] = 'off').")
        if session and all:
            raise CommandError("--session and --all do not go together.")
        if owner is not None and not session and not all:
            raise CommandError(
                "--owner goes with --session or --all (the sessions written since go together)."
            )
        named = self.sessions(session, owner)
        if watch is not None and watch <= 0:
            raise CommandError("--watch takes a number of seconds above 0.")
        total, passes = SyncResult(), 0
        for passes in self.passes(watch):
            if named:
                result = mirror.sync_sessions(named)
            elif all:
                result = mirror.sync_all(owner=owner)
            else:
                result = mirror.sync_dirty()
            total += result
            if watch is not None and (result.synced or result.gone or result.failed):
                self.log(
                    f"pass {passes}: synced {result.synced}, gone {result.gone}, failed {result.failed}", 2
                )
        return {
            "passes": passes,
            "synced": total.synced,
            "gone": total.gone,
            "failed": total.failed,
            "sync_errors": self.sync_errors(named, owner),
        }

    def sync_errors(self, named: list[str] | None, owner: str | None) -> list[dict[str, Any]]:
        """The sessions (of those named, or of ``owner``) whose last sync failed, newest first,
        at most ERRORS_SHOWN (``self.failing``: how many in all)."""
        rows = MemorySession.objects.filter(sync_failed_at__isnull=False)
        if named is not None:
            pairs = [split_storage_id(sid) for sid in named]
            rows = rows.filter(owner__in={o for o, _ in pairs}, session_id__in={s for _, s in pairs})
        elif owner is not None:
            rows = rows.filter(owner=owner)
        self.failing = rows.count()
        return [
            {"session_id": session_id, "owner": row_owner, "failed_at": failed_at.isoformat(), "error": error}
            for session_id, row_owner, failed_at, error in rows.order_by("-sync_failed_at").values_list(
                "session_id", "owner", "sync_failed_at", "sync_error"
            )[:ERRORS_SHOWN]
        ]

    def summary(self, counts: dict[str, Any]) -> str:
        errors = counts["sync_errors"]
        lines = [super().summary({k: v for k, v in counts.items() if k != "sync_errors"})]
        if errors:
            lines.append("Sessions the mirror could not write (retried at every sync):")
        for item in errors:
            who = f"{item['session_id']} (owner {item['owner']})" if item["owner"] else item["session_id"]
            lines.append(f"  {who} at {item['failed_at']}: {item['error']}")
        more = getattr(self, "failing", len(errors)) - len(errors)
        if more > 0:
            lines.append(f'  and {more:,} more (the admin\'s "mirror sync: failing" filter lists them all)')
        return "\n".join(lines)
