"""Sync the ORM mirror with the store: dirty sessions, named ones, or everything."""

from __future__ import annotations

import time
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import CommandError

from persistent_memory.management.base import MemoryCommand
from persistent_memory.mirror import SyncResult


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
        try:
            while True:
                if named:
                    result = mirror.sync_sessions(named)
                elif all:
                    result = mirror.sync_all(owner=owner)
                else:
                    result = mirror.sync_dirty()
                total += result
                passes += 1
                if watch is None:
                    break
                if result.synced or result.gone or result.failed:
                    self.log(
                        f"pass {passes}: synced {result.synced}, gone {result.gone}, failed {result.failed}",
                        2,
                    )
                time.sleep(watch)
        except KeyboardInterrupt:
            self.log("Interrupted: stopping after the last complete pass.")
        return {"passes": passes, "synced": total.synced, "gone": total.gone, "failed": total.failed}
