"""Conversations through memory_export and memory_import: exported from one backend and
imported into the other, they read the same (every branch, the heads, ids, seq, token
counts, the trimmed count) and are stored as the same bytes; a bad one is refused
before anything is written."""

from __future__ import annotations

import copy
import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from persistent_memory import get_store
from persistent_memory.operations.maintenance import InvalidRecord, parse_record
from persistent_memory.store import MemoryStore
from tests.conftest import memory_settings_for
from tests.test_conversations_mirror import WEATHER_CALL, chat, fill, reads

OPTIONS = {"MAX_MESSAGES": 8}


def run(*args: str) -> str:
    out = io.StringIO()
    call_command(*args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def everything(store: MemoryStore) -> dict[str, Any]:
    """What the filled store answers, conversations first."""
    return {
        "kept": reads(store, "kept"),
        "owned": reads(store.for_owner("user:1"), "owned"),
        "sessions": store.list_sessions(),
        "kept_values": store.get_all("kept"),
        "kept_history": store.get_history("kept", 0),
    }


@pytest.fixture
def store_on(db, settings, request):
    """Point the process store at a backend (a clean Redis keyspace for "redis")."""

    def point(backend: str) -> MemoryStore:
        url = None
        if backend == "redis":
            request.getfixturevalue("redis_client").flushdb()
            url = request.getfixturevalue("redis_url")
        settings.PERSISTENT_MEMORY = memory_settings_for(backend, url, **OPTIONS)
        return get_store()

    return point


@pytest.mark.parametrize(
    ("source", "target"), [("memory", "redis"), ("redis", "memory"), ("memory", "memory"), ("redis", "redis")]
)
def test_a_round_trip_reads_the_same(store_on, tmp_path: Path, source: str, target: str):
    store = store_on(source)
    fill(store)
    before = everything(store)
    assert before["kept"]["list"][1]["trimmed"] == 2  # "long" lost its two oldest messages
    assert before["kept"]["pinned"]["context"]["messages"][0]["role"] == "system"  # kept by the trim
    path = tmp_path / "export.jsonl"
    run("memory_export", "--output", str(path))

    imported = store_on(target)  # an empty store on the other backend
    assert imported.list_sessions() == []
    assert json.loads(run("memory_import", str(path), "--json"))["imported"] == 2
    after = everything(imported)
    assert after == before
    # Written again from the file, the stored texts are the bytes exported.
    assert after["kept"]["texts"] == before["kept"]["texts"]


def test_the_export_holds_every_branch_with_its_store_fields(store_on):
    store = store_on("memory")
    chat(store, "kept")
    (record,) = [json.loads(line) for line in run("memory_export").splitlines()]
    conversation = record["conversations"]["default"]
    assert {k: conversation[k] for k in ("head", "seq", "trimmed")} == {"head": "a2b", "seq": 6, "trimmed": 0}
    messages = {message["id"]: message for message in conversation["messages"]}
    assert [message["id"] for message in conversation["messages"]] == ["sys", "u1", "a1", "t1", "a2", "a2b"]
    assert messages["a2"]["parent_id"] == messages["a2b"]["parent_id"] == "t1"  # both branches
    assert messages["a1"]["tool_calls"] == [WEATHER_CALL]
    assert messages["a2b"]["metadata"] == {"model": "m2"}
    stored = store.get_messages("kept")["messages"]
    assert [messages[m["id"]] for m in stored] == stored  # tokens, tokenizer, created_at: as stored


def test_an_old_export_without_conversations_imports(store_on, tmp_path: Path):
    store = store_on("memory")
    store.create_session("plain")
    store.put("plain", "k", 1)
    line = json.loads(run("memory_export"))
    assert line["conversations"] == {}
    del line["conversations"]
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(line) + "\n")
    store.delete_session("plain")
    run("memory_import", str(path))
    assert store.get("plain", "k") == 1 and store.list_conversations("plain") == []


def test_an_import_writes_the_stored_layout_whatever_the_key_order(store_on):
    store = store_on("memory")
    chat(store, "kept")
    record = json.loads(run("memory_export"))
    texts = store.backend.snapshots(["kept"])["kept"]["conversations"]["default"]["messages"]
    for conversation in record["conversations"].values():
        conversation["messages"] = [dict(reversed(m.items())) for m in reversed(conversation["messages"])]
    snapshot = parse_record(json.dumps(record), max_value_bytes=1 << 20)
    assert snapshot["conversations"]["default"]["messages"] == texts


def _break(record: dict[str, Any], how: str) -> None:
    conversation = record["conversations"]["default"]
    messages = {message["id"]: message for message in conversation["messages"]}
    if how == "orphan tool result":
        messages["t1"]["parent_id"] = "u1"
    elif how == "head not a message":
        conversation["head"] = "nope"
    elif how == "same seq twice":
        messages["a2b"]["seq"] = messages["a2"]["seq"]
    elif how == "older than its parent":
        messages["u1"]["parent_id"] = "a2"
    elif how == "seq below a message's":
        conversation["seq"] = 2
    elif how == "unknown field":
        messages["u1"]["colour"] = "red"
    elif how == "bad tokens":
        messages["u1"]["tokens"] = -1
    elif how == "bad role":
        messages["u1"]["role"] = "wizard"
    elif how == "id twice":
        messages["a2b"]["id"] = "a2"
    elif how == "bad conversation name":
        record["conversations"]["bad name!"] = record["conversations"].pop("default")
    elif how == "too large":
        messages["u1"]["content"] = "x" * 2000


@pytest.mark.parametrize(
    "how",
    [
        "orphan tool result",
        "head not a message",
        "same seq twice",
        "older than its parent",
        "seq below a message's",
        "unknown field",
        "bad tokens",
        "bad role",
        "id twice",
        "bad conversation name",
        "too large",
    ],
)
def test_a_bad_conversation_is_refused(store_on, how: str):
    store = store_on("memory")
    chat(store, "kept")
    record = json.loads(run("memory_export"))
    assert parse_record(json.dumps(record), max_value_bytes=1 << 20, max_message_bytes=1000)
    broken = copy.deepcopy(record)
    _break(broken, how)
    with pytest.raises(InvalidRecord):
        parse_record(json.dumps(broken), max_value_bytes=1 << 20, max_message_bytes=1000)


def test_the_command_names_the_bad_line_and_imports_nothing(store_on, tmp_path: Path):
    store = store_on("memory")
    chat(store, "kept")
    chat(store, "other")
    good, bad = (json.loads(line) for line in run("memory_export").splitlines())
    bad["conversations"]["default"]["head"] = "nope"
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    store.delete_session("kept")
    store.delete_session("other")
    with pytest.raises(CommandError, match=r"line 2: conversation 'default': head must be"):
        run("memory_import", str(path))
    assert store.list_sessions() == []
