"""Conversations in export records (``memory_export`` / ``memory_import``).

An export writes each conversation with its head, its last ``seq``, how many messages
were trimmed, every message of every branch as stored (ids, parents, seq, token
counts, tokenizer and creation time included), decoded so that the file reads as
JSON, and its rolling summaries (one per branch that has one, each with its anchor).
An import checks each message against the append's rules and the tree's (unique ids
and seqs, parents older than their children, tool results after their calls, a head
among the messages) and each summary (its anchor a message, no anchor twice), and
builds the stored text again in the layout the backends write, so a conversation
exported and imported is the same bytes.
"""

from __future__ import annotations

import json
import math
from typing import Any, NotRequired, TypedDict

from persistent_memory.chat.messages import (
    CHAT_FIELDS,
    _check,  # the append's own shape rules
    stored_text,
    validate_conversation,
    validate_message_id,
)
from persistent_memory.exceptions import InvalidMessage, PersistentMemoryError
from persistent_memory.validation import encode_value


class ConversationSnapshot(TypedDict):
    """A whole conversation, for the mirror, export and import (messages in seq order).

    Part of the backend contract (:mod:`persistent_memory.backends.conversations` names
    it too); defined here so that the records below read and write it without importing
    a backend."""

    head: str | None
    seq: int
    trimmed: int
    messages: list[str]
    #: Summary._asdict() of each of its summaries, by anchor_seq (see
    #: :class:`~persistent_memory.backends.conversations.Summary`).
    summaries: NotRequired[list[dict[str, Any]]]
    #: What a backend that keeps them adds (the memory backend), so that the mirror reads
    #: only the messages it lacks: the XOR of
    #: :func:`~persistent_memory.backends.conversations.text_digest` of every message's text
    #: (hex), and the counts ``list_conversations`` gives.
    digest: NotRequired[str]
    message_count: NotRequired[int]
    tokens: NotRequired[int]
    branch_count: NotRequired[int]


#: The fields of a stored message.
STORED_FIELDS = frozenset(
    {*CHAT_FIELDS, "id", "parent_id", "seq", "metadata", "tokens", "tokenizer", "created_at"}
)
TOKENIZER_MAX_LENGTH = 200


def export_conversations(conversations: dict[str, ConversationSnapshot]) -> dict[str, Any]:
    """A snapshot's conversations as an export record holds them (messages decoded)."""
    return {
        name: {
            "head": conversation["head"],
            "seq": conversation["seq"],
            "trimmed": conversation["trimmed"],
            "messages": [json.loads(text) for text in conversation["messages"]],
            "summaries": conversation.get("summaries") or [],
        }
        for name, conversation in sorted(conversations.items())
    }


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidMessage(f"{what} must be an integer of 0 or more.")
    return value


def _stored(
    index: int, message: Any, *, max_message_bytes: int, max_depth: int
) -> tuple[dict[str, Any], str]:
    """One exported message checked, and its stored text built again."""
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise InvalidMessage(f"{where} must be an object.")
    unknown = set(message) - STORED_FIELDS
    if unknown:
        raise InvalidMessage(f"{where}: unknown fields {sorted(unknown)}.")
    message_id = validate_message_id(message.get("id"))
    parent_id = message.get("parent_id")
    if parent_id is not None:
        validate_message_id(parent_id, what="parent_id")
    seq = _count(message.get("seq"), f"{where}.seq")
    if seq < 1:
        raise InvalidMessage(f"{where}.seq must be 1 or more.")
    tokens = _count(message.get("tokens"), f"{where}.tokens")
    tokenizer = message.get("tokenizer")
    if (
        not isinstance(tokenizer, str)
        or not tokenizer.isprintable()
        or not 0 < len(tokenizer) <= TOKENIZER_MAX_LENGTH
    ):
        raise InvalidMessage(f"{where}.tokenizer must be the name of a tokenizer.")
    created_at = message.get("created_at")
    if (
        isinstance(created_at, bool)
        or not isinstance(created_at, int | float)
        or not math.isfinite(created_at)
        or created_at < 0
    ):
        raise InvalidMessage(f"{where}.created_at must be a time in seconds since the epoch.")
    chat = {field: message.get(field) for field in CHAT_FIELDS}
    chat = {field: value for field, value in chat.items() if value is not None or field == "content"}
    if message.get("metadata") is not None:
        chat["metadata"] = message["metadata"]
    _check(index, {**chat, "id": message_id})
    try:
        content_json = encode_value(chat, max_bytes=max_message_bytes, max_depth=max_depth)
    except PersistentMemoryError as exc:
        raise InvalidMessage(f"{where}: {exc}") from None
    # The layout messages.py builds at append, with the counts recorded then.
    stamp = f'"tokens": {tokens}, "tokenizer": {json.dumps(tokenizer)}, "created_at": {created_at!r}'
    text = stored_text(message_id, parent_id, seq, f"{content_json[:-1]}, {stamp}}}")
    return json.loads(text), text


