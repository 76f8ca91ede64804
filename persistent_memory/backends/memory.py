"""The in-process backend: the embedded default, private to each process."""

from __future__ import annotations

import copy
import json
import threading
import time
from bisect import bisect_left, insort
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii
from typing import Any

from persistent_memory import history
from persistent_memory.backends.base import (
    ANSWER_COUNT,
    LAST_ANSWER,
    AnswerRecord,
    BaseBackend,
    RunBinding,
    SessionInfo,
    SessionSnapshot,
    session_info,
)
from persistent_memory.conf import MemorySettings, mirror_mode, owner_session_cap
from persistent_memory.exceptions import (
    CapacityExceeded,
    KeyNotFound,
    NotANumber,
    QuotaExceeded,
    SessionExists,
    SessionExpired,
    SessionNotFound,
)
from persistent_memory.owners import namespace_of
from persistent_memory.validation import INT64_MAX, INT64_MIN


@dataclass
class _Session:
    created_at: float
    ttl_seconds: float | None
    expires_at: float | None
    values: dict[str, str] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    #: Bytes of keys plus JSON values (the texts are ASCII: one character, one byte).
    size: int = 0
    #: Run ids bound to this session (some may have been bound elsewhere since, or
    #: expired: pruned when the set has doubled), dropped with it.
    runs: set[str] = field(default_factory=set)
    runs_prune_at: int = 16

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at


