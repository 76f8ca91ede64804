"""Conversations in the ORM mirror, on both backends: a sync makes the conversation and
message rows equal to the store, writing only what changed; the memory backend comes
back from the mirror (and its journal) with the same conversations, byte for byte."""

from __future__ import annotations

import json
import logging
from functools import reduce
from operator import xor
from types import SimpleNamespace
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from persistent_memory import get_store, reset_store
from persistent_memory.backends.conversations import text_digest
from persistent_memory.mirror import conversations as mirror_conversations
from persistent_memory.models import MemoryConversation, MemoryMessage, MemorySession
from persistent_memory.owners import storage_id
from persistent_memory.store import MemoryStore
from tests.test_journal import crash, journaled  # noqa: F401  (journaled is a fixture)

WEATHER_CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
}


def chat(store: MemoryStore, session_id: str, conversation: str = "default") -> None:
    """A chat with a system message, a tool call and its result, and a regenerated answer."""
    store.add_messages(
        session_id,
        [
            {"id": "sys", "role": "system", "content": "You answer in one sentence."},
            {"id": "u1", "role": "user", "name": "ann", "content": "Weather in Paris?"},
            {"id": "a1", "role": "assistant", "content": None, "tool_calls": [WEATHER_CALL]},
            {"id": "t1", "role": "tool", "tool_call_id": "call_1", "content": '{"celsius": 21}'},
            {"id": "a2", "role": "assistant", "content": "21 degrees."},
        ],
        conversation=conversation,
    )
    store.add_messages(
        session_id,
        [{"id": "a2b", "role": "assistant", "content": "It is 21 °C in Paris.", "metadata": {"model": "m2"}}],
        conversation=conversation,
        parent_id="t1",
    )


#: What a conversation's snapshot holds on every backend (the memory backend adds its
#: digest and counts, checked by test_the_snapshot_figures_are_those_of_its_messages).
PORTABLE = ("head", "seq", "trimmed", "messages", "summaries")


def portable(conversations: dict[str, Any]) -> dict[str, Any]:
    return {name: {k: c[k] for k in PORTABLE if k in c} for name, c in conversations.items()}


def stored_conversations(store: MemoryStore, session_id: str) -> dict[str, Any]:
    """The session's conversations as every backend hands them to the mirror."""
    sid = storage_id(store.owner, session_id)
    snapshot = store.backend.snapshots([sid])[sid]
    assert snapshot is not None
    return portable(snapshot.get("conversations", {}))


def shown(value: Any) -> Any:
    """``value`` as the display columns hold it: U+0000 as the text ``\\u0000``."""
    return json.loads(json.dumps(value).replace("\\u0000", "\\\\u0000"))


def assert_conversations_mirrored(store: MemoryStore, session_id: str) -> MemorySession:
    """The rows say exactly what the store says of every conversation of the session."""
    row = MemorySession.objects.get(session_id=session_id)
    conversations = stored_conversations(store, session_id)
    listed = {info["conversation"]: info for info in store.list_conversations(session_id)}
    rows = {conversation.name: conversation for conversation in row.conversations.all()}
    assert set(rows) == set(conversations) == set(listed)
    for name, conversation in rows.items():
        info = listed[name]
        assert (
            conversation.head or None,
            conversation.message_count,
            conversation.tokens,
            conversation.branch_count,
            conversation.trimmed,
            conversation.seq,
        ) == (
            info["head"],
            info["message_count"],
            info["tokens"],
            info["branch_count"],
            info["trimmed"],
            conversations[name]["seq"],
        )
        messages = list(conversation.messages.order_by("seq"))
        assert [message.stored for message in messages] == conversations[name]["messages"]
        for message in messages:
            decoded = json.loads(message.stored)
            assert (message.message_id, message.parent_id or None, message.seq, message.role) == (
                decoded["id"],
                decoded["parent_id"],
                decoded["seq"],
                decoded["role"],
            )
            assert (message.tokens, message.tokenizer, message.name, message.tool_call_id) == (
                decoded["tokens"],
                decoded["tokenizer"],
                decoded.get("name", ""),
                decoded.get("tool_call_id", ""),
            )
            assert message.tool_calls == shown(decoded.get("tool_calls"))
            assert message.metadata == shown(decoded.get("metadata"))
            assert message.created_at.timestamp() == pytest.approx(decoded["created_at"], abs=1e-5)
    return row


