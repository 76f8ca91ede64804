"""The in-process backend: the embedded default, private to each process."""

from __future__ import annotations

import copy
import functools
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii
from typing import Any, NamedTuple, TypeVar

from persistent_memory import history
from persistent_memory.backends.base import (
    ANSWER_COUNT,
    LAST_ANSWER,
    AnswerRecord,
    BaseBackend,
    IdempotencyRecord,
    RunBinding,
    SessionInfo,
    SessionSnapshot,
    session_info,
)
from persistent_memory.conf import MemorySettings, mirror_mode, owner_session_cap
from persistent_memory.exceptions import (
    CapacityExceeded,
    IdempotencyKeyReused,
    KeyNotFound,
    NotANumber,
    QuotaExceeded,
    SessionExists,
    SessionExpired,
    SessionNotFound,
)
from persistent_memory.owners import namespace_of
from persistent_memory.validation import INT64_MAX, INT64_MIN

T = TypeVar("T")


@dataclass
class _Session:
    created_at: float
    ttl_seconds: float | None
    expires_at: float | None
    values: dict[str, str] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    #: Bytes of keys plus JSON values (the texts are ASCII: one character, one byte).
    size: int = 0

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at


class _Recorded(NamedTuple):
    """A write's result kept for its idempotency key until ``expires_at``."""

    fingerprint: str
    result: Any
    expires_at: float


def _idempotent(write: Callable[..., T]) -> Callable[..., T]:
    """``write`` with an ``idempotency=`` option: under the lock, a repeat of the key gets the
    recorded result back and writes nothing; otherwise the write runs and its result is
    recorded in the same critical section (a write that raises records nothing)."""

    @functools.wraps(write)
    def once(
        self: MemoryBackend, *args: Any, idempotency: IdempotencyRecord | None = None, **kwargs: Any
    ) -> T:
        if idempotency is None:
            return write(self, *args, **kwargs)
        with self._lock:  # reentrant: ``write`` takes it again
            recorded = self._recorded(idempotency)
            if recorded is not None:
                return copy.deepcopy(recorded.result)
            result = write(self, *args, **kwargs)
            self._remember(idempotency, result)
            return result

    return once


