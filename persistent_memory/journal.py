"""The memory backend's write-ahead journal: what makes the embedded default durable.

Like Redis's append-only file: every write is appended to a local file, with one
``write()``, before the backend applies it and answers, so a write answered 2xx
survives the process being killed (the kernel keeps what ``write()`` was given). A
thread calls ``fsync`` about once a second, which bounds what a power cut can take.

The ORM mirror is the base the journal builds on: a restart restores the sessions the
mirror holds, then replays the journal's records newer than each session's mirrored
point (``MemorySession.journal_seq``). Once the mirror has caught up with every write
before a checkpoint, the segments before it are deleted (:meth:`Journal.rotate`,
:meth:`Journal.drop`).

Records are JSON lines ``[seq, op, storage id, time, idempotency record or null, *args]``
in segment files named by their first sequence number. One process owns a journal directory (an ``flock``);
another process on the same directory can read it but writes no records of its own.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from persistent_memory.exceptions import BackendUnavailable

logger = logging.getLogger(__name__)

#: How often buffered journal writes are forced to disk (the most a power cut can lose).
FSYNC_INTERVAL_SECONDS = 1.0

_SUFFIX = ".journal"
# Built once: json.dumps with options builds an encoder per call, a third of a write's cost.
_ENCODER = json.JSONEncoder(separators=(",", ":"))


def journal_directory(setting: Any, database: dict[str, Any]) -> Path | None:
    """Where ``JOURNAL_DIR`` puts the journal: a path; None beside the ``database``
    (the default one's settings) when that is an SQLite file; False nowhere."""
    if setting is False:
        return None
    if setting:
        return Path(setting)
    name = str(database.get("NAME") or "")
    in_memory = name in ("", ":memory:") or "mode=memory" in name
    if database.get("ENGINE") != "django.db.backends.sqlite3" or in_memory:
        return None
    path = Path(name)
    # Not "-journal": that is SQLite's own rollback journal beside the database.
    return path.with_name(f"{path.name}.memory-journal")


def _first_seq(path: Path) -> int:
    return int(path.name.removesuffix(_SUFFIX))


class Journal:
    """Segment files in ``directory``; :meth:`append` is called with the backend's lock held."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.directory / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            #: False when another process owns the directory: this one only reads it.
            self.owned = True
        except BlockingIOError:
            self.owned = False
            logger.warning(
                "persistent_memory: another process owns the journal in %s; this one reads it "
                "but journals none of its own writes",
                self.directory,
            )
        self.seq = max((seq for seq, _ in self.records()), default=0)
        self._fd: int | None = None
        self._unsynced = False
        self._stop = threading.Event()
        self._syncer: threading.Thread | None = None
        if self.owned:
            self._open_segment(self.seq + 1)
            self._syncer = threading.Thread(
                target=self._sync_loop, name="persistent-memory-journal", daemon=True
            )
            self._syncer.start()

    # Writing ------------------------------------------------------------------

    def segments(self) -> list[Path]:
        """Segment files, oldest first."""
        return sorted(self.directory.glob(f"*{_SUFFIX}"), key=_first_seq)

    def _open_segment(self, first_seq: int) -> Path:
        path = self.directory / f"{first_seq:020d}{_SUFFIX}"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        if self._fd is not None:
            os.fsync(self._fd)
            os.close(self._fd)
        self._fd = fd
        return path

    def append(self, op: str, session_id: str, now: float, *args: Any) -> int:
        """Write one record and return its sequence number; ``BackendUnavailable`` if it
        cannot be written (nothing is applied then)."""
        if self._fd is None:
            return 0
        seq = self.seq + 1
        line = _ENCODER.encode([seq, op, session_id, now, *args]).encode() + b"\n"
        try:
            written = os.write(self._fd, line)
        except OSError as exc:
            raise BackendUnavailable(f"The memory backend's journal cannot be written: {exc}") from None
        if written != len(line):  # a full disk can cut a write short: never keep half a record
            raise BackendUnavailable("The memory backend's journal is out of space.")
        self.seq = seq
        self._unsynced = True
        return seq

    def rotate(self) -> list[Path]:
        """Start a new segment; return the older ones, which :meth:`drop` may delete once
        every record in them is mirrored."""
        if self._fd is None:
            return []
        current = self._open_segment(self.seq + 1)
        # An empty segment is opened again under the same name: it is not an older one.
        return [path for path in self.segments() if path != current]

    def drop(self, segments: list[Path]) -> None:
        """Delete segments whose every record the mirror holds."""
        for path in segments:
            path.unlink(missing_ok=True)

    def size(self) -> int:
        """Bytes in the journal's segments."""
        return sum(path.stat().st_size for path in self.segments() if path.exists())

    def _sync_loop(self) -> None:
        while not self._stop.wait(FSYNC_INTERVAL_SECONDS):
            self.sync()

    def sync(self) -> None:
        """Force written records to disk."""
        fd = self._fd
        if fd is not None and self._unsynced:
            self._unsynced = False
            try:
                os.fsync(fd)
            except OSError:  # closed by a rotation meanwhile (it synced), or a failing disk
                logger.warning("persistent_memory: journal fsync failed", exc_info=True)

    def close(self) -> None:
        """Sync, stop the sync thread and give up the directory."""
        self._stop.set()
        if self._syncer is not None:
            self._syncer.join(timeout=5)
        if self._fd is not None:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = -1

    # Reading ------------------------------------------------------------------

    def records(self) -> Iterator[tuple[int, list[Any]]]:
        """``(seq, record)`` of every whole record, oldest first.

        A record cut short by a crash (only the last line of a segment can be) was never
        answered: it is skipped.
        """
        for path in self.segments():
            try:
                data = path.read_bytes()
            except FileNotFoundError:  # dropped meanwhile by the owning process
                continue
            for line in data.split(b"\n"):
                if not line:
                    continue
                try:
                    record = json.loads(line)
                except ValueError:
                    logger.warning("persistent_memory: skipping a torn journal record in %s", path.name)
                    continue
                yield record[0], record
