"""What a journal record must hold before the memory backend replays it.

A record a write made passes: its arguments are what the store's checks let through,
and the messages in it what :mod:`persistent_memory.chat.messages` prepared.
Anything else (a line edited by hand, a disk that flipped bits into valid JSON, a
journal of another program) is :class:`MalformedRecord`: skipped whole, before any of
it is applied, so a restart never fails on it and never holds half of it. The checks
are the store's own where it has them, so what a write could journal, a replay takes.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from typing import Any

from persistent_memory.backends.checkpoints import DELTA_SEP, LINK_SEP, SEP
from persistent_memory.backends.conversations import Summary
from persistent_memory.chat.messages import (
    stored_text,
    validate_conversation,
    validate_message_id,
)
from persistent_memory.chat.records import (
    _stored,  # an exported message's rules: a journaled one is the same message
    import_conversations,
)
from persistent_memory.exceptions import PersistentMemoryError
from persistent_memory.owners import OWNED_MARK, split_storage_id, validate_owner
from persistent_memory.validation import (
    encode_value,
    validate_int,
    validate_key,
    validate_run_id,
    validate_session_id,
    validate_ttl,
)

# A replay takes what was admitted once, whatever the caps are now: no size or depth limit
# of its own (json.loads has parsed the line, so its depth is bounded already).
_ANY_SIZE = sys.maxsize
_ANY_DEPTH = 10**6


#: What a check raises on a shape it did not expect: a field missing, a number where a
#: string goes, text that is not JSON (besides the store's own PersistentMemoryError).
_SHAPE_ERRORS = (
    PersistentMemoryError,
    ValueError,
    TypeError,
    KeyError,
    IndexError,
    AttributeError,
    RecursionError,
)


class MalformedRecord(ValueError):
    """A journal record that no write made: skipped, never applied."""


def check_storage_id(sid: Any) -> None:
    """A session's storage id (see :mod:`persistent_memory.owners`)."""
    if not isinstance(sid, str):
        raise MalformedRecord("the session id is not a string")
    owner, session_id = split_storage_id(sid)
    if sid.startswith(OWNED_MARK):
        validate_owner(owner or None)
    validate_session_id(session_id)


def check_run_ref(ref: Any) -> None:
    """A run binding's ref (see ``owners.run_ref``): ``~run:{run_id}``, or
    ``~o:{owner}~:run:{run_id}``."""
    if not isinstance(ref, str):
        raise MalformedRecord("the run ref is not a string")
    if ref.startswith(OWNED_MARK):
        owner, mark, run_id = ref.removeprefix(OWNED_MARK).partition("~:run:")
        validate_owner(owner if mark else None)
    else:
        run_id = ref.removeprefix("~run:") if ref.startswith("~run:") else ""
    validate_run_id(run_id)


def _fail(what: str) -> MalformedRecord:
    return MalformedRecord(what)


def _number(value: Any, what: str, *, nullable: bool = False) -> None:
    if value is None and nullable:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise _fail(f"{what} is not a finite number")


def _string(value: Any, what: str, *, nullable: bool = False) -> None:
    if not (isinstance(value, str) or (value is None and nullable)):
        raise _fail(f"{what} is not a string")


def _count(value: Any, what: str, *, nullable: bool = False) -> None:
    if value is None and nullable:
        return
    validate_int(value, name=what, minimum=0)


def _json_text(value: Any, what: str, *, nullable: bool = False) -> None:
    """A value as the store keeps it: JSON text as ``encode_value`` writes it (ASCII, no
    NaN, no lone surrogate), which reads decode and the API can send."""
    if value is None and nullable:
        return
    _string(value, what)
    if not value.isascii():
        raise _fail(f"{what} is not the store's JSON text")
    encode_value(json.loads(value), max_bytes=_ANY_SIZE, max_depth=_ANY_DEPTH)


def _list(value: Any, what: str, length: int | None = None) -> list[Any]:
    if not isinstance(value, list) or (length is not None and len(value) != length):
        raise _fail(f"{what} is not a list{'' if length is None else f' of {length}'}")
    return value


