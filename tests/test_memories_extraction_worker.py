"""The extraction worker on both store backends (and on SQLite and PostgreSQL with
DATABASE_URL): appends over REST and Python and the enrich/store lanes yield memories
without ``memory_extract``, extracted on the worker's thread; owners kept apart; an
extractor that raises never fails a write and the worker goes on; a full queue drops
with a warning and ``memory_extract`` catches up; the worker stops at ``close()``; its
state in ``health/``. Waits are bounded (``wait_idle``), never a sleep."""

from __future__ import annotations

import logging
import threading
import time
from datetime import UTC, datetime
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from persistent_memory.conversations.signals import messages_added
from persistent_memory.conversations.summarizers import text_of
from persistent_memory.memories import memories_for
from persistent_memory.memories.extraction.candidates import Candidate
from persistent_memory.models import LongTermMemory
from persistent_memory.store import MemoryStore
from tests.chat import assistant, user

# The worker writes from its own thread and connection: the test must not hold a transaction.
pytestmark = pytest.mark.django_db(transaction=True)

RULES = "persistent_memory.memories.extraction.rules.extract"
ECHO = "tests.test_memories_extraction_worker.echo"
FLAKY = "tests.test_memories_extraction_worker.flaky"
GATED = "tests.test_memories_extraction_worker.gated"
WORKER_THREAD = "persistent-memory-extraction"

#: The threads the test extractors ran on.
threads_seen: list[str] = []
#: Opened by a test to let ``gated`` return.
gate = threading.Event()
#: Set by ``gated`` when the worker is extracting (past its gathering of writes).
entered = threading.Event()


def echo(messages: list[dict[str, Any]]) -> list[Candidate]:
    """One memory per message (user and assistant alike), keyed by its id."""
    threads_seen.append(threading.current_thread().name)
    return [
        Candidate(
            key=f"said.{message['id']}",
            type="episodic",
            content=f"{message['role']}: {text_of(message['content'])}",
            source_messages=[message["id"]],
        )
        for message in messages
    ]


def flaky(messages: list[dict[str, Any]]) -> list[Candidate]:
    """Raises on a message saying "boom"; finds nothing otherwise."""
    if any("boom" in text_of(message["content"]) for message in messages):
        raise RuntimeError("extractor bug")
    return []


def gated(messages: list[dict[str, Any]]) -> list[Candidate]:
    """Says the worker is extracting, then waits for the test to open the gate (at most 60 s)."""
    entered.set()
    gate.wait(60)
    return []


@pytest.fixture
def worker(configure):
    """The parametrized store with the extraction worker on (and ``extra`` settings)."""
    threads_seen.clear()
    gate.clear()
    entered.clear()

    def apply(**extra: Any) -> MemoryStore:
        store = configure(**({"MEMORY_EXTRACTION_WORKER": True} | extra))
        assert store.extraction_worker.running
        return store

    yield apply
    gate.set()


def settle(store: MemoryStore) -> None:
    assert store.extraction_worker.wait_idle(timeout=30), "the extraction worker did not finish"


def by_key(owner: str) -> dict[str, dict[str, Any]]:
    return {memory["key"]: memory for memory in memories_for(owner).list(limit=100)[1]}


def api_user(username: str) -> tuple[str, APIClient]:
    account = get_user_model().objects.create_user(username, password="pw-for-tests")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=account).key}")
    return f"user:{account.pk}", client


def test_a_python_append_yields_memories_on_the_worker_thread(worker):
    store = worker()
    alice = store.for_owner("user:alice")
    added = alice.add_messages("chat", [user("I love jazz. Do you?", id="m1"), assistant("I do.", id="m2")])
    assert [m["id"] for m in added["messages"]] == [
        "m1",
        "m2",
    ]  # the write is done, extraction is not waited for
    settle(store)
    memory = by_key("user:alice")["preference.jazz"]
    assert (memory["content"], memory["source"], memory["source_messages"]) == (
        "I love jazz.",
        "extraction",
        ["m1"],
    )
    said = added["messages"][0]["created_at"]  # when the statement was said, from the write itself
    assert memory["said_at"] == datetime.fromtimestamp(said, tz=UTC)
    assert store.extraction_worker.messages == 2 and store.extraction_worker.written == 1


def test_the_worker_never_runs_an_extractor_on_the_writers_thread(worker):
    store = worker(MEMORY_EXTRACTORS=[ECHO])
    store.for_owner("user:alice").add_messages("chat", [user("Hello.", id="m1")])
    settle(store)
    assert threads_seen == [WORKER_THREAD]
    assert set(by_key("user:alice")) == {"said.m1"}


def test_a_rest_append_yields_memories(worker):
    store = worker()
    owner, client = api_user("alice")
    response = client.post(
        "/api/memory/sessions/chat/messages/",
        {"messages": [{"id": "r1", "role": "user", "content": "We decided to ship on Mondays."}]},
        format="json",
    )
    assert response.status_code == 201, response.content
    settle(store)
    memory = by_key(owner)["decision.ship-on-mondays"]
    assert memory["source_messages"] == ["r1"] and memory["source"] == "extraction"


