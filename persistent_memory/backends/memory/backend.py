"""The in-process backend: the embedded default, private to each process."""

from __future__ import annotations

import copy
import json
import logging
import threading
import time
from bisect import bisect_left, insort
from json.encoder import encode_basestring_ascii
from typing import Any, TypeVar

from persistent_memory.backends.base import (
    ANSWER_COUNT,
    LAST_ANSWER,
    AnswerRecord,
    BaseBackend,
    IdempotencyRecord,
    RunBinding,
    SessionInfo,
    session_info,
)
from persistent_memory.backends.checkpoints import CheckpointBackend
from persistent_memory.backends.conversations import Answer, ConversationBackend, Enriched, SummaryBackend
from persistent_memory.backends.memory import history
from persistent_memory.backends.memory.admission import admit
from persistent_memory.backends.memory.checkpoints import MemoryCheckpoints
from persistent_memory.backends.memory.conversations import MemoryConversations, journaled, prepared
from persistent_memory.backends.memory.journaling import MemoryJournaling
from persistent_memory.backends.memory.listing import MemoryListing
from persistent_memory.backends.memory.maintenance import MemoryMaintenance
from persistent_memory.backends.memory.once import Recorded, encoded, idempotent
from persistent_memory.backends.memory.sessions import Session as _Session
from persistent_memory.backends.memory.summaries import MemorySummaries
from persistent_memory.backends.memory.tree import Tree
from persistent_memory.backends.memory.whole import MemoryWholeSessions
from persistent_memory.backends.parts import delegate
from persistent_memory.conf import (
    MemorySettings,
    memory_idle_ttl,
    mirror_mode,
    owner_session_cap,
    summarize_after_tokens,
)
from persistent_memory.exceptions import (
    IdempotencyKeyReused,
    KeyNotFound,
    NotANumber,
    QuotaExceeded,
    SessionExists,
    SessionExpired,
    SessionNotFound,
)
from persistent_memory.journal import Journal
from persistent_memory.owners import namespace_of
from persistent_memory.validation import INT64_MAX, INT64_MIN

logger = logging.getLogger(__name__)

T = TypeVar("T")


