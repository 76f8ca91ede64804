"""The conversations contract, on both backends, through the store's Python API: messages
and their store fields, threads and heads, idempotent appends and conflicts, orphan tool
results, validation, MAX_MESSAGES trimming, windows, listing, clearing, session ends,
TTL alignment and the sweep on Redis, owner isolation, and one round trip per method."""

from __future__ import annotations

import copy
import json
import math
import re
import time
from typing import Any

import pytest
import redis

from persistent_memory import get_store
from persistent_memory.backends.conversations import Summary
from persistent_memory.backends.redis import RedisBackend
from persistent_memory.chat.messages import CHAT_FIELDS, MESSAGE_ID_PATTERN
from persistent_memory.conversations.summaries import summary_tokens
from persistent_memory.exceptions import (
    HeadMoved,
    InvalidMessage,
    InvalidValue,
    MessageConflict,
    MessageNotFound,
    OrphanToolResult,
    QuotaExceeded,
    RevisionConflict,
    SessionNotFound,
)
from persistent_memory.operations import maintenance
from persistent_memory.pipeline import MemoryFilter
from persistent_memory.store import MemoryStore
from tests.chat import assistant, calling, ids, result, system, tool_call, user
from tests.conftest import TOPOLOGIES, CountingConnection, memory_settings_for, pttls
from tests.timing import LIVE_TTL, wait_past

PREFIX = "rr:memory"


@pytest.fixture(params=TOPOLOGIES)
def backend_name(request: pytest.FixtureRequest) -> str:
    """This suite runs on every Redis setup (tests.conftest.TOPOLOGIES), not only one server."""
    return request.param


def thread(store: MemoryStore, session_id: str = "s1", **options: Any) -> list[dict[str, Any]]:
    return store.get_messages(session_id, **options)["messages"]


def contents(messages: list[dict[str, Any]]) -> list[Any]:
    return [message["content"] for message in messages]


def conversation_info(store: MemoryStore, session_id: str = "s1", name: str = "default") -> dict[str, Any]:
    (info,) = [info for info in store.list_conversations(session_id) if info["conversation"] == name]
    return info


def state(store: MemoryStore, session_id: str = "s1", conversation: str = "default") -> tuple[Any, ...]:
    """Everything an append could change in a conversation, to compare before and after."""
    read = store.get_messages(session_id, conversation=conversation)
    infos = {info["conversation"]: info for info in store.list_conversations(session_id)}
    return read["head"], read["messages"], infos, store.get_history(session_id, 0)


def assert_no_session(store: MemoryStore, session_id: str) -> None:
    with pytest.raises(SessionNotFound):
        store.session_info(session_id)


# Messages and their store fields -----------------------------------------------------------


def test_add_and_get_messages(store):
    before = time.time()
    added = store.add_messages(
        "s1",
        [
            system("Be brief."),
            user("Hi", name="alice", metadata={"client": "web", "nested": {"n": [1, 2]}}),
            assistant("Hello!"),
        ],
    )
    stored = added["messages"]
    assert added["conversation"] == "default"
    assert added["head"] == stored[-1]["id"]
    assert [m["seq"] for m in stored] == [1, 2, 3]
    assert [m["parent_id"] for m in stored] == [None, stored[0]["id"], stored[1]["id"]]
    assert [m["role"] for m in stored] == ["system", "user", "assistant"]
    assert contents(stored) == ["Be brief.", "Hi", "Hello!"]
    assert stored[1]["name"] == "alice"
    assert stored[1]["metadata"] == {"client": "web", "nested": {"n": [1, 2]}}
    assert "metadata" not in stored[0] and "name" not in stored[0]
    for message in stored:
        assert MESSAGE_ID_PATTERN.fullmatch(message["id"])
        assert isinstance(message["tokens"], int) and message["tokens"] > 3
        assert message["tokenizer"] == "o200k_base"
        assert before <= message["created_at"] <= time.time()
    read = store.get_messages("s1")
    assert read == {"conversation": "default", "head": added["head"], "messages": stored}
    assert store.session_info("s1")["session_id"] == "s1"  # the append created the session


def test_tool_calls_are_stored_and_read_back(store):
    call = tool_call("call_1", "weather", '{"city": "Paris"}')
    stored = store.add_messages(
        "s1",
        [user("Weather?"), assistant(None, tool_calls=[call]), result("call_1", "18C", name="weather")],
    )["messages"]
    assert stored[1]["tool_calls"] == [call] and stored[1]["content"] is None
    assert stored[2]["tool_call_id"] == "call_1" and stored[2]["name"] == "weather"
    assert thread(store) == stored


def test_content_parts_are_kept(store):
    parts = [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
    ]
    (stored,) = store.add_messages("s1", [user(parts)])["messages"]
    assert stored["content"] == parts
    assert store.get_context("s1")["messages"] == [{"role": "user", "content": parts}]


def test_seq_strictly_increasing_per_conversation(store):
    first = store.add_messages("s1", [user("a"), assistant("b")])["messages"]
    second = store.add_messages("s1", [user("c")])["messages"]
    branch = store.add_messages("s1", [assistant("b2")], parent_id=first[0]["id"])["messages"]
    other = store.add_messages("s1", [user("x")], conversation="other")["messages"]
    assert [m["seq"] for m in first + second + branch] == [1, 2, 3, 4]  # a branch takes the next seq
    assert [m["seq"] for m in other] == [1]  # each conversation counts its own
    store.add_messages("s1", [user("d"), user("e")])
    assert [m["seq"] for m in thread(store)] == [1, 4, 5, 6]


def test_generated_ids_are_unique_and_sort_by_creation(store):
    made = []
    for i in range(30):
        made += store.add_messages("s1", [user(f"m{i}")])["messages"]
    made += store.add_messages("s1", [user(f"batch{i}") for i in range(40)])["messages"]
    messages = thread(store)
    assert ids(messages) == ids(made)
    assert len(set(ids(messages))) == 70
    assert sorted(ids(messages)) == ids(messages)  # in seq order, within a batch too
    assert all(MESSAGE_ID_PATTERN.fullmatch(message_id) for message_id in ids(messages))


def test_generated_ids_differ_across_sessions_and_conversations(store):
    made = []
    for session_id in ("s1", "s2"):
        for name in ("default", "other"):
            made += store.add_messages(session_id, [user("same")] * 1, conversation=name)["messages"]
    assert len(set(ids(made))) == 4


def test_caller_ids_are_kept(store):
    stored = store.add_messages(
        "s1",
        [user("q", id="chatcmpl-9aB_c.1:x"), assistant("a", id="0b1c2d3e-aaaa-bbbb-cccc-000000000001")],
    )["messages"]
    assert ids(stored) == ["chatcmpl-9aB_c.1:x", "0b1c2d3e-aaaa-bbbb-cccc-000000000001"]
    assert stored[1]["parent_id"] == "chatcmpl-9aB_c.1:x"
    assert ids(thread(store)) == ids(stored)
    # The same caller id may be used in another conversation of the session.
    other = store.add_messages("s1", [user("q", id="chatcmpl-9aB_c.1:x")], conversation="other")
    assert other["messages"][0]["seq"] == 1


# Threads and heads ----------------------------------------------------------------------


def test_default_parent_is_the_head(store):
    for i in range(4):
        store.add_messages("s1", [user(f"q{i}") if i % 2 == 0 else assistant(f"a{i}")])
    messages = thread(store)
    assert [m["parent_id"] for m in messages] == [None, *ids(messages)[:-1]]
    assert store.get_messages("s1")["head"] == messages[-1]["id"]


def test_a_regenerated_answer_replaces_the_old_one(store):
    question, old = store.add_messages("s1", [user("Capital of France?"), assistant("Lyon")])["messages"]
    regenerated = store.add_messages("s1", [assistant("Paris")], parent_id=question["id"])
    new = regenerated["messages"][0]
    assert regenerated["head"] == new["id"] and new["parent_id"] == question["id"]
    assert contents(thread(store)) == ["Capital of France?", "Paris"]
    assert [m["content"] for m in store.get_context("s1")["messages"]] == ["Capital of France?", "Paris"]
    # The old answer is kept, readable through its id.
    assert contents(thread(store, leaf=old["id"])) == ["Capital of France?", "Lyon"]
    # The chat goes on from the regenerated answer.
    follow = store.add_messages("s1", [user("And Spain?")])["messages"][0]
    assert follow["parent_id"] == new["id"]
    assert contents(thread(store)) == ["Capital of France?", "Paris", "And Spain?"]


def test_branching_from_an_older_message(store):
    stored = store.add_messages("s1", [user("1"), assistant("2"), user("3"), assistant("4")])["messages"]
    store.add_messages("s1", [user("3b"), assistant("4b")], parent_id=stored[1]["id"])
    assert contents(thread(store)) == ["1", "2", "3b", "4b"]
    assert contents(thread(store, leaf=stored[3]["id"])) == ["1", "2", "3", "4"]
    assert conversation_info(store)["message_count"] == 6
    assert conversation_info(store)["branch_count"] == 2


def test_set_head_moves_reads_to_another_branch(store):
    question, old = store.add_messages("s1", [user("q"), assistant("old")])["messages"]
    new = store.add_messages("s1", [assistant("new")], parent_id=question["id"])["messages"][0]
    assert store.set_head("s1", old["id"]) == old["id"]
    assert store.get_messages("s1")["head"] == old["id"]
    assert contents(thread(store)) == ["q", "old"]
    assert [m["content"] for m in store.get_context("s1")["messages"]] == ["q", "old"]
    after = store.add_messages("s1", [user("next")])["messages"][0]
    assert after["parent_id"] == old["id"]
    # Back to the other branch, and to a message in the middle of a thread.
    store.set_head("s1", new["id"])
    assert contents(thread(store)) == ["q", "new"]
    store.set_head("s1", question["id"])
    assert contents(thread(store)) == ["q"]
    assert store.add_messages("s1", [assistant("third")])["messages"][0]["parent_id"] == question["id"]


def test_set_head_to_a_missing_message(store):
    store.add_messages("s1", [user("q")])
    head = store.get_messages("s1")["head"]
    with pytest.raises(MessageNotFound) as missing:
        store.set_head("s1", "nope")
    assert str(missing.value) == "Conversation 'default' has no message 'nope'."
    with pytest.raises(MessageNotFound):
        store.set_head("s1", head, conversation="other")  # ids are per conversation
    with pytest.raises(InvalidMessage):
        store.set_head("s1", "bad id!")
    with pytest.raises(SessionNotFound):
        store.set_head("s2", head)
    assert store.get_messages("s1")["head"] == head


def test_get_messages_limit_and_leaf(store):
    stored = store.add_messages("s1", [user(str(i)) for i in range(6)])["messages"]
    assert contents(thread(store, limit=2)) == ["4", "5"]
    assert contents(thread(store, limit=6)) == [str(i) for i in range(6)]
    assert contents(thread(store, limit=100)) == [str(i) for i in range(6)]
    assert contents(thread(store, leaf=stored[3]["id"])) == ["0", "1", "2", "3"]
    assert contents(thread(store, leaf=stored[3]["id"], limit=2)) == ["2", "3"]
    assert contents(thread(store, leaf=stored[0]["id"], limit=5)) == ["0"]
    # A read through a leaf does not move the head.
    assert store.get_messages("s1", leaf=stored[2]["id"])["head"] == stored[-1]["id"]
    for limit in (0, -1, "2", 1.5, True):
        with pytest.raises(InvalidValue):
            store.get_messages("s1", limit=limit)
    with pytest.raises(MessageNotFound):
        store.get_messages("s1", leaf="missing")
    with pytest.raises(InvalidMessage):
        store.get_messages("s1", leaf="not valid")


