"""Copy every session between the Redis key layouts (node and cluster), or into another Redis."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import CommandError

from persistent_memory.conf import REDIS_LAYOUTS
from persistent_memory.management.base import MemoryCommand
from persistent_memory.operations.maintenance import BATCH_SIZE, as_counts
from persistent_memory.operations.relayout import (
    TARGET_TOPOLOGIES,
    RelayoutReport,
    relayout,
    relayout_backends,
)


class Command(MemoryCommand):
    help = (
        "Copy every session (values, history, conversations, summaries, TTLs) from one Redis key layout "
        "to the other: on the same server, or into another Redis with --target-url. Sessions whose copy "
        "is up to date are skipped, so a second run, or one started again after an interruption, "
        "finishes the job. Stop the application's writers first."
    )
    # The store is not used: the command builds its own source and target backends.
    uses_sessions = False

    def add_arguments(self, parser: ArgumentParser) -> None:
        super().add_arguments(parser)
        parser.add_argument("--to", required=True, choices=REDIS_LAYOUTS, help="The target's layout.")
        parser.add_argument(
            "--from",
            dest="source_layout",
            choices=REDIS_LAYOUTS,
            help="The source's layout (default: the other one; with --target-url, the configured one).",
        )
        parser.add_argument(
            "--target-url", metavar="URL", help="Copy into this Redis instead of the configured server."
        )
        parser.add_argument(
            "--target-topology",
            choices=TARGET_TOPOLOGIES,
            default="single",
            help="What --target-url is: one server or a Redis Cluster seed node (default single).",
        )
        parser.add_argument(
            "--delete-source",
            action="store_true",
            help="Delete each source session once its copy reads back equal (default: keep the source).",
        )
        parser.add_argument(
            "-n", "--dry-run", action="store_true", help="Count what would be copied; write nothing."
        )
        parser.add_argument(
            "--batch-size",
            type=int,
            default=BATCH_SIZE,
            metavar="N",
            help=f"Sessions per batch (default {BATCH_SIZE}).",
        )

    def run(
        self,
        *,
        to: str,
        source_layout: str | None,
        target_url: str | None,
        target_topology: str,
        delete_source: bool,
        dry_run: bool,
        batch_size: int,
        owner: str | None,
        **options: Any,
    ) -> dict[str, Any]:
        if batch_size < 1:
            raise CommandError("--batch-size must be 1 or more.")
        if target_url is None and target_topology != "single":
            raise CommandError("--target-topology needs --target-url.")
        if dry_run and delete_source:
            raise CommandError("--dry-run deletes nothing: leave out --delete-source.")
        source, target = relayout_backends(
            to=to, source_layout=source_layout, target_url=target_url, target_topology=target_topology
        )
        try:
            self.log(f"From {source.layout.name} layout on {source.describe()}", level=2)
            self.log(f"  to {target.layout.name} layout on {target.describe()}", level=2)
            report = relayout(
                source,
                target,
                dry_run=dry_run,
                delete_source=delete_source,
                owner=owner,
                batch_size=batch_size,
                progress=self._batch_done,
            )
        finally:
            source.close()
            target.close()
        if report.interrupted:
            self.log(self.summary({"dry_run": dry_run, **as_counts(report)}))
            raise CommandError("Interrupted: run the command again to finish (copied sessions are skipped).")
        return {"dry_run": dry_run, **as_counts(report)}

    def _batch_done(self, report: RelayoutReport) -> None:
        self.log(
            f"  batch {report.batches}: {report.scanned:,} scanned, {report.copied:,} copied, "
            f"{report.up_to_date:,} up to date, {report.expired:,} expired",
            level=2,
        )

    def summary(self, counts: dict[str, Any]) -> str:
        verb = "Dry run: would copy" if counts["dry_run"] else "Copied"
        line = (
            f"{verb} {counts['copied']} sessions, skipped {counts['up_to_date']} up to date, "
            f"{counts['expired']} expired"
        )
        if counts["deleted_source"]:
            line += f"; deleted {counts['deleted_source']} from the source"
        if counts["failed"]:
            line += f"; {counts['failed']} copies did not read back equal (their source is kept)"
        return line + "."

    def failure(self, counts: dict[str, Any]) -> str:
        return (
            f"{counts['failed']} copies differ from their source (written meanwhile?): run the command again."
        )
