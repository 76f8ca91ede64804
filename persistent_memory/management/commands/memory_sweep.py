"""The TTL sweep: remove what expired from the store, the mirror and the long-term memories."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import CommandError

from persistent_memory.management.base import MemoryCommand
from persistent_memory.memories.upkeep import forget_by_policy
from persistent_memory.operations.maintenance import as_counts, sweep, sweep_memories


class Command(MemoryCommand):
    help = (
        "Remove expired sessions, their leftover keys and stale run bindings from the store "
        "(SCAN in batches), mark them gone in the mirror, and delete mirrored sessions gone "
        "for longer than the retention."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        super().add_arguments(parser)
        parser.add_argument(
            "-n", "--dry-run", action="store_true", help="Count what would go; change nothing."
        )
        parser.add_argument(
            "--mirror-retention-days",
            type=float,
            default=30,
            metavar="N",
            help="Keep gone sessions in the mirror this long (default 30).",
        )
        parser.add_argument(
            "--batch-size", type=int, default=500, metavar="N", help="SCAN batch size (default 500)."
        )

    def run(
        self,
        *,
        dry_run: bool,
        mirror_retention_days: float,
        batch_size: int,
        owner: str | None,
        **options: Any,
    ) -> dict[str, Any]:
        if mirror_retention_days < 0:
            raise CommandError("--mirror-retention-days must be 0 or more.")
        if batch_size < 1:
            raise CommandError("--batch-size must be 1 or more.")
        report = sweep(
            dry_run=dry_run, batch_size=batch_size, mirror_retention_days=mirror_retention_days, owner=owner
        )
        report.memories_deleted = sweep_memories(dry_run=dry_run, owner=owner)
        forgotten = forget_by_policy(dry_run=dry_run, owner=owner)
        return {
            "dry_run": dry_run,
            **as_counts(report),
            "memories_inactive": forgotten.inactive,
            "memories_over_budget": forgotten.over_budget,
        }

    def summary(self, counts: dict[str, Any]) -> str:
        prefix = "Dry run, would remove" if counts["dry_run"] else "Removed"
        return (
            f"{prefix}: {counts['expired_sessions']} expired sessions, "
            f"{counts['leftover_keys']} leftover keys, {counts['run_bindings']} run bindings; "
            f"mirror: {counts['mirror_marked_gone']} marked gone, {counts['mirror_deleted']} deleted; "
            f"{counts['memories_deleted']} expired memories, {counts['memories_inactive']} inactive "
            f"(MEMORY_INACTIVE_DAYS), {counts['memories_over_budget']} over MEMORY_MAX_PER_OWNER."
        )