class MemoryBackend(ConversationBackend, SummaryBackend, CheckpointBackend, BaseBackend):
    """Thread-safe dict of sessions under one lock, ``max_sessions`` live shared fairly by
    the owners (see :meth:`_admit`).

    Sessions and values are the backend's own; it holds its other parts, made in
    ``__init__``, each given the backend as its session table (see
    :class:`~persistent_memory.backends.memory.sessions.SessionTable`): ``conversations``,
    ``summaries``, ``checkpoints``, ``listing``, ``maintenance`` (scans, the sweep, the
    dirty set), ``journaling`` (the journal's replay and checkpoints) and
    ``whole_sessions`` (snapshots and restores). The contract's
    methods that a part serves are delegated to it by name below; the writes' idempotency
    keys are the backend's (its records), so :func:`idempotent` wraps the delegated writes
    here.
    """

    name = "memory"
    #: A full process admits owners below their fair share until it holds this many times
    #: ``max_sessions``; then it refuses every new session (see :meth:`_admit`).
    CEILING = 2
    #: Without ``max_sessions_per_owner``, a full process admits an owner below its fair
    #: share only while it holds less than ``max_sessions`` divided by this (a tenth).
    SHARE_PAST_FULL = 10

    conversations: MemoryConversations
    summaries: MemorySummaries
    checkpoints: MemoryCheckpoints
    listing: MemoryListing
    maintenance: MemoryMaintenance
    journaling: MemoryJournaling
    whole_sessions: MemoryWholeSessions

    # Whole sessions, for the mirror, export and import, served by ``whole_sessions``.
    snapshots = delegate("whole_sessions", MemoryWholeSessions.snapshots)
    restore_session = delegate("whole_sessions", MemoryWholeSessions.restore_session)

    # Sessions listed, served by ``listing``.
    list_sessions = delegate("listing", MemoryListing.list_sessions)
    list_session_infos = delegate("listing", MemoryListing.list_session_infos)
    list_session_page = delegate("listing", MemoryListing.list_session_page)

    # Maintenance in batches and the dirty set, served by ``maintenance``.
    scan_sessions = delegate("maintenance", MemoryMaintenance.scan_sessions)
    existing = delegate("maintenance", MemoryMaintenance.existing)
    infos = delegate("maintenance", MemoryMaintenance.infos)
    summarize_many = delegate("maintenance", MemoryMaintenance.summarize_many)
    sweep = delegate("maintenance", MemoryMaintenance.sweep)
    forget_namespace = delegate("maintenance", MemoryMaintenance.forget_namespace)
    pop_dirty = delegate("maintenance", MemoryMaintenance.pop_dirty)
    dirty_count = delegate("maintenance", MemoryMaintenance.dirty_count)
    mark_dirty = delegate("maintenance", MemoryMaintenance.mark_dirty)

    # The write-ahead journal, served by ``journaling``.
    open_journal = delegate("journaling", MemoryJournaling.open_journal)
    replay = delegate("journaling", MemoryJournaling.replay)
    restoring = delegate("journaling", MemoryJournaling.restoring)
    checkpoint = delegate("journaling", MemoryJournaling.checkpoint)
    drop_segments = delegate("journaling", MemoryJournaling.drop_segments)
    journal_size = delegate("journaling", MemoryJournaling.journal_size)
    idempotency_size = delegate("journaling", MemoryJournaling.idempotency_size)
    journal_skipped = delegate("journaling", MemoryJournaling.journal_skipped)

    # ConversationBackend, served by ``conversations``.
    add_messages = idempotent(delegate("conversations", MemoryConversations.add_messages))
    get_messages = delegate("conversations", MemoryConversations.get_messages)
    get_context = delegate("conversations", MemoryConversations.get_context)
    list_conversations = delegate("conversations", MemoryConversations.list_conversations)
    set_head = idempotent(delegate("conversations", MemoryConversations.set_head))
    clear_messages = idempotent(delegate("conversations", MemoryConversations.clear_messages))
    pop_message = idempotent(delegate("conversations", MemoryConversations.pop_message))
    write_thread = delegate("conversations", MemoryConversations.write_thread)
    enrich_recording = idempotent(delegate("conversations", MemoryConversations.enrich_recording))

    # SummaryBackend, served by ``summaries``.
    pop_unsummarized = delegate("summaries", MemorySummaries.pop_unsummarized)
    mark_unsummarized = delegate("summaries", MemorySummaries.mark_unsummarized)
    unsummarized_count = delegate("summaries", MemorySummaries.unsummarized_count)
    summary_source = delegate("summaries", MemorySummaries.summary_source)
    commit_summary = delegate("summaries", MemorySummaries.commit_summary)
    summarizer_health = delegate("summaries", MemorySummaries.summarizer_health)
    set_summarizer_health = delegate("summaries", MemorySummaries.set_summarizer_health)

    # CheckpointBackend, served by ``checkpoints``.
    put_checkpoint = delegate("checkpoints", MemoryCheckpoints.put_checkpoint)
    put_checkpoint_writes = delegate("checkpoints", MemoryCheckpoints.put_checkpoint_writes)
    get_checkpoint = delegate("checkpoints", MemoryCheckpoints.get_checkpoint)
    list_checkpoints = delegate("checkpoints", MemoryCheckpoints.list_checkpoints)
    checkpoint_chain = delegate("checkpoints", MemoryCheckpoints.checkpoint_chain)
    prune_checkpoints = delegate("checkpoints", MemoryCheckpoints.prune_checkpoints)
    delete_checkpoint_runs = delegate("checkpoints", MemoryCheckpoints.delete_checkpoint_runs)
    checkpoint_entries = delegate("checkpoints", MemoryCheckpoints.checkpoint_entries)
    load_checkpoint_entries = delegate("checkpoints", MemoryCheckpoints.load_checkpoint_entries)

    def __init__(self, *, max_sessions: int, **options: Any) -> None:
        super().__init__(**options)
        self.max_sessions = max_sessions
        # Reentrant: an idempotent write holds it around the write's own critical section.
        self._lock = threading.RLock()
        self._sessions: dict[str, _Session] = {}
        # Conversations marked for a summarizer, and the summarizers' health record.
        self._unsummarized: set[tuple[str, str]] = set()
        self._health: dict[str, Any] = {}
        # Live and not yet pruned sessions per owner namespace ("": unowned), for
        # max_sessions_per_owner and for the fair share of a full process (see _admit).
        self._owned: dict[str, int] = {}
        # No session expires before this (a lower bound; 0: unknown), so that a create in
        # a full process scans for expired sessions only when one may have expired.
        self._expiry_floor = 0.0
        # Whether a restore (the mirror's rows, the journal's replay) is loading sessions:
        # they were all admitted once, so _admit admits them.
        self._restoring = False
        self._dirty: set[str] = set()
        # run_id -> (session_id, expires_at); expired ones are pruned when the dict has
        # doubled since the last pruning, so binding stays O(1) amortized.
        self._runs: dict[str, tuple[str, float]] = {}
        self._runs_prune_at = 1024
        # Idempotency records by ref, pruned the same way; the key of the write under way.
        self._records: dict[str, Recorded] = {}
        self._records_prune_at = 1024
        self._idempotency: IdempotencyRecord | None = None
        #: The write-ahead journal (see persistent_memory.journal); None: writes live in
        #: this process only until the mirror has them.
        self.journal: Journal | None = None
        self._rotated_at = -1  # journal seq after the last checkpoint
        # The listing's indexes per owner namespace ("": unowned), kept sorted:
        # (created_at, session id), and session ids (for a prefix range).
        self._by_time: dict[str, list[tuple[float, str]]] = {}
        self._by_name: dict[str, list[str]] = {}
        self.conversations = MemoryConversations(self)
        self.summaries = MemorySummaries(self, self.conversations)
        self.checkpoints = MemoryCheckpoints(self)
        self.listing = MemoryListing(self)
        self.maintenance = MemoryMaintenance(self)
        self.journaling = MemoryJournaling(self)
        self.whole_sessions = MemoryWholeSessions(self)

    @classmethod
    def from_settings(cls, conf: MemorySettings) -> MemoryBackend:
        return cls(
            max_history=conf.MAX_HISTORY,
            auto_summarize=conf.AUTO_SUMMARIZE,
            max_sessions=conf.MAX_SESSIONS,
            track_dirty=mirror_mode(conf) != "off",
            max_sessions_per_owner=owner_session_cap(conf),
            max_session_bytes=conf.MAX_SESSION_BYTES,
            max_messages=conf.MAX_MESSAGES,
            idle_ttl_seconds=memory_idle_ttl(conf),
            refresh_on_read=conf.IDLE_TTL_REFRESH_ON_READ,
            summarize_after_tokens=summarize_after_tokens(conf),
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
        self._owned[owner] -= 1
        if not self._owned[owner]:
            del self._owned[owner]
        _remove_sorted(self._by_time, owner, (session.created_at, session_id))
        _remove_sorted(self._by_name, owner, session_id)
        for run_id in session.runs:
            if self._runs.get(run_id, ("",))[0] == session_id:
                del self._runs[run_id]
        return session

    def _log(self, op: str, session_id: str, now: float, *args: Any) -> None:
        """Journal a write before it is applied: a write that then fails (a cap, a bad
        counter) fails the same way when replayed, so nothing needs undoing."""
        if self.journal is not None and self.journal.owned:
            self.journal.append(op, session_id, now, self._idempotency, *args)

    def _recorded(self, idempotency: IdempotencyRecord) -> Recorded | None:
        """The live record of ``idempotency``'s key, if any; ``IdempotencyKeyReused`` when it
        was recorded for another request."""
        recorded = self._records.get(idempotency.ref)
        if recorded is None or recorded.expires_at <= time.time():
            return None
        if recorded.fingerprint != idempotency.fingerprint:
            raise IdempotencyKeyReused("This idempotency key was used for a different request.")
        return recorded

    def _remember(self, idempotency: IdempotencyRecord, result: Any, now: float) -> None:
        """Record a write's ``result`` under its idempotency key (the one place records are made)."""
        if len(self._records) >= self._records_prune_at:
            self._records = {ref: r for ref, r in self._records.items() if r.expires_at > now}
            self._records_prune_at = max(1024, 2 * len(self._records))
        recorded = self._records[idempotency.ref] = Recorded(
            idempotency.fingerprint, copy.deepcopy(result), now + idempotency.ttl_seconds
        )
        self._keep(idempotency.ref, recorded)

    def _keep(self, ref: str, recorded: Recorded) -> None:
        """Write an idempotency record to the journal's record files, so that it outlives a
        checkpoint and a restart. The write it records is applied and journaled already:
        should this fail, the record still holds in this process, so it is logged, not raised."""
        if self.journal is None or not self.journal.owned:
            return
        try:
            self.journal.remember(ref, recorded.fingerprint, recorded.expires_at, encoded(recorded.result))
        except (OSError, TypeError):
            logger.warning("persistent_memory: could not keep an idempotency record on disk", exc_info=True)

    def _live(self, session_id: str, now: float) -> _Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise SessionNotFound(f"Session {session_id!r} not found.")
        if session.expired(now):
            self._drop(session_id)
            self._mark(session_id)
            raise SessionExpired(f"Session {session_id!r} has expired.")
        return session

    def _prune(self, now: float) -> None:
        for session_id in [sid for sid, s in self._sessions.items() if s.expired(now)]:
            self._drop(session_id)
            self._mark(session_id)
        expiries = [s.expires_at for s in self._sessions.values() if s.expires_at is not None]
        self._expiry_floor = min(expiries, default=float("inf"))

    def _reclaim(self, now: float) -> None:
        """:meth:`_prune`, but only when a session may have expired since the last one
        (a create at a cap then costs O(1) instead of a scan of every session)."""
        if now >= self._expiry_floor:
            self._prune(now)

    # The admission of a new session (the owner's cap, the fair share of a full process):
    # a rule of its own module, bound here as a method (no extra call on a write's path).
    _admit = admit

    def _create(
        self,
        session_id: str,
        ttl_seconds: float | None,
        now: float,
        *,
        created_at: float | None = None,
        idle_ttl_seconds: Any = "default",
    ) -> _Session:
        """A new session; ``idle_ttl_seconds`` defaults to the backend's (for the lanes).
        The caller has admitted it (:meth:`_admit`) before journaling the write."""
        existing = self._sessions.get(session_id)
        if existing is not None and not existing.expired(now):
            raise SessionExists(f"Session {session_id!r} already exists.")
        self._drop(session_id)
        owner = namespace_of(session_id)  # "": unowned (no per-owner cap; a fair share)
        expires_at = now + ttl_seconds if ttl_seconds else None
        created_at = now if created_at is None else created_at
        session = self._sessions[session_id] = _Session(created_at, ttl_seconds, expires_at)
        idle = self.idle_ttl_seconds if idle_ttl_seconds == "default" else idle_ttl_seconds
        if idle:
            session.idle_ttl_seconds, session.deadline = idle, expires_at
            self._touch(session, now)
        # A restore sets an expiry of its own afterwards, never before the session's creation.
        floor = session.expires_at if created_at == now else created_at
        if floor is not None:
            self._expiry_floor = min(self._expiry_floor, floor)
        self._owned[owner] = self._owned.get(owner, 0) + 1
        insort(self._by_time.setdefault(owner, []), (created_at, session_id))
        insort(self._by_name.setdefault(owner, []), session_id)
        self._mark(session_id)
        return session

    @staticmethod
    def _size_after(session: _Session, changes: dict[str, str]) -> int:
        """The session's bytes once ``changes`` (key -> JSON text) are written."""
        size, values = session.size, session.values
        for key, text in changes.items():
            old = values.get(key)
            size += len(key) + len(text) if old is None else len(text) - len(old)
        return size

    def _within_cap(self, size: int) -> None:
        """QuotaExceeded when a session would hold ``size`` bytes, over ``max_session_bytes``.
        Not while restoring: a replay takes what was admitted once, whatever the cap is now
        (a lowered cap, or checkpoints journalled before they counted)."""
        cap = self.max_session_bytes
        if cap is not None and size > cap and not self._restoring:
            raise QuotaExceeded(f"The session would hold {size} bytes, over MAX_SESSION_BYTES ({cap}).")

    def _write(self, session: _Session, changes: dict[str, str]) -> None:
        """Write values (key -> JSON text) unless the session would go over
        ``max_session_bytes`` (``QuotaExceeded``; nothing is written then)."""
        size = self._size_after(session, changes)
        self._within_cap(size)
        session.size = size
        session.values.update(changes)

    def _remove_value(self, session: _Session, key: str) -> bool:
        text = session.values.pop(key, None)
        if text is None:
            return False
        session.size -= len(key) + len(text)
        return True

    def _is_live(self, session_id: str, now: float) -> bool:
        session = self._sessions.get(session_id)
        return session is not None and not session.expired(now)

    @staticmethod
    def _touch(session: _Session, now: float) -> None:
        """Move an idle session's expiry to ``now`` plus its idle TTL (never past its deadline)."""
        if session.idle_ttl_seconds:
            at = now + session.idle_ttl_seconds
            session.expires_at = at if session.deadline is None else min(at, session.deadline)

    def _read(self, session_id: str, now: float) -> _Session:
        """A live session for a read of its data (which refreshes an idle TTL when so configured)."""
        session = self._live(session_id, now)
        if self.refresh_on_read:
            self._touch(session, now)
        return session

    def _record(
        self, session_id: str, session: _Session, now: float, op: str, key: str | None, **extra: Any
    ) -> None:
        session.history.append(history.entry(op, key, now, **extra))
        if self.auto_summarize:
            self._fold(session, self.max_history, now)
        self._touch(session, now)
        self._mark(session_id)

    @staticmethod
    def _fold(session: _Session, max_entries: int, now: float) -> int:
        folded = history.fold(session.history, max_entries, now)
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
            idle_ttl_seconds=session.idle_ttl_seconds,
            deadline=session.deadline,
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
    #
    # Each write is a public method that takes the lock and the time, and an ``_op``
    # method that does it at a given time: the journal replays records through the
    # latter, so a replayed write gives the same state as the original.

    @idempotent
    def create_session(
        self, session_id: str, ttl_seconds: float | None, *, idle_ttl_seconds: float | None = None
    ) -> SessionInfo:
        with self._lock:
            return self._create_op(time.time(), session_id, ttl_seconds, idle_ttl_seconds)

    def _create_op(
        self, now: float, session_id: str, ttl_seconds: float | None, idle_ttl_seconds: float | None = None
    ) -> SessionInfo:
        self._admit(session_id, now)  # a refused create is not journaled
        self._log("create", session_id, now, ttl_seconds, idle_ttl_seconds)
        session = self._create(session_id, ttl_seconds, now, idle_ttl_seconds=idle_ttl_seconds)
        return self._info(session_id, session)

    def resume_session(self, session_id: str) -> SessionInfo:
        with self._lock:
            return self._info(session_id, self._live(session_id, time.time()))

    session_info = resume_session

    @idempotent
    def delete_session(self, session_id: str) -> list[str]:
        with self._lock:
            return self._delete_op(time.time(), session_id)

    def _delete_op(self, now: float, session_id: str) -> list[str]:
        session = self._live(session_id, now)
        self._log("delete", session_id, now)
        self._drop(session_id)
        self._mark(session_id)
        return sorted(session.values)

    # Values -----------------------------------------------------------------

    @idempotent
    def put(self, session_id: str, key: str, value_json: str) -> None:
        with self._lock:
            self._put_op(time.time(), session_id, key, value_json)

    def _put_op(self, now: float, session_id: str, key: str, value_json: str) -> None:
        session = self._live(session_id, now)
        self._log("put", session_id, now, key, value_json)
        self._write(session, {key: value_json})
        self._record(session_id, session, now, "put", key)

    def get(self, session_id: str, key: str) -> str:
        with self._lock:
            try:
                return self._read(session_id, time.time()).values[key]
            except KeyError:
                raise KeyNotFound(f"Session {session_id!r} has no key {key!r}.") from None

    def get_all(self, session_id: str) -> str:
        with self._lock:
            return self._values_json(self._read(session_id, time.time()))

    def get_many(self, session_ids: list[str], key: str) -> dict[str, str]:
        now = time.time()
        with self._lock:
            found = {}
            for session_id in session_ids:
                session = self._sessions.get(session_id)
                if session is not None and not session.expired(now) and key in session.values:
                    found[session_id] = session.values[key]
            return found

    def list_keys(self, session_id: str) -> list[str]:
        with self._lock:
            return sorted(self._live(session_id, time.time()).values)

    @idempotent
    def increment(self, session_id: str, key: str, amount: int) -> int:
        with self._lock:
            return self._increment_op(time.time(), session_id, key, amount)

    def _increment_op(self, now: float, session_id: str, key: str, amount: int) -> int:
        session = self._live(session_id, now)
        result = self._added(session, key, amount)  # before the journal: a bad counter is no write
        self._log("increment", session_id, now, key, amount)
        self._write(session, {key: str(result)})
        self._record(session_id, session, now, "increment", key)
        return result

    @idempotent
    def clear(self, session_id: str, key: str | None) -> list[str]:
        with self._lock:
            return self._clear_op(time.time(), session_id, key)

    def _clear_op(self, now: float, session_id: str, key: str | None) -> list[str]:
        session = self._live(session_id, now)
        self._log("clear", session_id, now, key)
        if key is None:
            cleared = sorted(session.values)
            # Only the values' bytes: the session's messages and checkpoints stay.
            session.size -= sum(len(key) + len(text) for key, text in session.values.items())
            session.values.clear()
            self._record(session_id, session, now, "clear", None, cleared=cleared)
        else:
            cleared = [key] if self._remove_value(session, key) else []
            self._record(session_id, session, now, "clear", key)
        return cleared

    # History ----------------------------------------------------------------

    def get_history(self, session_id: str, limit: int) -> list[dict[str, Any]]:
        with self._lock:
            entries = self._live(session_id, time.time()).history
            return copy.deepcopy(entries[-limit:] if limit else entries)

    @idempotent
    def summarize(self, session_id: str, max_entries: int) -> int:
        with self._lock:
            return self._summarize_op(time.time(), session_id, max_entries)

    def _summarize_op(self, now: float, session_id: str, max_entries: int) -> int:
        session = self._live(session_id, now)
        self._touch(session, now)
        if len(session.history) <= max_entries:
            return 0
        self._log("summarize", session_id, now, max_entries)
        self._mark(session_id)
        return self._fold(session, max_entries, now)

    # Lanes ------------------------------------------------------------------

    @idempotent
    def enrich(self, session_id: str, ttl_seconds: float | None, run: RunBinding | None = None) -> str:
        with self._lock:
            now = time.time()
            if run is None and self._is_live(session_id, now):  # a read: nothing to journal
                return self._values_json(self._read(session_id, now))
            run_args = (run.run_id, run.ttl_seconds) if run else (None, None)
            return self._enrich_op(now, session_id, ttl_seconds, *run_args)

    def _enrich_op(
        self,
        now: float,
        session_id: str,
        ttl_seconds: float | None,
        run_id: str | None,
        run_ttl: float | None,
        asked: list[Any] | None = None,
    ) -> Any:
        """With ``asked`` (a question to record: see enrich_recording), an ``Enriched``."""
        live = self._sessions[session_id] if self._is_live(session_id, now) else None
        if asked is not None:  # checked before anything is written
            tree = (live.conversations.get(asked[0]) if live else None) or Tree()
            plan = tree.plan(None, [prepared(asked[1])])
            self.conversations._check_room(live, plan)
        if live is None:
            self._admit(session_id, now)
        self._log("enrich", session_id, now, ttl_seconds, run_id, run_ttl, *([asked] if asked else []))
        session = live or self._create(session_id, ttl_seconds, now)
        if self.refresh_on_read:
            self._touch(session, now)
        if run_id is not None and run_ttl is not None:
            self._bind_op(now, run_id, session_id, now + run_ttl)
        values = self._values_json(session)
        if asked is None:
            return values
        window = self.conversations._window(tree, *asked[2:])
        self.conversations._commit(session_id, session, asked[0], tree, plan, now)
        if run_id is not None:
            session.questions[run_id] = (asked[0], plan[0][0].id)
        return Enriched(values, window, plan[0][0].id)

    def _bind_op(
        self, now: float, run_id: str, session_id: str, until: float, question: list[str] | None = None
    ) -> None:
        session = self._sessions.get(session_id)
        if session is None:  # a replayed binding whose session is gone since
            return
        session.questions.pop(run_id, None)
        if question is not None:
            session.questions[run_id] = (question[0], question[1])
        if len(self._runs) >= self._runs_prune_at:
            self._runs = {r: bound for r, bound in self._runs.items() if bound[1] > now}
            self._runs_prune_at = max(1024, 2 * len(self._runs))
        if session.expires_at is not None:  # a binding never outlives its session
            until = min(until, session.expires_at)
        self._runs[run_id] = (session_id, until)
        session.runs.add(run_id)
        if len(session.runs) >= session.runs_prune_at:
            self._prune_session_runs(session_id, session)

    def _prune_session_runs(self, session_id: str, session: _Session) -> None:
        """Keep in ``session.runs`` (and its questions) only the run ids still bound to it."""
        session.runs = {r for r in session.runs if self._runs.get(r, ("",))[0] == session_id}
        session.questions = {r: q for r, q in session.questions.items() if r in session.runs}
        session.runs_prune_at = max(16, 2 * len(session.runs))

    @idempotent
    def record_answer(
        self,
        session_id: str | None,
        answer_json: str,
        ttl_seconds: float | None,
        run_id: str | None = None,
        message: Answer | None = None,
    ) -> AnswerRecord | None:
        with self._lock:
            now = time.time()
            answered = (
                None
                if message is None
                else [message.conversation, journaled(message.message), message.parent_id]
            )
            if session_id is None:
                bound = self._runs.get(run_id or "")
                if bound is None or bound[1] <= now:
                    return None
                session_id = bound[0]
                if not self._is_live(session_id, now):
                    # Deleted or expired since it was bound: the binding goes too, so that it
                    # never recreates the session (or reaches a new one under the same id).
                    del self._runs[run_id or ""]
                    return None
            return self._answer_op(now, session_id, answer_json, ttl_seconds, answered, run_id)

    def _answer_op(
        self,
        now: float,
        session_id: str,
        answer_json: str,
        ttl_seconds: float | None,
        answered: list[Any] | None = None,
        run_id: str | None = None,
    ) -> AnswerRecord:
        self._admit(session_id, now)
        self._log(
            "answer", session_id, now, answer_json, ttl_seconds, *([answered, run_id] if answered else [])
        )
        try:
            session, created = self._live(session_id, now), False
        except SessionNotFound:
            session, created = self._create(session_id, ttl_seconds, now), True
        try:
            count = self._added(session, ANSWER_COUNT, 1)  # first: a bad counter changes nothing
            changes = {ANSWER_COUNT: str(count), LAST_ANSWER: answer_json}
            if answered is not None:  # the values and the message fit together, or nothing is written
                tree, plan = self.conversations._answer_plan(session, answered, run_id)
                self.conversations._check_room(
                    session, plan, self._size_after(session, changes) - session.size
                )
            self._write(session, changes)
        except (QuotaExceeded, NotANumber):
            if created:  # nothing of this answer stays, not even its session
                self._drop(session_id)
            raise
        self._record(session_id, session, now, "put", LAST_ANSWER)
        self._record(session_id, session, now, "increment", ANSWER_COUNT)
        if answered is not None:
            self.conversations._commit(session_id, session, answered[0], tree, plan, now)
        return AnswerRecord(session_id, count)

    # Health -----------------------------------------------------------------

    def ping(self) -> None:
        return None

    def close(self) -> None:
        if self.journal is not None:
            self.journal.close()


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
