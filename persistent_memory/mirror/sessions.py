"""Copies the store into the ORM (``persistent_memory.models``) for the admin.

Every store write marks its session dirty in the same backend step; a sync takes
dirty ids (storage ids: see :mod:`persistent_memory.owners`), reads those sessions
whole (one backend call per batch) and makes their rows equal to the store in one
transaction. A sync never blocks store writes, and
a failed one (database down) is logged and its ids marked dirty again. When the
database refuses one session's rows (a constraint, a value it cannot hold), the batch
is written again one session at a time: that session's row records why
(``sync_error``) and it stays dirty, to be retried, while the others are mirrored.

Modes (``MIRROR_MODE``): ``"immediate"`` runs a write-behind worker thread in the
process that flushes about twice a second and once more at shutdown; ``"deferred"``
syncs only when staff open the admin or ``manage.py memory_mirror`` runs; ``"off"``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, connections, transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from persistent_memory.backends.base import BaseBackend, SessionSnapshot, session_info
from persistent_memory.backends.batches import session_batches
from persistent_memory.exceptions import (
    CapacityExceeded,
    PersistentMemoryError,
    QuotaExceeded,
    SessionExists,
)
from persistent_memory.mirror.checkpoints import checkpoint_columns
from persistent_memory.mirror.rows import _datetime, _insert
from persistent_memory.owners import split_storage_id, storage_id
from persistent_memory.telemetry import instrument

if TYPE_CHECKING:
    from persistent_memory.models import MemorySession

logger = logging.getLogger(__name__)

BATCH_SIZE = 200
FLUSH_INTERVAL_SECONDS = 0.5

#: What writing one session's rows can fail on while the database is up: a constraint
#: or a value the database refuses (DatabaseError), or one its driver refuses before
#: sending it (ValueError). Such a session is retried alone; the others are written.
SESSION_WRITE_ERRORS = (DatabaseError, ValueError)
#: The longest error text a row keeps (PostgreSQL's DETAIL can quote a whole row).
ERROR_TEXT_LIMIT = 2000

# One mirror writer at a time in this process: SQLite allows a single writer, and
# the worker and admin page loads would otherwise contend for it. Reentrant: a journal
# checkpoint holds it around the syncs it waits for (see Mirror._flush).
_write_lock = threading.RLock()


@dataclass
class SyncResult:
    """What a sync did."""

    synced: int = 0
    gone: int = 0
    failed: int = 0

    def __iadd__(self, other: SyncResult) -> SyncResult:
        self.synced += other.synced
        self.gone += other.gone
        self.failed += other.failed
        return self


def _history_digests(history: list[dict[str, Any]], length: int) -> tuple[str, str | None]:
    """Digests of the whole history and of its first ``length`` entries (None: it has fewer).

    A history grows at its end until a fold replaces its start (or an import replaces
    it whole): when the first entries hash to the digest the rows were written with,
    a sync keeps those rows and writes only the entries after them. The text hashed
    is the JSON list without its brackets, so a prefix's text starts the whole one's.
    """
    hasher = hashlib.blake2b(digest_size=16)
    head = json.dumps(history[:length])[1:-1]
    hasher.update(head.encode())
    prefix = hasher.hexdigest() if length <= len(history) else None
    if length < len(history):
        tail = json.dumps(history[length:])[1:-1]
        hasher.update(((", " if head else "") + tail).encode())
    return hasher.hexdigest(), prefix


def _rows(storage_ids: Iterable[str]) -> QuerySet[MemorySession]:
    """The mirror rows of these sessions (each found by its owner and session id)."""
    from persistent_memory.models import MemorySession

    pairs = [Q(owner=owner, session_id=sid) for owner, sid in map(split_storage_id, storage_ids)]
    if not pairs:
        return MemorySession.objects.none()
    return MemorySession.objects.filter(Q(*pairs, _connector=Q.OR))


def _epoch(moment: datetime | None) -> float | None:
    return None if moment is None else moment.timestamp()


def _first_line(error: str | None) -> str | None:
    """What failed, without PostgreSQL's DETAIL (which quotes the row, different at every try)."""
    return None if error is None else error.partition("\n")[0]


