"""The thread tail on Redis (conversations.lua): the newest texts of each conversation's
current thread, kept where a read takes them with a plain LRANGE beside its script call.
Every way a thread changes leaves the tail equal to the thread's newest texts; reads take
their texts from it (one round trip: test_conversations_contract), async ones too; data
without a tail (written before it was kept) reads as before."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import redis

from persistent_memory.exceptions import BackendUnavailable
from persistent_memory.idempotency import Idempotency
from persistent_memory.integrations.redis_bridge import run_bridged
from persistent_memory.store import MemoryStore
from tests.chat import assistant, calling, result, system, user
from tests.conftest import TOPOLOGIES

TAIL = 32  # conversations.lua


@pytest.fixture(params=[name for name in TOPOLOGIES if name != "memory"])
def backend_name(request: pytest.FixtureRequest) -> str:
    return request.param


def keys(store: MemoryStore, session_id: str = "s1", conversation: str = "default") -> dict[str, str]:
    names = store.backend.layout.conversation_keys(session_id, conversation)
    return {"thread": names[3], "texts": names[1], "tail": names[8]}


def assert_tail_is_the_thread(
    store: MemoryStore, session_id: str = "s1", conversation: str = "default"
) -> None:
    client, named = store.backend.client, keys(store, session_id, conversation)
    ids = client.lrange(named["thread"], -TAIL, -1)
    expected = client.hmget(named["texts"], ids) if ids else []
    assert client.lrange(named["tail"], 0, -1) == expected
    if ids:  # and it expires with the session
        assert abs(client.pttl(named["tail"]) - client.pttl(named["thread"])) < 1000


def change_in_tail(store: MemoryStore, index: int) -> str:
    """Make the tail's text at ``index`` say "from the tail" (there only): what a read then
    answers shows where its texts came from. Returns the tail's key."""
    tail = keys(store)["tail"]
    stored = json.loads(store.backend.client.lindex(tail, index))
    stored["content"] = "from the tail"
    store.backend.client.lset(tail, index, json.dumps(stored))
    return tail


def turn(i: int) -> list[dict[str, Any]]:
    return [user(f"question {i}"), assistant(f"answer {i}")]


def test_every_change_of_the_thread_leaves_the_tail_equal_to_it(configure):
    store = configure(MAX_MESSAGES=60)
    store.add_messages("s1", [system("Be brief.")])
    for i in range(20):  # past TAIL: pushed and cut
        store.add_messages("s1", turn(i))
        assert_tail_is_the_thread(store)
    head = store.get_messages("s1")["head"]
    parent = store.get_messages("s1", limit=2)["messages"][0]["id"]
    steps = {
        "regenerate (a branch)": lambda: store.add_messages("s1", [assistant("again")], parent_id=parent),
        "back to the first answer": lambda: store.set_head("s1", head),
        "tool calls": lambda: store.add_messages("s1", [calling("c1"), result("c1"), assistant("done")]),
        "pop": lambda: store.pop_message("s1", store.get_messages("s1")["head"]),
        "pop with a replacement": lambda: store.pop_message(
            "s1", store.get_messages("s1")["head"], replacement=[assistant("better")]
        ),
        "trims past MAX_MESSAGES": lambda: [store.add_messages("s1", turn(100 + i)) for i in range(15)],
        "a thread written with its record": lambda: store.write_thread(
            "s1",
            key="record",
            expected=None,
            record={"revision": "1"},
            messages=turn(0),
            conversation="other",
        ),
        "the record's thread moved to no head": lambda: store.write_thread(
            "s1", key="record", expected="1", record={"revision": "2"}, conversation="other"
        ),
    }
    for step in steps.values():
        step()
        assert_tail_is_the_thread(store)
        assert_tail_is_the_thread(store, conversation="other")
    snapshot = store.backend.snapshots(["s1"])["s1"]
    store.backend.restore_session(snapshot, replace=True)
    assert_tail_is_the_thread(store)
    store.clear_messages("s1")
    assert not store.backend.client.exists(keys(store)["tail"])


def test_a_short_thread_trimmed_from_the_front_keeps_its_tail(configure):
    """Trimming removes the oldest messages: on a thread shorter than the tail, from inside it."""
    store = configure(MAX_MESSAGES=10)
    store.add_messages("s1", [system("Be brief.")])
    for i in range(12):
        store.add_messages("s1", turn(i))
        assert_tail_is_the_thread(store)
    assert store.list_conversations("s1")[0]["trimmed"] > 0


def test_reads_take_their_texts_from_the_tail(configure):
    store = configure()
    for i in range(3):
        store.add_messages("s1", turn(i))
    change_in_tail(store, -1)
    assert store.get_messages("s1")["messages"][-1]["content"] == "from the tail"
    assert store.get_messages("s1", limit=2)["messages"][-1]["content"] == "from the tail"
    assert store.get_context("s1", max_tokens=1000)["messages"][-1]["content"] == "from the tail"
    assert store.get_context("s1", max_messages=1)["messages"][-1]["content"] == "from the tail"
    # A thread other than the current one (a leaf given) is read from the stored texts.
    head = store.get_messages("s1")["head"]
    assert store.get_messages("s1", leaf=head)["messages"][-1]["content"] == "answer 2"
    # Async: through the bridge, the same.
    read = asyncio.run(run_bridged(store.get_messages, "s1"))
    assert read["messages"][-1]["content"] == "from the tail"


