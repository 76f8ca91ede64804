"""Pydantic AI's conversation stores on our conversations (persistent_memory.integrations.
pydantic_ai), on every backend and Redis setup: Pydantic AI's ``Agent`` with its
``TestModel`` and ``FunctionModel`` (no network) saving, loading, branching and forking
through the store; the same scenario on Pydantic AI's own ``InMemoryConversationStore``
and on ours, observed alike; conflicting and concurrent writes; owners and scopes; message
parts read back equal; and what the app does with any conversation (windows, forget-an-
owner, export and import, expiry, round trips)."""

from __future__ import annotations

import asyncio
import json
import threading
from datetime import UTC, datetime
from typing import Any

import pytest
import redis
from django.contrib.auth import get_user_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic_ai import Agent
from pydantic_ai.conversation import Conversation
from pydantic_ai.conversation_store import (
    ConversationConflict,
    ConversationStore,
    InMemoryConversationStore,
)
from pydantic_ai.exceptions import UserError
from pydantic_ai.messages import (
    BinaryContent,
    ImageUrl,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from persistent_memory.backends.redis import RedisBackend
from persistent_memory.exceptions import InvalidSessionId
from persistent_memory.integrations.pydantic_ai import (
    KEY,
    PART_OF,
    RECORDS,
    PersistentMemoryConversationStore,
    entries_of,
    entry_of,
)
from persistent_memory.store import MemoryStore
from tests.conftest import TOPOLOGIES, AsyncSends
from tests.storable_json import JSON
from tests.timing import LIVE_TTL, wait_past


@pytest.fixture(params=TOPOLOGIES)
def backend_name(request: pytest.FixtureRequest) -> str:
    return request.param


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def agent() -> Agent[None, str]:
    """An agent whose model calls its tool once, then answers (Pydantic AI's TestModel)."""
    made = Agent(TestModel(), system_prompt="Be brief.")

    @made.tool_plain
    def add(a: int, b: int) -> int:
        return a + b

    return made


def echo() -> Agent[None, str]:
    """An agent that answers with every user prompt it was sent, in order (FunctionModel)."""

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        prompts = [
            part.content
            for message in messages
            if isinstance(message, ModelRequest)
            for part in message.parts
            if isinstance(part, UserPromptPart)
        ]
        return ModelResponse(parts=[TextPart(" | ".join(map(str, prompts)))])

    return Agent(FunctionModel(answer))


async def turn(
    store: ConversationStore, conversation_id: str, prompt: str, model: Agent[None, str] | None = None
) -> Any:
    """One turn as the docs show it: load (or start), run, save."""
    conversation = await store.load(conversation_id) or Conversation(conversation_id=conversation_id)
    result = await (model or echo()).run(prompt, conversation=conversation)
    await store.save(result)
    return result


def prompts(conversation: Conversation | None) -> list[str]:
    assert conversation is not None
    return [
        part.content
        for message in conversation.messages
        if isinstance(message, ModelRequest)
        for part in message.parts
        if isinstance(part, UserPromptPart)
    ]


# Pydantic AI's Agent with the store -------------------------------------------------------


def test_it_is_a_conversation_store(store):
    assert isinstance(PersistentMemoryConversationStore(), ConversationStore)


def test_an_agent_keeps_a_conversation_across_runs(store):
    memory = PersistentMemoryConversationStore(owner="alice")
    first = run(turn(memory, "chat", "hello", agent()))
    loaded = run(memory.load("chat"))
    assert loaded.messages == first.all_messages() and loaded.revision == first.conversation.revision
    # The next run is sent the history: its model sees both prompts.
    second = run(turn(memory, "chat", "again"))
    assert second.output == "hello | again"
    assert run(memory.load("chat")).messages == second.all_messages()
    entries = run(memory.load_entries("chat"))
    assert [entry.parent_id for entry in entries[1:]] == [entry.id for entry in entries[:-1]]
    assert run(memory.load("chat", limit=2)).messages == second.all_messages()[-2:]
    # Saving a result twice stores nothing more.
    assert run(memory.save(second)) == []


def test_save_returns_the_entries_it_stored(store):
    memory = PersistentMemoryConversationStore()
    result = run(echo().run("q", conversation=Conversation(conversation_id="c")))
    entries = run(memory.save(result))
    assert [entry.message for entry in entries] == result.all_messages()
    assert [entry.id for entry in run(memory.load_entries("c"))] == [entry.id for entry in entries]
    assert run(memory.read_entry(entries[0].id)).message == result.all_messages()[0]


def test_branch_regenerates_and_switches_back(store):
    memory = PersistentMemoryConversationStore()
    run(turn(memory, "c", "one"))
    run(turn(memory, "c", "two"))
    loaded = run(memory.load("c"))
    old_tip = run(memory.load_entries("c"))[-1].id
    # Regenerate the last turn: keep the first two messages, then run again.
    branched = run(memory.branch("c", at=2, expected_revision=loaded.revision))
    assert prompts(branched) == ["one"]
    result = run(echo().run("other", conversation=branched))
    run(memory.save(result))
    assert prompts(run(memory.load("c"))) == ["one", "other"]
    record = run(memory.read_record("c"))
    assert record.branches == [old_tip]
    # The branch left stays stored: back to it.
    back = run(memory.branch("c", from_entry=old_tip, expected_revision=record.revision))
    assert prompts(back) == ["one", "two"]
    assert prompts(run(memory.load("c"))) == ["one", "two"]
    # A branch against a revision that moved on is refused and changes nothing.
    with pytest.raises(ConversationConflict):
        run(memory.branch("c", at=0, expected_revision=loaded.revision))
    with pytest.raises(UserError):
        run(memory.branch("c", from_entry="not-an-entry", expected_revision=back.revision))
    assert prompts(run(memory.load("c"))) == ["one", "two"]
    # To nothing at all: the conversation is empty, its messages stay for a branch back.
    empty = run(memory.branch("c", at=0, expected_revision=back.revision))
    assert run(memory.load("c")).messages == [] and empty.messages == []
    assert run(memory.read_record("c")).head_id is None


def test_the_app_sees_the_current_branch(store):
    memory = PersistentMemoryConversationStore()
    run(turn(memory, "c", "one"))
    run(turn(memory, "c", "two"))
    branched = run(memory.branch("c", at=2, expected_revision=run(memory.load("c")).revision))
    run(memory.save(run(echo().run("other", conversation=branched))))
    thread = store.get_messages("c")["messages"]
    assert [(m["role"], m["content"]) for m in thread] == [
        ("user", "one"),
        ("assistant", "one"),
        ("user", "other"),
        ("assistant", "one | other"),
    ]
    assert store.list_conversations("c")[0]["branch_count"] == 2


def test_fork_copies_the_history_it_keeps(store):
    memory = PersistentMemoryConversationStore()
    run(turn(memory, "c", "one"))
    run(turn(memory, "c", "two"))
    fork = run(memory.fork("c", at=2, new_conversation_id="f"))
    assert prompts(fork) == ["one"] and run(memory.read_record("f")).forked_from == "c"
    run(memory.save(run(echo().run("forked", conversation=fork))))
    assert prompts(run(memory.load("f"))) == ["one", "forked"]
    assert prompts(run(memory.load("c"))) == ["one", "two"]  # the original carries on
    whole = run(memory.fork("c"))
    assert run(memory.load(whole.conversation_id)).messages == run(memory.load("c")).messages
    # The original goes on after a fork of all of it, in its own session only.
    run(turn(memory, "c", "three"))
    assert prompts(run(memory.load("c"))) == ["one", "two", "three"]
    assert prompts(run(memory.load(whole.conversation_id))) == ["one", "two"]
    assert store.list_conversations("c")[0]["message_count"] == 6
    # Deleting the original takes none of a fork's messages.
    run(memory.delete("c"))
    assert run(memory.load("c")) is None
    assert prompts(run(memory.load("f"))) == ["one", "forked"]
    with pytest.raises(ConversationConflict):  # the fork's id is taken
        run(memory.fork("f", new_conversation_id=whole.conversation_id))
    with pytest.raises(UserError):
        run(memory.fork("gone"))


def test_a_fork_from_another_store_object_reads_its_own_session(store):
    run(turn(PersistentMemoryConversationStore(), "c", "one"))
    run(PersistentMemoryConversationStore().fork("c", new_conversation_id="f"))
    fresh = PersistentMemoryConversationStore()  # knows nothing of either yet
    assert prompts(run(fresh.load("f"))) == ["one"]
    fields = ("id", "parent_id", "role", "content", "metadata")
    copied, source = (store.get_messages(sid)["messages"] for sid in ("f", "c"))
    assert [[m[f] for f in fields] for m in copied] == [[m[f] for f in fields] for m in source]


# The same scenario on Pydantic AI's own store and on ours ---------------------------------


async def scenario(memory: ConversationStore) -> list[Any]:
    """Save, continue, a conflicting save, branch, fork, list, delete: what each answers,
    with the ids and revisions the stores mint left out."""
    seen: list[Any] = []
    first = await turn(memory, "a", "one")
    stale = await memory.load("a")
    await turn(memory, "a", "two")
    seen.append(prompts(await memory.load("a")))
    try:
        await memory.save(await echo().run("late", conversation=stale))
    except ConversationConflict:
        seen.append("conflict")
    try:
        await memory.save(first)  # not loaded from the store: its id is taken
    except ConversationConflict:
        seen.append("taken")
    current = await memory.load("a")
    branched = await memory.branch("a", at=2, expected_revision=current.revision)
    await memory.save(await echo().run("three", conversation=branched))
    seen.append(prompts(await memory.load("a")))
    record = await memory.read_record("a")
    seen.append((len(record.branches), record.usage.requests, record.forked_from))
    fork = await memory.fork("a", at=1, new_conversation_id="b")
    seen.append((prompts(fork), (await memory.read_record("b")).forked_at is not None))
    await turn(memory, "b", "forked")
    seen.append(sorted(record.conversation_id for record in await memory.list_conversations()))
    seen.append([record.conversation_id for record in await memory.list_conversations(limit=1)])
    await memory.delete("a")
    seen.append((await memory.load("a"), prompts(await memory.load("b"))))
    await memory.delete("a")  # already gone: nothing to do
    return seen


def test_the_same_scenario_reads_the_same_as_pydantic_ais_own_store(store):
    ours = run(scenario(PersistentMemoryConversationStore(owner="alice")))
    theirs = run(scenario(InMemoryConversationStore()))
    assert ours == theirs
    assert ours[1:3] == ["conflict", "taken"]


# Conflicts and concurrency -------------------------------------------------------------


def test_a_stale_save_writes_nothing(store):
    memory = PersistentMemoryConversationStore()
    run(turn(memory, "c", "one"))
    a, b = run(memory.load("c")), run(memory.load("c"))
    run(memory.save(run(echo().run("from a", conversation=a))))
    before = store.get_messages("c"), store.get("c", KEY)
    with pytest.raises(ConversationConflict):
        run(memory.save(run(echo().run("from b", conversation=b))))
    assert (store.get_messages("c"), store.get("c", KEY)) == before
    with pytest.raises(ConversationConflict):
        run(memory.write_record(run(memory.read_record("c")), expected_revision="stale"))


def test_of_concurrent_writers_with_one_revision_exactly_one_wins(store):
    memory = PersistentMemoryConversationStore()
    run(turn(memory, "c", "start"))
    loaded = [run(memory.load("c")) for _ in range(6)]
    results = [run(echo().run(f"writer {i}", conversation=c)) for i, c in enumerate(loaded)]
    outcomes: list[str] = []
    barrier = threading.Barrier(len(results))

    def save(result: Any) -> None:
        barrier.wait()
        try:
            run(memory.save(result))
            outcomes.append("saved")
        except ConversationConflict:
            outcomes.append("conflict")

    threads = [threading.Thread(target=save, args=(result,)) for result in results]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["conflict"] * 5 + ["saved"]
    final = prompts(run(memory.load("c")))
    assert final[0] == "start" and len(final) == 2 and final[1].startswith("writer ")
    assert store.list_conversations("c")[0]["message_count"] == 4


def test_a_new_conversation_saved_twice_keeps_the_first(store):
    memory = PersistentMemoryConversationStore()
    one = run(echo().run("one", conversation=Conversation(conversation_id="c")))
    two = run(echo().run("two", conversation=Conversation(conversation_id="c")))
    run(memory.save(one))
    with pytest.raises(ConversationConflict):
        run(memory.save(two))
    assert prompts(run(memory.load("c"))) == ["one"]


def test_a_conversation_the_app_started_is_not_taken_over(store):
    store.add_messages("c", [{"role": "user", "content": "from the REST API"}])
    with pytest.raises(ConversationConflict):
        run(turn(PersistentMemoryConversationStore(), "c", "hello"))
    assert len(store.get_messages("c")["messages"]) == 1
    # Its own conversation name in the same session is free.
    run(turn(PersistentMemoryConversationStore(conversation="agent"), "c", "hello"))
    assert store.get_messages("c", conversation="agent")["messages"][0]["content"] == "hello"


# Owners and scopes -----------------------------------------------------------------------


def test_owners_are_isolated_and_scope_is_the_owner(store):
    alice, bob = (
        PersistentMemoryConversationStore(owner="alice"),
        PersistentMemoryConversationStore(owner="bob"),
    )
    run(turn(alice, "c", "mine"))
    assert run(bob.load("c")) is None and run(bob.list_conversations()) == []
    run(turn(bob, "c", "his"))
    assert prompts(run(alice.load("c"))) == ["mine"] and prompts(run(bob.load("c"))) == ["his"]
    assert run(alice.read_record("c")).scope == "alice"
    assert run(alice.load("c", scope="alice")) is not None and run(alice.load("c", scope="bob")) is None
    assert [r.scope for r in run(alice.list_conversations(scope="alice"))] == ["alice"]
    assert run(alice.list_conversations(scope="bob")) == []
    with pytest.raises(UserError):  # an owner's store saves in that owner's scope only
        run(alice.save(run(echo().run("x", conversation=Conversation(conversation_id="d"))), scope="bob"))
    run(bob.delete("c", scope="alice"))  # not bob's to delete in alice's scope: left as it is
    run(alice.delete("c", scope="bob"))
    assert prompts(run(alice.load("c"))) == ["mine"]
    # Nothing of either in the unowned namespace.
    assert store.list_sessions() == [] and run(PersistentMemoryConversationStore().load("c")) is None


def test_the_unowned_store_keeps_scopes_as_labels(store):
    memory = PersistentMemoryConversationStore()
    run(memory.save(run(echo().run("a", conversation=Conversation(conversation_id="a"))), scope="team-1"))
    run(memory.save(run(echo().run("b", conversation=Conversation(conversation_id="b"))), scope="team-2"))
    assert [r.conversation_id for r in run(memory.list_conversations(scope="team-1"))] == ["a"]
    assert run(memory.load("a", scope="team-2")) is None
    assert sorted(r.scope for r in run(memory.list_conversations())) == ["team-1", "team-2"]


def test_an_invalid_conversation_id_is_refused_at_once(store):
    with pytest.raises(InvalidSessionId):
        run(PersistentMemoryConversationStore().load("not a session id"))


# Messages read back equal ------------------------------------------------------------------


STAMP = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
MESSAGES: list[ModelMessage] = [
    ModelRequest(parts=[SystemPromptPart("Be brief.", timestamp=STAMP)], timestamp=STAMP),
    ModelRequest(
        parts=[
            UserPromptPart(
                [
                    "Look at this:",
                    ImageUrl("https://example.com/a.png"),
                    BinaryContent(b"\x89PNG", media_type="image/png"),
                ],
                timestamp=STAMP,
            )
        ],
        timestamp=STAMP,
        instructions="Answer in French.",
    ),
    ModelResponse(
        parts=[
            ThinkingPart("Let me think", signature="sig"),
            TextPart("Calling a tool"),
            ToolCallPart("lookup", {"q": "weather"}, tool_call_id="call-1"),
            ToolCallPart("lookup", '{"q": "time"}', tool_call_id="call-2"),
        ],
        model_name="test-model",
        timestamp=STAMP,
    ),
    ModelRequest(
        parts=[
            ToolReturnPart(
                "lookup", {"sunny": True, "celsius": 21.5}, tool_call_id="call-1", timestamp=STAMP
            ),
            RetryPromptPart(
                "bad arguments", tool_name="lookup", tool_call_id="call-2", timestamp=STAMP
            ),  # legacy
        ],
        timestamp=STAMP,
    ),
    ModelResponse(
        parts=[TextPart('Il fait beau. \u00e9\u4e2d\U0001f600 \x00 {"json": [1]}')], timestamp=STAMP
    ),
]


def test_every_message_part_reads_back_equal(store):
    memory = PersistentMemoryConversationStore()
    conversation = Conversation(conversation_id="c", messages=list(MESSAGES))
    run(memory.save(conversation))
    loaded = run(memory.load("c")).messages
    # Stored as Pydantic AI serializes them, and read back as it reads that (which moves a
    # legacy retry part and a binary image to their current classes).
    thread = store.get_messages("c")["messages"]
    kept = [message["metadata"][KEY] for message in thread if KEY in message["metadata"]]
    assert kept == ModelMessagesTypeAdapter.dump_python(MESSAGES, mode="json")
    assert loaded == ModelMessagesTypeAdapter.validate_python(kept)
    # The chat form the app keeps: roles, the text a model reads, the tool calls as
    # `tool_calls` and each result as a `tool` message (as the Agents SDK's are).
    assert [m["role"] for m in thread] == ["system", "user", "assistant", "tool", "tool", "assistant"]
    assert thread[1]["content"] == "Look at this:"
    assert thread[2]["content"] == "Calling a tool"
    assert thread[2]["tool_calls"] == [
        {"id": "call-1", "type": "function", "function": {"name": "lookup", "arguments": '{"q":"weather"}'}},
        {"id": "call-2", "type": "function", "function": {"name": "lookup", "arguments": '{"q":"time"}'}},
    ]
    results = [(m["tool_call_id"], m["name"], m["content"]) for m in thread[3:5]]
    assert results == [
        ("call-1", "lookup", '{"sunny":true,"celsius":21.5}'),
        ("call-2", "lookup", "bad arguments\n\nFix the errors and try again."),
    ]
    # The entry's id on its last result; the one before it is part of it.
    entry_id = thread[4]["id"]
    assert thread[3]["id"] == f"{entry_id}.1" and thread[3]["metadata"] == {PART_OF: entry_id}
    window = store.get_context("c", max_messages=10)["messages"]
    assert [m["role"] for m in window] == ["system", "user", "assistant", "tool", "tool", "assistant"]
    # Read an entry at a time, from the end: the results' entry is one entry.
    history = memory.get_history(thread[-1]["id"], limit=2)
    assert [entry.id for entry in history] == [entry_id, thread[-1]["id"]]
    assert history[0].parent_id == thread[2]["id"]
    assert [entry.id for entry in memory.get_history(entry_id, limit=1)] == [entry_id]


def test_an_agents_tool_call_is_stored_as_tool_calls(store):
    """Pydantic AI's own Agent and TestModel: the call and its result are real chat
    messages of the conversation, and the conversation loads back as Pydantic AI wrote it."""
    memory = PersistentMemoryConversationStore()
    result = run(turn(memory, "c", "add them", agent()))
    thread = store.get_messages("c")["messages"]
    roles = [m["role"] for m in thread]
    assert roles == ["user", "assistant", "tool", "assistant"], roles  # the system prompt: in the first
    (call,) = thread[1]["tool_calls"]
    assert call["function"]["name"] == "add" and thread[1]["content"] is None
    assert thread[2]["tool_call_id"] == call["id"] and thread[2]["name"] == "add"
    assert run(memory.load("c")).messages == result.all_messages()


def test_a_resumed_run_stores_its_results_as_tool_messages(store):
    """A save whose first entry returns results (deferred tools' results, after a save that
    ended on the calls) still answers the stored call with `tool` messages."""
    memory = PersistentMemoryConversationStore()
    asked = ModelResponse(parts=[ToolCallPart("approve", {"id": 7}, tool_call_id="call-7")], timestamp=STAMP)
    first = [ModelRequest(parts=[UserPromptPart("refund order 7", timestamp=STAMP)], timestamp=STAMP), asked]
    run(memory.save(Conversation(conversation_id="c", messages=first)))
    conversation = run(memory.load("c"))
    results = ModelRequest(parts=[ToolReturnPart("approve", "yes", tool_call_id="call-7", timestamp=STAMP)])
    done = ModelResponse(parts=[TextPart("Refunded.")], timestamp=STAMP)
    resumed = Conversation(
        conversation_id="c",
        messages=[*conversation.messages, results, done],
        revision=conversation.revision,
        new_message_index=len(conversation.messages),
    )
    run(memory.save(resumed))
    thread = store.get_messages("c")["messages"]
    assert [m["role"] for m in thread] == ["user", "assistant", "tool", "assistant"]
    assert thread[2]["tool_call_id"] == "call-7"
    assert run(memory.load("c")).messages == [*first, results, done]


def test_rows_stored_as_text_before_still_read_back(store, monkeypatch):
    """Conversations saved before tool calls were stored as such (every entry one message,
    tool calls and results as text) load as they were saved."""
    import persistent_memory.integrations.pydantic_ai as integration

    def as_text(entry, open_calls):  # what the previous version stored
        (dumped,) = ModelMessagesTypeAdapter.dump_python([entry.message], mode="json")
        role = "assistant" if isinstance(entry.message, ModelResponse) else "user"
        text = "\n".join(filter(None, map(integration._part_text, entry.message.parts))) or "-"
        return [{"id": entry.id, "role": role, "content": text, "metadata": {KEY: dumped}}], set()

    monkeypatch.setattr(integration, "chats_of", as_text)
    memory = PersistentMemoryConversationStore()
    run(memory.save(Conversation(conversation_id="old", messages=list(MESSAGES[1:]))))
    assert "tool" not in [m["role"] for m in store.get_messages("old")["messages"]]
    monkeypatch.undo()
    loaded = run(PersistentMemoryConversationStore().load("old")).messages
    kept = ModelMessagesTypeAdapter.dump_python(MESSAGES[1:], mode="json")
    assert loaded == ModelMessagesTypeAdapter.validate_python(kept)
    run(turn(PersistentMemoryConversationStore(), "old", "and now?"))  # it goes on


def test_messages_the_app_recorded_read_as_prompts_and_answers():
    stored = [
        {"id": "a", "parent_id": None, "role": "system", "content": "rules"},
        {"id": "b", "parent_id": "a", "role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"id": "c", "parent_id": "b", "role": "assistant", "content": "hello"},
    ]
    entries = [entry_of(message) for message in stored]
    assert [entry.parent_id for entry in entries] == [None, "a", "b"]
    assert entries[0].message.parts[0] == SystemPromptPart(
        "rules", timestamp=entries[0].message.parts[0].timestamp
    )
    assert entries[1].message.parts[0].content == "hi"
    assert entries[2].message.parts == [TextPart("hello")]


def test_tool_calls_the_app_recorded_read_as_tool_parts():
    """Messages in the chat format (the REST API's, the Agents SDK's) read as Pydantic AI's
    tool call and tool return parts, the tool named from its call."""
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "weather", "arguments": '{"city":"Paris"}'},
    }
    stored = [
        {"id": "u", "parent_id": None, "role": "user", "content": "weather?"},
        {"id": "a", "parent_id": "u", "role": "assistant", "content": None, "tool_calls": [call]},
        {"id": "t", "parent_id": "a", "role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        {"id": "b", "parent_id": "t", "role": "assistant", "content": "Sunny."},
    ]
    entries = entries_of(stored)
    assert entries[1].message.parts == [ToolCallPart("weather", '{"city":"Paris"}', tool_call_id="call_1")]
    (result,) = entries[2].message.parts
    assert (type(result), result.tool_name, result.content, result.tool_call_id) == (
        ToolReturnPart,
        "weather",
        "sunny",
        "call_1",
    )
    assert [entry.parent_id for entry in entries] == [None, "u", "a", "t"]


# What the app does with any conversation ------------------------------------------------


def test_windows_and_pinned_system_prompts(store):
    memory = PersistentMemoryConversationStore()
    run(turn(memory, "c", "one"))
    context = store.get_context("c", max_messages=1)
    assert context["messages"] == [{"role": "assistant", "content": "one"}]
    run(memory.save(Conversation(conversation_id="d", messages=list(MESSAGES))))
    assert store.get_context("d", max_messages=1)["messages"][0] == {"role": "system", "content": "Be brief."}


@pytest.mark.django_db
def test_forgetting_the_owner_forgets_the_conversations(store):
    from persistent_memory.operations.forget import forget_owner

    alice, bob = (
        PersistentMemoryConversationStore(owner="alice"),
        PersistentMemoryConversationStore(owner="bob"),
    )
    run(turn(alice, "c", "mine"))
    run(turn(bob, "c", "his"))
    forget_owner("alice")
    assert run(alice.load("c")) is None and run(alice.list_conversations()) == []
    assert prompts(run(bob.load("c"))) == ["his"]


def test_export_and_import_carry_the_conversation(store):
    from persistent_memory.operations.maintenance import export_sessions, import_sessions

    memory = PersistentMemoryConversationStore(owner="alice")
    run(memory.save(Conversation(conversation_id="c", messages=list(MESSAGES))))
    before = run(memory.load("c"))
    lines = [json.dumps(record) for record in export_sessions(owner="alice", store=store)]
    run(memory.delete("c"))
    assert run(memory.load("c")) is None
    import_sessions(lines, store=store)
    after = run(memory.load("c"))
    assert (after.messages, after.revision) == (before.messages, before.revision)
    run(turn(memory, "c", "goes on"))


def test_a_conversation_expires_with_its_session(store):
    store.create_session("short", ttl_seconds=LIVE_TTL)  # the first save keeps its TTL
    memory = PersistentMemoryConversationStore()
    run(turn(memory, "short", "soon gone"))
    assert prompts(run(memory.load("short"))) == ["soon gone"]
    wait_past(store.session_info("short")["expires_at"])
    assert run(memory.load("short")) is None and run(memory.list_conversations()) == []


def test_delete_keeps_a_session_that_holds_more(store):
    memory = PersistentMemoryConversationStore()
    run(turn(memory, "c", "one"))
    store.put("c", "mine", 1)
    run(memory.delete("c"))
    assert store.get_all("c") == {"mine": 1} and store.list_conversations("c") == []
    run(turn(memory, "d", "one"))
    run(memory.delete("d"))
    assert "d" not in store.list_sessions()


def test_round_trips_on_redis(redis_url, redis_client, monkeypatch):
    """Each method awaits Redis on the event loop (no worker thread), in these many round trips."""
    client = redis.Redis.from_url(redis_url)
    store = MemoryStore(RedisBackend(client=client, max_history=100, auto_summarize=True))
    memory = PersistentMemoryConversationStore(store=store)
    store.create_session("warm")  # the script is loaded
    first = run(echo().run("one", conversation=Conversation(conversation_id="c")))
    counted = AsyncSends(monkeypatch)
    trips = {}
    for name, call in {
        "save (new)": lambda: memory.save(first),
        "load": lambda: memory.load("c"),
        "save (a turn)": lambda: memory.save(run(echo().run("two", conversation=run(memory.load("c"))))),
        "read_record": lambda: memory.read_record("c"),
        "delete": lambda: memory.delete("c"),
    }.items():
        coroutine = call()  # a run inside it is made before counting
        with monkeypatch.context() as patched:
            patched.setattr(asyncio, "to_thread", None)  # any worker thread would fail
            counted.sends = 0
            run(coroutine)
            trips[name] = counted.sends
    assert trips == {"save (new)": 2, "load": 2, "save (a turn)": 2, "read_record": 1, "delete": 2}
    store.close()


# What an owner wrote through the REST API -------------------------------------------------


def rest_client(username: str) -> tuple[str, APIClient]:
    """An API client of a new user, and the owner its writes belong to."""
    user = get_user_model().objects.create_user(username, password="pw-for-tests")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return f"user:{user.pk}", client


@pytest.mark.django_db
@pytest.mark.parametrize("backend_name", ["memory", "redis"])
def test_values_and_metadata_written_through_the_rest_api_are_passed_over(store):
    """A value under ``pydantic_ai`` that is no record, or a message whose ``pydantic_ai``
    metadata is no message, never makes a method raise: the session holds no conversation
    of the store, the message reads as one recorded otherwise."""
    owner, client = rest_client("rest-writer")
    memory = PersistentMemoryConversationStore(owner=owner)
    run(turn(memory, "mine", "kept"))
    record = run(memory.read_record("mine"))
    for number, value in enumerate(
        [1, {}, None, "x", {"conversation_id": 5}, {**record_json(record), "head_id": 7}]
    ):
        client.post("/api/memory/sessions/", {"session_id": f"s{number}"}, format="json")
        answer = client.put(f"/api/memory/sessions/s{number}/memory/{KEY}/", {"value": value}, format="json")
        assert answer.status_code == 200, answer.content
        assert [r.conversation_id for r in run(memory.list_conversations())] == ["mine"], value
        assert run(memory.load(f"s{number}")) is None
    # A record copied into another session is not that session's conversation.
    client.post("/api/memory/sessions/", {"session_id": "copy"}, format="json")
    client.put(f"/api/memory/sessions/copy/memory/{KEY}/", {"value": record_json(record)}, format="json")
    assert run(memory.load("copy")) is None
    assert [r.conversation_id for r in run(memory.list_conversations())] == ["mine"]
    # A message whose metadata claims to keep a Pydantic AI message reads as a prompt.
    for number, kept in enumerate([1, {}, {"kind": "request", "parts": 3}, ["x"]]):
        posted = client.post(
            f"/api/memory/sessions/m{number}/messages/",
            {"messages": [{"role": "user", "content": "from REST", "metadata": {KEY: kept}}]},
            format="json",
        )
        assert posted.status_code in (200, 201), posted.content
        (stored,) = store.for_owner(owner).get_messages(f"m{number}")["messages"]
        (part,) = entry_of(stored).message.parts
        assert isinstance(part, UserPromptPart) and part.content == "from REST"
    assert prompts(run(memory.load("mine"))) == ["kept"]


def record_json(record: Any) -> dict[str, Any]:
    return json.loads(json.dumps(RECORDS.dump_python(record, mode="json")))


@pytest.mark.parametrize("backend_name", ["memory", "redis"])
@settings(max_examples=40, suppress_health_check=list(HealthCheck), deadline=None)
@given(value=JSON, field=st.sampled_from(["usage", "scope", "head_id", "branches", "revision", "updated_at"]))
def test_any_value_under_the_key_leaves_every_method_working(store, value, field):
    """Any JSON under ``pydantic_ai``, or a record with one field replaced by any JSON:
    listing, loading and saving answer (the protocol's ConversationConflict included)."""
    owned = store.for_owner("alice")
    for session_id in owned.list_sessions():
        owned.delete_session(session_id)
    memory = PersistentMemoryConversationStore(owner="alice")
    run(turn(memory, "mine", "kept"))
    near = {**record_json(run(memory.read_record("mine"))), "conversation_id": "near", field: value}
    for session_id, stored in (("any", value), ("near", near)):
        owned.create_session(session_id)
        owned.put(session_id, KEY, stored)
    owned.add_messages("talk", [{"role": "user", "content": "hi", "metadata": {KEY: value}}])
    listed = {r.conversation_id for r in run(memory.list_conversations())}
    assert {"mine"} <= listed <= {"mine", "near"}
    assert run(memory.load("any")) is None
    near_loaded = run(memory.load("near")) is not None
    assert near_loaded <= ("near" in listed)
    assert ("near" in {r.conversation_id for r in run(memory.list_conversations())}) == near_loaded
    (stored,) = owned.get_messages("talk")["messages"]
    assert entry_of(stored).id == stored["id"]
    with pytest.raises(ConversationConflict):  # the owner's value is not overwritten
        run(turn(memory, "any", "hello"))
    assert owned.get("any", KEY) == value