@pytest.fixture
def mirrored(db, configure):
    """A store whose mirror syncs when told to (deferred), on each backend."""
    store = configure(MIRROR_MODE="deferred", MAX_MESSAGES=8)
    assert store.mirror.mode == "deferred"
    return store


def test_a_sync_mirrors_every_branch_and_the_head(mirrored):
    store = mirrored
    chat(store, "s1")
    chat(store, "s1", "node-b")
    store.set_head("s1", "a2", conversation="node-b")
    assert store.mirror.sync_dirty().synced == 1
    row = assert_conversations_mirrored(store, "s1")
    default = row.conversations.get(name="default")
    assert (default.head, default.message_count, default.branch_count) == ("a2b", 6, 2)
    assert row.conversations.get(name="node-b").head == "a2"
    call = MemoryMessage.objects.get(conversation=default, message_id="a1")
    assert (call.role, call.content_text, call.tool_calls) == ("assistant", "", [WEATHER_CALL])
    result = MemoryMessage.objects.get(conversation=default, message_id="t1")
    assert (result.parent_id, result.tool_call_id, result.content_text) == ("a1", "call_1", '{"celsius": 21}')
    regenerated = MemoryMessage.objects.get(conversation=default, message_id="a2b")
    assert (regenerated.parent_id, regenerated.metadata) == ("t1", {"model": "m2"})


def test_a_sync_inserts_only_the_new_messages(mirrored):
    store = mirrored
    chat(store, "s1")
    store.mirror.sync_dirty()
    before = dict(MemoryMessage.objects.values_list("message_id", "pk"))
    store.add_messages("s1", [{"id": "u2", "role": "user", "content": "And tomorrow?"}])
    store.mirror.sync_dirty()
    assert_conversations_mirrored(store, "s1")
    after = dict(MemoryMessage.objects.values_list("message_id", "pk"))
    assert {message_id: after[message_id] for message_id in before} == before  # the same rows
    assert set(after) - set(before) == {"u2"}
    # A head move alone writes no message.
    store.set_head("s1", "a2")
    store.mirror.sync_dirty()
    assert_conversations_mirrored(store, "s1")
    assert dict(MemoryMessage.objects.values_list("message_id", "pk")) == after


def test_the_snapshot_figures_are_those_of_its_messages(mirrored):
    """A backend that hands the mirror a digest and counts (the memory backend) hands true
    ones, through appends, a branch, a head move, trims and a restore."""
    store = mirrored  # MAX_MESSAGES=8

    def check() -> None:
        [conversation] = store.backend.snapshots(["s1"])["s1"]["conversations"].values()
        if store.backend.name == "redis":
            assert "digest" not in conversation  # the mirror counts and hashes itself
            return
        [info] = store.list_conversations("s1")
        digest = reduce(xor, map(text_digest, conversation["messages"]), 0)
        assert conversation["digest"] == f"{digest:032x}"
        figures = [conversation[k] for k in ("message_count", "tokens", "branch_count")]
        assert figures == [info["message_count"], info["tokens"], info["branch_count"]]

    chat(store, "s1")
    check()
    store.set_head("s1", "a2")
    check()
    for turn in range(3):  # beyond MAX_MESSAGES: the oldest go
        turn_messages = [{"role": "user", "content": f"q{turn}"}, {"role": "assistant", "content": "a"}]
        store.add_messages("s1", turn_messages)
        check()
    assert store.list_conversations("s1")[0]["trimmed"] > 0
    snapshot = store.backend.snapshots(["s1"])["s1"]
    store.backend.restore_session(snapshot, replace=True)
    check()
    store.add_messages("s1", [{"role": "user", "content": "after the restore"}])
    check()


