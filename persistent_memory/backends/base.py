"""The contract every storage backend implements.

Backends receive arguments the store has already validated, and values as JSON text
(the store encodes and decodes), so the same bytes live in memory and in Redis. Each
method is one atomic step: a write appends its history entry, aligns the TTL and
summarizes in the same step, and on Redis costs one round trip.

Backends know nothing of owners: a ``session_id`` here is the store's *storage id*
(see :mod:`persistent_memory.owners`), and a run id is a run reference that already
holds its owner. They only read the owner part of an id to keep each owner's count
of sessions for ``max_sessions_per_owner``.

Every write takes ``idempotency=`` (an :class:`IdempotencyRecord`, or None): the backend
checks it and records the write's result in the same atomic step as the write, and
answers a repeat with the recorded result instead of writing again (see
:mod:`persistent_memory.idempotency`). The store passes it only when it has one.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from contextlib import AbstractContextManager, nullcontext
from typing import Any, NamedTuple, NotRequired, TypedDict

from persistent_memory.conf import MemorySettings
from persistent_memory.owners import namespace_of

#: Keys the answers lane writes (the node's names).
LAST_ANSWER = "last_answer"
ANSWER_COUNT = "answer_count"


class SessionInfo(TypedDict):
    """What ``create_session``, ``resume_session`` and ``session_info`` return."""

    session_id: str
    created_at: float
    expires_at: float | None
    ttl_seconds: float | None
    key_count: int
    history_length: int
    #: Idle expiry (None: none): each write (and with IDLE_TTL_REFRESH_ON_READ each read)
    #: moves ``expires_at`` to now plus this, never past the fixed TTL's deadline.
    idle_ttl_seconds: float | None
    #: What ``expires_at`` is from: "ttl" (the fixed TTL), "idle", or None (never expires).
    expires_by: str | None
    #: Added by the store (backends report storage ids; see persistent_memory.owners).
    owner: NotRequired[str]


def _whole(seconds: float | None) -> float | int | None:
    """A whole number of seconds as an int, so that every backend answers 604800 (Redis
    keeps milliseconds as integers), not 604800.0 on one of them."""
    return int(seconds) if isinstance(seconds, float) and seconds.is_integer() else seconds


def session_info(
    session_id: str,
    *,
    created_at: float,
    ttl_seconds: float | None,
    expires_at: float | None,
    key_count: int,
    history_length: int,
    idle_ttl_seconds: float | None = None,
    deadline: float | None = None,
) -> SessionInfo:
    """Build a :class:`SessionInfo` (``deadline``: when the fixed TTL ends, for ``expires_by``)."""
    if expires_at is None:
        expires_by = None
    elif idle_ttl_seconds is not None and (deadline is None or expires_at < deadline - 0.001):
        expires_by = "idle"
    else:
        expires_by = "ttl"
    return {
        "session_id": session_id,
        "created_at": created_at,
        "expires_at": expires_at,
        "ttl_seconds": _whole(ttl_seconds),
        "key_count": key_count,
        "history_length": history_length,
        "idle_ttl_seconds": _whole(idle_ttl_seconds),
        "expires_by": expires_by,
    }


def remaining_seconds(info: SessionInfo, now: float | None = None) -> float | None:
    """Seconds until the session expires (None: never; 0: already expired)."""
    if info["expires_at"] is None:
        return None
    return max(0.0, info["expires_at"] - (time.time() if now is None else now))


class SessionSnapshot(TypedDict):
    """A whole session: what the mirror copies and export writes (values as JSON text)."""

    info: SessionInfo
    values: dict[str, str]
    history: list[dict[str, Any]]
    #: Conversations by name (ConversationSnapshot, see backends.conversations); none: empty.
    conversations: NotRequired[dict[str, Any]]
    #: The backend's journal position when it was read (memory backend with a journal).
    journal_seq: NotRequired[int]
    #: Checkpoint entries (see backends.checkpoints); none: no checkpoints.
    checkpoints: NotRequired[dict[str, str]]
    #: The memory backend's change counters of those entries, for its mirror.
    checkpoint_state: NotRequired[dict[str, Any]]


class RunBinding(NamedTuple):
    """Remember for ``ttl_seconds`` that pipeline run ``run_id`` is on the enriched session.

    ``run_id`` is the run's reference from :func:`persistent_memory.owners.run_ref`."""

    run_id: str
    ttl_seconds: float