def test_reads_of_missing_sessions_and_conversations(store):
    for read in (
        lambda: store.get_messages("nobody"),
        lambda: store.get_context("nobody"),
        lambda: store.list_conversations("nobody"),
        lambda: store.clear_messages("nobody"),
    ):
        with pytest.raises(SessionNotFound):
            read()
    assert_no_session(store, "nobody")  # reads create nothing
    store.create_session("s1")
    assert store.get_messages("s1") == {"conversation": "default", "head": None, "messages": []}
    assert store.get_context("s1") == {
        "conversation": "default",
        "messages": [],
        "tokens": 0,
        "truncated": False,
    }
    assert store.list_conversations("s1") == []
    with pytest.raises(MessageNotFound):
        store.get_messages("s1", leaf="missing")


def test_conversation_names_follow_the_key_rules(store):
    store.add_messages("s1", [user("q")], conversation="node.summarize-1")
    assert [info["conversation"] for info in store.list_conversations("s1")] == ["node.summarize-1"]
    for name in ("", "a b", "x" * 1000, 5, None):
        with pytest.raises(InvalidMessage):
            store.add_messages("s1", [user("q")], conversation=name)
        with pytest.raises(InvalidMessage):
            store.get_messages("s1", conversation=name)
        with pytest.raises(InvalidMessage):
            store.get_context("s1", conversation=name)


# Idempotent appends and conflicts --------------------------------------------------------


def test_resending_the_same_message_is_a_no_op(store):
    first = store.add_messages("s1", [user("q", id="m1"), assistant("a", id="m2", metadata={"k": 1})])
    before = state(store)
    again = store.add_messages("s1", [user("q", id="m1"), assistant("a", id="m2", metadata={"k": 1})])
    assert again["messages"] == first["messages"]  # the stored messages, seq and created_at included
    assert again["head"] == first["head"]
    assert state(store) == before
    one = store.add_messages("s1", [assistant("a", id="m2", metadata={"k": 1})])
    assert one["messages"] == first["messages"][1:]
    assert state(store) == before


def test_resending_after_the_chat_went_on_leaves_the_head(store):
    store.add_messages("s1", [user("q", id="m1"), assistant("a", id="m2")])
    store.add_messages("s1", [user("q2", id="m3")])
    before = state(store)
    again = store.add_messages("s1", [user("q", id="m1")])
    assert again["messages"][0]["seq"] == 1 and again["head"] == "m3"
    assert state(store) == before


def test_a_retried_batch_stores_only_what_is_new(store):
    store.add_messages("s1", [user("q", id="m1")])
    retried = store.add_messages("s1", [user("q", id="m1"), assistant("a", id="m2")])
    assert [m["seq"] for m in retried["messages"]] == [1, 2]
    assert retried["messages"][1]["parent_id"] == "m1"
    assert ids(thread(store)) == ["m1", "m2"] and retried["head"] == "m2"


def test_a_retried_batch_goes_on_from_its_stored_call(store):
    store.add_messages("s1", [user("q", id="m1"), calling("c1", "c2", id="m2")])
    retried = store.add_messages("s1", [calling("c1", "c2", id="m2"), result("c1", id="m3")])
    assert [m["seq"] for m in retried["messages"]] == [2, 3]  # the call as stored, its result new
    assert retried["messages"][1]["parent_id"] == "m2"
    store.add_messages("s1", [calling("c1", "c2", id="m2"), result("c1", id="m3"), result("c2", id="m4")])
    assert ids(thread(store)) == ["m1", "m2", "m3", "m4"]


def test_a_restored_conversation_takes_a_resent_message_as_a_no_op(store):
    first = store.add_messages("s1", [user("q", id="m1"), assistant("a", id="m2", metadata={"k": 1})])
    store.backend.restore_session(store.backend.snapshots(["s1"])["s1"], replace=True)
    before = state(store)
    again = store.add_messages("s1", [user("q", id="m1"), assistant("a", id="m2", metadata={"k": 1})])
    assert again["messages"] == first["messages"] and state(store) == before
    with pytest.raises(MessageConflict):
        store.add_messages("s1", [assistant("other", id="m2")])


@pytest.mark.parametrize(
    "changed",
    [
        user("other text", id="m1"),
        assistant("q", id="m1"),
        user("q", id="m1", name="bob"),
        user("q", id="m1", metadata={"k": 2}),
        user([{"type": "text", "text": "q"}], id="m1"),
    ],
    ids=["content", "role", "name", "metadata", "content-parts"],
)
def test_the_same_id_with_other_content_is_a_conflict(store, changed):
    store.add_messages("s1", [user("q", id="m1", metadata={"k": 1})])
    store.add_messages("s1", [assistant("a", id="m2")])
    before = state(store)
    with pytest.raises(MessageConflict) as info:
        store.add_messages("s1", [changed])
    assert "m1" in str(info.value)
    assert state(store) == before
    # A new message before the conflicting one in the same call is not written either.
    with pytest.raises(MessageConflict):
        store.add_messages("s1", [user("new", id="m9"), changed])
    assert state(store) == before
    with pytest.raises(MessageNotFound):
        store.get_messages("s1", leaf="m9")


# Orphan tool results ----------------------------------------------------------------------


def test_tool_results_answer_open_calls(store):
    stored = store.add_messages(
        "s1", [user("q"), calling("c1", "c2"), result("c2"), result("c1"), assistant("done")]
    )["messages"]
    assert [m["role"] for m in stored] == ["user", "assistant", "tool", "tool", "assistant"]
    # Results may also come in later calls, one at a time.
    store.add_messages("s1", [calling("c3", "c4")])
    store.add_messages("s1", [result("c3")])
    store.add_messages("s1", [result("c4")])
    # And on a branch from the calling message.
    calling_message = stored[1]
    store.add_messages("s1", [result("c1", "other")], parent_id=calling_message["id"])
    assert [m["role"] for m in thread(store)] == ["user", "assistant", "tool"]


@pytest.mark.parametrize(
    "before_messages, batch",
    [
        ([], [result("c1")]),
        ([user("q")], [result("c1")]),
        ([user("q"), calling("c1"), result("c1")], [result("c1")]),
        ([user("q"), calling("c1")], [user("more"), result("c1")]),
        ([user("q"), calling("c1"), user("more")], [result("c1")]),
        ([user("q"), calling("c1")], [result("c2")]),
        ([user("q")], [calling("c1"), result("c1"), result("c2")]),
        ([user("q")], [calling("c1"), result("c1"), result("c1", "twice")]),
        ([user("q"), calling("c1"), system("note")], [result("c1")]),
    ],
    ids=[
        "new-session",
        "no-call",
        "already-answered",
        "user-between-in-batch",
        "after-a-user-message",
        "unknown-call",
        "batch-unknown-call",
        "batch-answered-twice",
        "system-between",
    ],
)
def test_orphan_tool_results_are_refused_with_nothing_written(store, before_messages, batch):
    if before_messages:
        store.add_messages("s1", before_messages)
        before = state(store)
    with pytest.raises(
        OrphanToolResult, match=r"must follow the assistant message that called it\)\.$"
    ) as info:
        store.add_messages("s1", batch)
    assert info.value.code == "orphan_tool_result"
    if before_messages:
        assert state(store) == before
    else:
        assert_no_session(store, "s1")


def test_an_orphan_on_a_branch_is_refused(store):
    stored = store.add_messages("s1", [user("q"), calling("c1"), result("c1"), assistant("a")])["messages"]
    before = state(store)
    with pytest.raises(OrphanToolResult):
        store.add_messages("s1", [result("c1")], parent_id=stored[0]["id"])  # the call is not on that thread
    with pytest.raises(OrphanToolResult):
        store.add_messages("s1", [result("c1")], parent_id=stored[2]["id"])  # already answered there
    assert state(store) == before


# Validation ----------------------------------------------------------------------------------

BAD_BATCHES = {
    "not-a-list": {"role": "user", "content": "q"},
    "empty": [],
    "not-an-object": ["q"],
    "bad-role": [{"role": "robot", "content": "q"}],
    "no-role": [{"content": "q"}],
    "tool-calls-on-user": [user("q", tool_calls=[tool_call("c1")])],
    "tool-calls-on-tool": [result("c1", tool_calls=[tool_call("c2")])],
    "empty-tool-calls": [assistant("a", tool_calls=[])],
    "tool-call-not-function": [assistant(None, tool_calls=[{**tool_call("c1"), "type": "code"}])],
    "tool-call-extra-field": [assistant(None, tool_calls=[{**tool_call("c1"), "x": 1}])],
    "tool-call-arguments-not-string": [
        assistant(
            None, tool_calls=[{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {}}}]
        )
    ],
    "tool-call-id-twice": [assistant(None, tool_calls=[tool_call("c1"), tool_call("c1")])],
    "missing-tool-call-id": [{"role": "tool", "content": "42"}],
    "tool-call-id-on-user": [user("q", tool_call_id="c1")],
    "no-content": [{"role": "user"}],
    "null-content-on-user": [user(None)],
    "null-content-without-calls": [assistant(None)],
    "number-content": [user(5)],
    "empty-parts": [user([])],
    "part-without-type": [user([{"text": "q"}])],
    "text-part-without-text": [user([{"type": "text"}])],
    "image-part-in-tool": [result("c1", [{"type": "image_url", "image_url": {"url": "x"}}])],
    "unknown-field": [user("q", temperature=0.2)],
    "bad-name": [user("q", name="with space")],
    "metadata-not-object": [user("q", metadata=[1])],
    "bad-id": [user("q", id="has space")],
    "id-twice-in-call": [user("q", id="m1"), assistant("a", id="m1")],
    "nan-in-metadata": [user("q", metadata={"x": float("nan")})],
    "lone-surrogate": [user("\ud800")],
    "too-many": [user(str(i)) for i in range(101)],
}


@pytest.mark.parametrize("batch", list(BAD_BATCHES.values()), ids=list(BAD_BATCHES))
def test_invalid_messages_are_refused_with_nothing_written(store, batch):
    with pytest.raises(InvalidValue):
        store.add_messages("new", batch)
    assert_no_session(store, "new")
    store.add_messages("s1", [user("q", id="m0")])
    before = state(store)
    with pytest.raises(InvalidValue) as info:
        store.add_messages(
            "s1", [user("first", id="m-first"), *batch] if batch and isinstance(batch, list) else batch
        )
    assert isinstance(info.value, InvalidMessage) or info.value.code in ("invalid_unicode", "invalid_value")
    assert state(store) == before


def test_max_batch_is_the_most_messages_per_call(configure):
    store = configure(MAX_BATCH=5)
    assert len(store.add_messages("s1", [user(str(i)) for i in range(5)])["messages"]) == 5
    with pytest.raises(InvalidMessage, match="MAX_BATCH"):
        store.add_messages("s1", [user(str(i)) for i in range(6)])
    assert conversation_info(store)["message_count"] == 5


def test_max_message_bytes(configure):
    store = configure(MAX_MESSAGE_BYTES=2000)
    store.add_messages("s1", [user("x" * 1900)])
    before = state(store)
    with pytest.raises(InvalidMessage, match="MAX_MESSAGE_BYTES"):
        store.add_messages("s1", [user("ok"), user("x" * 2001)])
    with pytest.raises(InvalidMessage, match="MAX_MESSAGE_BYTES"):
        store.add_messages("s1", [user("x", metadata={"blob": "y" * 2000})])  # metadata counts too
    assert state(store) == before