class MemoryBackend(BaseBackend):
    """Thread-safe dict of sessions under one lock, at most ``max_sessions`` live."""

    name = "memory"

    def __init__(self, *, max_sessions: int, **options: Any) -> None:
        super().__init__(**options)
        self.max_sessions = max_sessions
        # Reentrant: an idempotent write holds it around the write's own critical section.
        self._lock = threading.RLock()
        self._sessions: dict[str, _Session] = {}
        # Live and not yet pruned sessions per owner namespace, for max_sessions_per_owner.
        self._owned: dict[str, int] = {}
        self._dirty: set[str] = set()
        # run_id -> (session_id, expires_at); expired ones are pruned when the dict has
        # doubled since the last pruning, so binding stays O(1) amortized.
        self._runs: dict[str, tuple[str, float]] = {}
        self._runs_prune_at = 1024
        # Idempotency records by ref, pruned the same way.
        self._records: dict[str, _Recorded] = {}
        self._records_prune_at = 1024

    @classmethod
    def from_settings(cls, conf: MemorySettings) -> MemoryBackend:
        return cls(
            max_history=conf.MAX_HISTORY,
            auto_summarize=conf.AUTO_SUMMARIZE,
            max_sessions=conf.MAX_SESSIONS,
            track_dirty=mirror_mode(conf) != "off",
            max_sessions_per_owner=owner_session_cap(conf),
            max_session_bytes=conf.MAX_SESSION_BYTES,
        )

    # Helpers, called with the lock held ---------------------------------------

    def _mark(self, session_id: str) -> None:
        if self.track_dirty:
            self._dirty.add(session_id)

    def _drop(self, session_id: str) -> _Session | None:
        session = self._sessions.pop(session_id, None)
        owner = namespace_of(session_id)
        if session is not None and owner:
            self._owned[owner] -= 1
            if not self._owned[owner]:
                del self._owned[owner]
        return session

    def _recorded(self, idempotency: IdempotencyRecord) -> _Recorded | None:
        """The live record of ``idempotency``'s key, if any; ``IdempotencyKeyReused`` when it
        was recorded for another request."""
        recorded = self._records.get(idempotency.ref)
        if recorded is None or recorded.expires_at <= time.time():
            return None
        if recorded.fingerprint != idempotency.fingerprint:
            raise IdempotencyKeyReused("This idempotency key was used for a different request.")
        return recorded

    def _remember(self, idempotency: IdempotencyRecord, result: Any) -> None:
        """Record a write's ``result`` under its idempotency key (the one place records are made)."""
        now = time.time()
        if len(self._records) >= self._records_prune_at:
            self._records = {ref: r for ref, r in self._records.items() if r.expires_at > now}
            self._records_prune_at = max(1024, 2 * len(self._records))
        self._records[idempotency.ref] = _Recorded(
            idempotency.fingerprint, copy.deepcopy(result), now + idempotency.ttl_seconds
        )

    def _live(self, session_id: str) -> _Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise SessionNotFound(f"Session {session_id!r} not found.")
        if session.expired(time.time()):
            self._drop(session_id)
            self._mark(session_id)
            raise SessionExpired(f"Session {session_id!r} has expired.")
        return session

    def _prune(self, now: float) -> None:
        for session_id in [sid for sid, s in self._sessions.items() if s.expired(now)]:
            self._drop(session_id)
            self._mark(session_id)

    def _create(self, session_id: str, ttl_seconds: float | None) -> _Session:
        now = time.time()
        existing = self._sessions.get(session_id)
        if existing is not None and not existing.expired(now):
            raise SessionExists(f"Session {session_id!r} already exists.")
        self._drop(session_id)
        owner = namespace_of(session_id)  # "": unowned, not counted
        cap = self.max_sessions_per_owner
        if owner and cap is not None and self._owned.get(owner, 0) >= cap:
            self._prune(now)
            if self._owned.get(owner, 0) >= cap:
                raise QuotaExceeded(f"This owner holds its maximum of {cap} sessions.")
        if len(self._sessions) >= self.max_sessions:
            self._prune(now)
            if len(self._sessions) >= self.max_sessions:
                raise CapacityExceeded(
                    f"The memory backend holds its maximum of {self.max_sessions} sessions."
                )
        expires_at = now + ttl_seconds if ttl_seconds else None
        session = self._sessions[session_id] = _Session(now, ttl_seconds, expires_at)
        if owner:
            self._owned[owner] = self._owned.get(owner, 0) + 1
        self._mark(session_id)
        return session

    def _write(self, session: _Session, changes: dict[str, str]) -> None:
        """Write values (key -> JSON text) unless the session would go over
        ``max_session_bytes`` (``QuotaExceeded``; nothing is written then)."""
        size, values = session.size, session.values
        for key, text in changes.items():
            old = values.get(key)
            size += len(key) + len(text) if old is None else len(text) - len(old)
        cap = self.max_session_bytes
        if cap is not None and size > cap:
            raise QuotaExceeded(f"The session would hold {size} bytes, over MAX_SESSION_BYTES ({cap}).")
        session.size = size
        values.update(changes)

    def _remove_value(self, session: _Session, key: str) -> bool:
        text = session.values.pop(key, None)
        if text is None:
            return False
        session.size -= len(key) + len(text)
        return True

    def _live_or_create(self, session_id: str, ttl_seconds: float | None) -> _Session:
        try:
            return self._live(session_id)
        except SessionNotFound:
            return self._create(session_id, ttl_seconds)

    def _record(self, session_id: str, session: _Session, op: str, key: str | None, **extra: Any) -> None:
        session.history.append(history.entry(op, key, time.time(), **extra))
        if self.auto_summarize:
            self._fold(session, self.max_history)
        self._mark(session_id)

    @staticmethod
    def _fold(session: _Session, max_entries: int) -> int:
        folded = history.fold(session.history, max_entries, time.time())
        if folded is None:
            return 0
        count = len(session.history) - len(folded) + 1
        session.history = folded
        return count

    @staticmethod
    def _info(session_id: str, session: _Session) -> SessionInfo:
        return session_info(
            session_id,
            created_at=session.created_at,
            ttl_seconds=session.ttl_seconds,
            expires_at=session.expires_at,
            key_count=len(session.values),
            history_length=len(session.history),
        )

    @staticmethod
    def _values_json(session: _Session) -> str:
        items = session.values.items()
        return "{" + ", ".join([f"{encode_basestring_ascii(key)}: {text}" for key, text in items]) + "}"

    @staticmethod
    def _added(session: _Session, key: str, amount: int) -> int:
        """The value under ``key`` plus ``amount``, computed without writing it."""
        current = session.values.get(key, "0")
        number = json.loads(current)
        # Same rule as Redis INCRBY: a 64-bit integer, or nothing changes.
        if isinstance(number, bool) or not isinstance(number, int) or not INT64_MIN <= number <= INT64_MAX:
            raise NotANumber(f"The value under {key!r} is not an integer: {current[:80]}")
        result = number + amount
        if not INT64_MIN <= result <= INT64_MAX:
            raise NotANumber(f"Incrementing {key!r} by {amount} would overflow a 64-bit integer.")
        return result

    # Sessions ---------------------------------------------------------------

    @_idempotent
    def create_session(self, session_id: str, ttl_seconds: float | None) -> SessionInfo:
        with self._lock:
            return self._info(session_id, self._create(session_id, ttl_seconds))

    def resume_session(self, session_id: str) -> SessionInfo:
        with self._lock:
            return self._info(session_id, self._live(session_id))

    session_info = resume_session

    def list_sessions(self) -> list[str]:
        with self._lock:
            self._prune(time.time())
            return sorted(self._sessions)

    def list_session_infos(self, prefix: str = "") -> list[SessionInfo]:
        with self._lock:
            self._prune(time.time())
            return [self._info(sid, s) for sid, s in self._sessions.items() if sid.startswith(prefix)]

    @_idempotent
    def delete_session(self, session_id: str) -> list[str]:
        with self._lock:
            session = self._live(session_id)
            self._drop(session_id)
            self._mark(session_id)
            return sorted(session.values)

    # Values -----------------------------------------------------------------

    @_idempotent
    def put(self, session_id: str, key: str, value_json: str) -> None:
        with self._lock:
            session = self._live(session_id)
            self._write(session, {key: value_json})
            self._record(session_id, session, "put", key)

    def get(self, session_id: str, key: str) -> str:
        with self._lock:
            try:
                return self._live(session_id).values[key]
            except KeyError:
                raise KeyNotFound(f"Session {session_id!r} has no key {key!r}.") from None

    def get_all(self, session_id: str) -> str:
        with self._lock:
            return self._values_json(self._live(session_id))

    def list_keys(self, session_id: str) -> list[str]:
        with self._lock:
            return sorted(self._live(session_id).values)

    @_idempotent
    def increment(self, session_id: str, key: str, amount: int) -> int:
        with self._lock:
            session = self._live(session_id)
            result = self._added(session, key, amount)
            self._write(session, {key: str(result)})
            self._record(session_id, session, "increment", key)
            return result

    @_idempotent
    def clear(self, session_id: str, key: str | None) -> list[str]:
        with self._lock:
            session = self._live(session_id)
            if key is None:
                cleared = sorted(session.values)
                session.values.clear()
                session.size = 0
                self._record(session_id, session, "clear", None, cleared=cleared)
            else:
                cleared = [key] if self._remove_value(session, key) else []
                self._record(session_id, session, "clear", key)
            return cleared

    # History ----------------------------------------------------------------

    def get_history(self, session_id: str, limit: int) -> list[dict[str, Any]]:
        with self._lock:
            entries = self._live(session_id).history
            return copy.deepcopy(entries[-limit:] if limit else entries)

    @_idempotent
    def summarize(self, session_id: str, max_entries: int) -> int:
        with self._lock:
            folded = self._fold(self._live(session_id), max_entries)
            if folded:
                self._mark(session_id)
            return folded

    # Lanes ------------------------------------------------------------------

    @_idempotent
    def enrich(self, session_id: str, ttl_seconds: float | None, run: RunBinding | None = None) -> str:
        with self._lock:
            values = self._values_json(self._live_or_create(session_id, ttl_seconds))
            if run is not None:
                self._bind(run, session_id)
            return values

    def _bind(self, run: RunBinding, session_id: str) -> None:
        now = time.time()
        if len(self._runs) >= self._runs_prune_at:
            self._runs = {r: bound for r, bound in self._runs.items() if bound[1] > now}
            self._runs_prune_at = max(1024, 2 * len(self._runs))
        self._runs[run.run_id] = (session_id, now + run.ttl_seconds)

    @_idempotent
    def record_answer(
        self, session_id: str | None, answer_json: str, ttl_seconds: float | None, run_id: str | None = None
    ) -> AnswerRecord | None:
        with self._lock:
            if session_id is None:
                bound = self._runs.get(run_id or "")
                if bound is None or bound[1] <= time.time():
                    return None
                session_id = bound[0]
                session = self._sessions.get(session_id)
                if session is None or session.expired(time.time()):
                    # Deleted or expired since it was bound: the binding goes too, so that it
                    # never recreates the session (or reaches a new one under the same id).
                    del self._runs[run_id or ""]
                    return None
            try:
                session, created = self._live(session_id), False
            except SessionNotFound:
                session, created = self._create(session_id, ttl_seconds), True
            count = self._added(session, ANSWER_COUNT, 1)  # first: a bad counter changes nothing
            try:
                self._write(session, {ANSWER_COUNT: str(count), LAST_ANSWER: answer_json})
            except QuotaExceeded:
                if created:  # nothing of this answer stays, not even its session
                    self._drop(session_id)
                raise
            self._record(session_id, session, "put", LAST_ANSWER)
            self._record(session_id, session, "increment", ANSWER_COUNT)
            return AnswerRecord(session_id, count)

    # Whole sessions -----------------------------------------------------------

    def snapshots(self, session_ids: list[str]) -> dict[str, SessionSnapshot | None]:
        now = time.time()
        result: dict[str, SessionSnapshot | None] = {}
        with self._lock:
            for session_id in session_ids:
                session = self._sessions.get(session_id)
                if session is None or session.expired(now):
                    result[session_id] = None
                    continue
                # Entries are never changed once appended, and snapshot readers (the
                # mirror, export) only read them: a copy of each entry is enough, and a
                # deep copy of every history was most of a mirror sync's reading time.
                result[session_id] = {
                    "info": self._info(session_id, session),
                    "values": dict(session.values),
                    "history": [dict(entry) for entry in session.history],
                }
        return result

    def restore_session(self, snapshot: SessionSnapshot, *, replace: bool) -> None:
        info = snapshot["info"]
        session_id = info["session_id"]
        with self._lock:
            existing = self._sessions.get(session_id)
            if existing is not None and not existing.expired(time.time()) and not replace:
                raise SessionExists(f"Session {session_id!r} already exists.")
            self._drop(session_id)
            session = self._create(session_id, info["ttl_seconds"])
            session.created_at = info["created_at"]
            session.expires_at = info["expires_at"]
            session.values = dict(snapshot["values"])
            session.size = sum(len(key) + len(text) for key, text in session.values.items())
            session.history = copy.deepcopy(snapshot["history"])

    def scan_sessions(self, cursor: int, count: int, prefix: str = "") -> tuple[int, list[str]]:
        # All at once: at most MAX_SESSIONS ids, and no id is skipped when sessions go
        # between batches.
        with self._lock:
            return 0, sorted(sid for sid in self._sessions if sid.startswith(prefix))

    def existing(self, session_ids: list[str]) -> set[str]:
        now = time.time()
        with self._lock:
            return {
                sid for sid in session_ids if sid in self._sessions and not self._sessions[sid].expired(now)
            }

    def infos(self, session_ids: list[str]) -> dict[str, SessionInfo]:
        now = time.time()
        with self._lock:
            return {
                sid: self._info(sid, self._sessions[sid])
                for sid in session_ids
                if sid in self._sessions and not self._sessions[sid].expired(now)
            }

    def summarize_many(self, session_ids: list[str], max_entries: int) -> dict[str, int]:
        folded: dict[str, int] = {}
        for session_id in session_ids:
            try:
                folded[session_id] = self.summarize(session_id, max_entries)
            except SessionNotFound:
                continue
        return folded

    def sweep(self, *, dry_run: bool, batch_size: int, prefix: str = "") -> dict[str, int]:
        now = time.time()
        with self._lock:
            expired = [
                sid
                for sid, session in self._sessions.items()
                if session.expired(now) and sid.startswith(prefix)
            ]
            stale_runs = [
                r
                for r, (sid, until) in self._runs.items()
                if sid.startswith(prefix) and (until <= now or sid not in self._sessions)
            ]
            if not dry_run:
                # Idempotency records are not leftovers: only expired ones go, uncounted.
                self._records = {
                    ref: r
                    for ref, r in self._records.items()
                    if r.expires_at > now or not ref.startswith(prefix)
                }
                for session_id in expired:
                    self._drop(session_id)
                    self._mark(session_id)
                for run_id in stale_runs:
                    del self._runs[run_id]
        return {"expired_sessions": len(expired), "leftover_keys": 0, "run_bindings": len(stale_runs)}

    def pop_dirty(self, count: int) -> list[str]:
        with self._lock:
            taken = [self._dirty.pop() for _ in range(min(count, len(self._dirty)))]
        return taken

    def mark_dirty(self, session_ids: list[str]) -> None:
        with self._lock:
            self._dirty.update(session_ids)

    def ping(self) -> None:
        return None
