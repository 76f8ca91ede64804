"""The OpenAI Agents SDK's sessions on our conversations (persistent_memory.integrations.
openai_agents), on every backend and Redis setup: the behaviours the SDK's own session
tests ask of each session (direct operations, limits, empty sessions, text that breaks
parsers, concurrent writers, isolation), the SDK's ``Runner`` against a local stand-in for
the Responses API, every item type the installed SDK defines read back equal, parallel
tool calls as one chat turn, owners, and what the app does with any session (windows,
forget-an-owner, export and import, round trips)."""

from __future__ import annotations

import asyncio
import collections.abc
import gc
import itertools
import json
import math
import typing
from typing import Any

import openai
import pytest
import redis
from agents import Agent, OpenAIResponsesModel, RunConfig, Runner, function_tool
from agents.items import TResponseInputItem
from agents.memory import Session, SessionSettings
from django.contrib.auth import get_user_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from persistent_memory.backends.redis import RedisBackend
from persistent_memory.integrations.openai_agents import KEY, PersistentMemorySession, items_of, messages_of
from persistent_memory.store import MemoryStore
from tests.conftest import TOPOLOGIES, AsyncSends, CountingConnection
from tests.responses_server import call, reasoning, responses_server, text
from tests.storable_json import JSON


@pytest.fixture(params=TOPOLOGIES)
def backend_name(request: pytest.FixtureRequest) -> str:
    return request.param


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def contents(items: list[Any]) -> list[Any]:
    return [item.get("content") for item in items]


def user(content: str) -> dict[str, Any]:
    return {"role": "user", "content": content}


def said(content: str) -> dict[str, Any]:
    return {"role": "assistant", "content": content}


def function_call(call_id: str, name: str = "lookup", arguments: str = "{}") -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{call_id}",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": "completed",
    }


def output(call_id: str, result: Any = "42") -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": result}


# What the SDK's own session tests ask of every session ----------------------------------


def test_it_is_an_sdk_session(store):
    assert isinstance(PersistentMemorySession("s1"), Session)


def test_direct_operations(store):
    session = PersistentMemorySession("s1")
    run(session.add_items([user("Hello"), said("Hi there!")]))
    assert contents(run(session.get_items())) == ["Hello", "Hi there!"]
    assert run(session.pop_item()) == said("Hi there!")
    assert contents(run(session.get_items())) == ["Hello"]
    run(session.clear_session())
    assert run(session.get_items()) == []
    # The items are a conversation of the session, as any other.
    run(session.add_items([user("again")]))
    assert [m["content"] for m in store.get_messages("s1")["messages"]] == ["again"]


def test_get_items_with_limit(store):
    session = PersistentMemorySession("s1")
    run(session.add_items([user("1"), said("2"), user("3"), said("4")]))
    assert contents(run(session.get_items(limit=2))) == ["3", "4"]
    assert len(run(session.get_items())) == 4
    assert len(run(session.get_items(limit=10))) == 4
    assert run(session.get_items(limit=0)) == []
    # The SDK's settings give the default limit.
    limited = PersistentMemorySession("s1", session_settings=SessionSettings(limit=3))
    assert contents(run(limited.get_items())) == ["2", "3", "4"]
    assert contents(run(limited.get_items(limit=1))) == ["4"]


def test_empty_and_missing_sessions(store):
    session = PersistentMemorySession("nobody")
    assert run(session.get_items()) == []
    assert run(session.pop_item()) is None
    run(session.clear_session())
    run(session.add_items([]))
    assert store.list_sessions() == []  # reads and no-ops create nothing


