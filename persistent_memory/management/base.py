"""What every ``memory_*`` command shares: ``--json``, verbosity-gated output through
``self.stdout``/``self.stderr``, progress on a terminal, and store errors as
``CommandError`` (a non-zero exit status).

Where output goes: the result (the summary line, ``--json``) on stdout, in Django's
SUCCESS style when colour is on; notes and progress on stderr, unstyled (Django styles
everything on stderr as an error unless told otherwise); errors as ``CommandError``, in
the error style."""

from __future__ import annotations

import json
import signal
import threading
import time
from argparse import ArgumentParser
from collections.abc import Iterator
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from persistent_memory.exceptions import PersistentMemoryError
from persistent_memory.operations.maintenance import named_sessions
from persistent_memory.owners import owner_prefix
from persistent_memory.store import MemoryStore, get_store

#: Runs over this many sessions show progress on a terminal.
PROGRESS_FROM = 300


def plain(text: str) -> str:
    """The neutral style: text as it is (see :meth:`MemoryCommand.note`)."""
    return text


class MemoryCommand(BaseCommand):
    """Base of the maintenance commands: subclasses implement :meth:`run` and return counts."""

    #: Whether the command reads or changes sessions (a memory store is this process's own).
    uses_sessions = True

    #: Whether the command takes --owner (and --session, when it names sessions).
    takes_owner = True
    takes_sessions = False

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--json", action="store_true", help="Print one JSON object with the counts.")
        if self.takes_owner:
            parser.add_argument(
                "--owner",
                metavar="OWNER",
                help="Only this owner's sessions (e.g. user:42); default: every owner.",
            )
        if self.takes_sessions:
            parser.add_argument(
                "--session",
                action="append",
                metavar="ID",
                help="Only this session (repeatable): the owner's given --owner, else an unowned one.",
            )

    def execute(self, *args: Any, **options: Any) -> Any:
        self.as_json = options.get("json", False)
        self.verbosity = options.get("verbosity", 1)
        self._progress_at = 0.0
        try:
            if options.get("owner") is not None:  # before anything is opened, read or written
                owner_prefix(options["owner"])
            return super().execute(*args, **options)
        except PersistentMemoryError as exc:
            raise CommandError(str(exc)) from exc

    @property
    def store(self) -> MemoryStore:
        return get_store()

    @staticmethod
    def sessions(session: list[str] | None, owner: str | None) -> list[str] | None:
        """Storage ids of the sessions named with --session (None: not named)."""
        return None if session is None else named_sessions(session, owner)

    def handle(self, *args: Any, **options: Any) -> None:
        self.warn_if_private()
        counts = self.run(**options)
        if self.as_json:
            self.stdout.write(json.dumps(counts, sort_keys=True))
        else:
            # A run with failures is no success: plain, then the error exit says why.
            self.log(self.summary(counts), style_func=None if counts.get("failed") else self.style.SUCCESS)
        if counts.get("failed"):
            raise CommandError(self.failure(counts))

    def failure(self, counts: dict[str, Any]) -> str:
        """What the error exit says when ``counts["failed"]`` is not 0."""
        return f"{counts['failed']} sessions failed (see the log); run the command again."

    def run(self, **options: Any) -> dict[str, Any]:
        raise NotImplementedError

    def warn_if_private(self) -> None:
        """On the memory backend a command sees its own process's copy, not a server's."""
        if self.uses_sessions and self.store.backend.name == "memory":
            self.note(
                "Note: the memory backend lives inside each process. This command works on its own "
                "copy (restored from the mirror), not on the sessions of a running server; change "
                "those from the server (admin actions, API) or use the redis backend."
            )

    def summary(self, counts: dict[str, Any]) -> str:
        """The prose line for ``counts`` (``--json`` prints the counts themselves)."""
        return ", ".join(f"{name.replace('_', ' ')}: {value}" for name, value in counts.items())

    def log(self, message: str, level: int = 1, *, style_func: Any = None) -> None:
        """Write ``message`` on stdout when ``--verbosity`` is at least ``level`` (never with
        ``--json``), in ``style_func`` (e.g. ``self.style.SUCCESS``) if given."""
        if not self.as_json and self.verbosity >= level:
            self.stdout.write(message, style_func=style_func)

    def note(self, message: str, level: int = 1) -> None:
        """Write a note or progress line on stderr when ``--verbosity`` is at least ``level``,
        unstyled: stderr's own style is Django's error style, and a note is no error."""
        if self.verbosity >= level:
            self.stderr.write(message, style_func=plain)

    def passes(self, watch: float | None) -> Iterator[int]:
        """Pass numbers: one without ``--watch``; with it, one every ``watch`` seconds until
        Ctrl-C or SIGTERM.

        The signal only ends the wait between passes: a pass it arrives in runs to its end,
        so what the pass wrote is counted (a KeyboardInterrupt raised inside it lost that
        count). A second Ctrl-C interrupts at once.
        """
        if watch is None:
            yield 1
            return
        stop = threading.Event()

        def interrupt(signum: int, frame: Any) -> None:
            if stop.is_set():
                raise KeyboardInterrupt
            stop.set()

        # Handlers can only be set from the main thread; elsewhere no signal reaches us anyway.
        in_main = threading.current_thread() is threading.main_thread()
        previous = (
            {s: signal.signal(s, interrupt) for s in (signal.SIGINT, signal.SIGTERM)} if in_main else {}
        )
        try:
            number = 0
            while not stop.is_set():
                number += 1
                yield number
                stop.wait(watch)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        self.log("Interrupted: stopping after the last complete pass.")

    def progress(self, done: int, total: int | None, what: str = "sessions") -> None:
        """A line on stderr about once a second, only on a terminal and not with ``--json``."""
        if self.as_json or self.verbosity < 1 or not self.stderr.isatty():
            return
        if (total or done) < PROGRESS_FROM or time.monotonic() - self._progress_at < 1:
            return
        self._progress_at = time.monotonic()
        self.note(f"  {done:,}/{total:,} {what}" if total else f"  {done:,} {what}")
