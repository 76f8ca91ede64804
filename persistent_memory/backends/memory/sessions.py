"""The memory backend's session table: a session (:class:`Session`) and what a part of the
backend (its conversations, summaries, checkpoints) may use of the table
(:class:`SessionTable`), always with the table's lock held; the parts that walk every
session or the journal (listing, maintenance, journaling) use more of it
(:class:`IndexedTable`).

Imports the standard library only (the types below are for type checkers): the backend
and its parts import this, never the other way round.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from persistent_memory.backends.base import IdempotencyRecord, SessionInfo
    from persistent_memory.backends.memory.checkpoints import Checkpoints
    from persistent_memory.backends.memory.once import Recorded
    from persistent_memory.backends.memory.tree import Tree
    from persistent_memory.journal import Journal


@dataclass
class Session:
    """One session of the memory backend: its values, history, conversations and checkpoints."""

    created_at: float
    ttl_seconds: float | None
    expires_at: float | None
    values: dict[str, str] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    #: Bytes of keys plus JSON values (the texts are ASCII: one character, one byte), of its
    #: conversations' messages and of its checkpoints' entries: what MAX_SESSION_BYTES caps.
    size: int = 0
    #: Run ids bound to this session (some may have been bound elsewhere since, or
    #: expired: pruned when the set has doubled), dropped with it.
    runs: set[str] = field(default_factory=set)
    runs_prune_at: int = 16
    #: Conversations by name (see persistent_memory.backends.memory.conversations).
    conversations: dict[str, Tree] = field(default_factory=dict)
    #: The enrich lane's question per bound run id: (conversation, message id).
    questions: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: Idle expiry (None: none) and the fixed TTL's deadline it never passes.
    idle_ttl_seconds: float | None = None
    deadline: float | None = None
    #: Graph checkpoints (see persistent_memory.backends.memory.checkpoints); None: none yet.
    checkpoints: Checkpoints | None = None

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at


class SessionTable(Protocol):
    """What the memory backend gives its parts: the lock, the sessions, the summarizers'
    marks and health, the settings they read, and the helpers that keep the table's
    indexes, caps, journal and the mirror's marks right (the backend's, called with the
    lock held)."""

    _lock: threading.RLock
    _sessions: dict[str, Session]
    _unsummarized: set[tuple[str, str]]
    _health: dict[str, Any]
    journal: Journal | None
    max_messages: int
    max_session_bytes: int | None
    summarize_after_tokens: int | None

    def _admit(self, session_id: str, now: float) -> None: ...

    def _create(
        self,
        session_id: str,
        ttl_seconds: float | None,
        now: float,
        *,
        created_at: float | None = None,
        idle_ttl_seconds: Any = "default",
    ) -> Session: ...

    def _drop(self, session_id: str) -> Session | None: ...

    def _is_live(self, session_id: str, now: float) -> bool: ...

    def _live(self, session_id: str, now: float) -> Session: ...

    def _log(self, op: str, session_id: str, now: float, *args: Any) -> None: ...

    def _mark(self, session_id: str) -> None: ...

    def _read(self, session_id: str, now: float) -> Session: ...

    def _record(
        self, session_id: str, session: Session, now: float, op: str, key: str | None, **extra: Any
    ) -> None: ...

    def _remove_value(self, session: Session, key: str) -> bool: ...

    def _touch(self, session: Session, now: float) -> None: ...

    def _within_cap(self, size: int) -> None: ...

    def _write(self, session: Session, changes: dict[str, str]) -> None: ...

    def _enrich_op(
        self,
        now: float,
        session_id: str,
        ttl_seconds: float | None,
        run_id: str | None,
        run_ttl: float | None,
        asked: list[Any] | None = None,
    ) -> Any: ...


class IndexedTable(SessionTable, Protocol):
    """What the listing, the maintenance, the journal's part and the admission rule use
    besides: the caps and the sessions per owner, the listing's indexes, the run
    bindings, the idempotency records, the mirror's dirty set and the restore flag, the
    table's writes at a given time (the journal replays through them) and its other
    parts (whose writes it replays too)."""

    CEILING: int
    SHARE_PAST_FULL: int
    max_sessions: int
    max_sessions_per_owner: int | None
    _owned: dict[str, int]
    _by_time: dict[str, list[tuple[float, str]]]
    _by_name: dict[str, list[str]]
    _runs: dict[str, tuple[str, float]]
    _records: dict[str, Recorded]
    _dirty: set[str]
    _restoring: bool
    _rotated_at: int
    # The other parts (MemoryConversations, ...), not imported here: each imports this.
    conversations: Any
    summaries: Any
    checkpoints: Any
    whole_sessions: Any

    def _info(self, session_id: str, session: Session) -> SessionInfo: ...

    def _prune(self, now: float) -> None: ...

    def _reclaim(self, now: float) -> None: ...

    def _prune_session_runs(self, session_id: str, session: Session) -> None: ...

    def _remember(self, idempotency: IdempotencyRecord, result: Any, now: float) -> None: ...

    def _keep(self, ref: str, recorded: Recorded) -> None: ...

    def summarize(self, session_id: str, max_entries: int) -> int: ...

    # The writes at a given time, which the journal's records replay.
    _create_op: Any
    _delete_op: Any
    _put_op: Any
    _increment_op: Any
    _clear_op: Any
    _summarize_op: Any
    _answer_op: Any
    _bind_op: Any