def test_a_missing_parent_is_refused(store):
    store.add_messages("s1", [user("q")])
    before = state(store)
    with pytest.raises(MessageNotFound, match="has no message 'missing'"):
        store.add_messages("s1", [assistant("a")], parent_id="missing")
    with pytest.raises(InvalidMessage):
        store.add_messages("s1", [assistant("a")], parent_id="bad parent")
    assert state(store) == before
    with pytest.raises(MessageNotFound):
        store.add_messages("s2", [assistant("a")], parent_id="missing")
    assert_no_session(store, "s2")


# MAX_MESSAGES -------------------------------------------------------------------------------


def test_max_messages_trims_the_oldest_of_the_thread_keeping_system_messages(configure):
    store = configure(MAX_MESSAGES=6)
    store.add_messages("s1", [system("rules"), user("u0")])
    assert store.get_context("s1", max_tokens=10_000)["truncated"] is False
    for i in range(1, 10):
        store.add_messages("s1", [user(f"u{i}")])
    messages = thread(store)
    assert contents(messages) == ["rules", "u5", "u6", "u7", "u8", "u9"]
    assert [m["seq"] for m in messages] == [1, 7, 8, 9, 10, 11]  # seq is never reused
    info = conversation_info(store)
    assert info["message_count"] == 6 and info["trimmed"] == 5
    assert info["tokens"] == sum(m["tokens"] for m in messages)
    trims = [entry for entry in store.get_history("s1", 0) if entry["op"] == "trim_messages"]
    assert sum(entry["removed"] for entry in trims) == 5
    assert all(entry["conversation"] == "default" and entry["removed"] >= 1 for entry in trims)
    # Windows that reach back to the trimmed messages say so; the system message stays pinned.
    window = store.get_context("s1", max_tokens=10_000, max_messages=100)
    assert [m["content"] for m in window["messages"]] == contents(messages)
    assert window["truncated"] is True


def test_trimming_in_the_same_step_as_a_big_append(configure):
    store = configure(MAX_MESSAGES=4)
    added = store.add_messages("s1", [user(str(i)) for i in range(7)])
    assert len(added["messages"]) == 7  # the append answers what it stored
    assert contents(thread(store)) == ["3", "4", "5", "6"]
    (trim,) = [entry for entry in store.get_history("s1", 0) if entry["op"] == "trim_messages"]
    assert trim["removed"] == 3
    with pytest.raises(MessageNotFound):
        store.get_messages("s1", leaf=added["messages"][0]["id"])


def test_trimming_never_leaves_a_tool_result_without_its_call(configure):
    store = configure(MAX_MESSAGES=4)
    store.add_messages("s1", [user("u1"), calling("c1", "c2"), result("c1"), result("c2")])
    store.add_messages("s1", [assistant("a1")])  # removes u1
    assert [m["role"] for m in thread(store)] == ["assistant", "tool", "tool", "assistant"]
    store.add_messages("s1", [user("u2")])  # removes the call, so its results too
    messages = thread(store)
    assert contents(messages) == ["a1", "u2"]
    trims = [entry["removed"] for entry in store.get_history("s1", 0) if entry["op"] == "trim_messages"]
    assert trims == [1, 3]
    assert conversation_info(store)["trimmed"] == 4
    window = store.get_context("s1", max_tokens=10_000)
    assert [m["role"] for m in window["messages"]] == ["assistant", "user"]
    assert window["truncated"] is True


def test_trimming_keeps_the_head_and_its_open_call(configure):
    store = configure(MAX_MESSAGES=2)
    store.add_messages("s1", [user("u1"), calling("c1")])
    store.add_messages("s1", [result("c1")])  # 3 messages: u1 goes, the call stays for its result
    assert [m["role"] for m in thread(store)] == ["assistant", "tool"]
    assert [m["role"] for m in store.get_context("s1")["messages"]] == ["assistant", "tool"]


def test_trimming_keeps_pinned_system_messages_across_head_moves(configure):
    store = configure(MAX_MESSAGES=5)
    store.add_messages("s1", [system("rules"), user("u1"), assistant("a1")])
    question = store.add_messages("s1", [user("u2")])["messages"][0]
    first = store.add_messages("s1", [assistant("a2")])["messages"][0]
    store.add_messages("s1", [assistant("a2 again")], parent_id=question["id"])  # 6 messages: u1 goes
    assert contents(thread(store)) == ["rules", "a1", "u2", "a2 again"]
    store.set_head("s1", first["id"])
    assert contents(thread(store)) == ["rules", "a1", "u2", "a2"]
    assert contents(thread(store, leaf=first["id"])) == ["rules", "a1", "u2", "a2"]
    assert store.get_context("s1")["messages"][0] == {"role": "system", "content": "rules"}


def test_trimming_keeps_the_call_the_head_waits_for(configure):
    store = configure(MAX_MESSAGES=4)
    first = store.add_messages("s1", [user("u0"), user("u1"), user("u2"), user("u3")])["messages"][0]
    store.add_messages("s1", [user("q")], parent_id=first["id"])  # a branch: the old thread is stale
    store.add_messages("s1", [calling("c1", "c2")])
    store.add_messages("s1", [result("c1")])
    store.add_messages("s1", [result("c2")])
    window = store.get_context("s1")
    assert [m["role"] for m in window["messages"]][-3:] == ["assistant", "tool", "tool"]


def test_trimming_leaves_no_tool_result_of_another_branch_without_its_call(configure):
    store = configure(MAX_MESSAGES=5)
    added = store.add_messages("s1", [user("u0"), calling("c1"), result("c1"), user("w")])["messages"]
    store.set_head("s1", added[1]["id"])
    for text in ("x", "y", "z"):  # the last two trim u0, then the call
        store.add_messages("s1", [user(text)])
    with pytest.raises(MessageNotFound):
        store.get_messages("s1", leaf=added[1]["id"])
    store.set_head("s1", added[3]["id"])
    assert [m["role"] for m in store.get_context("s1")["messages"]] == ["user"]  # the window leaves it out
    assert [m["role"] for m in thread(store)] == ["user"]  # so should the thread


def test_conversations_are_trimmed_apart(configure):
    store = configure(MAX_MESSAGES=3)
    for i in range(5):
        store.add_messages("s1", [user(f"a{i}")], conversation="a")
    store.add_messages("s1", [user("b0"), user("b1")], conversation="b")
    infos = {info["conversation"]: info for info in store.list_conversations("s1")}
    assert (infos["a"]["message_count"], infos["a"]["trimmed"]) == (3, 2)
    assert (infos["b"]["message_count"], infos["b"]["trimmed"]) == (2, 0)


def test_a_thread_read_after_a_trim_keeps_its_pinned_system_messages_within_the_limit(configure):
    store = configure(MAX_MESSAGES=4)
    added = store.add_messages("s1", [system("s1"), system("s2"), user("u1"), user("u2")])["messages"]
    head = store.add_messages("s1", [user("u3")])["messages"][0]["id"]  # u1 goes
    assert contents(thread(store)) == ["s1", "s2", "u2", "u3"]
    assert contents(thread(store, leaf=head)) == ["s1", "s2", "u2", "u3"]
    for limit, expected in [(4, ["s1", "s2", "u2", "u3"]), (3, ["s2", "u2", "u3"]), (2, ["u2", "u3"])]:
        assert contents(thread(store, leaf=head, limit=limit)) == expected
    assert contents(thread(store, leaf=added[3]["id"])) == ["s1", "s2", "u2"]


def test_a_system_message_whose_parent_was_trimmed_is_read_once(configure):
    store = configure(MAX_MESSAGES=3)
    store.add_messages("s1", [user("u0"), system("rules"), user("u1")])
    head = store.add_messages("s1", [user("u2")])["messages"][0]["id"]  # u0 goes
    assert contents(thread(store)) == contents(thread(store, leaf=head)) == ["rules", "u1", "u2"]
    assert window_contents(store.get_context("s1")) == ["rules", "u1", "u2"]


def test_a_side_branch_system_message_is_not_pinned_to_a_trimmed_thread(configure):
    store = configure(MAX_MESSAGES=5)
    p, q, s1, s2 = store.add_messages("s1", [user("p"), user("q"), system("side"), system("side 2")])[
        "messages"
    ]
    store.add_messages("s1", [user("f")], parent_id=p["id"])
    head = store.add_messages("s1", [user("g")])["messages"][0]["id"]  # p goes: q and its system ones stay
    assert conversation_info(store)["message_count"] == 5
    assert contents(thread(store)) == contents(thread(store, leaf=head)) == ["f", "g"]
    assert contents(thread(store, leaf=s2["id"])) == ["q", "side", "side 2"]
    store.set_head("s1", s2["id"])
    store.set_head("s1", head)  # the thread is walked again from the head
    assert contents(thread(store)) == ["f", "g"]
    assert window_contents(store.get_context("s1")) == ["f", "g"]


def test_moving_the_head_back_along_a_trimmed_thread_keeps_its_messages(configure):
    store = configure(MAX_MESSAGES=3)
    p, q, s = store.add_messages("s1", [user("p"), user("q"), system("side")])["messages"]
    f = store.add_messages("s1", [user("f")], parent_id=p["id"])["messages"][0]
    store.add_messages("s1", [user("g")])  # p and q go; the side branch's system message stays
    assert contents(thread(store)) == ["f", "g"]
    store.set_head("s1", f["id"])
    assert contents(thread(store)) == ["f"]
    assert window_contents(store.get_context("s1")) == ["f"]


def test_nothing_is_trimmed_while_a_conversation_holds_max_messages(configure):
    store = configure(MAX_MESSAGES=2)
    store.add_messages("s1", [user("u1"), calling("c1", "c2")])
    store.add_messages("s1", [result("c1")])  # u1 goes
    store.add_messages("s1", [result("c2")])  # the call goes, and its first result: the head stays
    assert [m["role"] for m in thread(store)] == ["tool"]
    store.add_messages("s1", [user("u2")])  # two messages: nothing goes
    assert [m["role"] for m in thread(store)] == ["tool", "user"]
    assert conversation_info(store)["trimmed"] == 3


def test_a_trim_takes_a_tool_result_whose_call_an_earlier_trim_took(configure):
    store = configure(MAX_MESSAGES=4)
    u0, c, w = store.add_messages("s1", [user("u0"), calling("c1"), user("w")])["messages"]
    store.set_head("s1", c["id"])
    r = store.add_messages("s1", [result("c1")])["messages"][0]
    store.set_head("s1", w["id"])
    store.add_messages("s1", [user("y")])  # u0 goes
    store.add_messages("s1", [user("z")])  # the call goes, then w: its result stays, past the excess
    assert conversation_info(store)["message_count"] == 4
    assert contents(thread(store, leaf=r["id"])) == ["42"]
    store.add_messages("s1", [user("last")])  # the oldest goes, and the result without its call
    assert conversation_info(store)["message_count"] == 3
    with pytest.raises(MessageNotFound):
        store.get_messages("s1", leaf=r["id"])


def test_a_restored_conversation_counts_as_it_did(configure):
    store = configure(MAX_MESSAGES=2, MAX_SESSION_BYTES=2500)
    store.add_messages("s1", [system("r" * 1000), user("u1")])
    store.add_messages("s1", [user("x")])  # u1 goes; the system message stays pinned
    before = store.list_conversations("s1")
    assert before[0]["branch_count"] == 1
    with pytest.raises(QuotaExceeded):
        store.add_messages("s1", [user("y" * 1300)])
    store.backend.restore_session(store.backend.snapshots(["s1"])["s1"], replace=True)
    assert store.list_conversations("s1") == before
    with pytest.raises(QuotaExceeded):  # every restored message's bytes count toward the cap
        store.add_messages("s1", [user("y" * 1300)])
    store.add_messages("s1", [user("y" * 900)])


