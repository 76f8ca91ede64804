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
in segment files named by their first sequence number. A line that is not one (torn by
a power cut, or anything else: a disk's corruption, an edit) is skipped, logged with its
segment and line and counted (:attr:`Journal.skipped`); the backend checks each record's
arguments before it applies any of them (``backends.memory.replay``). One process owns a
journal directory (an ``flock``); another process on the same directory can read it but
writes no records of its own.

Idempotency records (a write's key, fingerprint and result) outlive the segments: a
checkpoint deletes those about every flush, and a key's promise is
``IDEMPOTENCY_TTL_SECONDS`` (a day). Carrying every live record into each new segment, as
run bindings are, would cost O(live records) per flush; instead each record is appended
once, with the same one ``write()``, to a file of its own hour of expiry
(``records-<hour>``), read back at start, and deleted whole once that hour has passed:
O(1) per idempotent write. Forgetting an owner rewrites those files without its records.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import os
import re
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

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
    test runner and pytest-django call, and ``teardown_test_environment`` undoes)."""
    from django.test import utils

    # Only setup_test_environment sets _TestState.saved_data. Not mail.outbox: the locmem
    # EmailBackend sets that too, in any deployment that sends a mail with it. _TestState
    # is private, so a Django without it counts as no test environment (the journal on).
    state = getattr(utils, "_TestState", None)
    return getattr(state, "saved_data", None) is not None


_told_testing = False  # the INFO line below is logged once per process


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
        global _told_testing
        if testing is None and not _told_testing:
            _told_testing = True
            logger.info(
                "persistent_memory: Django's test environment is set up: the memory backend "
                "keeps no journal by default (set JOURNAL_DIR for one)"
            )
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


def _total_size(paths: Iterable[Path]) -> int:
    total = 0
    for path in paths:
        try:
            total += path.stat().st_size
        except FileNotFoundError:  # dropped or expired meanwhile
            continue
    return total


class Entry(NamedTuple):
    """One journal record read back: its sequence number, the record, and ``where`` it is
    (``<segment file>:<line>``, for the log)."""

    seq: int
    record: list[Any]
    where: str


#: The largest sequence number: the mirror keeps it in a 64-bit column.
MAX_SEQ = 2**63 - 1


def _number(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)


def _head_error(record: Any) -> str | None:
    """Why ``record`` does not start as :meth:`Journal.append` writes one (None: it does):
    ``[seq, op, storage id, time, idempotency record or null, *args]``. The arguments
    are the backend's to check (see ``backends.memory.replay``)."""
    if not isinstance(record, list) or len(record) < 5:
        return "not a list of at least five items"
    seq, op, session_id, now, idempotency = record[:5]
    if isinstance(seq, bool) or not isinstance(seq, int) or not 0 < seq <= MAX_SEQ:
        return "its sequence number is not a positive 64-bit integer"
    if not isinstance(op, str) or not isinstance(session_id, str):
        return "its operation or session id is not a string"
    if not _number(now) or now < 0:
        return "its time is not a number of seconds"
    if idempotency is not None and not (
        isinstance(idempotency, list)
        and len(idempotency) == 3
        and isinstance(idempotency[0], str)
        and isinstance(idempotency[1], str)
        and _number(idempotency[2])
        and idempotency[2] > 0
    ):
        return "its idempotency record is malformed"
    return None


def _is_record(record: Any) -> bool:
    """Whether ``record`` has the shape :meth:`Journal.remember` writes."""
    if not isinstance(record, list) or len(record) != 4:
        return False
    ref, fingerprint, expires_at, _ = record
    number = isinstance(expires_at, int | float) and not isinstance(expires_at, bool)
    return isinstance(ref, str) and isinstance(fingerprint, str) and number


def _sync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
        except BaseException:
            os.close(self._lock_fd)
            raise
        #: Lines of the segments that are not records, by ``where``: why each was skipped.
        self.skipped: dict[str, str] = {}
        self._fd: int | None = None
        # Open idempotency record files by bucket: the newest only. Records are filed by
        # expiry and the TTL is one setting, so writes move forward to newer buckets; a
        # write to an older one opens it again, and it is closed at the next sync.
        self._record_fds: dict[int, int] = {}
        self._unsynced = False  # the segment was written since the last sync
        self._unsynced_fds: set[int] = set()  # record files written since the last sync
        self._retired: list[int] = []  # record files closed with writes to sync first
        # Guards the fd table: the sync thread, a remember and a close (not under the
        # backend's lock) would otherwise fsync or close an fd another one just closed.
        self._fds_lock = threading.Lock()
        self._stop = threading.Event()
        self._syncer: threading.Thread | None = None
        try:
            self.seq = max((entry.seq for entry in self.entries()), default=0)
            if self.owned:
                self._open_segment(self.seq + 1)
                self._syncer = threading.Thread(
                    target=self._sync_loop, name="persistent-memory-journal", daemon=True
                )
                self._syncer.start()
        except BaseException:
            # A start that fails gives the folder up, so that a retry (in this process or
            # another) owns it: an flock lives as long as its file descriptor.
            with contextlib.suppress(OSError):  # the error to report is the one above
                self.close()
            raise

    # Writing ------------------------------------------------------------------

    def segments(self) -> list[Path]:
        """Segment files, oldest first."""
        return sorted(self.directory.glob(f"*{_SUFFIX}"), key=_first_seq)

    def _open_segment(self, first_seq: int) -> Path:
        path = self.directory / f"{first_seq:020d}{_SUFFIX}"
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with self._fds_lock:
            previous, self._fd = self._fd, fd
        if previous is not None:  # no one else holds it now: the sync thread dups under the lock
            os.fsync(previous)
            os.close(previous)
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
            # Cut the torn half off (truncating needs no space): left there, it would join
            # the next record into one line that is no record, and that write would be lost.
            with contextlib.suppress(OSError):  # the error to report is the one below
                os.ftruncate(self._fd, os.fstat(self._fd).st_size - written)
            raise BackendUnavailable("The memory backend's journal is out of space.")
        self.seq = seq
        self._unsynced = True
        return seq

    def remember(self, ref: str, fingerprint: str, expires_at: float, result: Any) -> None:
        """Keep an idempotency record (``result`` JSON-able) until ``expires_at``, across
        restarts; only the owning process writes."""
        if not self.owned:
            return
        bucket = int(expires_at // RECORDS_BUCKET_SECONDS) + 1  # deletable from this bucket's start
        line = _ENCODER.encode([ref, fingerprint, expires_at, result]).encode() + b"\n"
        with self._fds_lock:
            if self._lock_fd < 0:  # closed
                return
            try:
                fd = self._record_fds.get(bucket)
                if fd is None:
                    fd = self._open_records(bucket)
                if os.write(fd, line) != len(line):
                    raise OSError("short write")  # a torn last line is skipped when read
            except OSError:
                # Never append to a torn line: the next remember opens the file again,
                # which ends that line first.
                self._close_records(bucket)
                raise
            self._unsynced_fds.add(fd)
            newest = max(self._record_fds)
            for older in [each for each in self._record_fds if each != newest]:
                self._close_records(older, retire=True)

    def _open_records(self, bucket: int) -> int:
        """Open ``bucket``'s record file for appending (the fd table's lock held)."""
        path = self.directory / f"{_RECORDS}{bucket}"
        fd = self._record_fds[bucket] = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            os.write(fd, b"\n")  # end a line a crash tore, or this record would join it
        return fd

    def _close_records(self, bucket: int, *, retire: bool = False) -> None:
        """Close ``bucket``'s record file if open (the fd table's lock held); ``retire``: its
        unsynced writes are synced by the next :meth:`sync` first, else dropped with it."""
        fd = self._record_fds.pop(bucket, None)
        if fd is None:
            return
        if retire and fd in self._unsynced_fds:
            self._unsynced_fds.discard(fd)
            self._retired.append(fd)
            return
        self._unsynced_fds.discard(fd)
        os.close(fd)

    def remembered(self, now: float) -> Iterator[tuple[str, str, float, Any]]:
        """``(ref, fingerprint, expires_at, result)`` of the live idempotency records, oldest
        file first (a ref written twice: the later one is the record)."""
        for bucket, path in self._record_files():
            if bucket * RECORDS_BUCKET_SECONDS <= now:
                continue  # expired whole: :meth:`expire_records` deletes it
            try:
                data = path.read_bytes()
            except FileNotFoundError:  # expired meanwhile by the owning process
                continue
            for line in data.split(b"\n"):
                try:
                    record = json.loads(line)
                except (ValueError, RecursionError):
                    continue  # empty, or a line torn by a crash: never answered
                if not _is_record(record):
                    # Edited, or not ours: a start must not fail on one line (its key is not kept).
                    logger.warning(
                        "persistent_memory: skipping a malformed idempotency record: %s", path.name
                    )
                    continue
                ref, fingerprint, expires_at, result = record
                if expires_at > now:
                    yield ref, fingerprint, expires_at, result

    def expire_records(self, now: float) -> None:
        """Delete the idempotency record files whose every record has expired."""
        if not self.owned:
            return
        for bucket, path in self._record_files():
            if bucket * RECORDS_BUCKET_SECONDS <= now:
                with self._fds_lock:
                    self._close_records(bucket)  # unsynced writes too: the file goes
                path.unlink(missing_ok=True)

    def forget_records(self, prefix: str) -> None:
        """Rewrite the idempotency record files without the records of refs starting with
        ``prefix`` (an owner forgotten: nothing of theirs stays on disk).

        ``BackendUnavailable`` if a file cannot be rewritten: the files rewritten so far
        stay so and the others as they were, whole, so forgetting the owner again
        finishes the job."""
        if not self.owned:
            return
        mark = _ENCODER.encode(prefix)[:-1].encode()  # '["' + prefix: a line of that owner starts so
        for bucket, path in self._record_files():
            temporary = path.with_name(f".{path.name}.tmp")
            try:
                lines = path.read_bytes().split(b"\n")
                kept = [line for line in lines if line and not line[1:].startswith(mark)]
                if len(kept) == len([line for line in lines if line]):
                    continue
                with self._fds_lock:
                    self._close_records(bucket)  # its writes are in the file read above
                temporary.write_bytes(b"".join(line + b"\n" for line in kept))
                with open(temporary, "rb") as written:
                    os.fsync(written.fileno())
                os.replace(temporary, path)
                _sync_directory(self.directory)  # or a power cut could bring the old file back
            except OSError:
                logger.exception("persistent_memory: could not rewrite the idempotency records %s", path.name)
                with contextlib.suppress(OSError):  # the error to report is the one above
                    temporary.unlink(missing_ok=True)
                raise BackendUnavailable(
                    "The memory backend could not remove the owner's idempotency records from "
                    "disk; forgetting the owner again finishes it."
                ) from None

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
        """Bytes in the journal's segments: what the mirror has yet to catch up with."""
        return _total_size(self.segments())

    def records_size(self) -> int:
        """Bytes in the idempotency record files (a TTL's worth of keyed writes' answers,
        whatever the mirror's lag)."""
        return _total_size(path for _, path in self._record_files())

    def _sync_loop(self) -> None:
        while not self._stop.wait(FSYNC_INTERVAL_SECONDS):
            try:
                self.sync()
            except OSError:  # out of fds for the duplicates: the next round tries again
                logger.warning("persistent_memory: journal fsync failed", exc_info=True)

    def sync(self) -> None:
        """Force the files written since the last sync to disk."""
        with self._fds_lock:
            # Duplicates, synced outside the lock: writers never wait for the disk, and a
            # close meanwhile can neither fail this fsync nor point it at a reused fd number.
            # Marked synced only once duplicated: a dup that fails (out of fds) leaves the
            # files to the next round.
            fds = [os.dup(fd) for fd in self._unsynced_fds]
            if self._fd is not None and self._unsynced:
                fds.append(os.dup(self._fd))
                self._unsynced = False
            self._unsynced_fds.clear()
            fds += self._retired  # closed by the table: synced, then closed, here
            self._retired = []
        for fd in fds:
            try:
                os.fsync(fd)
            except OSError:  # a failing disk
                logger.warning("persistent_memory: journal fsync failed", exc_info=True)
            finally:
                os.close(fd)

    def close(self) -> None:
        """Sync, stop the sync thread and give up the directory."""
        self._stop.set()
        if self._syncer is not None:
            self._syncer.join(timeout=5)
        with self._fds_lock:
            fds = [*self._record_fds.values(), *self._retired]
            if self._fd is not None:
                fds.append(self._fd)
            self._fd = None
            self._record_fds, self._retired, self._unsynced_fds = {}, [], set()
            lock_fd, self._lock_fd = self._lock_fd, -1  # no remember opens a file after this
        try:
            for fd in fds:
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        finally:
            if lock_fd >= 0:
                os.close(lock_fd)  # releases the flock, whatever failed before

    # Reading ------------------------------------------------------------------

    def records(self) -> Iterator[tuple[int, list[Any]]]:
        """``(seq, record)`` of every record, oldest first (see :meth:`entries`)."""
        for entry in self.entries():
            yield entry.seq, entry.record

    def entries(self) -> Iterator[Entry]:
        """Every record, oldest first; every other line is skipped (:meth:`skip`).

        A record cut short by a crash (only the last line of a segment can be) was never
        answered. Any other line that is not a record (a disk's corruption, an edit) was
        never a write: a start must not fail on it.
        """
        for path in self.segments():
            try:
                data = path.read_bytes()
            except FileNotFoundError:  # dropped meanwhile by the owning process
                continue
            for number, line in enumerate(data.split(b"\n"), 1):
                if not line:
                    continue
                where = f"{path.name}:{number}"
                try:
                    record = json.loads(line)
                except (ValueError, RecursionError):  # RecursionError: nested too deep to parse
                    self.skip(where, "torn, or not JSON")
                    continue
                error = _head_error(record)
                if error is not None:
                    self.skip(where, error)
                    continue
                yield Entry(record[0], record, where)

    def skip(self, where: str, reason: str) -> None:
        """Note that the line at ``where`` is skipped (logged once per process)."""
        if where not in self.skipped:
            self.skipped[where] = reason
            logger.warning("persistent_memory: skipping journal line %s: %s", where, reason)
