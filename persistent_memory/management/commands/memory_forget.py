"""Forget an owner: delete everything the app holds about them."""

from __future__ import annotations

import sys
from argparse import ArgumentParser
from typing import Any

from django.core.management.base import CommandError

from persistent_memory.management.base import MemoryCommand
from persistent_memory.operations.forget import forget_owner


class Command(MemoryCommand):
    help = (
        "Delete everything held about one owner: sessions (values, history, conversations, "
        "summaries), idempotency records and run bindings, mirror rows, long-term memories, "
        "and on the memory backend the journal's segments; prints the counts."
    )

    def add_arguments(self, parser: ArgumentParser) -> None:
        super().add_arguments(parser)
        # The base's --owner is a filter (default: every owner); here it names whom to forget.
        (owner,) = [action for action in parser._actions if action.dest == "owner"]
        owner.required = True
        owner.help = "The owner to forget (e.g. user:42); required."
        parser.add_argument("--yes", action="store_true", help="Do not ask for confirmation.")

    def run(self, *, owner: str | None, yes: bool, **options: Any) -> dict[str, Any]:
        if not owner:
            raise CommandError("--owner is required (e.g. --owner user:42).")
        if not yes:
            self.confirm(owner)
        return forget_owner(owner, store=self.store)

    @staticmethod
    def confirm(owner: str) -> None:
        """Ask on the terminal; ``CommandError`` (nothing deleted) unless the answer is "yes".

        Without a terminal there is nobody to ask: piped or redirected input (``echo no |``,
        a cron job) must not count as consent, so only ``--yes`` deletes then.
        """
        if not sys.stdin.isatty():
            raise CommandError(
                "Nothing deleted: standard input is not a terminal, so there is nobody to confirm. "
                "Pass --yes to delete without asking."
            )
        try:
            answer = input(f"Delete everything held about {owner!r}? Type 'yes': ")
        except EOFError:
            raise CommandError("Nothing deleted (no answer). Pass --yes to delete without asking.") from None
        if answer.strip() != "yes":
            raise CommandError("Nothing deleted.")

    def summary(self, counts: dict[str, Any]) -> str:
        return (
            f"Forgot {counts['owner']}: {counts['sessions']} sessions, {counts['expired_sessions']} "
            f"expired leftovers, {counts['records']} idempotency records and run bindings, "
            f"{counts['mirror_rows']} mirror rows, {counts['memories']} memories."
        )