def test_a_sync_of_a_grown_chat_reads_only_what_it_gained(mirrored, monkeypatch):
    store = mirrored
    store.add_messages("s1", [{"role": "user", "content": f"m{n}"} for n in range(6)])
    store.mirror.sync_dirty()
    store.add_messages("s1", [{"role": "assistant", "content": "the answer"}])
    parsed: list[str] = []
    counting = SimpleNamespace(loads=lambda text: parsed.append(text) or json.loads(text), dumps=json.dumps)
    monkeypatch.setattr(mirror_conversations, "json", counting)
    with CaptureQueriesContext(connection) as queries:
        store.mirror.sync_dirty()
    monkeypatch.undo()
    assert_conversations_mirrored(store, "s1")
    # Nor are the mirrored messages read back to compare: the digest says they are the same.
    assert not [q for q in queries if q["sql"].startswith("SELECT") and "_memorymessage" in q["sql"]]
    # The memory backend's snapshot says what the rows must hold: only the new message is
    # read (and the one before it, where the walk back stops); Redis's is read whole.
    assert len(parsed) == (2 if store.backend.name == "memory" else 7)


def test_a_conversation_written_again_between_syncs_is_compared_message_by_message(mirrored):
    """Cleared and written again past the rows' seq: what the rows hold is no longer the
    older part of the snapshot, so the sync compares instead of only appending."""
    store = mirrored
    chat(store, "s1")  # seq 6
    store.mirror.sync_dirty()
    store.clear_messages("s1")
    store.add_messages("s1", [{"role": "user", "content": f"new {n}"} for n in range(7)])  # seq 1-7
    store.mirror.sync_dirty()
    assert_conversations_mirrored(store, "s1")
    contents = MemoryMessage.objects.order_by("seq").values_list("content_text", flat=True)
    assert list(contents) == [f"new {n}" for n in range(7)]


def test_conversations_that_did_not_change_are_left_alone(mirrored):
    store = mirrored
    chat(store, "s1")
    chat(store, "s1", "other")
    store.mirror.sync_dirty()
    MemoryConversation.objects.filter(name="other").update(tokens=-1)  # a mark a rewrite would erase
    store.add_messages("s1", [{"id": "u2", "role": "user", "content": "And tomorrow?"}])
    store.mirror.sync_dirty()
    assert MemoryConversation.objects.get(name="other").tokens == -1
    assert MemoryConversation.objects.get(name="default").message_count == 7
    store.set_head("s1", "a2", conversation="other")  # a head move is a change
    store.mirror.sync_dirty()
    assert_conversations_mirrored(store, "s1")


def test_trimmed_messages_leave_the_mirror_and_the_rest_stay(mirrored):
    store = mirrored  # MAX_MESSAGES=8
    chat(store, "s1")
    store.mirror.sync_dirty()
    before = dict(MemoryMessage.objects.values_list("message_id", "pk"))
    for turn in range(3):
        store.add_messages(
            "s1",
            [
                {"id": f"q{turn}", "role": "user", "content": f"question {turn}"},
                {"id": f"r{turn}", "role": "assistant", "content": f"answer {turn}"},
            ],
        )
    store.mirror.sync_dirty()
    row = assert_conversations_mirrored(store, "s1")
    conversation = row.conversations.get()
    assert conversation.trimmed > 0
    mirrored_ids = set(MemoryMessage.objects.values_list("message_id", flat=True))
    assert "u1" not in mirrored_ids and "sys" in mirrored_ids  # oldest first; the system message stays
    after = dict(MemoryMessage.objects.values_list("message_id", "pk"))
    assert all(after[message_id] == pk for message_id, pk in before.items() if message_id in after)


def test_cleared_conversations_leave_the_mirror(mirrored):
    store = mirrored
    chat(store, "s1")
    chat(store, "s1", "other")
    store.mirror.sync_dirty()
    assert store.clear_messages("s1", conversation="other") == 6
    store.mirror.sync_dirty()
    row = assert_conversations_mirrored(store, "s1")
    assert list(row.conversations.values_list("name", flat=True)) == ["default"]
    assert not MemoryMessage.objects.filter(conversation__name="other").exists()
    # Cleared, then written again under the same ids with other content and seqs:
    # the rows follow the store, not what they held under those ids.
    store.clear_messages("s1")
    store.add_messages("s1", [{"id": "u1", "role": "user", "content": "Something else"}])
    store.add_messages("s1", [{"id": "sys", "role": "user", "content": "not a system message now"}])
    store.mirror.sync_dirty()
    assert_conversations_mirrored(store, "s1")
    assert MemoryMessage.objects.get(message_id="sys").role == "user"