# Windows --------------------------------------------------------------------------------


def chars_store(configure: Any, **extra: Any) -> MemoryStore:
    """A store counting 4 characters a token: an 8-character message costs 3 + 2 = 5."""
    return configure(TOKENIZER="chars", **extra)


def window_contents(window: dict[str, Any]) -> list[Any]:
    return [message["content"] for message in window["messages"]]


def test_the_window_holds_the_chat_fields_only(store):
    store.add_messages(
        "s1",
        [
            user("q", name="alice", metadata={"secret": 1}, id="m1"),
            calling("c1", content="let me look"),
            result("c1", name="lookup"),
        ],
    )
    window = store.get_context("s1")
    for message in window["messages"]:
        assert set(message) <= set(CHAT_FIELDS)
    assert window["messages"] == [
        {"role": "user", "content": "q", "name": "alice"},
        {"role": "assistant", "content": "let me look", "tool_calls": [tool_call("c1")]},
        {"role": "tool", "content": "42", "name": "lookup", "tool_call_id": "c1"},
    ]
    assert window["tokens"] == sum(m["tokens"] for m in thread(store))
    assert window["conversation"] == "default" and window["truncated"] is False


def test_a_window_is_the_callers_to_change(store):
    parts = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": "x"}}]
    store.add_messages(
        "s1",
        [user(parts), calling("c1", content="let me look"), result("c1"), assistant("done", name="bot")],
    )
    first = store.get_context("s1")
    expected = copy.deepcopy(first)
    asked, calling_message, *_ = first["messages"]
    asked["content"][0]["text"] = "changed"
    asked["content"].append({"type": "text", "text": "more"})
    calling_message["tool_calls"][0]["function"]["name"] = "changed"
    calling_message["tool_calls"].append(tool_call("c2"))
    for message in first["messages"]:
        message["content"] = "changed"
    assert store.get_context("s1") == expected


def test_a_thread_of_system_messages_is_whole_in_its_window(store):
    store.add_messages("s1", [system("rules"), system("more rules")])
    window = store.get_context("s1")
    assert (window_contents(window), window["truncated"]) == (["rules", "more rules"], False)


def test_the_window_keeps_the_newest_within_max_tokens(configure):
    store = chars_store(configure)
    store.add_messages("s1", [user(f"message{i}") for i in range(6)])  # 5 tokens each
    assert {m["tokens"] for m in thread(store)} == {5}
    window = store.get_context("s1", max_tokens=14)
    assert window_contents(window) == ["message4", "message5"]
    assert (window["tokens"], window["truncated"]) == (10, True)
    window = store.get_context("s1", max_tokens=30)
    assert (len(window["messages"]), window["tokens"], window["truncated"]) == (6, 30, False)
    window = store.get_context("s1", max_tokens=4)
    assert (window["messages"], window["tokens"], window["truncated"]) == ([], 0, True)


def test_the_window_keeps_the_newest_within_max_messages(store):
    store.add_messages("s1", [user(str(i)) for i in range(6)])
    window = store.get_context("s1", max_messages=3)
    assert window_contents(window) == ["3", "4", "5"] and window["truncated"] is True
    assert store.get_context("s1", max_messages=6)["truncated"] is False


def test_the_window_defaults_come_from_settings(configure):
    store = chars_store(configure, CONTEXT_MAX_MESSAGES=3, CONTEXT_MAX_TOKENS=12)
    store.add_messages("s1", [user(f"message{i}") for i in range(6)])
    assert window_contents(store.get_context("s1")) == ["message4", "message5"]  # 12 tokens: 2 messages
    assert window_contents(store.get_context("s1", max_tokens=100)) == ["message3", "message4", "message5"]
    assert len(store.get_context("s1", max_tokens=100, max_messages=100)["messages"]) == 6
    store = chars_store(configure, CONTEXT_MAX_MESSAGES=None, CONTEXT_MAX_TOKENS=None)
    store.add_messages("s2", [user(f"message{i}") for i in range(75)])
    store.add_messages("s2", [user(f"message{i}") for i in range(75, 150)])
    window = store.get_context("s2")
    total = sum(m["tokens"] for m in thread(store, "s2"))
    assert (len(window["messages"]), window["tokens"], window["truncated"]) == (150, total, False)


@pytest.mark.parametrize("bad", [0, -5, "10", 2.5, True])
def test_bad_budgets_are_refused(store, bad):
    store.add_messages("s1", [user("q")])
    with pytest.raises(InvalidValue):
        store.get_context("s1", max_tokens=bad)
    with pytest.raises(InvalidValue):
        store.get_context("s1", max_messages=bad)


def test_pinned_system_messages_come_first(configure):
    store = chars_store(configure)
    store.add_messages("s1", [system("rules!!!"), user("message0"), assistant("message1")])
    store.add_messages("s1", [system("late sys"), user("message2"), assistant("message3")])
    window = store.get_context("s1", max_messages=4)
    assert window_contents(window) == ["rules!!!", "late sys", "message2", "message3"]
    assert window["truncated"] is True
    window = store.get_context("s1", max_tokens=15)
    assert window_contents(window) == ["rules!!!", "late sys", "message3"]
    # All of it: the system messages first, the rest in thread order.
    window = store.get_context("s1")
    assert window_contents(window) == ["rules!!!", "late sys", "message0", "message1", "message2", "message3"]


def test_system_messages_that_do_not_fit_leave_the_window_empty(configure):
    store = chars_store(configure)
    store.add_messages("s1", [system("x" * 80), user("message0")])  # 23 + 5 tokens
    window = store.get_context("s1", max_tokens=10)
    assert (window["messages"], window["truncated"]) == ([], True)


def test_system_messages_of_another_branch_are_not_pinned(store):
    first = store.add_messages("s1", [user("q")])["messages"][0]
    store.add_messages("s1", [system("only here"), assistant("a")])
    store.add_messages("s1", [assistant("b")], parent_id=first["id"])
    assert window_contents(store.get_context("s1")) == ["q", "b"]


def test_the_window_keeps_whole_turn_groups(configure):
    store = chars_store(configure)
    store.add_messages(
        "s1", [user("question"), calling("c1", "c2"), result("c1", "result01"), result("c2", "result02")]
    )
    store.add_messages("s1", [assistant("answer!!")])
    roles = lambda window: [m["role"] for m in window["messages"]]  # noqa: E731
    # The call and its two results are one group: 3 messages or none.
    assert roles(store.get_context("s1", max_messages=3)) == ["assistant"]
    assert roles(store.get_context("s1", max_messages=4)) == ["assistant", "tool", "tool", "assistant"]
    group_tokens = sum(m["tokens"] for m in thread(store)[1:4])
    window = store.get_context("s1", max_tokens=group_tokens + 5 - 1)
    assert roles(window) == ["assistant"] and window["truncated"] is True
    window = store.get_context("s1", max_tokens=group_tokens + 5)
    assert roles(window) == ["assistant", "tool", "tool", "assistant"]
    assert window["tokens"] == group_tokens + 5


def test_the_newest_group_may_wait_for_its_results(store):
    store.add_messages("s1", [user("q"), calling("c1", "c2"), result("c1")])
    window = store.get_context("s1")
    assert [m["role"] for m in window["messages"]] == ["user", "assistant", "tool"]
    assert window["truncated"] is False
    assert [m["role"] for m in store.get_context("s1", max_messages=2)["messages"]] == ["assistant", "tool"]


def test_a_call_whose_results_never_came_is_left_out(store):
    store.add_messages("s1", [user("q"), calling("c1", "c2"), result("c1"), user("never mind")])
    window = store.get_context("s1")
    assert [m["role"] for m in window["messages"]] == ["user", "user"]
    assert window["tokens"] == sum(m["tokens"] for m in thread(store) if m["role"] == "user")


def test_a_window_follows_the_head(store):
    question = store.add_messages("s1", [user("q")])["messages"][0]
    old = store.add_messages("s1", [calling("c1")])["messages"][0]
    store.add_messages("s1", [result("c1")])
    store.add_messages("s1", [assistant("regenerated")], parent_id=question["id"])
    assert window_contents(store.get_context("s1")) == ["q", "regenerated"]
    store.set_head("s1", old["id"])
    assert [m["role"] for m in store.get_context("s1")["messages"]] == ["user", "assistant"]


def test_conversations_have_their_own_windows(store):
    store.add_messages("s1", [user("a")], conversation="a")
    store.add_messages("s1", [user("b")], conversation="b")
    assert window_contents(store.get_context("s1", conversation="a")) == ["a"]
    assert store.get_context("s1", conversation="b")["conversation"] == "b"
    assert store.get_context("s1")["messages"] == []


# Listing and clearing ------------------------------------------------------------------------


def test_list_conversations(store):
    stored = store.add_messages("s1", [user("q"), assistant("a")])["messages"]
    stored += store.add_messages("s1", [assistant("a2")], parent_id=stored[0]["id"])["messages"]
    stored += store.add_messages("s1", [assistant("a three")], parent_id=stored[0]["id"])["messages"]
    other = store.add_messages("s1", [user("x")], conversation="another")["messages"]
    infos = store.list_conversations("s1")
    assert [info["conversation"] for info in infos] == ["another", "default"]
    another, default = infos
    assert another == {
        "conversation": "another",
        "head": other[0]["id"],
        "message_count": 1,
        "tokens": other[0]["tokens"],
        "branch_count": 1,
        "trimmed": 0,
    }
    assert default == {
        "conversation": "default",
        "head": stored[-1]["id"],
        "message_count": 4,
        "tokens": sum(m["tokens"] for m in stored),
        "branch_count": 3,
        "trimmed": 0,
    }
    store.create_session("s2")
    assert store.list_conversations("s2") == []


def test_list_conversations_counts_tokens_of_every_branch(store):
    question, first = store.add_messages("s1", [user("q"), assistant("first answer")])["messages"]
    second = store.add_messages("s1", [assistant("the second, longer answer")], parent_id=question["id"])
    info = conversation_info(store)
    assert info["tokens"] == question["tokens"] + first["tokens"] + second["messages"][0]["tokens"]
    assert (info["message_count"], info["branch_count"]) == (3, 2)
    store.set_head("s1", question["id"])  # the head on a message with children: still 2 branches
    assert conversation_info(store)["branch_count"] == 2


def test_clear_messages(store):
    stored = store.add_messages("s1", [user("q"), assistant("a")])["messages"]
    store.add_messages("s1", [assistant("b")], parent_id=stored[0]["id"])
    store.add_messages("s1", [user("keep")], conversation="other")
    store.put("s1", "k", 1)
    assert store.clear_messages("s1") == 3  # every branch
    assert store.get_messages("s1") == {"conversation": "default", "head": None, "messages": []}
    assert [info["conversation"] for info in store.list_conversations("s1")] == ["other"]
    assert contents(thread(store, conversation="other")) == ["keep"]
    assert store.get("s1", "k") == 1
    assert store.clear_messages("s1") == 0
    assert store.clear_messages("s1", conversation="never") == 0
    # A cleared conversation starts again from seq 1.
    assert store.add_messages("s1", [user("again")])["messages"][0]["seq"] == 1
    with pytest.raises(MessageNotFound):
        store.get_messages("s1", leaf=stored[0]["id"])