def _dict(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(f"{what} is not an object")
    return value


def check_message(item: Any) -> None:
    """A journaled message, ``[id, body, link]`` (see ``memory.conversations.journaled``):
    the body a message the append's rules take, and the link the one it makes."""
    message_id, body, link = _list(item, "a message", 3)
    validate_message_id(message_id)
    _string(body, "a message's body")
    _string(link, "a message's link")
    if body[:1] != "{" or link[:1] != "{":
        raise _fail("a message's body or link is not a JSON object")
    stored = json.loads(stored_text(message_id, None, 1, body))
    # The body must not name the fields the backend writes before it (a later one wins).
    if stored.get("id") != message_id or stored.get("parent_id") is not None or stored.get("seq") != 1:
        raise _fail("a message's body holds its own id, parent or seq")
    _stored(0, stored, max_message_bytes=_ANY_SIZE, max_depth=_ANY_DEPTH)
    calls = [call["id"] for call in stored.get("tool_calls") or ()]
    data = json.loads(link)
    expected = {"t": stored["tokens"], "r": stored["role"], "c": calls, "a": stored.get("tool_call_id")}
    if (
        not isinstance(data, dict)
        or set(data) != {*expected, "f"}
        or {name: data[name] for name in expected} != expected
        or type(data["t"]) is not int
        or not isinstance(data["f"], str)
    ):
        raise _fail("a message's link does not match its body")


def _messages(items: Any) -> None:
    for item in _list(items, "the messages"):
        check_message(item)


def _question(asked: Any) -> None:
    """The enrich lane's question: conversation, message, then the window's options."""
    asked = _list(asked, "the question")
    if not 2 <= len(asked) <= 6:
        raise _fail("the question has the wrong length")
    validate_conversation(asked[0])
    check_message(asked[1])
    for limit in asked[2:4]:  # max_tokens, max_messages
        _count(limit, "a window limit", nullable=True)
    if not all(isinstance(option, bool) for option in asked[4:]):  # rolling, reserve_summary
        raise _fail("a window option is not a boolean")


def _delta(text: str) -> None:
    """A channel value; a delta names its base in four parts (see ``delta_base``)."""
    if text.startswith("d" + DELTA_SEP) and text.count(DELTA_SEP) < 4:
        raise _fail("a channel value is a delta without its base")


def _writes_text(writes: Any) -> None:
    for write in _list(writes, "the writes"):
        task_id, idx, channel, value, task_path = _list(write, "a write", 5)
        for text in (task_id, channel, value, task_path):
            _string(text, "a write's field")
        validate_int(idx, name="a write's idx")


def _checkpoint_name(name: Any, *, empty: bool = False) -> None:
    if not isinstance(name, str) or (not name and not empty) or LINK_SEP in name or SEP in name:
        raise _fail("a checkpoint namespace or id is malformed")


def _entries(entries: Any) -> None:
    """Checkpoint entries, by the rules ``load_checkpoint_entries`` and an import check."""
    for name, text in _dict(entries, "the checkpoint entries").items():
        if not name or name[0] not in "clwb" or SEP not in name:
            raise _fail(f"a checkpoint entry name {name!r} is malformed")
        _string(text, "a checkpoint entry")


_SNAPSHOT_FIELDS = {"info", "values", "history", "conversations", "checkpoints"}


def _snapshot(snapshot: Any) -> None:
    """A whole session, as ``restore_session`` journals it."""
    snapshot = _dict(snapshot, "the snapshot")
    if not {"info", "values", "history"} <= set(snapshot) <= _SNAPSHOT_FIELDS:
        raise _fail("the snapshot has the wrong fields")
    info = _dict(snapshot["info"], "the snapshot's info")
    if not {"created_at", "ttl_seconds", "expires_at"} <= set(info):
        raise _fail("the snapshot's info lacks its times")
    _number(info.get("created_at"), "created_at")
    validate_ttl(info.get("ttl_seconds"))
    _number(info.get("expires_at"), "expires_at", nullable=True)
    validate_ttl(info.get("idle_ttl_seconds"), name="idle_ttl_seconds")
    for key, text in _dict(snapshot["values"], "the values").items():
        validate_key(key)
        _json_text(text, "a value")
    for entry in _list(snapshot["history"], "the history"):
        if not isinstance(_dict(entry, "a history entry").get("op"), str):
            raise _fail("a history entry has no op")
        _number(entry.get("timestamp"), "a history entry's timestamp")
    encode_value(snapshot["history"], max_bytes=_ANY_SIZE, max_depth=_ANY_DEPTH)
    conversations = _dict(snapshot.get("conversations", {}), "the conversations")
    decoded = {}
    for name, tree in conversations.items():
        tree = _dict(tree, "a conversation")
        decoded[name] = {
            **{field: tree.get(field) for field in ("head", "seq", "trimmed")},
            "summaries": tree.get("summaries") or [],
            "messages": [json.loads(text) for text in _list(tree.get("messages"), "its messages")],
        }
    import_conversations(decoded, max_message_bytes=_ANY_SIZE, max_depth=_ANY_DEPTH)
    _entries(snapshot.get("checkpoints", {}))


def _summary(summary: Any) -> None:
    summary = _dict(summary, "the summary")
    if set(summary) != set(Summary._fields):
        raise _fail("the summary has the wrong fields")
    _string(summary["text"], "the summary's text")
    validate_message_id(summary["anchor"])
    for name in ("anchor_seq", "tokens", "covered_tokens"):
        _count(summary[name], name)


def _thread_write(write: Any) -> None:
    """A ``RecordWrite``: key, expected revision, new JSON text, parent and head."""
    key, expected, value, parent, head = _list(write, "the record write", 5)
    validate_key(key)
    _string(expected, "the expected revision", nullable=True)
    _json_text(value, "the record", nullable=True)
    if value is None and expected is None:  # a removal always names the revision removed
        raise _fail("a record removal without its revision")
    for message_id in (parent, head):
        if message_id is not None:
            validate_message_id(message_id)


# One check per operation, taking the record's arguments as its write journaled them
# (trailing ones with a default: a write leaves them out, or an older journal lacks them).


def _create(ttl: Any, idle: Any = None) -> None:
    validate_ttl(ttl)
    validate_ttl(idle, name="idle_ttl_seconds")


def _delete() -> None:
    return None


def _put(key: Any, value: Any) -> None:
    validate_key(key)
    _json_text(value, "the value")


def _increment(key: Any, amount: Any) -> None:
    validate_key(key)
    validate_int(amount, name="amount")


def _clear(key: Any) -> None:
    if key is not None:
        validate_key(key)


def _summarize(max_entries: Any) -> None:
    _count(max_entries, "max_entries")


def _enrich(ttl: Any, run_ref: Any, run_ttl: Any, asked: Any = None) -> None:
    validate_ttl(ttl)
    if run_ref is not None:
        check_run_ref(run_ref)
    validate_ttl(run_ttl)
    if asked is not None:
        _question(asked)


def _answer(answer: Any, ttl: Any, answered: Any = None, run_ref: Any = None) -> None:
    """The answer's JSON text, then (the store lane's message) conversation, message, parent."""
    _json_text(answer, "the answer")
    validate_ttl(ttl)
    if answered is not None:
        conversation, item, parent = _list(answered, "the answered message", 3)
        validate_conversation(conversation)
        check_message(item)
        if parent is not None:
            validate_message_id(parent)
    if run_ref is not None:
        check_run_ref(run_ref)


def _restore(snapshot: Any, replace: Any) -> None:
    _snapshot(snapshot)
    if not isinstance(replace, bool):
        raise _fail("replace is not a boolean")


def _bind(session_id: Any, until: Any, question: Any = None) -> None:
    """A run binding (the record's session id is the run's ref): its session, its end, and
    the enrich lane's question (conversation, message id)."""
    check_storage_id(session_id)
    _number(until, "the binding's end")
    if question is not None:
        conversation, message_id = _list(question, "the binding's question", 2)
        validate_conversation(conversation)
        validate_message_id(message_id)


def _append(conversation: Any, parent: Any, items: Any, ttl: Any) -> None:
    validate_conversation(conversation)
    if parent is not None:
        validate_message_id(parent)
    _messages(items)
    validate_ttl(ttl)


def _head(conversation: Any, message_id: Any) -> None:
    validate_conversation(conversation)
    validate_message_id(message_id)


def _pop(conversation: Any, head: Any, items: Any) -> None:
    validate_conversation(conversation)
    validate_message_id(head)
    _messages(items)


def _thread(conversation: Any, write: Any, items: Any, ttl: Any) -> None:
    validate_conversation(conversation)
    _thread_write(write)
    _messages(items)
    validate_ttl(ttl)


def _commit_summary(conversation: Any, expected: Any, summary: Any) -> None:
    validate_conversation(conversation)
    if expected is not None:
        validate_message_id(expected)
    _summary(summary)


def _cp_put(ns: Any, checkpoint_id: Any, record: Any, link_text: Any, blobs: Any, ttl: Any) -> None:
    _checkpoint_name(ns, empty=True)
    _checkpoint_name(checkpoint_id)
    _string(record, "the checkpoint record")
    _string(link_text, "the checkpoint link")
    for ref, text in _dict(blobs, "the channel values").items():
        _string(ref, "a channel value's ref")
        _string(text, "a channel value")
        _delta(text)
    validate_ttl(ttl)


def _cp_writes(ns: Any, checkpoint_id: Any, writes: Any, ttl: Any) -> None:
    _checkpoint_name(ns, empty=True)
    _checkpoint_name(checkpoint_id)
    _writes_text(writes)
    validate_ttl(ttl)


def _cp_prune(run_ids: Any) -> None:
    if run_ids is not None:
        for run_id in _list(run_ids, "the run ids"):
            _string(run_id, "a run id")


def _cp_load(entries: Any, ttl: Any) -> None:
    _entries(entries)
    validate_ttl(ttl)


#: Per operation: the fewest and most arguments after the record's head, and their check.
CHECKS: dict[str, tuple[int, int, Callable[..., None]]] = {
    "create": (1, 2, _create),
    "delete": (0, 0, _delete),
    "put": (2, 2, _put),
    "increment": (2, 2, _increment),
    "clear": (1, 1, _clear),
    "summarize": (1, 1, _summarize),
    "enrich": (3, 4, _enrich),
    "answer": (2, 4, _answer),
    "restore": (2, 2, _restore),
    "bind": (2, 3, _bind),
    "messages": (4, 4, _append),
    "head": (2, 2, _head),
    "clear_messages": (1, 1, validate_conversation),
    "pop": (3, 3, _pop),
    "thread": (4, 4, _thread),
    "summary": (3, 3, _commit_summary),
    "cp_put": (6, 6, _cp_put),
    "cp_writes": (4, 4, _cp_writes),
    "cp_prune": (1, 1, _cp_prune),
    "cp_load": (2, 2, _cp_load),
    "cp_replace": (2, 2, _cp_load),
}


def check_record(op: str, session_id: str, args: list[Any]) -> None:
    """Raise :class:`MalformedRecord` unless ``op`` is known and ``args`` are what its write
    journals (``session_id`` is the record's: a run's ref for ``bind``)."""
    spec = CHECKS.get(op)
    if spec is None:
        raise MalformedRecord(f"unknown operation {op!r}")
    fewest, most, check = spec
    if not fewest <= len(args) <= most:
        raise MalformedRecord(f"{op}: {len(args)} arguments, not {fewest}-{most}")
    try:
        (check_run_ref if op == "bind" else check_storage_id)(session_id)
        check(*args)
    except MalformedRecord as exc:
        raise MalformedRecord(f"{op}: {exc}") from None
    except _SHAPE_ERRORS as exc:
        raise MalformedRecord(f"{op}: {type(exc).__name__}: {exc}"[:300]) from None
