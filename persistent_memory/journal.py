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

Idempotency records (a write's key, fingerprint and result) outlive the segments: a
checkpoint deletes those about every flush, and a key's promise is
``IDEMPOTENCY_TTL_SECONDS`` (a day). Carrying every live record into each new segment, as
run bindings are, would cost O(live records) per flush; instead each record is appended
once, with the same one ``write()``, to a file of its own hour of expiry
(``records-<hour>``), read back at start, and deleted whole once that hour has passed:
O(1) per idempotent write. Forgetting an owner rewrites those files without its records.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from persistent_memory.exceptions import BackendUnavailable

logger = logging.getLogger(__name__)

#: How often buffered journal writes are forced to disk (the most a power cut can lose).
FSYNC_INTERVAL_SECONDS = 1.0

_SUFFIX = ".journal"
_RECORDS = "records-"
#: Idempotency records are filed by the hour in which they expire.
RECORDS_BUCKET_SECONDS = 3600
# What a database's folder name keeps of its server and name.
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
# Built once: json.dumps with options builds an encoder per call, a third of a write's cost.
_ENCODER = json.JSONEncoder(separators=(",", ":"))


def in_test_environment() -> bool:
    """Whether Django's test environment is set up (``setup_test_environment``, which the
    test runner and pytest-django call): it gives ``django.core.mail`` its ``outbox``."""
    from django.core import mail

    return hasattr(mail, "outbox")


def journal_directory(setting: Any, database: dict[str, Any], *, testing: bool | None = None) -> Path | None:
    """Where ``JOURNAL_DIR`` puts the journal of the mirror's ``database`` (the default
    one's settings): a path; False nowhere; None (the default) a folder of that database's
    own: beside an SQLite file, as it always was, or under the project's
    ``settings.BASE_DIR`` (else the working directory) in ``memory-journal/``, named after
    the database's server and name. None too for an in-memory SQLite database, and in a
    test environment (``testing``; None: :func:`in_test_environment`): a test database
    is made afresh for each run, and a journal outliving it would replay one run's writes
    into the next one's store."""
    if setting is False:
        return None
    if setting:
        return Path(setting)
    if in_test_environment() if testing is None else testing:
        return None
    name = str(database.get("NAME") or "")
    if database.get("ENGINE") == "django.db.backends.sqlite3":
        if name in ("", ":memory:") or "mode=memory" in name:
            return None
        path = Path(name)
        # Not "-journal": that is SQLite's own rollback journal beside the database.
        return path.with_name(f"{path.name}.memory-journal")
    # One folder per database: a journal replayed into another database than the one
    # its writes were for would put them there (two databases, or xdist workers each on
    # a test database of its own, in one project folder).
    from django.conf import settings

    vendor = str(database.get("ENGINE") or "db").rsplit(".", 1)[-1]
    parts = (vendor, database.get("HOST") or "local", database.get("PORT") or "default", name)
    folder = _UNSAFE.sub("_", "-".join(str(part) for part in parts))
    base = Path(getattr(settings, "BASE_DIR", None) or Path.cwd())
    return base / "memory-journal" / folder


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
        self._record_fds: dict[int, int] = {}  # open idempotency record files by bucket
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

    def remember(self, ref: str, fingerprint: str, expires_at: float, result: Any) -> None:
        """Keep an idempotency record (``result`` JSON-able) until ``expires_at``, across
        restarts; only the owning process writes."""
        if not self.owned or self._lock_fd < 0:
            return
        bucket = int(expires_at // RECORDS_BUCKET_SECONDS) + 1  # deletable from this bucket's start
        fd = self._record_fds.get(bucket)
        if fd is None:
            path = self.directory / f"{_RECORDS}{bucket}"
            fd = self._record_fds[bucket] = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                os.write(fd, b"\n")  # end a line a crash tore, or this record would join it
        line = _ENCODER.encode([ref, fingerprint, expires_at, result]).encode() + b"\n"
        if os.write(fd, line) != len(line):
            raise OSError("short write")  # a torn last line is skipped when read
        self._unsynced = True

    def remembered(self, now: float) -> Iterator[tuple[str, str, float, Any]]:
        """``(ref, fingerprint, expires_at, result)`` of the live idempotency records, oldest
        file first (a ref written twice: the later one is the record)."""
        for bucket, path in self._record_files():
            if bucket * RECORDS_BUCKET_SECONDS <= now:
                continue  # expired whole: :meth:`expire_records` deletes it
            for line in path.read_bytes().split(b"\n"):
                try:
                    ref, fingerprint, expires_at, result = json.loads(line)
                except ValueError:
                    continue  # empty, or a line torn by a crash: never answered
                if expires_at > now:
                    yield ref, fingerprint, expires_at, result

    def expire_records(self, now: float) -> None:
        """Delete the idempotency record files whose every record has expired."""
        if not self.owned:
            return
        for bucket, path in self._record_files():
            if bucket * RECORDS_BUCKET_SECONDS <= now:
                fd = self._record_fds.pop(bucket, None)
                if fd is not None:
                    os.close(fd)
                path.unlink(missing_ok=True)

    def forget_records(self, prefix: str) -> None:
        """Rewrite the idempotency record files without the records of refs starting with
        ``prefix`` (an owner forgotten: nothing of theirs stays on disk)."""
        if not self.owned:
            return
        mark = _ENCODER.encode(prefix)[:-1].encode()  # '["' + prefix: a line of that owner starts so
        for bucket, path in self._record_files():
            lines = path.read_bytes().split(b"\n")
            kept = [line for line in lines if line and not line[1:].startswith(mark)]
            if len(kept) == len([line for line in lines if line]):
                continue
            fd = self._record_fds.pop(bucket, None)
            if fd is not None:
                os.close(fd)
            temporary = path.with_name(f".{path.name}.tmp")
            temporary.write_bytes(b"".join(line + b"\n" for line in kept))
            with open(temporary, "rb") as written:
                os.fsync(written.fileno())
            os.replace(temporary, path)

    def _record_files(self) -> list[tuple[int, Path]]:
        files = []
        for path in self.directory.glob(f"{_RECORDS}*"):
            suffix = path.name.removeprefix(_RECORDS)
            if suffix.isdigit():
                files.append((int(suffix), path))
        return sorted(files)

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
        """Bytes in the journal's segments and idempotency record files."""
        paths = [*self.segments(), *(path for _, path in self._record_files())]
        return sum(path.stat().st_size for path in paths if path.exists())

    def _sync_loop(self) -> None:
        while not self._stop.wait(FSYNC_INTERVAL_SECONDS):
            self.sync()

    def sync(self) -> None:
        """Force written records to disk."""
        fd = self._fd
        if fd is not None and self._unsynced:
            self._unsynced = False
            for each in (fd, *list(self._record_fds.values())):
                try:
                    os.fsync(each)
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
        for fd in self._record_fds.values():
            os.fsync(fd)
            os.close(fd)
        self._record_fds = {}
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