def test_clearing_a_conversation_gives_its_bytes_back_to_the_cap(configure):
    store = configure(MAX_SESSION_BYTES=2000)
    store.create_session("s1")
    store.put("s1", "k", 1)
    store.add_messages("s1", [user("x" * 1200)])
    with pytest.raises(QuotaExceeded):
        store.add_messages("s1", [user("y" * 1200)], conversation="other")
    assert store.clear_messages("s1") == 1
    store.add_messages("s1", [user("y" * 1200)], conversation="other")  # room again
    with pytest.raises(QuotaExceeded):  # and no more than the cleared conversation's
        store.add_messages("s1", [user("z" * 1200)])


def test_reading_from_a_leaf_of_no_conversation_names_the_leaf(store):
    store.create_session("s1")
    with pytest.raises(MessageNotFound, match="has no message 'm-gone'"):
        store.get_messages("s1", conversation="never", leaf="m-gone")
    with pytest.raises(MessageNotFound, match="'never' has no messages"):
        store.pop_message("s1", "m-gone", conversation="never")


def test_clear_messages_is_recorded_in_the_history(store):
    store.add_messages("s1", [user("q"), assistant("a")])
    store.clear_messages("s1")
    (entry,) = [entry for entry in store.get_history("s1", 0) if entry["op"] == "clear_messages"]
    assert (entry["conversation"], entry["removed"]) == ("default", 2)


# Popping the head ------------------------------------------------------------------------


def test_pop_message_takes_the_head_off(store):
    stored = store.add_messages("s1", [user("q"), assistant("a")])["messages"]
    popped = store.pop_message("s1", stored[1]["id"])
    assert popped["removed"] == stored[1]
    assert (popped["head"], popped["messages"]) == (stored[0]["id"], [])
    assert thread(store) == stored[:1]
    info = conversation_info(store)
    assert (info["head"], info["message_count"], info["tokens"]) == (stored[0]["id"], 1, stored[0]["tokens"])
    assert store.get_context("s1")["messages"] == [{"role": "user", "content": "q"}]
    with pytest.raises(MessageNotFound):
        store.get_messages("s1", leaf=stored[1]["id"])
    # The next append goes after the new head, with the next seq.
    again = store.add_messages("s1", [assistant("b")])["messages"][0]
    assert (again["parent_id"], again["seq"]) == (stored[0]["id"], 3)
    (entry,) = [entry for entry in store.get_history("s1", 0) if entry["op"] == "pop_message"]
    assert (entry["conversation"], entry["removed"]) == ("default", stored[1]["id"])


def test_pop_message_replaces_the_head_in_one_step(store):
    stored = store.add_messages("s1", [user("q"), calling("c1", "c2")])["messages"]
    popped = store.pop_message("s1", stored[1]["id"], replacement=[calling("c1")])
    (replaced,) = popped["messages"]
    assert (replaced["parent_id"], popped["head"]) == (stored[0]["id"], replaced["id"])
    assert [message["id"] for message in thread(store)] == [stored[0]["id"], replaced["id"]]
    store.add_messages("s1", [result("c1")])  # answers the replacement's call
    with pytest.raises(OrphanToolResult):
        store.add_messages("s1", [result("c2")])  # the popped call is gone


def test_pop_message_of_a_moved_head_changes_nothing(store):
    stored = store.add_messages("s1", [user("q"), assistant("a")])["messages"]
    before = state(store)
    with pytest.raises(HeadMoved, match=f"is no longer '{stored[0]['id']}'") as raised:
        store.pop_message("s1", stored[0]["id"], replacement=[assistant("x")])
    assert raised.value.code == "head_moved" and isinstance(raised.value, MessageConflict)
    with pytest.raises(OrphanToolResult):  # a replacement is checked as an append
        store.pop_message("s1", stored[1]["id"], replacement=[result("nope")])
    with pytest.raises(MessageConflict):
        store.pop_message("s1", stored[1]["id"], replacement=[assistant("x", id=stored[1]["id"])])
    with pytest.raises(MessageConflict, match=f"reuses the id '{stored[1]['id']}'"):  # even as it was
        store.pop_message("s1", stored[1]["id"], replacement=[assistant("a", id=stored[1]["id"])])
    assert state(store) == before


def test_pop_message_gives_its_bytes_back_and_holds_the_replacement_to_the_cap(configure):
    store = configure(MAX_SESSION_BYTES=2000)
    store.create_session("s1")
    store.put("s1", "k", "x" * 600)
    head = store.add_messages("s1", [user("q"), assistant("a" * 1000)])["messages"][-1]["id"]
    with pytest.raises(QuotaExceeded):  # the session's bytes count, not only the replacement's
        store.pop_message("s1", head, replacement=[assistant("b" * 1600)])
    store.pop_message("s1", head)
    store.add_messages("s1", [assistant("c" * 1000)])  # room again
    with pytest.raises(QuotaExceeded):  # and no more than the popped message's
        store.add_messages("s1", [assistant("d" * 600)])


def test_pop_message_of_an_empty_or_missing_conversation(store):
    with pytest.raises(SessionNotFound):
        store.pop_message("s1", "m1")
    store.create_session("s1")
    store.put("s1", "k", 1)
    with pytest.raises(MessageNotFound):
        store.pop_message("s1", "m1")
    store.add_messages("s1", [user("only", id="m1")])
    assert store.pop_message("s1", "m1")["head"] is None
    # The last message taken: the conversation goes, as a clear takes it.
    assert store.list_conversations("s1") == []
    assert store.get_messages("s1") == {"conversation": "default", "head": None, "messages": []}
    with pytest.raises(MessageNotFound):
        store.pop_message("s1", "m1")
    assert store.add_messages("s1", [user("again")])["messages"][0]["parent_id"] is None
    assert store.get("s1", "k") == 1


def test_pop_message_keeps_a_message_another_branch_goes_on_from(store):
    q, a = store.add_messages("s1", [user("q"), assistant("a")])["messages"]
    follow = store.add_messages("s1", [user("more")])["messages"][0]
    store.set_head("s1", a["id"])
    assert store.pop_message("s1", a["id"])["head"] == q["id"]
    assert thread(store) == [q]
    assert thread(store, leaf=follow["id"]) == [q, a, follow]  # the other branch is whole
    assert conversation_info(store)["message_count"] == 3
    # Popping the branch's end leaves its parent a leaf again: one branch.
    store.set_head("s1", follow["id"])
    store.pop_message("s1", follow["id"])
    store.pop_message("s1", a["id"])
    info = conversation_info(store)
    assert (info["message_count"], info["branch_count"], info["head"]) == (1, 1, q["id"])


def test_pop_message_of_a_root_with_a_replacement(store):
    (root,) = store.add_messages("s1", [system("rules")])["messages"]
    popped = store.pop_message("s1", root["id"], replacement=[system("new rules"), user("q")])
    assert [message["parent_id"] for message in popped["messages"]] == [None, popped["messages"][0]["id"]]
    assert store.get_context("s1")["messages"] == [
        {"role": "system", "content": "new rules"},
        {"role": "user", "content": "q"},
    ]


def test_pop_message_takes_a_summary_anchored_at_the_head_with_it(store):
    def summary(text: str, message: dict[str, Any]) -> Summary:
        return Summary(text, message["id"], message["seq"], summary_tokens(text, "o200k_base"), 0)

    q, a = store.add_messages("s1", [user("q"), assistant("a")])["messages"]
    assert store.backend.commit_summary("s1", "default", None, summary("Up to q.", q))
    rolling = store.get_context("s1", strategy="rolling_summary")
    assert (rolling["summary"], contents(rolling["messages"])) == ("Up to q.", ["a"])
    store.pop_message("s1", a["id"])  # a summary of what stays, stays
    rolling = store.get_context("s1", strategy="rolling_summary")
    assert (rolling["summary"], rolling["messages"]) == ("Up to q.", [])
    (b,) = store.add_messages("s1", [assistant("b")])["messages"]
    assert store.backend.commit_summary("s1", "default", q["id"], summary("Up to b.", b))
    store.pop_message("s1", b["id"])  # the summary anchored at the head goes with it
    rolling = store.get_context("s1", strategy="rolling_summary")
    assert (rolling["summary"], contents(rolling["messages"])) == (None, ["q"])
    (record,) = maintenance.export_sessions(store=store)
    assert record["conversations"]["default"]["summaries"] == []


def summary_at(text: str, message: dict[str, Any]) -> Summary:
    return Summary(text, message["id"], message["seq"], summary_tokens(text, "o200k_base"), 0)


def summaries_store(configure: Any, **extra: Any) -> MemoryStore:
    """A store with rolling summaries on and no worker thread to make them."""
    return configure(CONTEXT_STRATEGY="rolling_summary", SUMMARIZER_WORKER=False, **extra)


def test_a_summary_covers_the_tokens_up_to_its_anchor_and_a_trim_takes_only_those(configure):
    store = summaries_store(configure, MAX_MESSAGES=4, SUMMARIZE_AFTER_TOKENS=10_000)
    added = []
    for text in ("one", "two words", "three words here", "four", "five", "six"):
        added += store.add_messages("s1", [user(text)])["messages"]
    # No summary yet: nothing is forgotten unsummarized, whatever MAX_MESSAGES says.
    assert conversation_info(store)["message_count"] == 6
    assert not [entry for entry in store.get_history("s1", 0) if entry["op"] == "trim_messages"]
    assert store.backend.commit_summary("s1", "default", None, summary_at("Up to three.", added[2]))
    # The two oldest go (the anchor stays): the summary covers what is left up to its anchor.
    assert contents(thread(store)) == ["three words here", "four", "five", "six"]
    (trim,) = [entry for entry in store.get_history("s1", 0) if entry["op"] == "trim_messages"]
    assert trim["removed"] == 2 and conversation_info(store)["trimmed"] == 2
    source = store.backend.summary_source("s1", "default")
    assert source.summary.text == "Up to three." and source.summary.covered_tokens == added[2]["tokens"]
    assert contents(json.loads(text) for text in source.messages) == ["four", "five", "six"]
    rolling = store.get_context("s1", strategy="rolling_summary")
    assert (rolling["summary"], window_contents(rolling)) == ("Up to three.", ["four", "five", "six"])


def test_a_summary_commit_counts_the_tokens_of_the_thread_up_to_its_anchor(configure):
    store = summaries_store(configure, SUMMARIZE_AFTER_TOKENS=10_000)
    added = store.add_messages("s1", [user("one"), user("two words"), user("three words here"), user("4")])
    stored = added["messages"]
    assert store.backend.commit_summary("s1", "default", None, summary_at("Up to two.", stored[1]))
    covered = store.backend.summary_source("s1", "default").summary.covered_tokens
    assert covered == stored[0]["tokens"] + stored[1]["tokens"]


def test_a_conversation_is_marked_for_its_summary_once_past_the_threshold(configure):
    (probe,) = configure().add_messages("probe", [user("How long is this question?")])["messages"]
    for session, threshold, marked in [("past", probe["tokens"] - 1, True), ("at", probe["tokens"], False)]:
        store = summaries_store(configure, SUMMARIZE_AFTER_TOKENS=threshold)
        store.add_messages(session, [user("How long is this question?")])
        assert store.backend.pop_unsummarized(10) == ([(session, "default")] if marked else [])


def test_no_summary_is_committed_on_a_conversation_without_a_head(store):
    stored = store.write_thread(
        "s1", key="rec", expected=None, record=record("r1"), messages=[user("q"), user("r")], head_id=None
    )
    assert not store.backend.commit_summary("s1", "default", None, summary_at("Up to q.", stored[0]))
    assert store.backend.summary_source("s1", "default").summary is None


