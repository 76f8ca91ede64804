"""Serve one owner's memory as an MCP server over stdio."""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from persistent_memory.exceptions import InvalidOwner


class Command(BaseCommand):
    help = (
        "Serve an MCP server over standard input and output whose tools read and write one "
        "owner's conversations and memories (for a desktop MCP client). Needs the 'mcp' extra."
    )
    # Standard output is the protocol's: no system checks printed there.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument(
            "--owner",
            required=True,
            help='The owner the tools act for, e.g. "user:42" ("" for the unowned namespace).',
        )

    def handle(self, *args: Any, owner: str, **options: Any) -> None:
        try:
            from persistent_memory.mcp.server import build_server
        except ImportError as exc:
            raise CommandError(
                "MCP needs the 'mcp' extra (python -m pip install "
                f"'path/to/django-persistent-memory[mcp]'): {exc}"
            ) from exc
        try:
            server = build_server(owner)
        except InvalidOwner as exc:
            raise CommandError(str(exc)) from exc
        server.run("stdio")