def test_popped_messages_leave_the_mirror(mirrored):
    store = mirrored
    chat(store, "s1")
    store.mirror.sync_dirty()
    head = store.get_messages("s1")["head"]
    store.pop_message("s1", head, replacement=[{"id": "instead", "role": "assistant", "content": "Other"}])
    store.mirror.sync_dirty()
    assert_conversations_mirrored(store, "s1")
    assert not MemoryMessage.objects.filter(message_id=head).exists()
    assert MemoryMessage.objects.get(message_id="instead").content_text == "Other"


def test_a_conversation_left_without_messages_is_mirrored_empty(mirrored):
    store = mirrored
    store.add_messages("s1", [{"id": "only", "role": "user", "content": "Hello?"}])
    store.mirror.sync_dirty()
    store.pop_message("s1", "only")
    store.mirror.sync_dirty()
    assert_conversations_mirrored(store, "s1")
    assert not MemoryMessage.objects.exists()


def test_deleted_sessions_keep_their_conversation_rows_until_swept(mirrored):
    store = mirrored
    chat(store, "s1")
    store.mirror.sync_dirty()
    store.delete_session("s1")
    assert store.mirror.sync_dirty().gone == 1
    row = MemorySession.objects.get(session_id="s1")
    assert row.state == MemorySession.State.DELETED
    assert MemoryMessage.objects.filter(conversation__session=row).count() == 6
    row.delete()
    assert not MemoryConversation.objects.exists() and not MemoryMessage.objects.exists()


def test_a_full_sync_mirrors_conversations_written_while_the_mirror_was_off(
    db, settings, redis_client, redis_url
):
    # Redis keeps what was written with the mirror off; a full pass finds it.
    settings.PERSISTENT_MEMORY = {"BACKEND": "redis", "REDIS_URL": redis_url, "MIRROR_MODE": "off"}
    chat(get_store(), "s1")
    settings.PERSISTENT_MEMORY = {"BACKEND": "redis", "REDIS_URL": redis_url, "MIRROR_MODE": "deferred"}
    store = get_store()
    assert store.mirror.sync_dirty().synced == 0
    assert store.mirror.sync_all().synced == 1
    assert_conversations_mirrored(store, "s1")


def test_nul_characters_are_kept_exactly(mirrored):
    # PostgreSQL's text and jsonb refuse U+0000: the stored text keeps it as JSON's
    # escape (exactly what the store holds); the display columns show that escape.
    store = mirrored
    store.add_messages(
        "s1",
        [
            {
                "id": "u1",
                "role": "user",
                "content": [{"type": "text", "text": "a\x00b"}],
                "metadata": {"k\x00": "v\x00"},
            },
            {
                "id": "a1",
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c", "type": "function", "function": {"name": "f", "arguments": "\x00"}}
                ],
            },
        ],
    )
    assert store.mirror.sync_dirty().failed == 0
    assert_conversations_mirrored(store, "s1")
    message = MemoryMessage.objects.get(message_id="u1")
    assert message.content_text == "a\\u0000b"
    assert message.metadata == {"k\\u0000": "v\\u0000"}
    assert json.loads(message.stored)["content"][0]["text"] == "a\x00b"
    assert MemoryMessage.objects.get(message_id="a1").tool_calls[0]["function"]["arguments"] == "\\u0000"


def test_content_is_searchable_as_plain_text(mirrored):
    store = mirrored
    store.add_messages(
        "s1",
        [
            {
                "id": "u1",
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is in"},
                    {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
                    {"type": "text", "text": "this picture?"},
                ],
            }
        ],
    )
    store.mirror.sync_dirty()
    message = MemoryMessage.objects.get(content_text__icontains="PICTURE")
    assert message.content_text == "What is in\n[image_url]\nthis picture?"


def test_a_database_failure_on_messages_is_recorded_and_retried(mirrored, caplog):
    store = mirrored
    chat(store, "s1")
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE persistent_memory_memorymessage RENAME TO pm_broken")
    try:
        with caplog.at_level(logging.ERROR, logger="persistent_memory.mirror"):
            result = store.mirror.sync_dirty()
        assert (result.synced, result.failed) == (0, 1)
        assert "persistent_memory_memorymessage" in MemorySession.objects.get(session_id="s1").sync_error
        store.add_messages("s1", [{"id": "u2", "role": "user", "content": "still there?"}])
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE pm_broken RENAME TO persistent_memory_memorymessage")
    assert store.mirror.sync_dirty().synced == 1
    row = assert_conversations_mirrored(store, "s1")
    assert row.sync_error == ""