def test_pop_message_is_isolated_by_owner(store):
    alice, bob = store.for_owner("alice"), store.for_owner("bob")
    (message,) = alice.add_messages("s1", [user("mine")])["messages"]
    bob.add_messages("s1", [user("his", id=message["id"])])
    with pytest.raises(SessionNotFound):
        store.for_owner("carol").pop_message("s1", message["id"])
    bob.pop_message("s1", message["id"])
    assert contents(thread(alice)) == ["mine"]


# A record beside a conversation (write_thread) --------------------------------------------


def record(revision: str, **fields: Any) -> dict[str, Any]:
    return {"revision": revision, **fields}


def test_write_thread_creates_the_session_conversation_and_record(store):
    stored = store.write_thread(
        "s1",
        key="rec",
        expected=None,
        record=record("r1", n=1),
        messages=[user("q"), assistant("a")],
        head_id=None,
    )
    assert store.get("s1", "rec") == {"revision": "r1", "n": 1}
    # The chain starts at a root; the head is where the write put it (none here).
    assert [m["parent_id"] for m in stored] == [None, stored[0]["id"]]
    assert store.get_messages("s1")["head"] is None
    assert conversation_info(store)["message_count"] == 2
    assert thread(store, leaf=stored[1]["id"]) == stored
    assert [(entry["op"], entry["key"]) for entry in store.get_history("s1", 0)] == [("put", "rec")]


def test_write_thread_appends_after_a_parent_and_moves_the_head(store):
    q, a = store.write_thread(
        "s1",
        key="rec",
        expected=None,
        record=record("r1"),
        messages=[user("q", id="q"), assistant("a", id="a")],
        head_id="a",
    )
    assert store.get_messages("s1")["head"] == "a"
    # A regenerated answer: a branch after q, and the head goes to it.
    (b,) = store.write_thread(
        "s1",
        key="rec",
        expected="r1",
        record=record("r2"),
        messages=[assistant("b", id="b")],
        parent_id="q",
        head_id="b",
    )
    assert (b["parent_id"], thread(store)) == ("q", [q, b])
    assert conversation_info(store)["branch_count"] == 2
    # Back to the first answer, nothing appended (a branch switch).
    assert store.write_thread("s1", key="rec", expected="r2", record=record("r3"), head_id="a") == []
    assert thread(store) == [q, a]
    # No head: the thread is empty, the messages stay.
    store.write_thread("s1", key="rec", expected="r3", record=record("r4"), head_id=None)
    assert thread(store) == [] and conversation_info(store)["message_count"] == 3
    # A new root beside the old ones.
    (root,) = store.write_thread(
        "s1", key="rec", expected="r4", record=record("r5"), messages=[user("again")], head_id=None
    )
    assert root["parent_id"] is None and root["seq"] == 4
    assert store.get("s1", "rec") == {"revision": "r5"}


def test_a_new_root_reads_none_of_an_older_roots_messages(store):
    store.write_thread(
        "s1",
        key="rec",
        expected=None,
        record=record("r1"),
        messages=[system("rules"), user("q")],
        head_id=None,
    )
    (root,) = store.write_thread(
        "s1",
        key="rec",
        expected="r1",
        record=record("r2"),
        messages=[user("again", id="again")],
        head_id="again",
    )
    assert thread(store, leaf=root["id"]) == thread(store) == [root]
    assert window_contents(store.get_context("s1")) == ["again"]


def test_write_thread_against_another_revision_writes_nothing(store):
    store.write_thread(
        "s1", key="rec", expected=None, record=record("r1"), messages=[user("q", id="q")], head_id="q"
    )
    store.add_messages("s1", [user("x")], conversation="plain")  # messages, but no record
    store.put("s1", "junk", [1, 2])  # a value that is not a record
    before = state(store), state(store, conversation="plain"), store.get_all("s1")
    attempts = [
        {"expected": "r0"},  # stale
        {"expected": None},  # a record is there
        {"expected": "r1", "key": "other"},  # no record under that key
        {"expected": None, "key": "rec2", "conversation": "plain"},
        {"expected": "r1", "key": "junk", "conversation": "j"},
    ]
    for attempt in attempts:
        options = {"key": "rec", "record": record("r2"), "messages": [assistant("a")], "parent_id": "q"}
        with pytest.raises(RevisionConflict) as raised:
            store.write_thread("s1", head_id=None, **(options | attempt))
        assert raised.value.code == "revision_conflict" and isinstance(raised.value, MessageConflict)
    assert (state(store), state(store, conversation="plain"), store.get_all("s1")) == before
    with pytest.raises(RevisionConflict):  # no session: no record
        store.write_thread("s2", key="rec", expected="r1", record=record("r2"))
    assert_no_session(store, "s2")


def test_write_thread_checks_everything_before_writing(store):
    store.write_thread(
        "s1", key="rec", expected=None, record=record("r1"), messages=[calling("c1", id="c")], head_id="c"
    )
    before = state(store), store.get_all("s1")
    refused = {
        MessageNotFound: [
            {"messages": [user("x")], "parent_id": "missing", "head_id": None},
            {"messages": [user("x")], "parent_id": "c", "head_id": "missing"},
        ],
        OrphanToolResult: [{"messages": [result("nope")], "parent_id": "c", "head_id": None}],
        MessageConflict: [{"messages": [user("other", id="c")], "parent_id": None, "head_id": None}],
        InvalidValue: [
            {"record": {"no": "revision"}},
            {"record": record("")},
            {"messages": [{"role": "nobody"}]},
        ],
    }
    for error, attempts in refused.items():
        for attempt in attempts:
            options = {"key": "rec", "expected": "r1", "record": record("r2"), "head_id": "c"} | attempt
            with pytest.raises(error):
                store.write_thread("s1", **options)
    assert (state(store), store.get_all("s1")) == before
    # The call's own result answers it.
    store.write_thread(
        "s1",
        key="rec",
        expected="r1",
        record=record("r2"),
        messages=[result("c1", id="t")],
        parent_id="c",
        head_id="t",
    )
    assert ids(thread(store)) == ["c", "t"]


def test_write_thread_takes_a_batch_up_to_max_messages(configure):
    store = configure(MAX_BATCH=2, MAX_MESSAGES=5)
    history = [user(f"m{i}", id=f"m{i}") for i in range(5)]
    store.write_thread("s1", key="rec", expected=None, record=record("r1"), messages=history, head_id="m4")
    assert ids(thread(store)) == [f"m{i}" for i in range(5)]
    with pytest.raises(InvalidMessage):
        store.write_thread(
            "s1", key="rec", expected="r1", record=record("r2"), messages=[user("x")] * 6, parent_id="m4"
        )


def test_write_thread_is_held_to_the_byte_cap(configure):
    store = configure(MAX_SESSION_BYTES=2000)
    with pytest.raises(QuotaExceeded):
        store.write_thread(
            "s1", key="rec", expected=None, record=record("r1", pad="x" * 2000), messages=[user("q")]
        )
    assert_no_session(store, "s1")
    store.write_thread(
        "s1", key="rec", expected=None, record=record("r1"), messages=[user("q", id="q")], head_id="q"
    )
    before = state(store), store.get_all("s1")
    with pytest.raises(QuotaExceeded):
        store.write_thread(
            "s1", key="rec", expected="r1", record=record("r2"), messages=[user("x" * 2000)], parent_id="q"
        )
    assert (state(store), store.get_all("s1")) == before


def test_an_append_moves_an_idle_sessions_expiry(configure, backend_name):
    if backend_name != "memory":
        pytest.skip("Redis counts expiries in milliseconds: two calls may share one")
    store = configure(SESSION_IDLE_TTL_SECONDS=3600)
    store.add_messages("s1", [user("q")])
    before = store.session_info("s1")["expires_at"]
    store.add_messages("s1", [user("again")])
    assert store.session_info("s1")["expires_at"] > before


def test_messages_count_once_toward_the_byte_cap(configure):
    store = configure(MAX_SESSION_BYTES=4000)
    store.add_messages("s1", [user("x" * 1000)])
    store.add_messages("s1", [user("y" * 100)])
    store.add_messages("s1", [user("z" * 2000)])  # about 3,600 bytes in all: it fits
    with pytest.raises(QuotaExceeded):
        store.add_messages("s1", [user("w" * 1000)])
    assert conversation_info(store)["message_count"] == 3


def test_write_thread_errors_name_the_conversation_and_the_message(store):
    store.write_thread("s1", key="rec", expected=None, record=record("r1"), conversation="talk")
    with pytest.raises(RevisionConflict) as stale:
        store.write_thread("s1", key="rec", expected="r0", record=record("r2"), conversation="talk")
    assert str(stale.value) == "The record of conversation 'talk' has another revision."
    with pytest.raises(MessageNotFound) as missing:
        store.write_thread(
            "s1", key="rec", expected="r1", record=record("r2"), head_id="nowhere", conversation="talk"
        )
    assert str(missing.value) == "Conversation 'talk' has no message 'nowhere'."


def test_write_thread_and_add_messages_create_their_session_with_the_default_ttl(configure):
    store = configure(SESSION_TTL_HOURS=1)
    before = math.floor(time.time() * 1000) / 1000  # Redis keeps expiries to the millisecond
    store.write_thread("s1", key="rec", expected=None, record=record("r1"), messages=[user("q")])
    store.add_messages("s2", [user("q")])
    for session_id in ("s1", "s2"):
        info = store.session_info(session_id)
        assert info["ttl_seconds"] == 3600
        assert before + 3600 <= info["expires_at"] <= time.time() + 3600


def test_write_thread_fills_the_session_to_the_byte_and_a_new_revision_takes_the_old_ones_place(
    configure,
):
    from persistent_memory.validation import encode_value

    cap = 2000
    store = configure(MAX_SESSION_BYTES=cap)

    def write(pad: int, revision: str, expected: str | None, **options: Any) -> None:
        store.write_thread(
            "s1", key="rec", expected=expected, record=record(revision, pad="x" * pad), **options
        )

    # A value counts its key and its JSON text: the pad that takes a new session to the cap.
    fits = cap - len("rec") - len(encode_value(record("r1", pad=""), max_bytes=cap))
    with pytest.raises(QuotaExceeded):
        write(fits + 1, "r1", None)
    write(fits, "r1", None)
    # The new revision's bytes replace the old one's: a record of the same size fits.
    write(fits, "r2", "r1")
    with pytest.raises(QuotaExceeded):
        write(fits + 1, "r3", "r2")
    # Messages with the record: refused whole, nothing written.
    with pytest.raises(QuotaExceeded):
        write(fits, "r3", "r2", messages=[user("m" * 200)])
    assert store.get("s1", "rec") == record("r2", pad="x" * fits)
    assert store.list_conversations("s1") == []


def test_thread_message_and_checkpoint_writes_create_a_session_only_within_the_owners_cap(configure):
    alice = configure(MAX_SESSIONS_PER_OWNER=1).for_owner("alice")
    alice.create_session("s1")
    with pytest.raises(QuotaExceeded) as refused:
        alice.write_thread("s2", key="rec", expected=None, record=record("r1"), messages=[user("q")])
    assert "MAX_SESSIONS_PER_OWNER" in str(refused.value)
    with pytest.raises(QuotaExceeded):
        alice.add_messages("s2", [user("q")])
    with pytest.raises(QuotaExceeded):
        alice.put_checkpoint("s2", "", "c1", "one")
    assert alice.list_sessions() == ["s1"]
    # Into the session the owner holds, it writes.
    alice.write_thread("s1", key="rec", expected=None, record=record("r1"), messages=[user("q")])
    assert alice.get("s1", "rec") == record("r1")