class MemoryBackend(BaseBackend):
    """Thread-safe dict of sessions under one lock, at most ``max_sessions`` live."""

    name = "memory"

    def __init__(self, *, max_sessions: int, **options: Any) -> None:
        super().__init__(**options)
        self.max_sessions = max_sessions
        self._lock = threading.Lock()
        self._sessions: dict[str, _Session] = {}
        # Live and not yet pruned sessions per owner namespace, for max_sessions_per_owner.
        self._owned: dict[str, int] = {}
        self._dirty: set[str] = set()
        # run_id -> (session_id, expires_at); expired ones are pruned when the dict has
        # doubled since the last pruning, so binding stays O(1) amortized.
        self._runs: dict[str, tuple[str, float]] = {}
        self._runs_prune_at = 1024
        # The listing's indexes per owner namespace ("": unowned), kept sorted:
        # (created_at, session id), and session ids (for a prefix range).
        self._by_time: dict[str, list[tuple[float, str]]] = {}
        self._by_name: dict[str, list[str]] = {}

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
        """Remove a session, its place in the indexes and its run bindings."""
        session = self._sessions.pop(session_id, None)
        if session is None:
            return None
        owner = namespace_of(session_id)
        if owner:
            self._owned[owner] -= 1
            if not self._owned[owner]:
                del self._owned[owner]
        _remove_sorted(self._by_time, owner, (session.created_at, session_id))
        _remove_sorted(self._by_name, owner, session_id)
        for run_id in session.runs:
            if self._runs.get(run_id, ("",))[0] == session_id:
                del self._runs[run_id]
        return session

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

    def _create(
        self, session_id: str, ttl_seconds: float | None, *, created_at: float | None = None
    ) -> _Session:
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
        created_at = now if created_at is None else created_at
        session = self._sessions[session_id] = _Session(created_at, ttl_seconds, expires_at)
        if owner:
            self._owned[owner] = self._owned.get(owner, 0) + 1
        insort(self._by_time.setdefault(owner, []), (created_at, session_id))
        insort(self._by_name.setdefault(owner, []), session_id)
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

    def list_session_page(self, prefix: str, offset: int, limit: int) -> tuple[int, list[SessionInfo]]:
        namespace = namespace_of(prefix)
        now = time.time()
        page: list[SessionInfo] = []
        with self._lock:
            ordered = self._by_time.get(namespace, [])
            names = self._by_name.get(namespace, [])
            first = bisect_left(names, prefix)
            total = bisect_left(names, prefix + "\U0010ffff", first) - first
            if total == len(ordered):  # no search, or every id matches: a range of the time order
                position = offset
                while len(page) < limit and position < len(ordered):
                    if self._add_live(page, ordered[-1 - position][1], now):
                        position += 1
                    else:  # dropped: the next one moved up to this position
                        total -= 1
                return total, page
            if total * 8 > len(ordered):  # a wide search: filtering the time order costs less
                matches = [sid for _, sid in reversed(ordered) if sid.startswith(prefix)]
            else:  # a narrow one: sort the matches
                matches = names[first : first + total]
                matches.sort(key=lambda sid: (self._sessions[sid].created_at, sid), reverse=True)
            for session_id in matches[offset:]:
                if len(page) == limit:
                    break
                if not self._add_live(page, session_id, now):
                    total -= 1
            return total, page

    def _add_live(self, page: list[SessionInfo], session_id: str, now: float) -> bool:
        """Add a live session's info to ``page``; drop an expired one (False)."""
        session = self._sessions[session_id]
        if session.expired(now):
            self._drop(session_id)
            self._mark(session_id)
            return False
        page.append(self._info(session_id, session))
        return True

    def delete_session(self, session_id: str) -> list[str]:
        with self._lock:
            session = self._live(session_id)
            self._drop(session_id)
            self._mark(session_id)
            return sorted(session.values)

    # Values -----------------------------------------------------------------

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

    def increment(self, session_id: str, key: str, amount: int) -> int:
        with self._lock:
            session = self._live(session_id)
            result = self._added(session, key, amount)
            self._write(session, {key: str(result)})
            self._record(session_id, session, "increment", key)
            return result

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

    def summarize(self, session_id: str, max_entries: int) -> int:
        with self._lock:
            folded = self._fold(self._live(session_id), max_entries)
            if folded:
                self._mark(session_id)
            return folded

    # Lanes ------------------------------------------------------------------

    def enrich(self, session_id: str, ttl_seconds: float | None, run: RunBinding | None = None) -> str:
        with self._lock:
            session = self._live_or_create(session_id, ttl_seconds)
            if run is not None:
                self._bind(run, session_id, session)
            return self._values_json(session)

    def _bind(self, run: RunBinding, session_id: str, session: _Session) -> None:
        now = time.time()
        if len(self._runs) >= self._runs_prune_at:
            self._runs = {r: bound for r, bound in self._runs.items() if bound[1] > now}
            self._runs_prune_at = max(1024, 2 * len(self._runs))
        until = now + run.ttl_seconds
        if session.expires_at is not None:  # a binding never outlives its session
            until = min(until, session.expires_at)
        self._runs[run.run_id] = (session_id, until)
        session.runs.add(run.run_id)
        if len(session.runs) >= session.runs_prune_at:
            self._prune_session_runs(session_id, session)

    def _prune_session_runs(self, session_id: str, session: _Session) -> None:
        """Keep in ``session.runs`` only the run ids still bound to it."""
        session.runs = {r for r in session.runs if self._runs.get(r, ("",))[0] == session_id}
        session.runs_prune_at = max(16, 2 * len(session.runs))

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
            session = self._create(session_id, info["ttl_seconds"], created_at=info["created_at"])
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
                for session_id in expired:
                    self._drop(session_id)
                    self._mark(session_id)
                for run_id in stale_runs:
                    self._runs.pop(run_id, None)
                for session_id, session in self._sessions.items():
                    if session.runs and session_id.startswith(prefix):
                        self._prune_session_runs(session_id, session)
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


def _remove_sorted(indexes: dict[str, list[Any]], namespace: str, item: Any) -> None:
    """Remove ``item`` from the sorted list ``indexes[namespace]`` (and an emptied list)."""
    items = indexes.get(namespace)
    if items is None:
        return
    position = bisect_left(items, item)
    if position < len(items) and items[position] == item:
        del items[position]
    if not items:
        del indexes[namespace]