@pytest.mark.parametrize(
    "texts",
    [
        ["こんにちは", "😊👍", "Привет"],
        ["O'Reilly", '{"nested": "json"}', 'Quote: "Hello world"', "Line1\nLine2\tTabbed"],
        ["DROP TABLE sessions;", "Robert'); DROP TABLE students;--", "\\n\\t\\r escapes", "nul \x00 byte"],
    ],
)
def test_text_is_kept_exactly(store, texts):
    session = PersistentMemorySession("s1")
    items = [user(text) if i % 2 == 0 else said(text) for i, text in enumerate(texts)]
    run(session.add_items(items))
    assert run(session.get_items()) == items


def test_concurrent_writers_lose_nothing(store):
    session = PersistentMemorySession("s1")

    async def write(start: int) -> None:
        await session.add_items([user(f"Message {start + i}") for i in range(5)])

    async def all_writers() -> None:
        await asyncio.gather(write(0), write(5), write(10))

    run(all_writers())
    got = contents(run(session.get_items()))
    assert sorted(got) == sorted(f"Message {i}" for i in range(15))
    for start in (0, 5, 10):  # each write is one step: its items stay together
        index = got.index(f"Message {start}")
        assert got[index : index + 5] == [f"Message {start + i}" for i in range(5)]


def test_concurrent_pops_take_each_item_once(store):
    session = PersistentMemorySession("s1")
    run(session.add_items([user(str(i)) for i in range(6)]))

    async def pops() -> list[Any]:
        return await asyncio.gather(*(session.pop_item() for _ in range(8)))

    popped = run(pops())
    assert sorted(item["content"] for item in popped if item) == [str(i) for i in range(6)]
    assert popped.count(None) == 2


def test_sessions_and_owners_are_isolated(store):
    one, two = PersistentMemorySession("session_1"), PersistentMemorySession("session_2")
    run(one.add_items([user("I like cats.")]))
    run(two.add_items([user("I like dogs.")]))
    assert contents(run(one.get_items())) == ["I like cats."]
    alice = PersistentMemorySession("chat", owner="alice")
    bob = PersistentMemorySession("chat", owner="bob")
    run(alice.add_items([user("alice's")]))
    assert run(bob.get_items()) == [] and run(bob.pop_item()) is None
    run(bob.clear_session())
    run(bob.add_items([user("bob's")]))
    assert contents(run(alice.get_items())) == ["alice's"]
    assert run(PersistentMemorySession("chat").get_items()) == []  # the unowned namespace
    assert store.for_owner("alice").get_messages("chat")["messages"][0]["content"] == "alice's"


def test_a_named_conversation_of_a_session(store):
    notes = PersistentMemorySession("s1", conversation="agent-notes")
    run(notes.add_items([user("kept apart")]))
    assert run(PersistentMemorySession("s1").get_items()) == []
    assert [info["conversation"] for info in store.list_conversations("s1")] == ["agent-notes"]


def test_an_invalid_session_id_is_refused_at_once(store):
    from persistent_memory.exceptions import InvalidSessionId

    with pytest.raises(InvalidSessionId):
        PersistentMemorySession("no spaces")


# Items: every type read back equal ------------------------------------------------------

ITEM_TYPES = typing.get_args(TResponseInputItem)


def jsonable(value: Any) -> Any:
    """A generated item as it would arrive from JSON: hypothesis builds any Iterable, lone
    surrogates and NaN for the TypedDicts' fields, which no JSON item holds."""
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode()
    if isinstance(value, float):
        return value if math.isfinite(value) else 0.5
    if isinstance(value, dict):
        return {str(key): jsonable(item) for key, item in value.items()}
    if isinstance(value, bool | int) or value is None:
        return value
    if isinstance(value, collections.abc.Iterable):  # any Iterable, an IPv6 network's too: a few
        return [jsonable(item) for item in itertools.islice(value, 8)]
    return str(value)


#: One strategy per type, built once (resolving a TypedDict's strategy costs more than drawing from it).
item_strategy = st.one_of([st.from_type(kind) for kind in ITEM_TYPES]).map(jsonable)
items_strategy = st.lists(item_strategy, min_size=1, max_size=6)


