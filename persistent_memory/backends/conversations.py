"""The conversations part of the backend contract (see :mod:`persistent_memory.conversations`).

A session holds named conversations; each is a tree of messages with a *head*, the
newest message of the current thread. Backends store each message as the text
:func:`~persistent_memory.chat.messages.stored_text` builds, and answer
messages as those texts. Like the rest of the contract, each method is one atomic step
(one round trip on Redis), takes storage ids, and gets arguments already checked;
writes take ``idempotency=`` as :class:`~persistent_memory.backends.base.BaseBackend`'s do.

Appending to a conversation checks, in the same step and before writing anything, what
only the stored tree can tell: that a parent exists, that each ``tool`` message answers
a call open on its thread (``OrphanToolResult``), and that a re-sent id carries the same
message (``MessageConflict``; the same one is a no-op answered with the stored message).
Beyond ``max_messages`` the oldest messages of the current thread are removed in the
same step (pinned ``system`` messages stay), and the history records how many.
"""

from __future__ import annotations

import hashlib
from abc import abstractmethod
from typing import Any, NamedTuple, TypedDict

from persistent_memory.backends.base import IdempotencyRecord, RunBinding
from persistent_memory.chat.messages import PreparedMessage

# A whole conversation's shape is the chat format's (records, below the backends, reads
# and writes it); the contract names it here too, where the backends and the mirror look.
from persistent_memory.chat.records import ConversationSnapshot as ConversationSnapshot


class Summary(NamedTuple):
    """A rolling summary: ``text`` stands for the thread from its root to ``anchor`` (seq
    ``anchor_seq``); ``tokens`` its count (a system message's); and ``covered_tokens``
    those of the stored messages it covers (the rest are pending).

    A conversation holds one per branch that has one, by anchor: a window of a thread uses
    the one whose anchor is deepest on it; a commit replaces only those it continues (the
    ones anchored on its thread), so what another branch's summary covers stays covered."""

    text: str
    anchor: str
    anchor_seq: int
    tokens: int
    covered_tokens: int


def text_digest(text: str) -> int:
    """A stored message text's digest; a set of messages is the XOR of theirs (in any order)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=16).digest(), "big")


class ConversationInfo(TypedDict):
    """One conversation of a session, as ``list_conversations`` reports it."""

    conversation: str
    head: str | None
    message_count: int
    tokens: int
    branch_count: int
    trimmed: int


class Appended(NamedTuple):
    """The conversation's head after an append, and the batch's messages as stored."""

    head: str
    messages: list[str]


class WindowTexts(NamedTuple):
    """A window's stored messages, in order, their tokens, and whether older ones were left out."""

    #: Stored texts (Redis answers them as bytes, parsed by the store in one call).
    messages: list[str] | list[bytes]
    tokens: int
    truncated: bool
    #: The messages' chat fields, fresh copies, when the backend holds them parsed (else None).
    chats: list[dict[str, Any]] | None = None
    #: With ``rolling=True``: the summary of the thread before the messages (None: none
    #: applies) and its tokens; the messages are then those after its anchor.
    summary: str | None = None
    summary_tokens: int = 0
    #: The summarizers' health state with ``rolling=True`` (see conversations.summaries).
    summary_state: str | None = None


class Question(NamedTuple):
    """What the enrich lane records: the question as a user message of ``conversation``, after
    reading the window before it (``max_tokens``/``max_messages``, None: no limit; ``rolling``
    and ``reserve_summary`` as for ``get_context``)."""

    conversation: str
    message: PreparedMessage
    max_tokens: int | None
    max_messages: int | None
    rolling: bool = False
    reserve_summary: bool = True


class Popped(NamedTuple):
    """What ``pop_message`` took off a conversation, the head after it and the
    replacement's messages as stored."""

    removed: str
    head: str | None
    messages: list[str]


class RecordWrite(NamedTuple):
    """A compare-and-set of a conversation together with the record an integration keeps
    beside it, a session value (``write_thread``)."""

    #: The session value that holds the record: a JSON object with a ``"revision"``.
    key: str
    #: The revision it must hold (None: no value under ``key``, and no such conversation).
    expected: str | None
    #: Its new JSON text (None: remove the record and the conversation).
    value: str | None
    #: Where the messages go: after this message (None: as a new root).
    parent: str | None
    #: The head after the write (None: none).
    head: str | None


class Answer(NamedTuple):
    """What the store lane records: the answer as an assistant message of ``conversation``.
    Its parent is the question ``run`` enriched when the binding names one in this
    conversation, else ``parent_id`` when that message exists, else the head."""

    conversation: str
    message: PreparedMessage
    parent_id: str | None


class Enriched(NamedTuple):
    """The enrich lane's reply with a question recorded."""

    values: str
    window: WindowTexts
    question_id: str


