"""Exceptions raised by the store. Every one is a :class:`PersistentMemoryError`."""

from __future__ import annotations


class PersistentMemoryError(Exception):
    """Base class of every error the store raises."""

    #: A short machine-readable code (the REST API answers it as ``code``).
    code = "persistent_memory_error"


class InvalidSessionId(PersistentMemoryError, ValueError):
    """A session id is not 1-128 of ``[A-Za-z0-9_-]`` or is reserved."""

    code = "invalid_session_id"


class InvalidKey(PersistentMemoryError, ValueError):
    """A key is not 1-256 of ``[A-Za-z0-9_.-]`` or is reserved."""

    code = "invalid_key"


class InvalidValue(PersistentMemoryError, ValueError):
    """A value (or numeric argument) the store cannot accept; nothing was stored."""

    code = "invalid_value"


class ValueTooLarge(InvalidValue):
    """One value's JSON is over ``MAX_VALUE_BYTES``; nothing was stored."""

    code = "value_too_large"


class InvalidUnicode(InvalidValue):
    """A string holds a lone surrogate (or a body is not valid UTF-8): no character, so
    no backend, database or JSON answer could carry it; nothing was stored."""

    code = "invalid_unicode"

    def __init__(
        self, message: str = "Invalid value: a string holds a lone surrogate (not a character)."
    ) -> None:
        super().__init__(message)


class ValueTooDeep(InvalidValue):
    """JSON nested deeper than ``MAX_JSON_DEPTH``; nothing was stored."""

    code = "json_too_deep"


class InvalidCursor(InvalidValue):
    """A listing cursor this listing did not give: malformed, forged, another owner's
    or another search's, or signed with a former ``SECRET_KEY``."""

    code = "invalid_cursor"


class PageTooDeep(InvalidValue):
    """A listing page asked by an offset past ``MAX_PAGE_OFFSET``: follow the cursor instead."""

    code = "page_too_deep"


class InvalidOwner(PersistentMemoryError, ValueError):
    """An owner string the store cannot use as a namespace (see :mod:`persistent_memory.owners`)."""

    code = "invalid_owner"


class InvalidRunId(InvalidValue):
    """A pipeline ``run_id`` does not follow the session id rules."""

    code = "invalid_run_id"


class InvalidThreadId(InvalidValue):
    """A LangGraph thread id longer than the checkpointer takes (see
    :data:`persistent_memory.integrations.langgraph_saver.MAX_THREAD_ID`); nothing was stored."""

    code = "invalid_thread_id"


class InvalidIdempotencyKey(InvalidValue):
    """An idempotency key is not 1-255 of ``[A-Za-z0-9_.:/@+=-]``."""

    code = "invalid_idempotency_key"


class IdempotencyKeyReused(PersistentMemoryError):
    """An idempotency key already recorded for a different request; nothing was written."""

    code = "idempotency_key_reused"


class SessionNotFound(PersistentMemoryError, LookupError):
    """No live session has this id."""

    code = "session_not_found"


class SessionExpired(SessionNotFound):
    """The session existed but its TTL ran out; it can be created again."""

    code = "session_expired"


class SessionExists(PersistentMemoryError):
    """``create_session`` for an id that is already live."""

    code = "session_exists"


class KeyNotFound(PersistentMemoryError, LookupError):
    """The session has no value under this key."""

    code = "key_not_found"


class NotANumber(PersistentMemoryError, ValueError):
    """``increment`` on a value that is not a 64-bit integer; nothing changed."""

    code = "not_a_number"


class InvalidMessage(InvalidValue):
    """A chat message (or a batch of them) breaks the message rules; nothing was written."""

    code = "invalid_message"


class OrphanToolResult(InvalidMessage):
    """A ``tool`` message answers no call open on its thread; nothing was written."""

    code = "orphan_tool_result"


class MessageConflict(PersistentMemoryError):
    """A message id already stored with other content; nothing was written."""

    code = "message_conflict"


class HeadMoved(MessageConflict):
    """A conversation's head is no longer the message a change was made against."""

    code = "head_moved"


class RevisionConflict(MessageConflict):
    """A conversation's record no longer has the revision a write was made against (or
    has one, or the conversation has messages, when the write expected none); nothing
    was written."""

    code = "revision_conflict"


class CheckpointBaseMissing(PersistentMemoryError):
    """A checkpoint's value extends a value the thread does not hold (deleted, or another
    thread's under the same reference); nothing was written: send it whole."""

    code = "checkpoint_base_missing"


class MessageNotFound(PersistentMemoryError, LookupError):
    """No message of the conversation has this id (a parent, a leaf or a new head)."""

    code = "message_not_found"


class ContextOverflow(PersistentMemoryError):
    """A window's summary and messages do not fit its budget and CONTEXT_OVERFLOW is "error"."""

    code = "context_overflow"


class CapacityExceeded(PersistentMemoryError):
    """The backend, the owner or the session holds as many sessions (or bytes) as it may."""

    code = "capacity_exceeded"


class QuotaExceeded(CapacityExceeded):
    """One owner's session cap or one session's byte cap: other owners are not affected."""


class SessionsFull(CapacityExceeded):
    """The memory backend's process holds the sessions MAX_SESSIONS allows it (and this owner
    its fair share of them). Its message names the setting to raise, for callers too."""


class BackendUnavailable(PersistentMemoryError):
    """The backend cannot be reached (Redis down, refused, timed out)."""

    code = "backend_unavailable"


class ReplicasBehind(BackendUnavailable):
    """A write was applied on the Redis primary, but fewer replicas than
    REDIS_WAIT_REPLICAS confirmed it in time: it may be lost in a failover, or be there."""

    code = "replicas_behind"


class InvalidMemory(InvalidValue):
    """A long-term memory (its content, type, key, metadata, source...) breaks the rules;
    nothing was written."""

    code = "invalid_memory"


class MemoryNotFound(PersistentMemoryError, LookupError):
    """The owner has no (unexpired) long-term memory with this id."""

    code = "memory_not_found"


class MemoryKeyExists(PersistentMemoryError):
    """An update would give a memory the key another memory of the owner holds."""

    code = "memory_key_exists"
