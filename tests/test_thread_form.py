"""The thread's form on Redis (conversations.lua): each conversation's current thread's
newest texts back to back in its ':x' key, with a record a text (running totals of tokens,
bytes and messages that are not plain) in its hash's 'form' field. Every way a thread
changes leaves the form equal to the thread's newest texts; windows and reads of the newest
messages take their texts from it in one reply, async ones too, and answer what the walk
of the thread answers; data without a form (written before it was kept) reads as before."""

from __future__ import annotations

import asyncio
import json
import struct
from typing import Any

import pytest
import redis

from persistent_memory.exceptions import BackendUnavailable
from persistent_memory.idempotency import Idempotency
from persistent_memory.integrations.redis_bridge import run_bridged
from persistent_memory.owners import storage_id
from persistent_memory.store import MemoryStore
from tests.chat import assistant, calling, result, system, user
from tests.conftest import TOPOLOGIES

#: conversations.lua: the texts a form holds once written again, and at most; a record's
#: size, and the records' region before the texts.
FORM, FORM_MAX, RECORD = 128, 256, 12
REGION = FORM_MAX * RECORD


@pytest.fixture(params=[name for name in TOPOLOGIES if name != "memory"])
def backend_name(request: pytest.FixtureRequest) -> str:
    return request.param


def keys(store: MemoryStore, session_id: str = "s1", conversation: str = "default") -> dict[str, str]:
    names = store.backend.layout.conversation_keys(session_id, conversation)
    return {
        "conversation": names[0],
        "thread": names[3],
        "texts": names[1],
        "links": names[2],
        "form": names[8],
    }


def form(store: MemoryStore, session_id: str = "s1", conversation: str = "default") -> tuple[list, bytes]:
    """The form's records (totals of tokens, bytes, messages not plain) and its texts."""
    client, named = store.backend.client, keys(store, session_id, conversation)
    head = client.hget(named["conversation"], "form")
    if head is None:
        return [], b""
    held, *totals, kind = struct.unpack(">IIIIB", head)
    stored = client.get(named["form"])
    records = list(struct.iter_unpack(">III", stored[: held * RECORD]))
    assert tuple(totals) == records[-1]
    assert kind == records[-1][2] - (records[-2][2] if held > 1 else 0)  # the newest's: 1 not plain
    return records, stored[REGION:]


def assert_form_is_the_thread(
    store: MemoryStore, session_id: str = "s1", conversation: str = "default"
) -> None:
    """The form holds the thread's newest texts (at least FORM of them, or all), their
    tokens and how many of them are not plain, and expires with the session."""
    client, named = store.backend.client, keys(store, session_id, conversation)
    totals, held_texts = form(store, session_id, conversation)
    thread = client.lrange(named["thread"], 0, -1)
    assert min(len(thread), FORM) <= len(totals) <= min(len(thread), FORM_MAX)
    ids = thread[len(thread) - len(totals) :]
    texts = client.hmget(named["texts"], ids) if ids else []
    assert held_texts == b"".join(texts)
    if not ids:
        assert not client.exists(named["form"])
    tokens = specials = 0
    for record, link in zip(totals, client.hmget(named["links"], ids) if ids else [], strict=True):
        link = json.loads(link)
        plain = link["r"] not in ("system", "tool") and not link["c"] and link["a"] is None
        tokens, specials = tokens + link["t"], specials + (not plain)
        assert (record[0], record[2]) == (tokens, specials)
    ends = [end for _, end, _ in totals]
    assert ends == [sum(map(len, texts[: i + 1])) for i in range(len(texts))]
    if ids:  # and it expires with the session
        assert abs(client.pttl(named["form"]) - client.pttl(named["thread"])) < 1000


def change_in_form(store: MemoryStore, content: str) -> None:
    """Make the form's text whose content is ``content`` say it in capitals (there only, the
    same length): what a read then answers shows where its texts came from."""
    client, key = store.backend.client, keys(store)["form"]
    old = json.dumps(content).encode()
    stored = client.get(key)
    assert old in stored
    client.set(key, stored.replace(old, old.upper()), keepttl=True)


def turn(i: int) -> list[dict[str, Any]]:
    return [user(f"question {i}"), assistant(f"answer {i}")]