class Checkpoint(NamedTuple):
    """A journal position: the segments before it, and the sessions written in them."""

    segments: list[Any]
    session_ids: list[str]


class IdempotencyRecord(NamedTuple):
    """Record a write's result under ``ref`` for ``ttl_seconds``; a repeat with the same
    ``fingerprint`` gets that result back, one with another raises ``IdempotencyKeyReused``.

    ``ref`` is from :func:`persistent_memory.owners.idempotency_ref` (it holds the owner)."""

    ref: str
    fingerprint: str
    ttl_seconds: float


class AnswerRecord(NamedTuple):
    """Where the answers lane stored an answer, and the session's new ``answer_count``."""

    session_id: str
    answer_count: int


class BaseBackend(ABC):
    """Storage for sessions, their JSON values and their histories."""

    #: Short name shown by health checks and the admin.
    name = "base"

    def __init__(
        self,
        *,
        max_history: int,
        auto_summarize: bool,
        track_dirty: bool = False,
        max_sessions_per_owner: int | None = None,
        max_session_bytes: int | None = None,
        max_messages: int = 1000,
        idle_ttl_seconds: float | None = None,
        refresh_on_read: bool = False,
        summarize_after_tokens: int | None = None,
    ) -> None:
        self.max_history = max_history
        self.auto_summarize = auto_summarize
        #: Whether writes mark their session for the ORM mirror (MIRROR_MODE is not "off").
        self.track_dirty = track_dirty
        #: Live sessions one owner may hold (unowned sessions are not counted); None: no cap.
        self.max_sessions_per_owner = max_sessions_per_owner
        #: Bytes of keys plus JSON values one session may hold; None: no cap. A write
        #: that would go over raises ``CapacityExceeded`` and writes nothing.
        self.max_session_bytes = max_session_bytes
        #: Messages one conversation keeps (MAX_MESSAGES): the oldest of the current thread go.
        self.max_messages = max_messages
        #: The idle TTL of sessions the lanes and appends create (None: none).
        self.idle_ttl_seconds = idle_ttl_seconds
        #: Whether reads of a session's data refresh its idle expiry (IDLE_TTL_REFRESH_ON_READ).
        self.refresh_on_read = refresh_on_read
        #: Pending tokens that mark a conversation for a summarizer (None: summaries are off).
        self.summarize_after_tokens = summarize_after_tokens

    @classmethod
    @abstractmethod
    def from_settings(cls, conf: MemorySettings) -> BaseBackend:
        """Build the backend from ``PERSISTENT_MEMORY`` settings."""

    # Sessions ---------------------------------------------------------------

    @abstractmethod
    def create_session(
        self,
        session_id: str,
        ttl_seconds: float | None,
        *,
        idle_ttl_seconds: float | None = None,
        idempotency: IdempotencyRecord | None = None,
    ) -> SessionInfo:
        """Create a session (expiring ``ttl_seconds`` after now, or ``idle_ttl_seconds`` after
        its last write, whichever comes first); ``SessionExists`` if it is live."""

    @abstractmethod
    def resume_session(self, session_id: str) -> SessionInfo:
        """Return a live session's info; ``SessionNotFound``/``SessionExpired`` otherwise."""

    @abstractmethod
    def session_info(self, session_id: str) -> SessionInfo:
        """Same as :meth:`resume_session`, for read-only callers."""

    @abstractmethod
    def list_sessions(self) -> list[str]:
        """Sorted ids of live sessions (expired ones are pruned)."""

    @abstractmethod
    def list_session_infos(self, prefix: str = "") -> list[SessionInfo]:
        """Info of every live session whose id starts with ``prefix``, in one step.

        ``""`` lists every owner's sessions; a prefix starting with an owner's namespace
        (``~o:{owner}~``) lists only that owner's; any other prefix only unowned ones.
        """

    def list_session_page(
        self, prefix: str, offset: int, limit: int, *, after: tuple[float, str] | None = None
    ) -> tuple[int, list[SessionInfo]]:
        """How many live sessions of ``prefix``'s namespace have an id starting with
        ``prefix``, and the ``limit`` of them from ``offset``, newest first (equal
        creation times: the greater id first).

        ``after`` (a creation time and a session id: the last session of the page
        before) starts the page at the first session that comes after that position in
        this order, whether or not that session is still there; ``offset`` then counts
        from it. A backend reads about ``limit`` ids from ``after`` (per bucket of its
        listing), however deep the page.

        Unlike :meth:`list_session_infos`, ``""`` (or any prefix outside an owner's
        namespace) selects the unowned namespace alone. Ids of sessions gone since they
        were indexed may be counted until a page or the sweep meets them. This default
        lists every session; backends answer from an ordered index instead.
        """
        namespace = namespace_of(prefix)
        infos = [
            info
            for info in self.list_session_infos(prefix)
            if namespace_of(info["session_id"]) == namespace and info["session_id"].startswith(prefix)
        ]
        later = [info for info in infos if after is None or (info["created_at"], info["session_id"]) < after]
        later.sort(key=lambda info: (info["created_at"], info["session_id"]), reverse=True)
        return len(infos), later[offset : offset + limit]

    @abstractmethod
    def delete_session(self, session_id: str, *, idempotency: IdempotencyRecord | None = None) -> list[str]:
        """Delete a session with everything in it (its run bindings too); return its keys, sorted."""

    # Values -----------------------------------------------------------------

    @abstractmethod
    def put(
        self, session_id: str, key: str, value_json: str, *, idempotency: IdempotencyRecord | None = None
    ) -> None:
        """Store JSON text under ``key``."""

    @abstractmethod
    def get(self, session_id: str, key: str) -> str:
        """The JSON text under ``key``; ``KeyNotFound`` when absent."""

    @abstractmethod
    def get_all(self, session_id: str) -> str:
        """Every key and its value as the text of one JSON object (keys in any order).

        One object, not a dict of texts: the store decodes it in one call, which is
        most of what reading a session costs."""

    @abstractmethod
    def get_many(self, session_ids: list[str], key: str) -> dict[str, str]:
        """The value (JSON text) under ``key`` of each live session that has one (one round
        trip per primary on Redis)."""

    @abstractmethod
    def list_keys(self, session_id: str) -> list[str]:
        """The session's keys, sorted."""

    @abstractmethod
    def increment(
        self, session_id: str, key: str, amount: int, *, idempotency: IdempotencyRecord | None = None
    ) -> int:
        """Add ``amount`` to an integer (a missing key counts as 0); ``NotANumber`` otherwise."""

    @abstractmethod
    def clear(
        self, session_id: str, key: str | None, *, idempotency: IdempotencyRecord | None = None
    ) -> list[str]:
        """Remove one key (or all with None); return the keys removed, sorted."""

    # History ----------------------------------------------------------------

    @abstractmethod
    def get_history(self, session_id: str, limit: int) -> list[dict[str, Any]]:
        """The newest ``limit`` entries (all for 0), oldest first."""

    @abstractmethod
    def summarize(
        self, session_id: str, max_entries: int, *, idempotency: IdempotencyRecord | None = None
    ) -> int:
        """Apply the summarization rule now; return how many entries it folded (0: none)."""

    # The pipeline lanes, each one atomic step -------------------------------

    @abstractmethod
    def enrich(
        self,
        session_id: str,
        ttl_seconds: float | None,
        run: RunBinding | None = None,
        *,
        idempotency: IdempotencyRecord | None = None,
    ) -> str:
        """Resume or create the session (binding ``run`` to it), then return :meth:`get_all`'s text."""

    @abstractmethod
    def record_answer(
        self,
        session_id: str | None,
        answer_json: str,
        ttl_seconds: float | None,
        run_id: str | None = None,
        message: Any = None,
        *,
        idempotency: IdempotencyRecord | None = None,
    ) -> AnswerRecord | None:
        """Resume or create, put ``last_answer``, increment ``answer_count``, and with
        ``message`` (an :class:`~persistent_memory.backends.conversations.Answer`) record
        it in the same step.

        With ``session_id=None`` the session is the one ``run_id`` is bound to; None
        when there is no such binding (nothing is written then). With both, ``run_id``
        only tells the answer's question.
        """

    # Whole sessions, for the mirror, export and import -------------------------

    @abstractmethod
    def snapshots(
        self, session_ids: list[str], *, checkpoints: bool = False
    ) -> dict[str, SessionSnapshot | None]:
        """Each session whole (None when it is not live), without side effects; with its
        checkpoint entries when ``checkpoints`` (a backend whose mirror needs them always
        gives them)."""

    @abstractmethod
    def restore_session(self, snapshot: SessionSnapshot, *, replace: bool) -> None:
        """Write a whole session (values, history, remaining TTL); ``SessionExists`` unless ``replace``."""

    # Maintenance in batches (bounded memory at any number of sessions) --------

    @abstractmethod
    def scan_sessions(self, cursor: int, count: int, prefix: str = "") -> tuple[int, list[str]]:
        """About ``count`` session ids from ``cursor`` (start at 0), and the next cursor (0: done).

        ``prefix`` selects as in :meth:`list_session_infos`. Ids may include expired
        sessions not yet swept; an id may come twice.
        """

    def forget_namespace(self, namespace: str) -> int:
        """Delete the records of an owner namespace (``~o:{owner}~``) that are no session's:
        idempotency records and run bindings; how many. Its sessions are deleted first, one
        by one, by the caller (see :mod:`persistent_memory.operations.forget`)."""
        raise NotImplementedError(f"{type(self).__name__} cannot forget an owner's records.")

    @abstractmethod
    def existing(self, session_ids: list[str]) -> set[str]:
        """Which of these sessions are live."""

    @abstractmethod
    def infos(self, session_ids: list[str]) -> dict[str, SessionInfo]:
        """The info of each of these sessions that is live (one step for the batch)."""

    @abstractmethod
    def summarize_many(self, session_ids: list[str], max_entries: int) -> dict[str, int]:
        """:meth:`summarize` each live session; how many entries each folded."""

    @abstractmethod
    def sweep(self, *, dry_run: bool, batch_size: int, prefix: str = "") -> dict[str, int]:
        """Remove what expired (sessions, leftover keys, run bindings); the counts by kind.

        A non-empty ``prefix`` (an owner's namespace) limits the sweep to that owner."""

    @abstractmethod
    def pop_dirty(self, count: int) -> list[str]:
        """Take up to ``count`` ids of sessions written since they were last taken."""

    @abstractmethod
    def mark_dirty(self, session_ids: list[str]) -> None:
        """Put ids back (a mirror sync that failed retries them next time)."""

    @abstractmethod
    def dirty_count(self) -> int:
        """How many sessions wait for the mirror."""

    # Health -----------------------------------------------------------------

    @abstractmethod
    def ping(self) -> None:
        """Return if the backend answers; raise ``BackendUnavailable`` otherwise."""

    # The write-ahead journal (the memory backend's; see persistent_memory.journal) ----

    def replay(self, mirrored: dict[str, int]) -> list[str]:
        """After a restore, apply journaled writes the mirror lacks; return their sessions."""
        return []

    def restoring(self) -> AbstractContextManager[None]:
        """Around a restore from the mirror: what it writes needs no journal."""
        return nullcontext()

    def checkpoint(self) -> Checkpoint | None:
        """Start a new journal segment and take every dirty id (None: no journal, or nothing
        written since the last checkpoint). Once those sessions are mirrored, every write
        in the older segments is: the mirror then hands them to :meth:`drop_segments`."""
        return None

    def drop_segments(self, segments: list[Any]) -> None:  # noqa: B027 - optional hook
        """Forget journal segments the mirror has caught up with."""

    def journal_size(self) -> int | None:
        """Bytes of journal kept for the mirror to catch up with (None: no journal)."""
        return None

    def idempotency_size(self) -> int | None:
        """Bytes of idempotency records kept on disk beside the journal (None: none)."""
        return None

    def journal_skipped(self) -> int | None:
        """Journal lines skipped since the start, not being records a write made (None: no journal)."""
        return None

    def describe(self) -> str:
        """Where the data lives, safe to show (never a password)."""
        return self.name

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release connections."""
