"""Chat messages: the rules they are checked against before anything is written, and the
texts the backends store.

A message is OpenAI's chat format (``role``, ``content``, ``name``, ``tool_calls``,
``tool_call_id``) plus ``metadata`` (any JSON object, never sent to a model) and an
optional caller-chosen ``id``. The store adds ``parent_id``, ``seq``, ``tokens``,
``tokenizer`` and ``created_at``. Backends store each message as one JSON text::

    {"id": ..., "parent_id": ..., "seq": ..., <the body prepared here>}

where the body (``{"role": ..., ..., "tokens": ..., "tokenizer": ..., "created_at": ...}``)
is built here, and the first three fields by the backend, which alone knows the
parent (the head, by default) and the next ``seq``. Beside it each message has a short
*link* the backend reads to follow threads and build windows without parsing contents:
``{"p": parent id, "s": seq, "t": tokens, "r": role, "c": [tool call ids], "a": answered
tool call id, "f": fingerprint}``, of which everything after ``"s"`` is built here.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from persistent_memory.chat.tokens import MESSAGE_OVERHEAD, message_tokens, text_counter
from persistent_memory.exceptions import (
    InvalidKey,
    InvalidMessage,
    InvalidUnicode,
    InvalidValue,
    ValueTooLarge,
)
from persistent_memory.validation import _has_lone_surrogate, encode_value, validate_key

ROLES = ("system", "user", "assistant", "tool")
FIELDS = frozenset({"id", "role", "content", "name", "tool_calls", "tool_call_id", "metadata"})
#: Message ids: the caller's own (OpenAI's, a UUID, a ULID) or one made here.
MESSAGE_ID_PATTERN = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
#: OpenAI's rule for ``name``.
NAME_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")
TOOL_CALL_ID_PATTERN = re.compile(r"[^\s\x00-\x1f]{1,256}")
DEFAULT_CONVERSATION = "default"


def validate_conversation(name: Any) -> str:
    """A conversation name follows the key rules."""
    try:
        return validate_key(name)
    except InvalidKey as exc:  # not an InvalidValue: caught by name
        raise InvalidMessage(str(exc).replace("key", "conversation name", 1)) from None


def validate_message_id(message_id: Any, *, what: str = "message id") -> str:
    """Return ``message_id`` if valid, else raise :class:`InvalidMessage`."""
    if not isinstance(message_id, str) or not MESSAGE_ID_PATTERN.fullmatch(message_id):
        raise InvalidMessage(
            f"Invalid {what} {message_id!r}: use 1-128 characters of letters, digits, '_', '.', ':' or '-'."
        )
    return message_id


_last_id = (0, 0)  # (milliseconds, random part) of the last id made in this process
_id_lock = threading.Lock()


def new_message_id(now: float) -> str:
    """A unique id that sorts by creation time: 12 hex digits of milliseconds, 16 random.

    Ids made by one process sort in the order they were made: within a millisecond
    (a batch shares one ``now``), or when the clock steps back, the next id is the last
    one's random part plus one, as monotonic ULIDs do."""
    global _last_id
    millis = int(now * 1000)
    with _id_lock:
        last_millis, last_random = _last_id
        randomness = last_random + 1
        if millis > last_millis or randomness >= 1 << 64:
            millis = max(millis, last_millis + (randomness >= 1 << 64))
            # The random module, not os.urandom: ids must be unique, not secret, and a
            # system call per message cost a turn more than the rest of making its id.
            # (It reseeds in a forked child, so workers of one server do not repeat.)
            randomness = random.getrandbits(64)
        else:
            millis = last_millis
        _last_id = (millis, randomness)
    return f"{millis:012x}{randomness:016x}"


@dataclass(frozen=True)
class PreparedMessage:
    """A checked message, ready for a backend (see the module's docstring)."""

    id: str
    role: str
    #: The stored text after ``{"id", "parent_id", "seq"``: ``{"role": ...}``.
    body: str
    #: The link after ``{"p", "s"``: ``{"t": ..., "r": ..., "c": ..., "a": ..., "f": ...}``.
    link: str
    tokens: int
    #: Tool call ids of an assistant message; the call a tool message answers.
    calls: tuple[str, ...]
    answers: str | None
    #: What makes a re-sent message "the same" (the link's ``"f"``).
    fingerprint: str


def _fail(index: int, message: str) -> InvalidMessage:
    return InvalidMessage(f"messages[{index}]: {message}")


def _check_content(index: int, role: str, content: Any, has_calls: bool) -> None:
    if content is None:
        if role == "assistant" and has_calls:
            return
        raise _fail(index, "content is required (null only on an assistant message with tool_calls).")
    if isinstance(content, str):
        return
    if not isinstance(content, list) or not content:
        raise _fail(index, "content must be a string or a non-empty list of content parts.")
    for position, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str) or not part["type"]:
            raise _fail(index, f"content[{position}] must be an object with a string 'type'.")
        if part["type"] == "text" and not isinstance(part.get("text"), str):
            raise _fail(index, f"content[{position}] is a text part without a string 'text'.")
        if role == "tool" and part["type"] != "text":
            raise _fail(index, "a tool message's content parts must be text parts.")