def test_every_change_of_the_thread_leaves_the_form_equal_to_it(configure):
    store = configure(MAX_MESSAGES=300)
    store.add_messages("s1", [system("Be brief.")])
    for i in range(140):  # past FORM_MAX: appended, then written again
        store.add_messages("s1", turn(i))
        assert_form_is_the_thread(store)
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
        assert_form_is_the_thread(store)
        assert_form_is_the_thread(store, conversation="other")
    snapshot = store.backend.snapshots(["s1"])["s1"]
    store.backend.restore_session(snapshot, replace=True)
    assert_form_is_the_thread(store)
    store.clear_messages("s1")
    assert not store.backend.client.exists(keys(store)["form"])


def test_a_short_thread_trimmed_from_the_front_keeps_its_form(configure):
    """Trimming removes the oldest messages: on a thread shorter than the form, from inside it."""
    store = configure(MAX_MESSAGES=10)
    store.add_messages("s1", [system("Be brief.")])
    for i in range(12):
        store.add_messages("s1", turn(i))
        assert_form_is_the_thread(store)
    assert store.list_conversations("s1")[0]["trimmed"] > 0


def test_reads_take_their_texts_from_the_form(configure):
    store = configure()
    for i in range(3):
        store.add_messages("s1", turn(i))
    change_in_form(store, "answer 2")
    assert store.get_messages("s1")["messages"][-1]["content"] == "ANSWER 2"
    assert store.get_messages("s1", limit=2)["messages"][-1]["content"] == "ANSWER 2"
    assert store.get_context("s1", max_tokens=1000)["messages"][-1]["content"] == "ANSWER 2"
    assert store.get_context("s1", max_messages=1)["messages"][-1]["content"] == "ANSWER 2"
    # A thread other than the current one (a leaf given) is read from the stored texts.
    head = store.get_messages("s1")["head"]
    assert store.get_messages("s1", leaf=head)["messages"][-1]["content"] == "answer 2"
    # Async: through the bridge, the same.
    read = asyncio.run(run_bridged(store.get_messages, "s1"))
    assert read["messages"][-1]["content"] == "ANSWER 2"


# One server: a pause of a Sentinel's primary or of a cluster node would fail it over.
@pytest.mark.parametrize("backend_name", ["redis"])
def test_an_async_read_of_a_stalled_server_times_out_and_the_next_one_is_whole(configure):
    """A server that stops answering fails a bridged read within the socket timeout, and
    the connection is not used again half read."""
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


def test_a_thread_without_a_form_reads_its_stored_texts(configure):
    """Data written before the form was kept (no 'form' field; ':x' the old tail, a list)
    reads as before, and its next append writes the form."""
    store = configure()
    for i in range(20):
        store.add_messages("s1", turn(i))
    expected = store.get_messages("s1")["messages"]
    window = store.get_context("s1", max_tokens=200)
    client, named = store.backend.client, keys(store)
    client.hdel(named["conversation"], "form")
    client.delete(named["form"])
    client.rpush(named["form"], "an old tail's text")
    assert store.get_messages("s1")["messages"] == expected
    assert store.get_messages("s1", limit=3)["messages"] == expected[-3:]
    assert store.get_context("s1", max_tokens=200) == window
    store.add_messages("s1", turn(20))
    assert [m["content"] for m in store.get_messages("s1", limit=2)["messages"]] == [
        "question 20",
        "answer 20",
    ]
    assert_form_is_the_thread(store)