def test_an_enrich_store_lane_pair_yields_memories_of_the_question_and_the_answer(worker):
    store = worker(MEMORY_EXTRACTORS=[RULES, ECHO])
    owner, client = api_user("alice")
    question = {"question": {"text": "I always take the train.", "metadata": {"session_id": "chat"}}}
    enriched = client.post("/api/memory/enrich/", question | {"run_id": "run-1"}, format="json")
    assert enriched.status_code == 200, enriched.content
    stored = client.post(
        "/api/memory/store/", {"answer": {"text": "Trains it is."}, "run_id": "run-1"}, format="json"
    )
    assert stored.status_code == 200, stored.content
    settle(store)
    q, a = store.for_owner(owner).get_messages("chat")["messages"]
    memories = by_key(owner)
    assert memories["habit.take-the-train"]["source_messages"] == [q["id"]]
    assert memories[f"said.{q['id']}"]["content"] == "user: I always take the train."
    assert memories[f"said.{a['id']}"]["content"] == "assistant: Trains it is."
    assert set(threads_seen) == {WORKER_THREAD}


def test_the_python_lanes_yield_memories(worker):
    store = worker(MEMORY_EXTRACTORS=[ECHO]).for_owner("user:bob")
    enriched = store.enrich_recording("chat", "My dog is called Rex.", run_id="run-9")
    answer = store.record_answer(None, "A fine name.", run_id="run-9")
    assert answer is not None
    settle(store)
    [_, a] = store.get_messages("chat")["messages"]
    assert set(by_key("user:bob")) == {f"said.{enriched.question_id}", f"said.{a['id']}"}


def test_owners_are_kept_apart(worker):
    store = worker(MEMORY_EXTRACTORS=[RULES, ECHO])
    alice, bob = store.for_owner("user:alice"), store.for_owner("user:bob")
    for turn in range(5):  # interleaved, each in a session "chat" of their own
        alice.add_messages("chat", [user(f"I love tea number {turn}.", id=f"a{turn}")])
        bob.add_messages("chat", [user(f"I hate coffee number {turn}.", id=f"b{turn}")])
    settle(store)
    for owner, mine, word, other in (
        ("user:alice", "a", "tea", "coffee"),
        ("user:bob", "b", "coffee", "tea"),
    ):
        memories = list(by_key(owner).values())
        assert len(memories) == 10  # five statements, five echoes
        for memory in memories:
            assert [source[0] for source in memory["source_messages"]] == [mine]
            assert word in memory["content"] and other not in memory["content"]
    assert set(LongTermMemory.objects.values_list("owner", flat=True)) == {"user:alice", "user:bob"}


def test_an_extractor_that_raises_fails_no_write_and_the_worker_goes_on(worker, caplog):
    store = worker(MEMORY_EXTRACTORS=[FLAKY, ECHO]).for_owner("user:alice")
    with caplog.at_level(logging.WARNING, logger="persistent_memory"):
        store.add_messages("chat", [user("boom", id="m1")])  # returns: the write stands
        settle(store)
    assert "extractor bug" in caplog.text
    worker_ = store.extraction_worker
    assert worker_.failures == 1 and "RuntimeError: extractor bug" in worker_.last_error
    assert set(by_key("user:alice")) == {"said.m1"}  # the other extractor still ran
    store.add_messages("chat", [user("All is well.", id="m2")])
    settle(store)
    assert worker_.running and worker_.failures == 1
    assert set(by_key("user:alice")) == {"said.m1", "said.m2"}
    # health/ shows it to staff.
    staff = APIClient()
    staff.force_login(get_user_model().objects.create_user("ops", password="pw-for-tests", is_staff=True))
    part = staff.get("/api/memory/health/").json()["extraction"]
    assert part["status"] == "ok" and part["enabled"] is True and part["worker"] == "thread"
    assert (part["batches"], part["messages"], part["failures"], part["dropped"], part["queued"]) == (
        2,
        2,
        1,
        0,
        0,
    )
    assert "extractor bug" in part["last_error"] and part["last_error_at"] and part["last_success_at"]


def wait_until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + 60  # only so that a broken run ends: never reached by a slow one
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_a_full_queue_drops_with_a_warning_and_memory_extract_catches_up(worker, caplog):
    store = worker(MEMORY_EXTRACTORS=[GATED, ECHO], MEMORY_EXTRACTION_QUEUE_SIZE=1)
    alice, extraction = store.for_owner("user:alice"), store.extraction_worker
    with caplog.at_level(logging.WARNING, logger="persistent_memory"):
        alice.add_messages("chat", [user("First.", id="m1")])
        assert entered.wait(60), "the worker did not take the first batch"
        alice.add_messages("chat", [user("Second.", id="m2")])  # queued behind it
        alice.add_messages("chat", [user("Third.", id="m3")])  # the queue is full: dropped
        alice.add_messages("chat", [user("Fourth.", id="m4")])  # still full: dropped, no new warning
    assert caplog.text.count("extraction queue is full") == 1 and "memory_extract" in caplog.text
    assert extraction.dropped == 2
    gate.set()
    settle(store)
    assert set(by_key("user:alice")) == {"said.m1", "said.m2"}
    call_command("memory_extract", stdout=StringIO(), stderr=StringIO())
    assert set(by_key("user:alice")) == {"said.m1", "said.m2", "said.m3", "said.m4"}