def test_the_sdk_defines_the_item_types_this_suite_generates():
    # A new item type in the SDK is generated too (it must read back equal); this guards
    # against the union being read wrong and the suite generating nothing.
    names = set()
    for kind in ITEM_TYPES:
        stack = [typing.get_type_hints(kind)["type"]]
        while stack:
            for arg in typing.get_args(stack.pop()):
                names.add(arg) if isinstance(arg, str) else stack.append(arg)
    assert len(names) >= 30 and {"message", "function_call", "reasoning", "compaction"} <= names


@settings(max_examples=400, suppress_health_check=list(HealthCheck), deadline=None)
@given(items_strategy)
def test_every_item_type_reads_back_equal_as_messages(items):
    messages = messages_of(items)
    assert [item for message in json.loads(json.dumps(messages)) for item in items_of(message)] == items


@pytest.mark.parametrize("backend_name", ["memory", "redis"])
@settings(max_examples=40, suppress_health_check=list(HealthCheck), deadline=None)
@given(batches=st.lists(items_strategy, min_size=1, max_size=3))
def test_every_item_type_reads_back_equal_from_the_store(store, batches):
    session = PersistentMemorySession("roundtrip")
    run(session.clear_session())
    for batch in batches:
        run(session.add_items(batch))
    everything = [item for batch in batches for item in batch]
    assert run(session.get_items()) == everything
    assert run(session.get_items(limit=2)) == everything[-2:]
    assert run(session.pop_item()) == everything[-1]
    assert run(session.get_items()) == everything[:-1]


# Tool calls as chat turns ----------------------------------------------------------------


def test_parallel_calls_are_one_assistant_turn(store):
    session = PersistentMemorySession("s1")
    thinking = {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Both."}]}
    answer = {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "Sunny twice.", "annotations": []}],
    }
    items = [
        user("Weather in Oslo and Rome?"),
        thinking,
        function_call("a", arguments='{"city": "Oslo"}'),
        function_call("b", arguments='{"city": "Rome"}'),
        output("a", "sunny"),
        output("b", [{"type": "input_text", "text": "sunny"}]),
        answer,
    ]
    run(session.add_items(items))
    assert run(session.get_items()) == items
    stored = store.get_messages("s1")["messages"]
    assert [m["role"] for m in stored] == ["user", "assistant", "tool", "tool", "assistant"]
    assert [call["id"] for call in stored[1]["tool_calls"]] == ["a", "b"]
    context = store.get_context("s1")["messages"]
    assert context[1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "lookup", "arguments": '{"city": "Oslo"}'}},
            {"id": "b", "type": "function", "function": {"name": "lookup", "arguments": '{"city": "Rome"}'}},
        ],
    }
    assert context[-1] == {"role": "assistant", "content": [{"type": "text", "text": "Sunny twice."}]}
    # Popping goes back item by item, through the turn of calls.
    assert [run(session.pop_item()) for _ in range(4)] == items[:2:-1]
    assert run(session.get_items()) == items[:3]
    assert [call["id"] for call in store.get_messages("s1")["messages"][-1]["tool_calls"]] == ["a"]
    run(session.add_items([output("a", "sunny")]))  # the remaining call is still open
    assert store.get_messages("s1")["messages"][-1]["role"] == "tool"


def test_an_output_whose_call_is_not_open_is_kept_verbatim(store):
    session = PersistentMemorySession("s1")
    items = [function_call("a"), user("meanwhile"), output("a")]
    for item in items:
        run(session.add_items([item]))
    assert run(session.get_items()) == items
    assert [m["role"] for m in store.get_messages("s1")["messages"]] == ["assistant", "user", "assistant"]


def test_messages_the_app_recorded_read_as_items(store):
    store.add_messages(
        "s1",
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
            {
                "role": "assistant",
                "content": "Looking.",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "find", "arguments": "{}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "found"},
        ],
    )
    assert run(PersistentMemorySession("s1").get_items()) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {"role": "assistant", "content": "Looking."},
        {"type": "function_call", "call_id": "c1", "name": "find", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "found"},
    ]