def _check_tool_calls(index: int, tool_calls: Any) -> tuple[str, ...]:
    if not isinstance(tool_calls, list) or not tool_calls:
        raise _fail(index, "tool_calls must be a non-empty list.")
    ids: list[str] = []
    for position, call in enumerate(tool_calls):
        where = f"tool_calls[{position}]"
        if not isinstance(call, dict) or set(call) - {"id", "type", "function"}:
            raise _fail(index, f"{where} must be an object with 'id', 'type' and 'function' only.")
        call_id = call.get("id")
        if not isinstance(call_id, str) or not TOOL_CALL_ID_PATTERN.fullmatch(call_id):
            raise _fail(index, f"{where}.id must be 1-256 characters without spaces.")
        if call.get("type") != "function":
            raise _fail(index, f"{where}.type must be 'function'.")
        function = call.get("function")
        if (
            not isinstance(function, dict)
            or set(function) != {"name", "arguments"}
            or not isinstance(function["name"], str)
            or not function["name"]
            or not isinstance(function["arguments"], str)
        ):
            raise _fail(index, f"{where}.function must be {{'name': str, 'arguments': str}}.")
        if call_id in ids:
            raise _fail(index, f"{where}.id {call_id!r} is used twice.")
        ids.append(call_id)
    return tuple(ids)


def _check(index: int, message: Any) -> tuple[tuple[str, ...], str | None]:
    """Check one message's shape; return its tool call ids and the call it answers."""
    if not isinstance(message, dict):
        raise _fail(index, "a message must be an object.")
    unknown = set(message) - FIELDS
    if unknown:
        raise _fail(index, f"unknown fields {sorted(unknown)}; a message has {sorted(FIELDS)}.")
    role = message.get("role")
    if role not in ROLES:
        raise _fail(index, f"role must be one of {', '.join(ROLES)}, not {role!r}.")
    if "id" in message:
        validate_message_id(message["id"])
    name = message.get("name")
    if name is not None and (not isinstance(name, str) or not NAME_PATTERN.fullmatch(name)):
        raise _fail(index, "name must be 1-64 characters of letters, digits, '_' or '-'.")
    calls: tuple[str, ...] = ()
    if message.get("tool_calls") is not None:
        if role != "assistant":
            raise _fail(index, "only an assistant message has tool_calls.")
        calls = _check_tool_calls(index, message["tool_calls"])
    answers = message.get("tool_call_id")
    if role == "tool":
        if not isinstance(answers, str) or not TOOL_CALL_ID_PATTERN.fullmatch(answers):
            raise _fail(index, "a tool message needs the tool_call_id of the call it answers.")
    elif answers is not None:
        raise _fail(index, "only a tool message has a tool_call_id.")
    _check_content(index, role, message.get("content"), bool(calls))
    metadata = message.get("metadata")
    if metadata is not None and not isinstance(metadata, dict):
        raise _fail(index, "metadata must be a JSON object.")
    return calls, answers


def is_chat_message(message: Any) -> bool:
    """Whether ``message`` has the shape of a chat message (the checks of an append that
    need no stored thread, but the byte and depth caps)."""
    try:
        _check(0, message)
    except InvalidValue:
        return False
    return True


def prepare_messages(
    messages: Any,
    *,
    tokenizer: str,
    max_batch: int,
    max_message_bytes: int,
    max_depth: int,
    now: float | None = None,
) -> list[PreparedMessage]:
    """Check a batch of messages and build what the backend stores; :class:`InvalidMessage`
    (or another ``InvalidValue``) before anything is written."""
    if not isinstance(messages, list) or not messages:
        raise InvalidMessage("messages must be a non-empty list of chat messages.")
    if len(messages) > max_batch:
        raise InvalidMessage(f"At most {max_batch} messages per call (MAX_BATCH), not {len(messages)}.")
    now = time.time() if now is None else now
    prepared: list[PreparedMessage] = []
    seen: set[str] = set()
    for index, message in enumerate(messages):
        calls, answers = _check(index, message)
        message_id = message.get("id") or new_message_id(now)
        if message_id in seen:
            raise _fail(index, f"id {message_id!r} is used twice in this call.")
        seen.add(message_id)
        prepared.append(
            _prepare(index, message, message_id, calls, answers, tokenizer, max_message_bytes, max_depth, now)
        )
    return prepared