def _check_tree(messages: dict[str, dict[str, Any]], head: Any, seq: int) -> None:
    """The rules a stored tree keeps: ids unique (the caller's), seqs unique and at most the
    conversation's, a parent older than its child, tool results after their call."""
    seqs = [message["seq"] for message in messages.values()]
    if len(set(seqs)) != len(seqs):
        raise InvalidMessage("two messages have the same seq.")
    if seqs and max(seqs) > seq:
        raise InvalidMessage(f"seq ({seq}) must be at least every message's seq.")
    for message in messages.values():
        parent = messages.get(message["parent_id"] or "")
        if parent is not None and parent["seq"] >= message["seq"]:
            raise InvalidMessage(f"message {message['id']!r} is older than its parent.")
        if message["role"] == "tool":
            caller = parent
            while caller is not None and caller["role"] == "tool":
                caller = messages.get(caller["parent_id"] or "")
            calls = {call["id"] for call in (caller or {}).get("tool_calls") or ()}
            if message["tool_call_id"] not in calls:
                raise InvalidMessage(f"tool message {message['id']!r} follows no call of its tool_call_id.")
    if head is not None and not isinstance(head, str):
        raise InvalidMessage("head must be a message id or null.")
    if (head is None) != (not messages) or (head is not None and head not in messages):
        raise InvalidMessage("head must be the id of one of its messages (null only without messages).")


def import_conversations(
    value: Any, *, max_message_bytes: int, max_depth: int
) -> dict[str, ConversationSnapshot]:
    """An export record's ``conversations`` checked and as a snapshot holds them (stored
    texts in seq order); :class:`InvalidMessage` saying what is wrong."""
    if not isinstance(value, dict):
        raise InvalidMessage("conversations must be an object of conversations by name.")
    result: dict[str, ConversationSnapshot] = {}
    for name, conversation in value.items():
        validate_conversation(name)
        try:
            result[name] = _conversation(
                conversation, max_message_bytes=max_message_bytes, max_depth=max_depth
            )
        except InvalidMessage as exc:
            raise InvalidMessage(f"conversation {name!r}: {exc}") from None
    return result


def _conversation(conversation: Any, *, max_message_bytes: int, max_depth: int) -> ConversationSnapshot:
    if not isinstance(conversation, dict) or not isinstance(conversation.get("messages"), list):
        raise InvalidMessage("a conversation is an object with head, seq, trimmed and messages.")
    seq = _count(conversation.get("seq"), "seq")
    trimmed = _count(conversation.get("trimmed", 0), "trimmed")
    head = conversation.get("head")
    decoded: dict[str, dict[str, Any]] = {}
    texts: dict[str, str] = {}
    for index, message in enumerate(conversation["messages"]):
        stored, text = _stored(index, message, max_message_bytes=max_message_bytes, max_depth=max_depth)
        if stored["id"] in decoded:
            raise InvalidMessage(f"messages[{index}]: id {stored['id']!r} is used twice.")
        decoded[stored["id"]], texts[stored["id"]] = stored, text
    _check_tree(decoded, head, seq)
    ordered = sorted(decoded, key=lambda message_id: decoded[message_id]["seq"])
    # Records written before summaries were kept per branch hold one, as "summary".
    legacy = conversation.get("summary")
    summaries = conversation.get("summaries", [] if legacy is None else [legacy])
    if not isinstance(summaries, list):
        raise InvalidMessage("summaries must be a list of summaries.")
    checked = [_summary(summary, decoded) for summary in summaries]
    if len({summary["anchor"] for summary in checked}) != len(checked):
        raise InvalidMessage("two summaries have the same anchor.")
    return {
        "head": head,
        "seq": seq,
        "trimmed": trimmed,
        "messages": [texts[m] for m in ordered],
        "summaries": sorted(checked, key=lambda summary: summary["anchor_seq"]),
    }


def _summary(summary: Any, messages: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One of a record's summaries, checked: its anchor a message of the conversation."""
    fields = ("text", "anchor", "anchor_seq", "tokens", "covered_tokens")
    if (
        not isinstance(summary, dict)
        or set(summary) != set(fields)
        or not isinstance(summary["text"], str)
        or summary["anchor"] not in messages
        or messages[summary["anchor"]]["seq"] != summary["anchor_seq"]
    ):
        raise InvalidMessage(
            "a summary is an object with text, anchor (a message of the conversation), its anchor_seq, "
            "tokens and covered_tokens."
        )
    for name in ("tokens", "covered_tokens"):
        _count(summary[name], f"summary {name}")
    return {name: summary[name] for name in fields}