@pytest.mark.parametrize("left", ["a value", "a conversation", "a checkpoint"])
def test_remove_thread_keeps_a_session_holding_anything_else(store, left):
    """Any one kind of data left keeps the session (values, conversations, checkpoints)."""
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_metadata

    from persistent_memory.integrations.langgraph_saver import PersistentMemorySaver, thread_session

    session_id = thread_session("t")  # a LangGraph thread's session, for its checkpoints
    store.write_thread(
        session_id, key="rec", expected=None, record=record("r1"), messages=[user("q", id="q")], head_id="q"
    )
    if left == "a value":
        store.put(session_id, "other", 1)
    elif left == "a conversation":
        store.add_messages(session_id, [user("kept")], conversation="kept")
    else:
        saver = PersistentMemorySaver(store=store)
        config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        saver.put(config, generate_checkpoint(), generate_metadata(), {})
    store.remove_thread(session_id, key="rec", expected="r1")
    assert thread(store, session_id) == []
    cleared = [
        {name: entry.get(name) for name in ("op", "key", "conversation", "removed")}
        for entry in store.get_history(session_id, 0)
        if entry["op"].startswith("clear")
    ]
    assert cleared == [
        {"op": "clear", "key": "rec", "conversation": None, "removed": None},
        {"op": "clear_messages", "key": None, "conversation": "default", "removed": 1},
    ]
    if left == "a checkpoint":
        assert saver.get_tuple(config) is not None


def test_remove_thread_of_a_record_without_messages(store):
    store.write_thread("s1", key="rec", expected=None, record=record("r1"), messages=[])
    store.put("s1", "other", 1)
    store.remove_thread("s1", key="rec", expected="r1")
    assert store.get_all("s1") == {"other": 1}


def test_remove_thread_gives_its_bytes_back_to_the_cap(configure):
    store = configure(MAX_SESSION_BYTES=2000)
    store.create_session("s1")
    store.put("s1", "k", 1)
    store.write_thread("s1", key="rec", expected=None, record=record("r1"), messages=[user("x" * 1200)])
    with pytest.raises(QuotaExceeded):
        store.add_messages("s1", [user("y" * 1200)], conversation="other")
    store.remove_thread("s1", key="rec", expected="r1")
    store.add_messages("s1", [user("y" * 1200)], conversation="other")  # room again
    with pytest.raises(QuotaExceeded):
        store.add_messages("s1", [user("z" * 1200)], conversation="more")


def test_remove_thread_takes_the_record_and_its_conversation(store):
    store.write_thread(
        "s1", key="rec", expected=None, record=record("r1"), messages=[user("q", id="q")], head_id="q"
    )
    with pytest.raises(RevisionConflict):
        store.remove_thread("s1", key="rec", expected="r0")
    assert thread(store) != []
    # Nothing else in the session: it goes too.
    store.remove_thread("s1", key="rec", expected="r1")
    assert_no_session(store, "s1")
    # With something else in it, the session stays with that.
    store.write_thread(
        "s1", key="rec", expected=None, record=record("r1"), messages=[user("q", id="q")], head_id="q"
    )
    store.put("s1", "other", 1)
    store.add_messages("s1", [user("kept")], conversation="kept")
    store.remove_thread("s1", key="rec", expected="r1")
    assert store.get_all("s1") == {"other": 1}
    assert [info["conversation"] for info in store.list_conversations("s1")] == ["kept"]
    assert [entry["op"] for entry in store.get_history("s1", 0)][-2:] == ["clear", "clear_messages"]
    with pytest.raises(RevisionConflict):
        store.remove_thread("s1", key="rec", expected="r1")
    # A record created again under the key starts afresh.
    (again,) = store.write_thread("s1", key="rec", expected=None, record=record("r9"), messages=[user("new")])
    assert again["parent_id"] is None


def test_write_thread_is_isolated_by_owner(store):
    alice, bob = store.for_owner("alice"), store.for_owner("bob")
    alice.write_thread(
        "s1", key="rec", expected=None, record=record("r1"), messages=[user("mine", id="q")], head_id="q"
    )
    with pytest.raises(RevisionConflict):
        bob.write_thread(
            "s1", key="rec", expected="r1", record=record("r2"), messages=[user("his")], parent_id="q"
        )
    with pytest.raises(RevisionConflict):
        bob.remove_thread("s1", key="rec", expected="r1")
    bob.write_thread(
        "s1", key="rec", expected=None, record=record("b1"), messages=[user("his", id="q")], head_id="q"
    )
    assert contents(thread(alice)) == ["mine"] and alice.get("s1", "rec") == {"revision": "r1"}
    assert_no_session(store, "s1")


# Session ends ---------------------------------------------------------------------------


def test_delete_session_removes_its_conversations(store):
    store.add_messages("s1", [user("q", id="m1")])
    store.add_messages("s1", [user("q")], conversation="other")
    store.delete_session("s1")
    with pytest.raises(SessionNotFound):
        store.get_messages("s1")
    fresh = store.add_messages("s1", [user("new", id="m1")])  # no conflict with the deleted m1
    assert fresh["messages"][0]["seq"] == 1
    assert [info["conversation"] for info in store.list_conversations("s1")] == ["default"]
    assert contents(thread(store)) == ["new"]


def test_expired_sessions_lose_their_conversations(store):
    info = store.create_session("s1", ttl_seconds=LIVE_TTL)
    store.add_messages("s1", [user("q", id="m1"), assistant("a")])
    store.add_messages("s1", [user("q")], conversation="other")
    wait_past(info["expires_at"])
    for read in (
        lambda: store.get_messages("s1"),
        lambda: store.get_context("s1"),
        lambda: store.list_conversations("s1"),
    ):
        with pytest.raises(SessionNotFound):
            read()
    fresh = store.add_messages("s1", [user("new", id="m1")])
    assert fresh["messages"][0]["seq"] == 1
    assert [info["conversation"] for info in store.list_conversations("s1")] == ["default"]
    assert store.session_info("s1")["ttl_seconds"] is None  # a new session, with the default TTL


def test_a_record_messages_and_checkpoints_of_an_expired_session_went_with_it(store):
    info = store.create_session("s1", ttl_seconds=LIVE_TTL)
    store.write_thread("s1", key="rec", expected=None, record=record("r1"), messages=[user("q")])
    ended = store.create_session("s2", ttl_seconds=LIVE_TTL)
    store.add_messages("s2", [user("q", id="m1")])
    graph = store.create_session("s3", ttl_seconds=LIVE_TTL)
    store.put_checkpoint("s3", "", "c1", "old")
    wait_past(max(info["expires_at"], ended["expires_at"], graph["expires_at"]))
    # An append to the ended session starts a new one (no read came between to drop it).
    assert store.add_messages("s2", [user("new", id="m1")])["messages"][0]["seq"] == 1
    store.put_checkpoint("s3", "", "c2", "new")
    assert [cp.record for cp in store.list_checkpoints("s3")] == ["new"]
    with pytest.raises(RevisionConflict):
        store.write_thread("s1", key="rec", expected="r1", record=record("r2"))
    # The next is written as the first, in a new session.
    (again,) = store.write_thread("s1", key="rec", expected=None, record=record("r9"), messages=[user("new")])
    assert (again["seq"], again["parent_id"]) == (1, None)
    assert store.get_all("s1") == {"rec": record("r9")}


def test_the_sweep_removes_expired_conversations(store):
    gone = store.create_session("gone", ttl_seconds=LIVE_TTL)
    store.add_messages("gone", [user("q"), assistant("a")])
    store.add_messages("kept", [user("q")])
    wait_past(gone["expires_at"])
    report = maintenance.sweep(store=store)
    assert report.expired_sessions in (0, 1)  # Redis may have expired the keys by itself
    assert_no_session(store, "gone")
    assert contents(thread(store, "kept")) == ["q"]
    with pytest.raises(SessionNotFound):
        store.get_messages("gone")


# Redis: TTL alignment and the sweep ------------------------------------------------------


def glob_escape(text: str) -> str:
    return re.sub(r"([*?\[\]\\])", r"\\\1", text)


def session_keys(client: redis.Redis, storage_id: str) -> dict[str, int]:
    """PTTL of every key of a session, by name."""
    keys = list(client.scan_iter(match=f"{PREFIX}:{re.escape(storage_id)}:*"))
    return {key.decode(): ttl for key, ttl in zip(keys, pttls(client, keys), strict=True)}


def assert_aligned(client: redis.Redis, storage_id: str, *, conversations: list[str]) -> dict[str, int]:
    keys = session_keys(client, storage_id)
    meta = keys.pop(f"{PREFIX}:{storage_id}:__meta__")
    for name in conversations:
        assert f"{PREFIX}:{storage_id}:~c:{name}" in keys or any(
            key.startswith(f"{PREFIX}:{storage_id}:~c:{name}:") for key in keys
        ), (name, sorted(keys))
    assert f"{PREFIX}:{storage_id}:~convs" in keys, sorted(keys)
    for key, pttl in keys.items():
        if meta == -1:
            assert pttl == -1, key
        else:
            assert pttl > 0 and abs(pttl - meta) <= 50, (key, pttl, meta)
    return keys


def test_every_conversation_key_shares_the_session_ttl(redis_store, redis_client):
    store = redis_store
    store.create_session("s1", ttl_seconds=60)
    time.sleep(0.2)  # appends made later must take the session's remaining TTL, not a fresh 60 s
    question = store.add_messages("s1", [system("rules"), user("q"), calling("c1"), result("c1")])[
        "messages"
    ][1]
    store.add_messages("s1", [assistant("a")], parent_id=question["id"])
    store.add_messages("s1", [user("x")], conversation="other")
    store.set_head("s1", question["id"])
    keys = assert_aligned(redis_client, "s1", conversations=["default", "other"])
    assert all(pttl < 59_900 for pttl in keys.values())
    store.clear_messages("s1", conversation="other")
    (again,) = store.add_messages("s1", [user("again")], conversation="other")["messages"]
    assert_aligned(redis_client, "s1", conversations=["default", "other"])
    # Popping the only message takes the conversation's keys; its replacement makes them anew.
    store.pop_message("s1", again["id"], conversation="other", replacement=[user("new"), assistant("a")])
    assert_aligned(redis_client, "s1", conversations=["default", "other"])


def test_a_record_and_its_conversation_share_the_session_ttl(settings, redis_client, redis_url):
    settings.PERSISTENT_MEMORY = memory_settings_for("redis", redis_url, SESSION_TTL_HOURS=1)
    store = get_store()
    # A session the write creates takes the default TTL; later writes keep its expiry.
    store.write_thread(
        "s1", key="rec", expected=None, record={"revision": "r1"}, messages=[user("q", id="q")]
    )
    time.sleep(0.2)
    store.write_thread(
        "s1", key="rec", expected="r1", record={"revision": "r2"}, messages=[assistant("a")], parent_id="q"
    )
    keys = assert_aligned(redis_client, "s1", conversations=["default"])
    assert f"{PREFIX}:s1:rec" in keys and all(3_500_000 < pttl < 3_599_900 for pttl in keys.values())


def test_conversation_keys_without_a_ttl_persist_with_the_session(redis_store, redis_client):
    redis_store.add_messages("s1", [user("q"), assistant("a")])
    assert_aligned(redis_client, "s1", conversations=["default"])