def _prepare(
    index: int,
    message: dict[str, Any],
    message_id: str,
    calls: tuple[str, ...],
    answers: str | None,
    tokenizer: str,
    max_message_bytes: int,
    max_depth: int,
    now: float,
) -> PreparedMessage:
    chat = {field: message.get(field) for field in CHAT_FIELDS}
    chat = {field: value for field, value in chat.items() if value is not None or field == "content"}
    if message.get("metadata") is not None:
        chat["metadata"] = message["metadata"]
    try:
        # The same rules as values: no NaN, no lone surrogates, not too deep.
        content_json = encode_value(chat, max_bytes=max_message_bytes, max_depth=max_depth)
    except ValueTooLarge:
        raise _fail(index, f"over MAX_MESSAGE_BYTES ({max_message_bytes} bytes of JSON).") from None
    except InvalidValue as exc:
        raise InvalidMessage(f"messages[{index}]: {exc}") from None
    tokens = message_tokens(chat, tokenizer)
    return _prepared(message_id, chat["role"], content_json, tokens, calls, answers, now, tokenizer)


def _prepared(
    message_id: str,
    role: str,
    content_json: str,
    tokens: int,
    calls: tuple[str, ...],
    answers: str | None,
    now: float,
    tokenizer: str = "",
) -> PreparedMessage:
    """The message whose chat fields encode as ``content_json``, stamped."""
    stamp = f'"tokens": {tokens}, "tokenizer": {_quoted_tokenizer(tokenizer)}, "created_at": {now!r}'
    body = f"{content_json[:-1]}, {stamp}}}"
    fingerprint = _fingerprint(content_json)
    link = _link(role, tokens, calls, answers, fingerprint)
    return PreparedMessage(message_id, role, body, link, tokens, calls, answers, fingerprint)


def prepare_text(role: str, text: str, *, tokenizer: str, max_message_bytes: int) -> PreparedMessage:
    """``prepare_messages([{"role": role, "content": text}], ...)[0]``, for the lanes: the
    same checks and the same stored bytes, without the general message's walk (a role of
    ``ROLES`` and a string are all such a message is; its JSON is one string deep)."""
    if role not in ROLES or not isinstance(text, str):
        raise InvalidMessage("messages[0]: a lane message is a role and a string.")
    content_json = f'{{"role": "{role}", "content": {json.dumps(text)}}}'
    # As encode_value: ensure_ascii writes a surrogate only as an escape.
    if "\\ud" in content_json and _has_lone_surrogate(text):
        raise InvalidMessage(f"messages[0]: {InvalidUnicode()}")
    if len(content_json) > max_message_bytes:
        raise _fail(0, f"over MAX_MESSAGE_BYTES ({max_message_bytes} bytes of JSON).")
    tokens = MESSAGE_OVERHEAD + text_counter(tokenizer)(text)
    now = time.time()
    return _prepared(new_message_id(now), role, content_json, tokens, (), None, now, tokenizer)


@lru_cache(maxsize=16)
def _quoted_tokenizer(tokenizer: str) -> str:
    return json.dumps(tokenizer)


def _fingerprint(chat_json: str) -> str:
    # A re-sent message is "the same" when its chat fields and metadata encode the same.
    return hashlib.blake2b(chat_json.encode(), digest_size=12).hexdigest()


def _link(role: str, tokens: int, calls: tuple[str, ...], answers: str | None, fingerprint: str) -> str:
    # As json.dumps writes it (redis.lua reads a plain message's with one pattern), built
    # without it for the common case: the role and fingerprint need no escaping.
    if not calls and answers is None:
        return f'{{"t": {tokens}, "r": "{role}", "c": [], "a": null, "f": "{fingerprint}"}}'
    return json.dumps({"t": tokens, "r": role, "c": list(calls), "a": answers, "f": fingerprint})


def link_of(stored: dict[str, Any]) -> str:
    """The whole link of a stored message (decoded), as the backend built it at append."""
    chat = {field: stored[field] for field in (*CHAT_FIELDS, "metadata") if field in stored}
    calls = tuple(call["id"] for call in chat.get("tool_calls") or ())
    tail = _link(
        chat["role"], stored["tokens"], calls, chat.get("tool_call_id"), _fingerprint(json.dumps(chat))
    )
    return stored_link(stored["parent_id"], stored["seq"], tail)


def _quoted(message_id: str | None) -> str:
    # Message ids (MESSAGE_ID_PATTERN) hold nothing JSON escapes.
    return "null" if message_id is None else f'"{message_id}"'


def stored_text(message_id: str, parent_id: str | None, seq: int, body: str) -> str:
    """The text a backend stores for a message (redis.lua builds the same bytes)."""
    return f'{{"id": {_quoted(message_id)}, "parent_id": {_quoted(parent_id)}, "seq": {seq}, {body[1:]}'


def stored_link(parent_id: str | None, seq: int, link: str) -> str:
    """The link a backend stores beside a message (redis.lua builds the same bytes)."""
    return f'{{"p": {_quoted(parent_id)}, "s": {seq}, {link[1:]}'


#: The fields of a stored message that a model is sent (``get_context``'s messages).
CHAT_FIELDS = ("role", "content", "name", "tool_calls", "tool_call_id")


def chat_message(stored: dict[str, Any]) -> dict[str, Any]:
    """A stored message as sent to a model: the chat fields only."""
    return {field: stored[field] for field in CHAT_FIELDS if field in stored}