# Restoring the memory backend ---------------------------------------------------------


def reads(store: MemoryStore, session_id: str) -> dict[str, Any]:
    """Everything the conversation API answers for the session, and the stored texts."""
    result: dict[str, Any] = {
        "list": sorted(store.list_conversations(session_id), key=lambda info: info["conversation"]),
        "texts": stored_conversations(store, session_id),
    }
    for name, conversation in result["texts"].items():
        leaves = {json.loads(text)["id"] for text in conversation["messages"]} - {
            json.loads(text)["parent_id"] for text in conversation["messages"]
        }
        result[name] = {
            "thread": store.get_messages(session_id, conversation=name),
            "leaves": {leaf: store.get_messages(session_id, conversation=name, leaf=leaf) for leaf in leaves},
            "context": store.get_context(session_id, conversation=name),
            "small": store.get_context(session_id, conversation=name, max_tokens=40, max_messages=3),
        }
    return result


def fill(store: MemoryStore) -> None:
    chat(store, "kept")
    chat(store, "kept", "moved")
    store.set_head("kept", "a2", conversation="moved")
    chat(store, "kept", "cleared")
    for turn in range(10):  # past MAX_MESSAGES: trimmed
        store.add_messages("kept", [{"role": "user", "content": f"turn {turn} \x00"}], conversation="long")
    store.clear_messages("kept", conversation="cleared")
    store.for_owner("user:1").add_messages("owned", [{"role": "user", "content": "hello"}])
    # A system message whose thread was trimmed after it: still pinned, also when its
    # first user message was edited (a branch from the system message).
    pinned = {"conversation": "pinned"}
    store.add_messages("kept", [{"id": "p-sys", "role": "system", "content": "Be brief."}], **pinned)
    store.add_messages("kept", [{"id": "p-u1", "role": "user", "content": "first"}], **pinned)
    store.add_messages(
        "kept", [{"id": "p-u1b", "role": "user", "content": "first, edited"}], parent_id="p-sys", **pinned
    )
    for turn in range(8):
        store.add_messages(
            "kept", [{"id": f"p-t{turn}", "role": "user", "content": f"turn {turn}"}], **pinned
        )


@pytest.mark.django_db(transaction=True)
def test_the_memory_backend_restores_conversations_from_the_mirror(settings):
    settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "MIRROR_MODE": "immediate", "MAX_MESSAGES": 8}
    store = get_store()
    fill(store)
    before = reads(store, "kept")
    owned = store.for_owner("user:1").get_messages("owned")
    assert before["list"][1]["conversation"] == "long" and before["list"][1]["trimmed"] == 2
    assert before["list"][3]["conversation"] == "pinned" and before["list"][3]["trimmed"] == 3
    # A trim takes the oldest messages on any branch: the first message and its edit went
    # (and turn 0), so one branch is left, pinned after its system message.
    assert before["list"][3]["branch_count"] == 1
    assert [m["id"] for m in before["pinned"]["thread"]["messages"]][:2] == ["p-sys", "p-t1"]
    assert before["pinned"]["context"]["messages"][0] == {"role": "system", "content": "Be brief."}
    reset_store()  # the process ends: the worker flushes

    fresh = MemoryStore.from_settings()  # a new process over the same database
    try:
        assert reads(fresh, "kept") == before
        assert fresh.for_owner("user:1").get_messages("owned") == owned
        # The trees work on: seq goes on from where it was, branches and trimming too.
        appended = fresh.add_messages("kept", [{"role": "user", "content": "again"}], conversation="moved")
        assert appended["messages"][0]["parent_id"] == "a2"
        assert appended["messages"][0]["seq"] == before["texts"]["moved"]["seq"] + 1
    finally:
        fresh.close()