def test_a_read_longer_than_the_form_takes_the_thread_from_the_stored_texts(configure):
    store = configure()
    for i in range(FORM_MAX // 2 + 10):
        store.add_messages("s1", turn(i))
    length = 2 * (FORM_MAX // 2 + 10)
    expected = [f"{'question' if k % 2 == 0 else 'answer'} {k // 2}" for k in range(length)]
    for limit, first in (
        (None, 0),
        (FORM_MAX + 5, length - FORM_MAX - 5),
        (40, length - 40),
        (3, length - 3),
    ):
        messages = store.get_messages("s1", limit=limit)["messages"]
        assert [message["content"] for message in messages] == expected[first:]
    window = store.get_context("s1", max_messages=FORM_MAX + 5)
    assert [m["content"] for m in window["messages"]] == expected[length - FORM_MAX - 5 :]


def test_the_enrich_lane_reads_its_window_from_the_form(configure):
    """The window is read before the question goes on."""
    store = configure()
    for i in range(40):
        store.add_messages("s1", turn(i))
    change_in_form(store, "answer 39")
    expected = store.get_context("s1")
    _, window, question = store.enrich_recording("s1", "and now?")
    assert window["messages"] == expected["messages"]
    assert window["messages"][-1]["content"] == "ANSWER 39"
    assert store.get_messages("s1", limit=1)["messages"][-1]["id"] == question
    _, window, _ = store.enrich_recording("s1", "and then?")
    assert [m["content"] for m in window["messages"][-2:]] == ["ANSWER 39", "and now?"]


def walked(store: MemoryStore, **budgets: Any) -> dict[str, Any]:
    """The window the walk of the thread finds (the form's records taken away for the read)."""
    client, conversation = store.backend.client, keys(store)["conversation"]
    records = client.hget(conversation, "form")
    client.hdel(conversation, "form")
    try:
        return store.get_context("s1", **budgets)
    finally:
        if records is not None:
            client.hset(conversation, "form", records)


def test_a_window_from_the_form_is_the_walked_window(configure):
    """Whatever the budgets, after regenerated answers, tool calls, system messages, a pop,
    an edit (a replacement) and trimming: the window read from the form is the walk's."""
    store = configure(MAX_MESSAGES=120)
    store.add_messages("s1", [system("Be brief.")])
    for i in range(30):
        store.add_messages("s1", turn(i))
    parent = store.get_messages("s1", limit=2)["messages"][0]["id"]
    store.add_messages("s1", [assistant("regenerated")], parent_id=parent)
    for i in range(30, 45):
        store.add_messages("s1", turn(i))
    store.add_messages(
        "s1", [user("weather?"), calling("c1", "c2"), result("c1"), result("c2"), assistant("sunny")]
    )
    for i in range(45, 50):
        store.add_messages("s1", turn(i))
    store.pop_message("s1", store.get_messages("s1")["head"], replacement=[assistant("edited")])
    store.add_messages("s1", [system("Be briefer.")])
    for i in range(50, 70):  # past MAX_MESSAGES: trimmed
        store.add_messages("s1", turn(i))
    assert store.list_conversations("s1")[0]["trimmed"] > 0
    budgets = [{"max_messages": n} for n in (1, 2, 5, 19, 20, 21, 40, 100, 1000)]
    budgets += [{"max_tokens": n} for n in (1, 3, 10, 50, 100, 200, 400, 10_000)]
    budgets += [{"max_tokens": 100, "max_messages": 7}, {"max_tokens": 7, "max_messages": 100}, {}]
    for budget in budgets:
        assert store.get_context("s1", **budget) == walked(store, **budget), budget
    for i in range(70, 75):
        store.add_messages("s1", turn(i))
        for budget in budgets:
            assert store.get_context("s1", **budget) == walked(store, **budget), budget
    assert_form_is_the_thread(store)


def test_an_enrich_that_trims_the_window_answers_the_window_before(configure):
    store = configure(MAX_MESSAGES=10)
    for i in range(5):
        store.add_messages("s1", turn(i))
    expected = store.get_context("s1")
    assert expected["messages"][0]["content"] == "question 0"  # the append trims it
    _, window, _ = store.enrich_recording("s1", "and now?")
    assert window["messages"] == expected["messages"]
    assert store.get_messages("s1")["messages"][0]["content"] == "answer 0"
    assert_form_is_the_thread(store)


def test_an_enrich_sent_again_answers_the_window_it_answered(configure):
    store = configure()
    for i in range(3):
        store.add_messages("s1", turn(i))
    once = Idempotency("enrich-1", "fingerprint")
    _, first, _ = store.enrich_recording("s1", "and now?", idempotency=once)
    store.add_messages("s1", turn(3))
    _, again, _ = store.enrich_recording("s1", "and now?", idempotency=once)
    assert again == first


@pytest.mark.django_db
def test_the_form_goes_with_its_session(configure):
    """It expires with its session (an idle TTL moves it with the rest), and a delete and
    forgetting the owner take it."""
    from persistent_memory.operations.forget import forget_owner

    store = configure()
    store.create_session("s1", 600, idle_ttl_seconds=300)
    for i in range(3):
        store.add_messages("s1", turn(i))
    client, form = store.backend.client, keys(store)["form"]
    assert client.type(form) == b"string" and 0 < client.pttl(form) <= 300_000
    assert_form_is_the_thread(store)
    store.delete_session("s1")
    assert not client.exists(form)
    owned = store.for_owner("alice")
    owned.add_messages("s2", turn(0))
    owned_form = keys(store, storage_id("alice", "s2"))["form"]
    assert client.exists(owned_form)
    forget_owner("alice")
    assert not client.exists(owned_form)