# One server: a pause of a Sentinel's primary or of a cluster node would fail it over.
@pytest.mark.parametrize("backend_name", ["redis"])
def test_an_async_read_of_a_stalled_server_times_out_and_the_next_one_is_whole(configure):
    """The bridge reads the four replies beside the tail under one timeout: a server that
    stops answering fails the read within it, and the connection is not used again half
    read."""
    store = configure(REDIS_SOCKET_TIMEOUT=1.0)
    for i in range(3):
        store.add_messages("s1", turn(i))
    client = store.backend.client

    async def reads() -> list[Any]:
        first = await run_bridged(store.get_messages, "s1")
        # Every command waits, CLIENT UNPAUSE too (a read is an FCALL_RO: a WRITE pause lets
        # it through), for three socket timeouts.
        client.execute_command("CLIENT", "PAUSE", 3_000, "ALL")
        with pytest.raises(BackendUnavailable):
            await run_bridged(store.get_messages, "s1")
        server = client.connection_pool.connection_kwargs
        with redis.Redis(host=server["host"], port=server["port"]) as waiter:
            waiter.ping()  # answered once the pause is over
        return [first, await run_bridged(store.get_messages, "s1")]

    first, after = asyncio.run(reads())
    assert after == first and [m["content"] for m in after["messages"]][-2:] == ["question 2", "answer 2"]


def test_a_thread_without_a_tail_reads_its_stored_texts(configure):
    """Data written before the tail was kept: no tail, then a tail shorter than the thread
    until as many messages as it holds were appended, or the thread changed otherwise."""
    store = configure()
    for i in range(20):
        store.add_messages("s1", turn(i))
    expected = store.get_messages("s1")["messages"]
    window = store.get_context("s1", max_tokens=200)
    store.backend.client.delete(keys(store)["tail"])
    assert store.get_messages("s1")["messages"] == expected
    assert store.get_messages("s1", limit=3)["messages"] == expected[-3:]
    assert store.get_context("s1", max_tokens=200) == window
    store.add_messages("s1", turn(20))
    assert store.backend.client.llen(keys(store)["tail"]) == 2
    assert store.get_messages("s1")["messages"][-3:-2] == expected[-1:]
    assert [m["content"] for m in store.get_messages("s1", limit=2)["messages"]] == [
        "question 20",
        "answer 20",
    ]
    for i in range(21, 40):
        store.add_messages("s1", turn(i))
    assert_tail_is_the_thread(store)


def test_a_read_longer_than_the_tail_takes_the_rest_from_the_stored_texts(configure):
    store = configure()
    for i in range(40):
        store.add_messages("s1", turn(i))
    change_in_tail(store, 0)  # the thread's message 80 - TAIL
    expected = [f"{'question' if k % 2 == 0 else 'answer'} {k // 2}" for k in range(80)]
    expected[80 - TAIL] = "from the tail"
    for limit, first in ((None, 0), (40, 40), (TAIL, 80 - TAIL), (3, 77)):
        messages = store.get_messages("s1", limit=limit)["messages"]
        assert [message["content"] for message in messages] == expected[first:]


def test_the_enrich_lane_reads_its_window_from_the_tail(configure):
    """The window is read before the question goes on; the texts come from the tail after."""
    store = configure()
    for i in range(40):
        store.add_messages("s1", turn(i))
    tail = change_in_tail(store, -1)
    expected = store.get_context("s1")
    _, window, question = store.enrich_recording("s1", "and now?")
    assert window["messages"] == expected["messages"]
    assert window["messages"][-1]["content"] == "from the tail"
    assert store.get_messages("s1")["messages"][-1]["id"] == question
    assert json.loads(store.backend.client.lindex(tail, -1))["id"] == question
    _, window, _ = store.enrich_recording("s1", "and then?")
    assert [m["content"] for m in window["messages"][-2:]] == ["from the tail", "and now?"]


def test_an_enrich_that_trims_the_window_answers_the_window_before(configure):
    store = configure(MAX_MESSAGES=10)
    for i in range(5):
        store.add_messages("s1", turn(i))
    expected = store.get_context("s1")
    assert expected["messages"][0]["content"] == "question 0"  # the append trims it
    _, window, _ = store.enrich_recording("s1", "and now?")
    assert window["messages"] == expected["messages"]
    assert store.get_messages("s1")["messages"][0]["content"] == "answer 0"
    assert_tail_is_the_thread(store)


def test_an_enrich_sent_again_answers_the_window_it_answered(configure):
    store = configure()
    for i in range(3):
        store.add_messages("s1", turn(i))
    once = Idempotency("enrich-1", "fingerprint")
    _, first, _ = store.enrich_recording("s1", "and now?", idempotency=once)
    store.add_messages("s1", turn(3))
    _, again, _ = store.enrich_recording("s1", "and now?", idempotency=once)
    assert again == first