@pytest.mark.django_db(transaction=True)
def test_the_journal_brings_back_what_the_mirror_had_not(journaled):  # noqa: F811
    store = journaled()
    chat(store, "kept")
    chat(store, "kept", "cleared")
    store.mirror.sync_dirty()  # rows written; what follows is in the journal only
    chat(store, "kept", "late")
    store.set_head("kept", "a2")
    store.add_messages("kept", [{"id": "u9", "role": "user", "content": "after the sync"}])
    store.clear_messages("kept", conversation="cleared")
    store.pop_message("kept", "u9", replacement=[{"id": "u10", "role": "user", "content": "instead"}])
    late = store.get_messages("kept", conversation="late")["head"]
    store.pop_message("kept", late, conversation="late")
    # A record and its conversation, one written twice, one removed with its session.
    message = {"id": "r-q", "role": "user", "content": "recorded"}
    store.write_thread(
        "kept", key="rec", expected=None, record={"revision": "1"}, messages=[message], conversation="rec"
    )
    store.write_thread(
        "kept", key="rec", expected="1", record={"revision": "2"}, head_id="r-q", conversation="rec"
    )
    store.write_thread("gone", key="rec", expected=None, record={"revision": "1"}, messages=[message])
    store.remove_thread("gone", key="rec", expected="1")
    values = store.get_all("kept")
    before = reads(store, "kept")
    assert set(before["texts"]) == {"default", "late", "rec"}
    crash(store)

    fresh = journaled()
    assert reads(fresh, "kept") == before
    assert fresh.get_all("kept") == values and fresh.list_sessions() == ["kept"]
    # Once the mirror has caught up, a restart from the rows alone gives the same.
    fresh.mirror.sync_dirty()
    assert not MemoryConversation.objects.filter(name="cleared").exists()
    fresh.mirror.checkpoint()
    fresh.mirror.stop()
    fresh.close()
    again = journaled()
    assert reads(again, "kept") == before


@pytest.mark.django_db(transaction=True)
def test_a_restart_from_the_mirror_keeps_the_summaries(settings):
    from persistent_memory.conversations.summarizing import summarize_conversation
    from tests.test_summaries import Recorder, options

    settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "MIRROR_MODE": "immediate"}
    store = get_store()
    store.add_messages(
        "s1",
        [
            {"role": "user", "content": "Where is the meeting?"},
            {"role": "assistant", "content": "In Paris."},
            {"role": "user", "content": "When?"},
            {"role": "assistant", "content": "At noon."},
        ],
    )
    summarizer = Recorder("They planned a meeting in Paris.")
    assert summarize_conversation(store, "s1", "default", summarizer, options(min_tokens=0, keep_tokens=0))
    before = reads(store, "s1")
    assert before["texts"]["default"]["summaries"][0]["text"] == "They planned a meeting in Paris."
    reset_store()  # the process ends: the worker flushes

    fresh = MemoryStore.from_settings()
    try:
        assert reads(fresh, "s1") == before
    finally:
        fresh.close()


def test_a_row_written_before_summaries_were_kept_per_branch_reads_as_a_list():
    one = {"text": "They talked.", "anchor": "a1", "anchor_seq": 2, "tokens": 3, "covered_tokens": 9}
    assert mirror_conversations.row_summaries(json.dumps(one)) == [one]
    assert mirror_conversations.row_summaries(json.dumps([one, one])) == [one, one]
    assert mirror_conversations.row_summaries("") == []


def test_content_parts_without_a_type_show_as_parts():
    parts = [{"type": "text", "text": "Look:"}, {"image": "..."}, "raw", {"type": "input_audio"}]
    assert mirror_conversations.content_text(parts) == "Look:\n[part]\n[part]\n[input_audio]"
    assert mirror_conversations.content_text([{"type": "text"}, {"type": "text", "text": "x"}]) == "\nx"
    assert mirror_conversations.content_text(None) == ""


def test_a_chat_grown_past_every_mirrored_message_is_mirrored(mirrored):
    """Every message the rows hold was trimmed since: none of the snapshot is older."""
    store = mirrored  # MAX_MESSAGES=8
    store.add_messages("s1", [{"role": "user", "content": "first"}])
    store.mirror.sync_dirty()
    store.add_messages("s1", [{"role": "user", "content": f"m{n}"} for n in range(10)])
    store.mirror.sync_dirty()
    assert_conversations_mirrored(store, "s1")
    assert not MemoryMessage.objects.filter(content_text="first").exists()