def _error_text(exc: BaseException) -> str:
    """``exc`` as text any column can hold (no NUL, no lone surrogate), of bounded length."""
    text = f"{type(exc).__name__}: {exc}".strip()[:ERROR_TEXT_LIMIT]
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode()


@instrument
class Mirror:
    """The mirror of one store, given the store's backend."""

    def __init__(self, backend: BaseBackend, mode: str) -> None:
        self.backend = backend
        self.mode = mode
        self._stop = threading.Event()
        self._worker: threading.Thread | None = None
        #: A memory store whose restore failed: the worker retries it before any sync.
        self.restore_pending = False
        #: The last sync failure (of a batch or of one session) and when it happened.
        self.last_error: str | None = None
        self.last_error_at: datetime | None = None
        #: When a sync last wrote a batch whole.
        self.last_sync_at: datetime | None = None

    @property
    def enabled(self) -> bool:
        return self.mode != "off"

    # Syncing ----------------------------------------------------------------

    def sync_sessions(self, session_ids: list[str]) -> SyncResult:
        """Make the rows of these sessions equal to the store (gone ones are marked)."""
        result = SyncResult()
        for start in range(0, len(session_ids), BATCH_SIZE):
            batch = session_ids[start : start + BATCH_SIZE]
            try:
                # Read and write under one lock: in this process a later snapshot is
                # never overwritten by an earlier one (across processes, see _apply).
                with _write_lock:
                    read_at = timezone.now()
                    snapshots = self.backend.snapshots(batch)
                    try:
                        result += self._apply(snapshots, read_at)
                        self.last_sync_at = timezone.now()
                    except SESSION_WRITE_ERRORS as exc:
                        # Perhaps one session the database refuses: write them one at a time.
                        # Said once, not at every retry of the same session.
                        known = _first_line(_error_text(exc)) == _first_line(self.last_error)
                        logger.log(
                            logging.DEBUG if known else logging.WARNING,
                            "persistent_memory: mirror sync of %d sessions failed (%s); "
                            "writing them one at a time",
                            len(batch),
                            _error_text(exc),
                        )
                        result += self._apply_each(snapshots, read_at)
            except (DatabaseError, PersistentMemoryError) as exc:
                self._note_error(exc)
                logger.exception(
                    "persistent_memory: mirror sync of %d sessions failed; will retry", len(batch)
                )
                self._retry_later(batch)
                result.failed += len(batch)
            except BaseException:  # Ctrl-C, a bug: keep the marks for the next sync
                self._retry_later(batch)
                raise
        return result

    def _retry_later(self, session_ids: list[str]) -> None:
        try:
            self.backend.mark_dirty(session_ids)
        except PersistentMemoryError:
            # The backend is down too; `memory_mirror --all` reconciles everything later.
            logger.warning("persistent_memory: could not mark %d sessions for a later sync", len(session_ids))

    def sync_dirty(self, limit: int | None = None) -> SyncResult:
        """Sync sessions written since their last sync (at most ``limit``), each once."""
        result = SyncResult()
        taken = 0
        seen: set[str] = set()
        while limit is None or taken < limit:
            count = BATCH_SIZE if limit is None else min(BATCH_SIZE, limit - taken)
            with _write_lock:  # taken and synced under the lock: a checkpoint waits for both
                popped = self.backend.pop_dirty(count)
                # Synced (or failed) earlier in this pass and marked again since: the next pass's.
                ids = [sid for sid in popped if sid not in seen]
                self._retry_later([sid for sid in popped if sid in seen])
                if not ids:
                    break
                seen.update(ids)
                batch = self.sync_sessions(ids)
            taken += len(ids)
            result += batch
            if batch.failed and not (batch.synced or batch.gone):
                break  # the database is failing: leave the rest for the next sync
        return result

    def catch_up(self, owner: str | None = None, *, limit: int | None = None) -> None:
        """Before the mirror's messages are searched: sync what the store marked dirty, and
        (given ``owner``) the owner's sessions whose rows say they expired, at most ``limit``
        of each. A session kept alive by reads (IDLE_TTL_REFRESH_ON_READ) is not marked
        dirty, and its row keeps its last write's expiry."""
        from persistent_memory.models import MemorySession

        if not self.enabled:
            return
        self.sync_dirty(limit=limit)
        if owner is None:
            return
        lapsed = MemorySession.objects.filter(
            owner=owner, state=MemorySession.State.LIVE, expires_at__lte=timezone.now()
        ).values_list("session_id", flat=True)[:limit]
        if lapsed:  # each once: the sync marks a gone one expired, a live one's expiry moves
            self.sync_sessions([storage_id(owner, session_id) for session_id in lapsed])

    def sync_all(self, *, owner: str | None = None) -> SyncResult:
        """Sync every live session (of ``owner``, when given), and mark mirrored sessions
        the store no longer has.

        It takes the marks of the sessions it syncs, so the next :meth:`sync_dirty` does
        not redo them; a write made meanwhile marks its session again.
        """
        from persistent_memory.models import MemorySession

        # Held from taking the marks to writing the rows: a checkpoint must not find the
        # sessions unmarked before their rows are written (it would let the journal go).
        with _write_lock:
            marked = self._drain_marks()
            if owner is not None:  # other owners' marks go back for a later sync
                self._retry_later([sid for sid in marked if split_storage_id(sid)[0] != owner])
                marked = [sid for sid in marked if split_storage_id(sid)[0] == owner]
            try:
                live = list(
                    dict.fromkeys(
                        sid for batch in session_batches(self.backend, owner=owner) for sid in batch
                    )
                )
                rows = MemorySession.objects.filter(state=MemorySession.State.LIVE)
                if owner is not None:
                    rows = rows.filter(owner=owner)
                mirrored = {
                    storage_id(row_owner, sid) for row_owner, sid in rows.values_list("owner", "session_id")
                }
                # Marked sessions neither live nor mirrored (deleted since) are synced too,
                # so their marks are not simply dropped.
                ids = dict.fromkeys([*live, *sorted(mirrored - set(live)), *marked])
                return self.sync_sessions(list(ids))
            except BaseException:
                # sync_sessions marks again a batch that failed, not those it never reached.
                self._retry_later(marked)
                raise

    def _apply(self, snapshots: dict[str, SessionSnapshot | None], read_at: datetime) -> SyncResult:
        """Write snapshots read at ``read_at``. ``synced_at`` says how current a row is: a
        row another process synced from a later read is left alone."""
        from persistent_memory.mirror.checkpoints import write_checkpoints
        from persistent_memory.mirror.conversations import write_conversations
        from persistent_memory.models import HistoryEntry, MemorySession, MemoryValue

        with transaction.atomic():
            # Every existing row locked first: a sync in another process waits here and
            # then reads what that one committed (on PostgreSQL; SQLite has one writer).
            fetched = (
                _rows(snapshots)
                .select_for_update()
                .values_list(
                    "owner",
                    "session_id",
                    "synced_at",
                    "history_length",
                    "history_digest",
                    "checkpoint_epoch",
                    "checkpoint_seq",
                )
            )
            rows, checkpoints = {}, {}
            for owner, sid, synced_at, length, digest, epoch, seq in fetched:
                rows[storage_id(owner, sid)] = (synced_at, length, digest)
                checkpoints[storage_id(owner, sid)] = (epoch, seq)
            newer = {sid for sid, (synced_at, _, _) in rows.items() if synced_at > read_at}
            live = {sid: snap for sid, snap in snapshots.items() if snap is not None and sid not in newer}
            gone = [sid for sid, snap in snapshots.items() if snap is None and sid not in newer]
            # A batch is read in one step: any live snapshot's journal position is the batch's.
            seq = max((snap.get("journal_seq", 0) for snap in live.values()), default=None)
            marked = self._mark_gone(gone, read_at, seq)
            kept: dict[str, int] = {}
            digests: dict[str, str] = {}
            for sid, snap in live.items():
                _, length, digest = rows.get(sid, (None, 0, ""))
                digests[sid], prefix = _history_digests(snap["history"], length)
                if length and prefix == digest:
                    kept[sid] = length
            MemorySession.objects.bulk_create(
                [self._session_row(snap, read_at, digests[sid]) for sid, snap in live.items()],
                update_conflicts=True,
                unique_fields=["owner", "session_id"],
                update_fields=MemorySession.SYNCED_FIELDS,
            )
            pks = {
                storage_id(owner, sid): pk
                for owner, sid, pk in _rows(live).values_list("owner", "session_id", "pk")
            }
            MemoryValue.objects.filter(session_id__in=pks.values()).delete()
            HistoryEntry.objects.filter(session_id__in=[pks[sid] for sid in live if sid not in kept]).delete()
            _insert(
                MemoryValue,
                ("session", "key", "value"),
                (
                    (pks[sid], key, text)  # the store's JSON text, as it is
                    for sid, snap in live.items()
                    for key, text in snap["values"].items()
                ),
            )
            _insert(
                HistoryEntry,
                ("session", "position", "op", "key", "timestamp", "details"),
                (
                    self._history_row(pks[sid], position, item, read_at)
                    for sid, snap in live.items()
                    for position, item in enumerate(snap["history"])
                    if position >= kept.get(sid, 0)
                ),
            )
            write_conversations(pks, live, read_at)
            write_checkpoints(pks, live, checkpoints)
        return SyncResult(synced=len(live), gone=marked)

    def _apply_each(self, snapshots: dict[str, SessionSnapshot | None], read_at: datetime) -> SyncResult:
        """:meth:`_apply` one session at a time. A session the database refuses records why on
        its row and is marked dirty again; should even that fail, the database itself is
        failing and the error is raised (the caller retries the whole batch)."""
        result, failed = SyncResult(), []
        for sid, snapshot in snapshots.items():
            try:
                result += self._apply({sid: snapshot}, read_at)
            except SESSION_WRITE_ERRORS as exc:
                self._record_failure(sid, snapshot, read_at, exc)
                failed.append(sid)
        self._retry_later(failed)
        result.failed += len(failed)
        return result

    def _record_failure(
        self, sid: str, snapshot: SessionSnapshot | None, read_at: datetime, exc: BaseException
    ) -> None:
        """Say on the session's row why it could not be written (a row is created for a
        session never mirrored, with its info and no values or history)."""
        error, now = _error_text(exc), timezone.now()
        with transaction.atomic():
            rows = _rows([sid])
            previous = rows.values_list("sync_error", flat=True).first()
            if previous is not None:
                rows.update(sync_error=error, sync_failed_at=now)
            elif snapshot is not None:
                # An empty digest: the next sync rewrites the whole history.
                row = self._session_row(snapshot, read_at, "")
                row.sync_error, row.sync_failed_at = error, now
                row.journal_seq = 0  # it holds none of the writes: a restart replays them all
                row.save(force_insert=True)
        self._note_error(exc, now)
        # Once per new error, not at every retry (twice a second in immediate mode).
        level = logging.DEBUG if _first_line(previous) == _first_line(error) else logging.ERROR
        owner, session_id = split_storage_id(sid)
        where = f"{session_id} (owner {owner!r})" if owner else session_id
        logger.log(
            level, "persistent_memory: mirror could not write session %s: %s; will retry", where, error
        )

    def _note_error(self, exc: BaseException, at: datetime | None = None) -> None:
        self.last_error, self.last_error_at = _error_text(exc), at or timezone.now()

    @staticmethod
    def _mark_gone(session_ids: list[str], now: datetime, journal_seq: int | None) -> int:
        from persistent_memory.models import MemorySession

        rows = _rows(session_ids).filter(state=MemorySession.State.LIVE)
        # Without a position, the row keeps its older one: replaying from there to a
        # session that ends gone still ends gone.
        fields = {"gone_at": now, "synced_at": now, "sync_error": "", "sync_failed_at": None}
        if journal_seq is not None:
            fields["journal_seq"] = journal_seq
        expired = rows.filter(expires_at__lte=now).update(state=MemorySession.State.EXPIRED, **fields)
        deleted = rows.update(state=MemorySession.State.DELETED, **fields)
        return expired + deleted

    @staticmethod
    def _session_row(snapshot: SessionSnapshot, now: datetime, history_digest: str) -> MemorySession:
        from persistent_memory.models import MemorySession

        info = snapshot["info"]
        created_at = _datetime(info["created_at"], now)
        newest = snapshot["history"][-1].get("timestamp") if snapshot["history"] else None
        owner, session_id = split_storage_id(info["session_id"])
        epoch, seq = checkpoint_columns(snapshot)
        return MemorySession(
            owner=owner,
            session_id=session_id,
            state=MemorySession.State.LIVE,
            created_at=created_at,
            expires_at=None if info["expires_at"] is None else _datetime(info["expires_at"], now),
            ttl_seconds=info["ttl_seconds"],
            idle_ttl_seconds=info.get("idle_ttl_seconds"),
            key_count=info["key_count"],
            history_length=info["history_length"],
            last_activity=_datetime(newest, created_at) if newest is not None else created_at,
            synced_at=now,
            gone_at=None,
            history_digest=history_digest,
            journal_seq=snapshot.get("journal_seq", 0),
            checkpoint_epoch=epoch,
            checkpoint_seq=seq,
        )

    @staticmethod
    def _history_row(session_pk: int, position: int, item: dict[str, Any], now: datetime) -> tuple[Any, ...]:
        """The column values of one history entry, in the order :meth:`_apply` inserts them."""
        key = item.get("key")
        op = str(item.get("op", "unknown"))[:32]
        details = {k: v for k, v in item.items() if k not in ("op", "key", "timestamp")}
        timestamp = _datetime(item.get("timestamp"), now)
        return session_pk, position, op, key if isinstance(key, str) else "", timestamp, details

    # Restoring the embedded default after a restart ---------------------------

    @staticmethod
    def _history_item(entry: Any) -> dict[str, Any]:
        """A history row back in the store's shape (summaries have no key field)."""
        head = {"op": entry.op} if entry.op == "summary" else {"op": entry.op, "key": entry.key or None}
        return {**head, **entry.details, "timestamp": entry.timestamp.timestamp()}

    def restore(self) -> int:
        """Load the mirror's live sessions into an empty memory store; return how many."""
        from persistent_memory.mirror.conversations import with_conversations
        from persistent_memory.models import MemorySession

        now = timezone.now()
        sessions = with_conversations(
            MemorySession.objects.filter(state=MemorySession.State.LIVE)
            .exclude(expires_at__lte=now)
            # A row made only to say why a session could not be mirrored holds none of it.
            .exclude(Q(history_digest="") & ~Q(sync_error=""))
            .order_by("-last_activity")  # the most recently used first
            .prefetch_related("values", "history", "checkpoint_entries")
        )
        # Marks of writes made before (a retried restore) are kept; marks the restore
        # itself makes are dropped: what it loads is what the mirror holds.
        earlier = self._drain_marks()
        restored = 0
        try:
            with self.backend.restoring():
                restored = self._load(sessions)
            self._drain_marks()
            # Then the writes the mirror had not caught up with (their marks stay).
            mirrored = {
                storage_id(owner, sid): seq
                for owner, sid, seq in MemorySession.objects.values_list("owner", "session_id", "journal_seq")
            }
            replayed = self.backend.replay(mirrored)
            if replayed:
                logger.info("persistent_memory: replayed the journal's writes to %d sessions", len(replayed))
        finally:
            self.backend.mark_dirty(earlier)
        return restored

    def _load(self, sessions: QuerySet[MemorySession]) -> int:
        """Restore these rows into the backend, all of them: each was admitted once, and the
        caps apply to new sessions (the memory backend admits every session it restores,
        even over a MAX_SESSIONS lowered since)."""
        restored = 0
        for row in sessions.iterator(chunk_size=500):
            try:
                self.backend.restore_session(self._snapshot_of(row), replace=False)
            except SessionExists:
                continue
            except (QuotaExceeded, CapacityExceeded) as exc:
                # A backend with a rule of its own for restores: only this session is left
                # out (a rule about one owner or the total says nothing of the next row).
                logger.warning("persistent_memory: %s; session %s stays in the mirror only", exc, row)
                continue
            restored += 1
        return restored

    def _snapshot_of(self, row: MemorySession) -> SessionSnapshot:
        from persistent_memory.mirror.checkpoints import snapshot_checkpoints
        from persistent_memory.mirror.conversations import snapshot_conversations

        history = [self._history_item(e) for e in sorted(row.history.all(), key=lambda e: e.position)]
        info = session_info(
            row.storage_id,
            created_at=row.created_at.timestamp(),
            ttl_seconds=row.ttl_seconds,
            expires_at=_epoch(row.expires_at),
            key_count=row.key_count,
            history_length=len(history),
            idle_ttl_seconds=row.idle_ttl_seconds,
            deadline=None if row.ttl_seconds is None else row.created_at.timestamp() + row.ttl_seconds,
        )
        return {
            "info": info,
            "values": {v.key: v.value for v in row.values.all()},  # the store's JSON text
            "history": history,
            "conversations": snapshot_conversations(row),
            **snapshot_checkpoints(row),
        }

    def _drain_marks(self) -> list[str]:
        taken: list[str] = []
        while batch := self.backend.pop_dirty(BATCH_SIZE):
            taken.extend(batch)
        return taken

    def restore_safely(self) -> bool:
        """:meth:`restore`, logging a failure and leaving it pending for the worker to retry."""
        try:
            restored = self.restore()
        except Exception:  # no table before `migrate`, the database down...
            if not self.restore_pending:
                logger.warning(
                    "persistent_memory: could not restore sessions from the mirror; will retry", exc_info=True
                )
            self.restore_pending = True
            return False
        self.restore_pending = False
        if restored:
            logger.info("persistent_memory: restored %d sessions from the mirror", restored)
        return True

    # The write-behind worker ("immediate") ------------------------------------

    def start(self) -> None:
        """Start the worker thread (idempotent)."""
        if self._worker is None:
            self._stop.clear()
            self._worker = threading.Thread(target=self._run, name="persistent-memory-mirror", daemon=True)
            self._worker.start()

    def stop(self) -> None:
        """Stop the worker after a last flush."""
        worker, self._worker = self._worker, None
        if worker is not None:
            self._stop.set()
            worker.join(timeout=30)

    def _run(self) -> None:
        try:
            while not self._stop.wait(FLUSH_INTERVAL_SECONDS):
                self._flush()
            self._flush()
        finally:
            connections.close_all()  # this thread's connections

    def _flush(self) -> None:
        # Until the restore has worked, writing this process's sessions into the mirror
        # could replace rows that were never loaded.
        if self.restore_pending and not self.restore_safely():
            return
        try:
            self.checkpoint()
            self.sync_dirty()
        except Exception:  # the worker must survive anything and try again
            logger.exception("persistent_memory: mirror flush failed")

    def checkpoint(self) -> bool:
        """Mirror every session written before now, then let the backend's journal forget
        what it kept for them; whether it could (False: a sync failed, the journal keeps all)."""
        backend = self.backend
        with _write_lock:  # no sync of ids taken before the checkpoint is still running
            point = backend.checkpoint()
            if point is None:
                return True
            if self.sync_sessions(point.session_ids).failed:
                return False
            backend.drop_segments(point.segments)
            return True