# The SDK's Runner against a local Responses API ----------------------------------------


def test_the_runner_keeps_a_conversation_across_runs(store):
    looked_up: list[str] = []

    @function_tool
    def weather(city: str) -> str:
        """The weather in a city."""
        looked_up.append(city)
        return f"sunny in {city}"

    session = PersistentMemorySession("chat", owner="alice")

    async def turn(url: str, question: str) -> Any:
        client = openai.AsyncOpenAI(base_url=url, api_key="test", max_retries=0)
        model = OpenAIResponsesModel(model="gpt-test", openai_client=client)
        agent = Agent(name="weather", instructions="Answer briefly.", model=model, tools=[weather])
        return await Runner.run(agent, question, session=session, run_config=RunConfig(tracing_disabled=True))

    script = [
        [reasoning("Two cities."), call("weather", {"city": "Oslo"}), call("weather", {"city": "Rome"})],
        [text("Sunny in both.")],
        [text("You asked about Oslo and Rome.")],
    ]
    with responses_server(*script) as server:
        first = run(turn(server.url, "Weather in Oslo and Rome?"))
        second = run(turn(server.url, "Which cities did I ask about?"))
    assert (first.final_output, second.final_output) == ("Sunny in both.", "You asked about Oslo and Rome.")
    assert sorted(looked_up) == ["Oslo", "Rome"]
    # The resumed run sent the whole history back: the first run's items, then the question.
    sent = server.requests[2]["input"]
    assert [item.get("type", "message") for item in sent] == [
        "message",
        "reasoning",
        "function_call",
        "function_call",
        "function_call_output",
        "function_call_output",
        "message",
        "message",
    ]
    assert sent[-1]["content"] == "Which cities did I ask about?"
    items = run(session.get_items())
    assert items[-1]["content"][0]["text"] == "You asked about Oslo and Rome."
    assert [item.get("type", "message") for item in items] == [
        item.get("type", "message") for item in sent
    ] + ["message"]
    # The app sees a conversation of alice's session: roles, a turn of two calls, a window.
    owned = store.for_owner("alice")
    roles = [m["role"] for m in owned.get_messages("chat")["messages"]]
    assert roles == ["user", "assistant", "tool", "tool", "assistant", "user", "assistant"]
    assert owned.get_context("chat", max_messages=3)["messages"][-1]["content"][0]["text"] == (
        "You asked about Oslo and Rome."
    )
    assert run(session.pop_item())["content"][0]["text"] == "You asked about Oslo and Rome."
    assert len(run(session.get_items())) == len(items) - 1
    assert run(PersistentMemorySession("chat", owner="bob").get_items()) == []