def test_more_stale_messages_than_one_delete_takes_all_leave_the_mirror(db, settings):
    """A rewritten conversation compared message by message deletes its stale rows 500 a
    query (within every database's limit of parameters): past 1,000 of them, none is left."""
    settings.PERSISTENT_MEMORY = {
        "BACKEND": "memory",
        "MIRROR_MODE": "deferred",
        "MAX_MESSAGES": 1100,
        "MAX_BATCH": 1100,
    }
    store = get_store()
    store.add_messages("s1", [{"role": "user", "content": f"old {n}"} for n in range(1001)])
    store.mirror.sync_dirty()
    store.clear_messages("s1")
    store.add_messages("s1", [{"role": "user", "content": f"new {n}"} for n in range(1001)])
    store.mirror.sync_dirty()
    contents = MemoryMessage.objects.order_by("seq").values_list("content_text", flat=True)
    assert list(contents) == [f"new {n}" for n in range(1001)]


#: A tokenizer named by a dotted path longer than the message column holds (200 characters).
LONG_TOKENIZER = f"{__name__}.counter_{'x' * 200}"
globals()[LONG_TOKENIZER.rsplit(".", 1)[1]] = len


def test_a_tokenizer_name_longer_than_its_column_is_cut(db, settings):
    settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "MIRROR_MODE": "deferred", "TOKENIZER": LONG_TOKENIZER}
    store = get_store()
    store.add_messages("s1", [{"role": "user", "content": "Hello"}])
    store.mirror.sync_dirty()
    message = MemoryMessage.objects.get()
    assert json.loads(message.stored)["tokenizer"] == LONG_TOKENIZER
    assert message.tokenizer == LONG_TOKENIZER[:200]


def test_a_conversation_without_a_head_is_mirrored_without_one(mirrored):
    """A thread written with no head (the next append starts a new root) keeps its
    messages; its row says it has none."""
    store = mirrored
    message = {"id": "q", "role": "user", "content": "recorded"}
    store.write_thread("s1", key="rec", expected=None, record={"revision": "1"}, messages=[message])
    assert store.get_messages("s1")["head"] is None
    store.mirror.sync_dirty()
    row = assert_conversations_mirrored(store, "s1")
    assert row.conversations.get().head == ""


def test_a_sync_writes_grown_conversations_after_one_written_again(mirrored):
    """A conversation compared message by message does not stop the sync from appending
    to the conversations after it (each session here has one of each, in either order)."""
    store = mirrored
    for sid in ("s1", "s2"):
        chat(store, sid)
        chat(store, sid, "other")
    store.mirror.sync_dirty()
    for sid, rewritten, grown in (("s1", "default", "other"), ("s2", "other", "default")):
        store.clear_messages(sid, conversation=rewritten)
        store.add_messages(
            sid, [{"role": "user", "content": f"new {n}"} for n in range(7)], conversation=rewritten
        )
        store.add_messages(
            sid, [{"id": "u2", "role": "user", "content": "And tomorrow?"}], conversation=grown
        )
    store.mirror.sync_dirty()
    assert_conversations_mirrored(store, "s1")
    assert_conversations_mirrored(store, "s2")


def test_message_times_no_column_can_hold_are_stored_as_the_syncs_time(mirrored):
    """An import takes any finite time for a message, even past any date: the message
    still gets its row, with the sync's time, whether new or compared with the rows."""
    from django.utils import timezone

    from persistent_memory.chat.records import export_conversations, import_conversations

    store = mirrored
    chat(store, "s1")
    store.mirror.sync_dirty()  # s1's rows are written first: its next sync compares them
    chat(store, "s2")
    for sid in ("s1", "s2"):
        snapshot = store.backend.snapshots([sid])[sid]
        exported = export_conversations(snapshot["conversations"])
        exported["default"]["messages"][0]["created_at"] = 1e300
        snapshot["conversations"] = import_conversations(exported, max_message_bytes=1 << 20, max_depth=32)
        store.backend.restore_session(snapshot, replace=True)
    before = timezone.now()
    assert store.mirror.sync_dirty().synced == 2
    for sid in ("s1", "s2"):
        first = MemoryMessage.objects.get(conversation__session__session_id=sid, message_id="sys")
        assert before <= first.created_at <= timezone.now()
        held = len(store.backend.snapshots([sid])[sid]["conversations"]["default"]["messages"])
        assert MemoryMessage.objects.filter(conversation__session__session_id=sid).count() == held