def test_conversation_keys_take_the_default_ttl_of_a_session_they_create(settings, redis_client, redis_url):
    settings.PERSISTENT_MEMORY = memory_settings_for("redis", redis_url, SESSION_TTL_HOURS=1)
    store = get_store()
    store.add_messages("s1", [user("q")])
    keys = assert_aligned(redis_client, "s1", conversations=["default"])
    assert all(3_590_000 < pttl <= 3_600_000 for pttl in keys.values())


def test_owned_conversation_keys_share_the_session_ttl(redis_store, redis_client):
    alice = redis_store.for_owner("user:1")
    alice.create_session("s1", ttl_seconds=30)
    alice.add_messages("s1", [user("q"), calling("c1"), result("c1")])
    assert_aligned(redis_client, "~o:user:1~s1", conversations=["default"])


def test_the_lanes_keep_conversation_keys_aligned(settings, redis_client, redis_url):
    settings.PERSISTENT_MEMORY = memory_settings_for("redis", redis_url, SESSION_TTL_HOURS=1)
    lanes = MemoryFilter(get_store())
    lanes.enrich({"text": "q", "metadata": {"session_id": "s1"}}, run_id="r1")
    time.sleep(0.1)
    lanes.store({"text": "a", "metadata": {}}, run_id="r1")
    assert_aligned(redis_client, "s1", conversations=["default"])
    assert [m["role"] for m in thread(get_store())] == ["user", "assistant"]


def test_the_sweep_leaves_no_conversation_keys_of_an_expired_session(redis_store, redis_client):
    store = redis_store
    gone = store.create_session("gone", ttl_seconds=LIVE_TTL)
    store.add_messages("gone", [user("q"), calling("c1"), result("c1")])
    store.add_messages("gone", [user("q")], conversation="other")
    store.add_messages("kept", [user("q")])
    keys = session_keys(redis_client, "gone")
    assert any(":~c:" in key for key in keys)
    # A crash could leave conversation keys behind without a TTL: the sweep finds them.
    leftovers = {key: redis_client.dump(key) for key in keys if ":~c:" in key or key.endswith(":~convs")}
    wait_past(gone["expires_at"])
    for key, dumped in leftovers.items():
        redis_client.restore(key, 0, dumped, replace=True)
    assert session_keys(redis_client, "gone")
    counts = maintenance.sweep(store=store)
    assert counts.expired_sessions + counts.leftover_keys >= 1
    assert session_keys(redis_client, "gone") == {}
    assert contents(thread(store, "kept")) == ["q"]
    assert session_keys(redis_client, "kept")


# Owners -------------------------------------------------------------------------------------


def test_conversations_are_isolated_by_owner(store):
    alice, bob = store.for_owner("alice"), store.for_owner("bob")
    mine = alice.add_messages("s1", [user("alice's", id="m1"), assistant("reply")])
    with pytest.raises(SessionNotFound):
        bob.get_messages("s1")
    with pytest.raises(SessionNotFound):
        store.get_messages("s1")  # nor the unowned namespace
    theirs = bob.add_messages("s1", [user("bob's", id="m1")])  # same ids, no conflict
    assert theirs["messages"][0]["seq"] == 1 and theirs["head"] == "m1"
    assert contents(thread(alice)) == ["alice's", "reply"]
    assert contents(thread(bob)) == ["bob's"]
    with pytest.raises(MessageNotFound):
        bob.set_head("s1", mine["head"])
    with pytest.raises(MessageNotFound):
        bob.get_messages("s1", leaf=mine["head"])
    assert bob.clear_messages("s1") == 1
    assert contents(thread(alice)) == ["alice's", "reply"]
    assert [info["message_count"] for info in alice.list_conversations("s1")] == [2]
    assert bob.list_conversations("s1") == []
    assert window_contents(alice.get_context("s1")) == ["alice's", "reply"]
    bob.delete_session("s1")
    assert contents(thread(alice)) == ["alice's", "reply"]


def test_errors_name_the_callers_session_id(store):
    alice = store.for_owner("alice")
    with pytest.raises(SessionNotFound) as info:
        alice.get_messages("s1")
    assert "'s1'" in str(info.value) and "~o:" not in str(info.value)


# The lanes --------------------------------------------------------------------------------


def test_the_lanes_record_questions_and_answers(store):
    lanes = MemoryFilter(store)
    lanes.open()
    asked, _ = lanes.enrich({"text": "What is 2+2?", "metadata": {"session_id": "s1"}})
    assert asked["metadata"]["conversation"] == {"messages": [], "tokens": 0, "truncated": False}
    lanes.store({"text": "4", "metadata": {"session_id": "s1"}})
    lanes.open()
    asked, _ = lanes.enrich({"text": "And 3+3?", "metadata": {"session_id": "s1"}})
    window = asked["metadata"]["conversation"]
    assert window["messages"] == [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    assert window["tokens"] == sum(m["tokens"] for m in thread(store)[:2])
    messages = thread(store)
    assert [(m["role"], m["content"]) for m in messages] == [
        ("user", "What is 2+2?"),
        ("assistant", "4"),
        ("user", "And 3+3?"),
    ]
    assert messages[1]["parent_id"] == messages[0]["id"]


def test_an_answer_by_run_goes_after_its_runs_question_wherever_the_head_went(store):
    store.enrich_recording("s1", "First?", run_id="r1")
    store.enrich_recording("s1", "Second?", run_id="r2")  # the head moves past r1's question
    store.record_answer(None, "To the first.", run_id="r1")
    assert contents(thread(store)) == ["First?", "To the first."]
    assert conversation_info(store)["branch_count"] == 2
    # Without a run: after the parent given, or after the head when it is none of its.
    first = thread(store)[0]["id"]
    store.record_answer("s1", "Again.", parent_id=first)
    assert contents(thread(store)) == ["First?", "Again."]
    store.record_answer("s1", "Last.", parent_id="nowhere")
    assert contents(thread(store)) == ["First?", "Again.", "Last."]


def test_the_lanes_name_a_conversation_and_record_nothing_without_text(store):
    lanes = MemoryFilter(store)
    lanes.enrich({"text": "q", "metadata": {"session_id": "s1", "conversation_name": "node-1"}}, run_id="r1")
    lanes.store({"text": "a", "metadata": {"conversation_name": "node-1"}}, run_id="r1")
    lanes.enrich({"metadata": {"session_id": "s1"}})  # no text: nothing recorded
    assert [info["conversation"] for info in store.list_conversations("s1")] == ["node-1"]
    assert contents(thread(store, conversation="node-1")) == ["q", "a"]


def test_record_conversation_off_records_nothing(configure):
    store = configure(RECORD_CONVERSATION=False)
    lanes = MemoryFilter(store)
    question, _ = lanes.enrich({"text": "q", "metadata": {"session_id": "s1"}})
    lanes.store({"text": "a", "metadata": {"session_id": "s1"}})
    assert "conversation" not in question["metadata"]
    assert store.list_conversations("s1") == []
    assert store.get("s1", "last_answer") == "a"


# Redis: one round trip per method --------------------------------------------------------


def test_every_conversation_method_is_one_round_trip(counting_client):
    store = MemoryStore(RedisBackend(client=counting_client, max_history=100, auto_summarize=True))
    lanes = MemoryFilter(store)
    store.ping()
    store.create_session("warm")
    first = store.add_messages("s1", [user("q"), assistant("a")])["messages"]
    operations = {
        "add_messages (1 message)": lambda: store.add_messages("s1", [user("q2")]),
        "add_messages (a call and its results)": lambda: store.add_messages(
            "s1", [calling("c1", "c2"), result("c1"), result("c2")]
        ),
        "add_messages (branch)": lambda: store.add_messages("s1", [assistant("b")], parent_id=first[0]["id"]),
        "add_messages (re-sent)": lambda: store.add_messages("s1", [user("q", id="m1")]),
        "add_messages (new session)": lambda: store.add_messages("s2", [user("q")]),
        "get_messages": lambda: store.get_messages("s1"),
        "get_messages (leaf, limit)": lambda: store.get_messages("s1", leaf=first[1]["id"], limit=1),
        "get_context": lambda: store.get_context("s1"),
        "get_context (budgets)": lambda: store.get_context("s1", max_tokens=10, max_messages=2),
        "list_conversations": lambda: store.list_conversations("s1"),
        "set_head": lambda: store.set_head("s1", first[1]["id"]),
        "clear_messages": lambda: store.clear_messages("s2"),
        "pop_message (with a replacement)": lambda: store.pop_message(
            "s1", heads["s1"], replacement=[user("again")]
        ),
        "write_thread (new session)": lambda: store.write_thread(
            "s4",
            key="rec",
            expected=None,
            record={"revision": "r1"},
            messages=[user("q", id="q")],
            head_id="q",
        ),
        "write_thread (append)": lambda: store.write_thread(
            "s4",
            key="rec",
            expected="r1",
            record={"revision": "r2"},
            messages=[assistant("a")],
            parent_id="q",
        ),
        "remove_thread": lambda: store.remove_thread("s4", key="rec", expected="r2"),
        "enrich lane (recording)": lambda: lanes.enrich({"text": "q3", "metadata": {"session_id": "s1"}}),
        "store lane (recording)": lambda: lanes.store({"text": "a3", "metadata": {"session_id": "s1"}}),
        "enrich lane with run_id": lambda: MemoryFilter(store).enrich(
            {"text": "q4", "metadata": {"session_id": "s3"}}, run_id="r1"
        ),
        "store lane through run_id": lambda: MemoryFilter(store).store(
            {"text": "a4", "metadata": {}}, run_id="r1"
        ),
    }
    trips = {}
    for name, call in operations.items():
        if name == "add_messages (re-sent)":
            store.add_messages("s1", [user("q", id="m1")])
        heads = {"s1": store.get_messages("s1", limit=1)["head"]}
        CountingConnection.sends = 0
        call()
        trips[name] = CountingConnection.sends
    assert trips == dict.fromkeys(operations, 1)
    refused = {
        "orphan tool result": lambda: store.add_messages("s1", [result("nope")]),
        "conflict": lambda: store.add_messages("s1", [user("other", id="m1")]),
        "missing parent": lambda: store.add_messages("s1", [user("x")], parent_id="missing"),
    }
    for name, call in refused.items():
        CountingConnection.sends = 0
        with pytest.raises((OrphanToolResult, MessageConflict, MessageNotFound)):
            call()
        trips[name] = CountingConnection.sends
    assert [trips[name] for name in refused] == [1, 1, 1]
    store.close()


def test_the_enrich_lane_counts_the_session_values_against_the_byte_cap(configure):
    """A question recorded by the enrich lane counts against MAX_SESSION_BYTES with every
    value of the session (read once for the reply on Redis): over it, nothing is written."""
    store = configure(MAX_SESSION_BYTES=2000)
    store.create_session("s1")
    store.put("s1", "big", "x" * 1500)
    store.put("s1", "small", 1)
    lanes = MemoryFilter(store)
    lanes.enrich({"text": "first?", "metadata": {"session_id": "s1"}})
    before = state(store)
    with pytest.raises(QuotaExceeded):
        lanes.enrich({"text": "y" * 400, "metadata": {"session_id": "s1"}})
    assert state(store) == before
    asked, _ = lanes.enrich({"text": "short?", "metadata": {"session_id": "s1"}})
    assert asked["metadata"]["memory_context"] == {"big": "x" * 1500, "small": 1}
    assert contents(thread(store)) == ["first?", "short?"]
