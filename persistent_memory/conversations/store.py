"""The conversations service: the store's methods for messages, threads and windows.

:class:`ConversationMethods` is mixed into :class:`~persistent_memory.store.MemoryStore`,
so ``get_store()`` and ``for_owner(...)`` stores have these methods, scoped to the
store's owner like every other. Each checks its arguments, then makes one backend call
(one round trip on Redis).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

from persistent_memory.backends.conversations import (
    Answer,
    ConversationInfo,
    Question,
    RecordWrite,
    WindowTexts,
)
from persistent_memory.chat.messages import (
    DEFAULT_CONVERSATION,
    PreparedMessage,
    chat_message,
    prepare_messages,
    prepare_text,
    validate_conversation,
    validate_message_id,
)
from persistent_memory.chat.tokens import text_counter
from persistent_memory.conversations.signals import messages_added, send_safely
from persistent_memory.conversations.summaries import (
    OVERFLOWS,
    ROLLING,
    STRATEGIES,
    TRUNCATION,
    rolling_context,
)
from persistent_memory.exceptions import InvalidValue
from persistent_memory.idempotency import Idempotency
from persistent_memory.validation import encode_value, validate_int, validate_key

if TYPE_CHECKING:
    from persistent_memory.conf import MemorySettings
    from persistent_memory.store import MemoryStore


@dataclass(frozen=True)
class ConversationOptions:
    """The conversation settings a store was built with (see ``conf.DEFAULTS``)."""

    tokenizer: str = "o200k_base"
    context_max_tokens: int | None = 8000
    context_max_messages: int | None = 100
    max_message_bytes: int = 1024 * 1024
    max_batch: int = 100
    record: bool = True
    strategy: str = TRUNCATION
    overflow: str = "truncate_oldest"
    summary_max_tokens: int = 1000

    @classmethod
    def from_settings(cls, conf: MemorySettings) -> ConversationOptions:
        options = cls(
            tokenizer=conf.TOKENIZER,
            context_max_tokens=conf.CONTEXT_MAX_TOKENS,
            context_max_messages=conf.CONTEXT_MAX_MESSAGES,
            max_message_bytes=conf.MAX_MESSAGE_BYTES,
            max_batch=conf.MAX_BATCH,
            record=conf.RECORD_CONVERSATION,
            strategy=conf.CONTEXT_STRATEGY,
            overflow=conf.CONTEXT_OVERFLOW,
            summary_max_tokens=conf.SUMMARY_MAX_TOKENS,
        )
        text_counter(options.tokenizer)  # an unknown tokenizer fails now, not at the first message
        return options


class Context(TypedDict):
    """What to send to a model now (``get_context``); the summary's fields come with the
    ``rolling_summary`` strategy (see :mod:`persistent_memory.conversations.summaries`)."""

    conversation: str
    messages: list[dict[str, Any]]
    tokens: int
    truncated: bool
    summary: NotRequired[str | None]
    summary_state: NotRequired[str | None]


def _revision(value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or not value):
        raise InvalidValue("A revision is a non-empty string.")
    return value


def _limit(value: Any, name: str) -> int | None:
    return None if value is None else validate_int(value, name=name, minimum=1)


#: Where a stored text's chat fields start and end (see ``messages.stored_text``: the id,
#: parent and seq before them, the token count, tokenizer and time after), and the field
#: of theirs a model is not sent.
_CHAT_START, _CHAT_END, _METADATA = b', "role": ', b', "tokens": ', b'"metadata": '


class ChatJSON(bytes):
    """Chat messages as one JSON array, cut out of the stored texts: for an answer that
    only passes them on (the API's enrich lane), which writes them as they are rather
    than parse them and encode them again (see :mod:`persistent_memory.api.rendering`)."""


def _chat_json(raw: list[bytes], metadata: bool = False) -> ChatJSON | None:
    """The JSON array of the chat fields of stored texts (with ``metadata``: and their
    metadata); None when a text holds metadata not asked for, which only a parse leaves
    out. (A quote in a JSON string is escaped, so the markers found are the stored text's
    own; the stored text's metadata comes before its token count, the last marker.)"""
    middles = []
    for text in raw:
        start, end = text.find(_CHAT_START), text.rfind(_CHAT_END)
        middle = text[start + 2 : end]
        if start < 0 or end < start or (not metadata and _METADATA in middle):
            return None
        middles.append(middle)
    return ChatJSON(b"[{" + b"}, {".join(middles) + b"}]" if middles else b"[]")


def _chats(
    texts: list[str] | list[bytes], *, metadata: bool = False, as_json: bool = False
) -> list[dict[str, Any]] | ChatJSON:
    """The chat messages of stored texts (with ``metadata``: and their metadata), in one
    parse of their chat fields only (the fields a model is not sent cost most of the
    parsing); with ``as_json``, their JSON unparsed where it can be cut out."""
    raw = [text.encode() if isinstance(text, str) else text for text in texts]
    chat_json = _chat_json(raw, metadata)
    if chat_json is None:
        return [_chat_fields(stored, metadata) for stored in json.loads(b"[" + b", ".join(raw) + b"]")]
    return chat_json if as_json else json.loads(chat_json)


def _chat_fields(stored: dict[str, Any], metadata: bool) -> dict[str, Any]:
    chat = chat_message(stored)
    if metadata and stored.get("metadata") is not None:
        chat["metadata"] = stored["metadata"]
    return chat


def _parsed(texts: list[str] | list[bytes]) -> list[dict[str, Any]]:
    """Stored texts (Redis answers bytes, the memory backend str) parsed in one call."""
    if not texts:
        return []
    if isinstance(texts[0], bytes):
        return json.loads(b"[" + b", ".join(texts) + b"]")  # type: ignore[arg-type]
    return json.loads("[" + ", ".join(texts) + "]")  # type: ignore[arg-type]


def window_context(
    conversation: str,
    window: WindowTexts,
    *,
    max_tokens: int | None = None,
    overflow: str = "truncate_oldest",
    tokenizer: str = "o200k_base",
    as_json: bool = False,
) -> Context:
    """A backend's window as ``get_context`` answers it (a rolling one when the backend read
    it so: see :func:`~persistent_memory.conversations.summaries.rolling_context`). With
    ``as_json``, a plain window's messages may come as :class:`ChatJSON`."""
    if window.summary_state is not None or window.chats is not None:
        messages = window.chats if window.chats is not None else _chats(window.messages)
    else:
        messages = _chats(window.messages, as_json=as_json)
    if window.summary_state is not None:
        return rolling_context(  # type: ignore[return-value]
            conversation, window, messages, max_tokens=max_tokens, overflow=overflow, tokenizer=tokenizer
        )
    return {
        "conversation": conversation,
        "messages": messages,
        "tokens": window.tokens,
        "truncated": window.truncated,
    }


def _choice(value: Any, choices: tuple[str, ...], name: str) -> str:
    if value not in choices:
        raise InvalidValue(f"Invalid {name} {value!r}: use one of {', '.join(choices)}.")
    return value


class ConversationMethods:
    """Messages, threads and windows of a session's named conversations."""

    conversation_options = ConversationOptions()

    def _prepare(self: MemoryStore, messages: Any) -> list[Any]:
        options = self.conversation_options
        return prepare_messages(
            messages,
            tokenizer=options.tokenizer,
            max_batch=options.max_batch,
            max_message_bytes=options.max_message_bytes,
            max_depth=self.max_json_depth,
        )

    def add_messages(
        self: MemoryStore,
        session_id: str,
        messages: list[dict[str, Any]],
        *,
        conversation: str = DEFAULT_CONVERSATION,
        parent_id: str | None = None,
        idempotency: Idempotency | None = None,
    ) -> dict[str, Any]:
        """Append chat messages as a chain after ``parent_id`` (None: the head), creating the
        session when it does not exist; ``{"conversation", "head", "messages"}`` with the
        messages as stored. A message re-sent with its id is answered as stored."""
        conversation = validate_conversation(conversation)
        if parent_id is not None:
            validate_message_id(parent_id, what="parent_id")
        batch = self._prepare(messages)
        once = self._once(idempotency)
        with self._session(session_id) as sid:
            appended = self.backend.add_messages(
                sid, conversation, parent_id, batch, self.default_ttl_seconds, **once
            )
        stored = self._stored(session_id, conversation, batch, appended.messages, "add_messages")
        return {"conversation": conversation, "head": appended.head, "messages": stored}

    def _stored(
        self: MemoryStore,
        session_id: str,
        conversation: str,
        batch: list[PreparedMessage],
        texts: list[str],
        source: str,
    ) -> list[dict[str, Any]]:
        """An append's messages as stored, after ``messages_added`` for the new ones."""
        stored = [json.loads(text) for text in texts]
        if messages_added.receivers:
            # A re-sent message (a no-op) is stored with its first body, not this batch's.
            added = [
                message
                for message, text, prepared in zip(stored, texts, batch, strict=True)
                if text.endswith(prepared.body[1:])
            ]
            if added:
                self.messages_added(session_id, conversation, added, source)
        return stored

    def messages_added(
        self: MemoryStore, session_id: str, conversation: str, messages: list[dict[str, Any]], source: str
    ) -> None:
        """Send ``messages_added`` (best-effort: see :mod:`persistent_memory.conversations.signals`)."""
        send_safely(
            messages_added,
            type(self),
            store=self,
            session_id=session_id,
            owner=self.owner,
            conversation=conversation,
            messages=messages,
            source=source,
        )

    def get_messages(
        self: MemoryStore,
        session_id: str,
        *,
        conversation: str = DEFAULT_CONVERSATION,
        leaf: str | None = None,
        limit: int | None = None,
    ) -> dict[str, Any]:
        """The thread ending at ``leaf`` (None: the head), oldest first, its newest ``limit``
        messages (None: all); ``{"conversation", "head", "messages"}``."""
        conversation = validate_conversation(conversation)
        if leaf is not None:
            validate_message_id(leaf, what="leaf")
        count = 0 if limit is None else validate_int(limit, name="limit", minimum=1)
        with self._session(session_id) as sid:
            head, texts = self.backend.get_messages(sid, conversation, leaf, count)
        return {"conversation": conversation, "head": head, "messages": _parsed(texts)}

    def get_chat_messages(
        self: MemoryStore,
        session_id: str,
        *,
        conversation: str = DEFAULT_CONVERSATION,
        limit: int | None = None,
    ) -> list[dict[str, Any]]:
        """The current thread's newest ``limit`` messages (None: all), oldest first, in the
        chat format with their metadata: what a framework's session reads back (no ids,
        sequence numbers, token counts or times, which cost most of the parsing)."""
        conversation = validate_conversation(conversation)
        count = 0 if limit is None else validate_int(limit, name="limit", minimum=1)
        with self._session(session_id) as sid:
            _, texts = self.backend.get_messages(sid, conversation, None, count)
        return _chats(texts, metadata=True)

    def get_context(
        self: MemoryStore,
        session_id: str,
        *,
        conversation: str = DEFAULT_CONVERSATION,
        max_tokens: int | None = None,
        max_messages: int | None = None,
        strategy: str | None = None,
        overflow: str | None = None,
    ) -> Context:
        """What to send to a model now: the pinned system messages and the newest whole turn
        groups of the current thread within the budgets (None: ``CONTEXT_MAX_TOKENS`` /
        ``CONTEXT_MAX_MESSAGES``), in the chat format only. With ``strategy="rolling_summary"``
        (None: ``CONTEXT_STRATEGY``) the summary of what comes before, and the messages after
        it; ``overflow`` (None: ``CONTEXT_OVERFLOW``) says what gives when both do not fit."""
        conversation = validate_conversation(conversation)
        options = self.conversation_options
        tokens = _limit(options.context_max_tokens if max_tokens is None else max_tokens, "max_tokens")
        count = _limit(options.context_max_messages if max_messages is None else max_messages, "max_messages")
        rolling = _choice(strategy or options.strategy, STRATEGIES, "strategy") == ROLLING
        overflow = _choice(overflow or options.overflow, OVERFLOWS, "overflow")
        reserve = overflow != "truncate_summary"
        with self._session(session_id) as sid:
            window = self.backend.get_context(
                sid, conversation, tokens, count, rolling=rolling, reserve_summary=reserve
            )
        return window_context(
            conversation, window, max_tokens=tokens, overflow=overflow, tokenizer=options.tokenizer
        )

    def list_conversations(self: MemoryStore, session_id: str) -> list[ConversationInfo]:
        """Each conversation's name, head, message count, token total, branch count and how
        many messages were trimmed, by name."""
        with self._session(session_id) as sid:
            infos = self.backend.list_conversations(sid)
        return sorted(infos, key=lambda info: info["conversation"])

    def set_head(
        self: MemoryStore,
        session_id: str,
        message_id: str,
        *,
        conversation: str = DEFAULT_CONVERSATION,
        idempotency: Idempotency | None = None,
    ) -> str:
        """Move the head to ``message_id`` (another branch, or back); reads follow it."""
        conversation = validate_conversation(conversation)
        validate_message_id(message_id)
        once = self._once(idempotency)
        with self._session(session_id) as sid:
            return self.backend.set_head(sid, conversation, message_id, **once)

    def clear_messages(
        self: MemoryStore,
        session_id: str,
        *,
        conversation: str = DEFAULT_CONVERSATION,
        idempotency: Idempotency | None = None,
    ) -> int:
        """Remove a conversation with all its messages; return how many it held."""
        conversation = validate_conversation(conversation)
        once = self._once(idempotency)
        with self._session(session_id) as sid:
            return self.backend.clear_messages(sid, conversation, **once)

    def pop_message(
        self: MemoryStore,
        session_id: str,
        head_id: str,
        *,
        conversation: str = DEFAULT_CONVERSATION,
        replacement: list[dict[str, Any]] | None = None,
        idempotency: Idempotency | None = None,
    ) -> dict[str, Any]:
        """Take the head off the current thread if it is still ``head_id`` (else
        ``HeadMoved``), and append ``replacement`` (None: nothing) after its parent in the
        same step; ``{"conversation", "head", "removed", "messages"}``. The head is removed
        unless another branch goes on from it."""
        conversation = validate_conversation(conversation)
        validate_message_id(head_id, what="head_id")
        batch = self._prepare(replacement) if replacement else []
        once = self._once(idempotency)
        with self._session(session_id) as sid:
            popped = self.backend.pop_message(sid, conversation, head_id, batch, **once)
        stored = [json.loads(text) for text in popped.messages]
        if stored and messages_added.receivers:
            self.messages_added(session_id, conversation, stored, "pop_message")
        return {
            "conversation": conversation,
            "head": popped.head,
            "removed": json.loads(popped.removed),
            "messages": stored,
        }

    def write_thread(
        self: MemoryStore,
        session_id: str,
        *,
        key: str,
        expected: str | None,
        record: dict[str, Any],
        messages: list[dict[str, Any]] | None = None,
        parent_id: str | None = None,
        head_id: str | None = None,
        conversation: str = DEFAULT_CONVERSATION,
    ) -> list[dict[str, Any]]:
        """A compare-and-set of a conversation and the record an integration keeps beside it
        (session value ``key``, a JSON object whose ``"revision"`` changes on every write):
        if the stored record's revision is ``expected`` (None: there is no record and no such
        conversation; else ``RevisionConflict``), append ``messages`` as a chain after
        ``parent_id`` (None: as a new root), move the head to ``head_id`` (None: none) and
        store ``record``, all in one step, creating the session when it does not exist.
        Returns the messages as stored. A batch may hold up to ``MAX_MESSAGES`` messages."""
        conversation = validate_conversation(conversation)
        key = validate_key(key)
        for name, message_id in (("parent_id", parent_id), ("head_id", head_id)):
            if message_id is not None:
                validate_message_id(message_id, what=name)
        if not isinstance(record, dict) or _revision(record.get("revision")) is None:
            raise InvalidValue('record must be a JSON object with a "revision".')
        value = encode_value(record, max_bytes=self.max_value_bytes, max_depth=self.max_json_depth)
        options = self.conversation_options
        batch = (
            prepare_messages(
                messages,
                tokenizer=options.tokenizer,
                max_batch=max(options.max_batch, self.backend.max_messages),
                max_message_bytes=options.max_message_bytes,
                max_depth=self.max_json_depth,
            )
            if messages
            else []
        )
        write = RecordWrite(key, _revision(expected), value, parent_id, head_id)
        with self._session(session_id) as sid:
            texts = self.backend.write_thread(sid, conversation, write, batch, self.default_ttl_seconds)
        return self._stored(session_id, conversation, batch, texts, "write_thread")

    def remove_thread(
        self: MemoryStore,
        session_id: str,
        *,
        key: str,
        expected: str,
        conversation: str = DEFAULT_CONVERSATION,
    ) -> None:
        """Remove the record under ``key`` and its conversation if the record's revision is
        still ``expected`` (else ``RevisionConflict``), and the session when nothing else is
        left in it."""
        conversation = validate_conversation(conversation)
        if _revision(expected) is None:
            raise InvalidValue("A revision is a non-empty string.")
        write = RecordWrite(validate_key(key), expected, None, None, None)
        with self._session(session_id) as sid:
            self.backend.write_thread(sid, conversation, write, [], None)

    # The lanes -------------------------------------------------------------------

    def _lane_message(self: MemoryStore, role: str, text: str) -> Any:
        """The lane's text as one prepared message, or None when there is no text to record."""
        options = self.conversation_options
        if not options.record or not isinstance(text, str) or not text:
            return None
        return prepare_text(
            role, text, tokenizer=options.tokenizer, max_message_bytes=options.max_message_bytes
        )

    def question(self: MemoryStore, text: Any, conversation: str) -> Question | None:
        """What the enrich lane records for a question's ``text`` (None: nothing)."""
        message = self._lane_message("user", text)
        if message is None:
            return None
        options = self.conversation_options
        return Question(
            validate_conversation(conversation),
            message,
            options.context_max_tokens,
            options.context_max_messages,
            options.strategy == ROLLING,
            options.overflow != "truncate_summary",
        )

    def answer(self: MemoryStore, text: Any, conversation: str, parent_id: str | None) -> Answer | None:
        """What the store lane records for an answer's ``text`` (None: nothing)."""
        message = self._lane_message("assistant", text)
        if message is None:
            return None
        return Answer(validate_conversation(conversation), message, parent_id)