def test_a_run_paused_for_approval_resumes_on_the_session(store):
    refunded: list[str] = []

    @function_tool(needs_approval=True)
    def refund(order: str) -> str:
        """Refund an order."""
        refunded.append(order)
        return f"refunded {order}"

    session = PersistentMemorySession("chat", owner="alice")
    config = RunConfig(tracing_disabled=True)

    async def both(url: str) -> tuple[Any, Any]:
        client = openai.AsyncOpenAI(base_url=url, api_key="test", max_retries=0)
        model = OpenAIResponsesModel(model="gpt-test", openai_client=client)
        agent = Agent(name="support", instructions="Help.", model=model, tools=[refund])
        paused = await Runner.run(agent, "Refund order 7", session=session, run_config=config)
        assert [item.get("type", "message") for item in await session.get_items()] == [
            "message",
            "function_call",
        ]
        state = paused.to_state()
        for interruption in paused.interruptions:
            state.approve(interruption)
        return paused, await Runner.run(agent, state, session=session, run_config=config)

    with responses_server([call("refund", {"order": "7"}, call_id="c7")], [text("Refunded.")]) as server:
        paused, resumed = run(both(server.url))
    assert [interruption.name for interruption in paused.interruptions] == ["refund"]
    assert (resumed.final_output, refunded) == ("Refunded.", ["7"])
    items = run(session.get_items())
    assert [item.get("type", "message") for item in items] == [
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]
    assert (items[2]["call_id"], items[2]["output"]) == ("c7", "refunded 7")
    # The approved call's output answers the call stored before the pause: one chat turn.
    roles = [m["role"] for m in store.for_owner("alice").get_messages("chat")["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant"]


# What the app does with any session -----------------------------------------------------


@pytest.mark.django_db
def test_forgetting_the_owner_forgets_the_session(store):
    from persistent_memory.operations.forget import forget_owner

    alice = PersistentMemorySession("chat", owner="alice")
    bob = PersistentMemorySession("chat", owner="bob")
    run(alice.add_items([user("mine")]))
    run(bob.add_items([user("his")]))
    forget_owner("alice")
    assert run(alice.get_items()) == []
    assert contents(run(bob.get_items())) == ["his"]


def test_export_and_import_carry_the_items(store):
    from persistent_memory.operations.maintenance import export_sessions, import_sessions

    session = PersistentMemorySession("chat", owner="alice")
    items = [user("q"), function_call("a"), output("a"), {"type": "compaction", "encrypted_content": "x"}]
    run(session.add_items(items))
    lines = [json.dumps(record) for record in export_sessions(owner="alice", store=store)]
    store.for_owner("alice").delete_session("chat")
    assert run(session.get_items()) == []
    import_sessions(lines, store=store)
    assert run(session.get_items()) == items


def test_a_session_expires_with_the_store_ttl(store):
    from tests.timing import LIVE_TTL, wait_past

    store.create_session("short", ttl_seconds=LIVE_TTL)
    session = PersistentMemorySession("short")
    run(session.add_items([user("soon gone")]))
    wait_past(store.session_info("short")["expires_at"])
    assert run(session.get_items()) == []


def test_round_trips_on_redis(redis_url, redis_client, monkeypatch):
    """The async methods await Redis on the event loop (no worker thread): one script
    call each (pop_item two)."""
    client = redis.Redis.from_url(redis_url)
    store = MemoryStore(RedisBackend(client=client, max_history=100, auto_summarize=True))
    session = PersistentMemorySession("s1", store=store)
    store.create_session("warm")  # the script is loaded
    counted = AsyncSends(monkeypatch)
    monkeypatch.setattr(asyncio, "to_thread", None)  # any worker thread would fail
    trips = {}
    for name, method in {
        "add_items": lambda: session.add_items([user("q"), function_call("a"), output("a"), said("a")]),
        "get_items": lambda: session.get_items(),
        "get_items(limit)": lambda: session.get_items(limit=2),
        "pop_item": lambda: session.pop_item(),
        "clear_session": lambda: session.clear_session(),
    }.items():
        counted.sends = 0
        run(method())
        trips[name] = counted.sends
    assert trips == {"add_items": 1, "get_items": 1, "get_items(limit)": 1, "pop_item": 2, "clear_session": 1}
    store.close()


def test_a_client_the_bridge_cannot_make_runs_in_a_worker_thread(counting_client):
    """Connections of the project's own class (here, counting ones) are not remade on the
    loop: the call runs in a worker thread, on them."""
    store = MemoryStore(RedisBackend(client=counting_client, max_history=100, auto_summarize=True))
    session = PersistentMemorySession("s1", store=store)
    run(session.add_items([user("q")]))
    CountingConnection.sends = 0
    assert run(session.get_items()) == [user("q")]
    assert CountingConnection.sends == 1
    store.close()


def test_an_unreachable_redis_is_the_stores_error_in_async_calls():
    from persistent_memory.exceptions import BackendUnavailable
    from tests.conftest import _free_port

    client = redis.Redis(port=_free_port(), socket_connect_timeout=1)
    store = MemoryStore(RedisBackend(client=client, max_history=100, auto_summarize=True))
    session = PersistentMemorySession("s1", store=store)
    with pytest.raises(BackendUnavailable):
        run(session.get_items())
    with pytest.raises(BackendUnavailable):
        run(session.add_items([user("q")]))


def test_each_event_loop_closes_its_connections(redis_url, redis_client):
    """A loop per call (asyncio.run, async_to_sync, async views under WSGI) leaves no
    connection behind: the bridge's connections close when their loop shuts down."""
    from tests.redis_topologies import poll

    client = redis.Redis.from_url(redis_url)
    store = MemoryStore(RedisBackend(client=client, max_history=100, auto_summarize=True))
    session = PersistentMemorySession("s1", store=store)
    run(session.add_items([user("q")]))

    def clients() -> int:
        return redis_client.info("clients")["connected_clients"]

    before = poll(lambda: clients() or None, "a count")
    gc.disable()  # closed by the bridge, not by the garbage collector finding them
    try:
        for _ in range(20):
            assert run(session.get_items()) == [user("q")]
        poll(lambda: clients() <= before or None, "the loops' connections to close")
    finally:
        gc.enable()
    store.close()


# What an owner wrote through the REST API -------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("backend_name", ["memory", "redis"])
def test_metadata_written_through_the_rest_api_is_passed_over(store):
    """A message whose ``openai_agents`` metadata is not the entries of that message reads
    as the items of a message recorded without a session, and pops as one."""
    writer = get_user_model().objects.create_user("rest-writer", password="pw-for-tests")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=writer).key}")
    session = PersistentMemorySession("s1", owner=f"user:{writer.pk}")
    run(session.add_items([user("kept")]))
    malformed = [
        *(1, {}, None, "m", [1], [{}], [{"m": 1}], [{"x": {}}], [{"m": {}, "c": {}}]),
        *([{"m": {"content": 3}}], [{"c": {}}], [{"o": {}}], [{"m": {"content": [{"a": 1}, None]}}]),
    ]
    for entries in malformed:
        posted = client.post(
            "/api/memory/sessions/s1/messages/",
            {"messages": [{"role": "user", "content": "from REST", "metadata": {KEY: entries}}]},
            format="json",
        )
        assert posted.status_code in (200, 201), posted.content
        assert run(session.get_items()) == [user("kept"), user("from REST")], entries
        assert run(session.pop_item()) == user("from REST")
    assert run(session.get_items()) == [user("kept")]


@pytest.mark.parametrize("backend_name", ["memory", "redis"])
@settings(max_examples=40, suppress_health_check=list(HealthCheck), deadline=None)
@given(
    entries=JSON
    | st.lists(st.dictionaries(st.sampled_from(["m", "c", "o", "v"]), JSON, max_size=2), max_size=3)
)
def test_any_metadata_leaves_every_method_working(store, entries):
    """Whatever JSON a message's ``openai_agents`` metadata holds, get_items and pop_item
    answer, and a message recorded otherwise reads as one."""
    session = PersistentMemorySession("any")
    run(session.clear_session())
    tool_call = {"id": "c1", "type": "function", "function": {"name": "find", "arguments": "{}"}}
    store.add_messages(
        "any",
        [
            {
                "role": "assistant",
                "content": "Looking.",
                "tool_calls": [tool_call],
                "metadata": {KEY: entries},
            },
            {"role": "tool", "tool_call_id": "c1", "content": "found", "metadata": {KEY: entries}},
        ],
    )
    items = run(session.get_items())
    assert isinstance(items, list) and all(isinstance(item, dict) for item in items)
    assert run(session.pop_item()) == items[-1]
    assert run(session.get_items()) == items[:-1]