class ConversationBackend:
    """What a backend does with conversations."""

    #: Messages one conversation keeps (MAX_MESSAGES); set by the backend's ``__init__``.
    max_messages: int = 1000

    @abstractmethod
    def add_messages(
        self,
        session_id: str,
        conversation: str,
        parent_id: str | None,
        messages: list[PreparedMessage],
        ttl_seconds: float | None,
        *,
        idempotency: IdempotencyRecord | None = None,
    ) -> Appended:
        """Append ``messages`` as a chain from ``parent_id`` (None: the head), creating the
        session (with ``ttl_seconds``) when it is not live."""

    @abstractmethod
    def get_messages(
        self, session_id: str, conversation: str, leaf: str | None, limit: int
    ) -> tuple[str | None, list[str] | list[bytes]]:
        """The head, and the stored texts of the newest ``limit`` (0: all) messages of the
        thread ending at ``leaf`` (None: the head), oldest first (str or bytes: the store
        parses them in one call)."""

    @abstractmethod
    def get_context(
        self,
        session_id: str,
        conversation: str,
        max_tokens: int | None,
        max_messages: int | None,
        *,
        rolling: bool = False,
        reserve_summary: bool = True,
    ) -> WindowTexts:
        """The window of the current thread (see :mod:`persistent_memory.chat.window`).

        ``rolling``: when a summary's anchor is on the thread, the summary and the window of
        the messages after it, within ``max_tokens`` less the summary's tokens (all of
        ``max_tokens`` with ``reserve_summary=False``: the caller shortens the summary)."""

    @abstractmethod
    def list_conversations(self, session_id: str) -> list[ConversationInfo]:
        """Every conversation of the session (any order)."""

    @abstractmethod
    def set_head(
        self,
        session_id: str,
        conversation: str,
        message_id: str,
        *,
        idempotency: IdempotencyRecord | None = None,
    ) -> str:
        """Make ``message_id`` the head (the thread then ends there); return it."""

    @abstractmethod
    def clear_messages(
        self, session_id: str, conversation: str, *, idempotency: IdempotencyRecord | None = None
    ) -> int:
        """Remove the conversation; return how many messages it held."""

    @abstractmethod
    def pop_message(
        self,
        session_id: str,
        conversation: str,
        head_id: str,
        messages: list[PreparedMessage],
        *,
        idempotency: IdempotencyRecord | None = None,
    ) -> Popped:
        """Take the head off the current thread if it is still ``head_id`` (else
        ``HeadMoved``; ``MessageNotFound`` when the conversation is empty) and append
        ``messages`` (checked as an append is) after its parent in the same step: the head
        is removed unless another branch goes on from it, and a summary anchored there
        goes with it."""

    @abstractmethod
    def write_thread(
        self,
        session_id: str,
        conversation: str,
        write: RecordWrite,
        messages: list[PreparedMessage],
        ttl_seconds: float | None,
    ) -> list[str]:
        """Check that the record's revision is ``write.expected`` (else ``RevisionConflict``),
        then in the same step append ``messages`` (checked as an append is) after
        ``write.parent``, move the head to ``write.head`` (a stored or new message, else
        ``MessageNotFound``) and store ``write.value``, creating the session (with
        ``ttl_seconds``) when it is not live; or, with no value, remove the record and the
        conversation, and the session when nothing else is left in it. Returns the
        messages as stored."""

    @abstractmethod
    def enrich_recording(
        self,
        session_id: str,
        ttl_seconds: float | None,
        run: RunBinding | None,
        question: Question,
        *,
        idempotency: IdempotencyRecord | None = None,
    ) -> Enriched:
        """:meth:`BaseBackend.enrich`, then read the window and record ``question`` (bound
        to ``run``, so that the answer finds it) in the same step."""


class SummarySource(NamedTuple):
    """What a summarizer reads: the summary so far and the current thread's messages after
    its anchor (stored texts, oldest first; all of the thread when there is none)."""

    summary: Summary | None
    messages: list[str]


class SummaryBackend:
    """Rolling summaries of conversations (see :mod:`persistent_memory.conversations.summaries`).

    An append that takes a conversation's pending tokens (its tokens less those the current
    thread's summary covers) past ``summarize_after_tokens`` marks it in the same step;
    summarizers take marked conversations, read them, and commit a summary with a
    compare-and-set on the anchor, so concurrent appends are never lost and of two
    summarizers one commits. Summaries are kept per branch (see :class:`Summary`), and a
    trim removes only messages the current thread's summary covers, so every message is
    stored or covered by a summary of a thread it is on.
    """

    #: Pending tokens that mark a conversation (None: no summarizer; trims are not held back).
    summarize_after_tokens: int | None = None

    @abstractmethod
    def pop_unsummarized(self, count: int) -> list[tuple[str, str]]:
        """Take up to ``count`` marked (storage id, conversation) pairs."""

    @abstractmethod
    def mark_unsummarized(self, items: list[tuple[str, str]]) -> None:
        """Mark pairs again (a summary that failed is tried again)."""

    @abstractmethod
    def unsummarized_count(self) -> int:
        """How many conversations wait for a summarizer."""

    @abstractmethod
    def summary_source(self, session_id: str, conversation: str) -> SummarySource:
        """The current thread's summary (the one whose anchor is deepest on it; None: none)
        and the thread after its anchor (empty for no conversation)."""

    @abstractmethod
    def commit_summary(
        self, session_id: str, conversation: str, expected_anchor: str | None, summary: Summary
    ) -> bool:
        """Store ``summary`` as the current thread's if that thread's summary is still the one
        anchored at ``expected_anchor`` (None: it had none, as ``summary_source`` answers) and
        the new anchor is still on the thread after it (False otherwise: someone else
        committed, the thread moved, or the anchor is gone). The summaries anchored on the
        thread before it (those it continues) go; other branches' stay. Its
        ``covered_tokens`` are counted by the backend, from the stored messages; then trim
        what it covers beyond ``max_messages`` and unmark it when nothing more is pending
        past the threshold."""

    @abstractmethod
    def summarizer_health(self) -> dict[str, Any]:
        """The summarizers' shared health record (empty before any)."""

    @abstractmethod
    def set_summarizer_health(self, health: dict[str, Any]) -> None:
        """Replace the health record (JSON-able values)."""