def listening(extraction: Any) -> bool:
    """Whether the worker's receiver is connected to ``messages_added`` (by its dispatch
    uid: other receivers, the tasks' for one, may be connected too)."""
    return any(lookup[0] == extraction._uid for lookup, *_ in messages_added.receivers)


def test_the_worker_stops_at_close(worker):
    store = worker(MEMORY_EXTRACTORS=[ECHO])
    extraction = store.extraction_worker
    assert listening(extraction)
    store.close()
    assert not extraction.running and not listening(extraction)
    assert extraction.wait_idle(timeout=0)


def test_close_leaves_what_is_queued_to_memory_extract(worker, caplog):
    store = worker(MEMORY_EXTRACTORS=[GATED, ECHO])
    alice, extraction = store.for_owner("user:alice"), store.extraction_worker
    alice.add_messages("chat", [user("First.", id="m1")])
    assert entered.wait(60), "the worker did not take the first batch"
    alice.add_messages("chat", [user("Second.", id="m2")])
    closer = threading.Thread(target=store.close)
    with caplog.at_level(logging.INFO, logger="persistent_memory"):
        closer.start()  # it waits for the batch in progress
        wait_until(lambda: not listening(extraction), "close() did not stop the worker")
        gate.set()
        closer.join(60)
    assert not extraction.running and "1 batches not extracted" in caplog.text
    assert set(by_key("user:alice")) == {"said.m1"}


def test_off_by_setting_or_without_extractors(configure):
    store = configure(MEMORY_EXTRACTION_WORKER=False)
    assert not store.extraction_worker.enabled and not store.extraction_worker.running
    store = configure(MEMORY_EXTRACTION_WORKER=True, MEMORY_EXTRACTORS=[])
    assert not store.extraction_worker.enabled and not store.extraction_worker.running
    store.for_owner("user:alice").add_messages("chat", [user("I love jazz.", id="m1")])
    assert LongTermMemory.objects.count() == 0


def test_forgetting_an_owner_skips_what_the_worker_holds_of_theirs(worker):
    from persistent_memory.operations.forget import forget_owner

    store = worker(MEMORY_EXTRACTORS=[GATED, ECHO])
    alice, bob = store.for_owner("user:alice"), store.for_owner("user:bob")
    bob.add_messages("chat", [user("Bob first.", id="b1")])
    assert entered.wait(60), "the worker did not take bob's batch"
    alice.add_messages("chat", [user("Alice, queued.", id="a1")])  # waits behind bob's
    counts = forget_owner("user:alice", store=store)  # does not wait for bob's extraction
    assert counts["sessions"] == 1
    # Written after (to a session of the same id, so only the forgetting tells them apart).
    alice.add_messages("chat", [user("Alice, after.", id="a2")])
    gate.set()
    settle(store)
    assert set(by_key("user:alice")) == {"said.a2"} and set(by_key("user:bob")) == {"said.b1"}


def test_a_batch_of_a_session_deleted_since_is_skipped(worker):
    store = worker(MEMORY_EXTRACTORS=[GATED, ECHO])
    alice = store.for_owner("user:alice")
    alice.add_messages("kept", [user("First.", id="m1")])
    assert entered.wait(60), "the worker did not take the first batch"
    alice.add_messages("gone", [user("Second.", id="m2")])
    alice.delete_session("gone")  # as memory_forget in another process would
    gate.set()
    settle(store)
    assert set(by_key("user:alice")) == {"said.m1"}


def test_forgetting_waits_for_an_extraction_of_theirs_in_progress(worker, monkeypatch):
    from persistent_memory.operations.forget import forget_owner

    store = worker(MEMORY_EXTRACTORS=[GATED, ECHO])
    alice, extraction = store.for_owner("user:alice"), store.extraction_worker
    reached, forget = threading.Event(), extraction.forget

    def forget_then_note(owner: str, timeout: float = 30.0) -> bool:
        reached.set()  # forget_owner is done with the database until the memories' delete
        return forget(owner, timeout)

    monkeypatch.setattr(extraction, "forget", forget_then_note)
    alice.add_messages("chat", [user("In progress.", id="a1")])
    assert entered.wait(60), "the worker did not take the batch"
    forgetting = threading.Thread(target=forget_owner, args=("user:alice",), kwargs={"store": store})
    forgetting.start()
    assert reached.wait(60), "forget_owner did not reach the worker"
    assert forgetting.is_alive()  # waiting for the extraction in progress
    gate.set()
    forgetting.join(60)
    assert not forgetting.is_alive()
    settle(store)
    assert by_key("user:alice") == {}
