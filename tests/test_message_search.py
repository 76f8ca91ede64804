"""Searchable conversations, on both store backends: what was said in an owner's
conversations is found by the same search as their memories (Python, REST, MCP,
injection), with its session, conversation, speaker and time; never another owner's,
never an expired, deleted or forgotten session's, never an injected memory block; on
SQLite's FTS5, PostgreSQL's tsvector and the ``icontains`` fallback."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any

import anyio
import pytest
import requests
import schemathesis
from asgiref.sync import sync_to_async
from django.core.management import call_command
from django.db import connection, connections
from django.test.utils import CaptureQueriesContext
from django.utils.dateparse import parse_datetime
from mcp.server.mcpserver.exceptions import ToolError
from rest_framework.test import APIClient
from schemathesis.core.transport import Response

from persistent_memory.exceptions import InvalidMemory, SessionNotFound
from persistent_memory.mcp.server import build_server
from persistent_memory.memories import embedders, embedding_worker, memories_for, message_search
from persistent_memory.memories.injection import HEADER, render_memories
from persistent_memory.models import LongTermMemory, MemoryMessage, MemorySession
from persistent_memory.operations.forget import forget_owner
from persistent_memory.pipeline import MemoryFilter
from persistent_memory.store import MemoryStore
from tests.servers import manage
from tests.test_mcp import env, over_stdio  # noqa: F401  (env is a fixture)
from tests.test_mcp import payload as stdio_payload
from tests.test_memories_api import code_of, make_user
from tests.timing import LIVE_TTL, wait_past, wait_until

pytestmark = pytest.mark.django_db

ANN, BOB = "user:ann", "user:bob"
SEARCH = "/api/memory/memories/search/"
#: An idle TTL (seconds) that reads keep moving.
IDLE = 1.0
#: What a message found carries.
MESSAGE_FIELDS = {
    "kind",
    "id",
    "owner",
    "session_id",
    "conversation",
    "role",
    "name",
    "content",
    "said_at",
    "seq",
    "tokens",
    "score",
    "score_parts",
}


@pytest.fixture
def said(configure: Any) -> MemoryStore:
    """The store on each backend, its mirror synced only when told (or by a search)."""
    store = configure(MIRROR_MODE="deferred")
    assert store.mirror.mode == "deferred"
    return store


def say(
    store: MemoryStore,
    owner: str,
    session_id: str,
    content: str,
    *,
    role: str = "user",
    name: str | None = None,
    conversation: str = "default",
) -> dict[str, Any]:
    """One message of ``owner``'s session, as stored."""
    message = {"role": role, "content": content, **({"name": name} if name else {})}
    added = store.for_owner(owner).add_messages(session_id, [message], conversation=conversation)
    return added["messages"][0]


def said_at(stored: dict[str, Any]) -> datetime:
    return datetime.fromtimestamp(stored["created_at"], tz=UTC)


def contents(found: list[dict[str, Any]], kind: str | None = None) -> list[str]:
    return [item["content"] for item in found if kind is None or item["kind"] == kind]


# Found, with all its fields ---------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["keyword", "hybrid", "recent"])
def test_a_message_is_found_with_its_session_conversation_speaker_and_time(
    said: MemoryStore, strategy: str
) -> None:
    ann = memories_for(ANN)
    for unrelated in ("My dog is called Rex", "Prefers dark mode", "Works at Acme"):
        ann.add(unrelated)
    stored = say(said, ANN, "trip-1", "We fly to Lisbon on Friday", name="ann", conversation="travel")
    found = ann.search("Which day is the Lisbon flight?", strategy=strategy)
    if strategy == "recent":  # every memory too, the newest (the message) first
        assert len(found) == 4
    else:  # no unrelated memory
        assert len(found) == 1
    [hit] = [item for item in found if item["kind"] == "message"]
    assert found[0] is hit
    assert set(hit) == MESSAGE_FIELDS
    assert (hit["owner"], hit["session_id"], hit["conversation"]) == (ANN, "trip-1", "travel")
    assert (hit["id"], hit["role"], hit["name"], hit["content"]) == (
        stored["id"],
        "user",
        "ann",
        "We fly to Lisbon on Friday",
    )
    assert (hit["seq"], hit["tokens"]) == (stored["seq"], stored["tokens"]) and hit["tokens"] > 0
    assert hit["said_at"].timestamp() == pytest.approx(stored["created_at"], abs=1e-5)
    assert hit["score"] > 0 and hit["score_parts"]
    # Only memories are counted as accessed.
    assert sum(LongTermMemory.objects.values_list("access_count", flat=True)) == len(found) - 1


@pytest.mark.parametrize("strategy", ["keyword", "hybrid", "recent"])
def test_kinds_choose_what_is_looked_through(said: MemoryStore, strategy: str, settings: Any) -> None:
    ann = memories_for(ANN)
    ann.add("Booked the Lisbon hotel", type="episodic")
    say(said, ANN, "trip-1", "The Lisbon flight leaves at nine")
    query = "Lisbon"
    assert {item["kind"] for item in ann.search(query, strategy=strategy)} == {"memory", "message"}
    assert contents(ann.search(query, strategy=strategy, kinds=["memory"])) == ["Booked the Lisbon hotel"]
    assert contents(ann.search(query, strategy=strategy, kinds=["message"])) == [
        "The Lisbon flight leaves at nine"
    ]
    assert len(ann.search(query, strategy=strategy, kinds="message")) == 1  # one kind as a string
    # ``types`` narrows memories, so alone it searches memories only; with kinds, both.
    assert contents(ann.search(query, strategy=strategy, types=["episodic"])) == ["Booked the Lisbon hotel"]
    both = ann.search(query, strategy=strategy, types=["episodic"], kinds=["memory", "message"])
    assert len(both) == 2
    other_type = ann.search(query, strategy=strategy, types=["factual"], kinds=["memory", "message"])
    assert [item["kind"] for item in other_type] == ["message"]
    # MEMORY_SEARCH_KINDS is the default.
    settings.PERSISTENT_MEMORY = {**settings.PERSISTENT_MEMORY, "MEMORY_SEARCH_KINDS": ["message"]}
    assert [item["kind"] for item in ann.search(query, strategy=strategy)] == ["message"]
    settings.PERSISTENT_MEMORY = {**settings.PERSISTENT_MEMORY, "MEMORY_SEARCH_KINDS": ["memory"]}
    assert [item["kind"] for item in ann.search(query, strategy=strategy)] == ["memory"]


@pytest.mark.parametrize("kinds", [[], ["bogus"], ["memory", "bogus"], "bogus", [None], [["memory"]], 5])
def test_invalid_kinds_are_refused_before_anything_is_counted(said: MemoryStore, kinds: Any) -> None:
    ann = memories_for(ANN)
    ann.add("Booked the Lisbon hotel")
    say(said, ANN, "trip-1", "The Lisbon flight leaves at nine")
    with pytest.raises(InvalidMemory, match="kind"):
        ann.search("Lisbon", kinds=kinds)
    assert LongTermMemory.objects.get().access_count == 0


@pytest.mark.parametrize("types", [5, [None], ["bogus"]])
def test_invalid_types_are_refused_as_invalid_memory(said: MemoryStore, types: Any) -> None:
    with pytest.raises(InvalidMemory, match="type"):
        memories_for(ANN).search("Lisbon", types=types)


def test_invalid_session_ids_are_refused(said: MemoryStore) -> None:
    ann = memories_for(ANN)
    for bad in ({"session_id": "bad id"}, {"exclude_session_id": "bad id"}, {"exclude_session_id": 5}):
        with pytest.raises(InvalidMemory, match="session"):
            ann.search("Lisbon", **bad)
        with pytest.raises(InvalidMemory, match="session"):  # whatever is looked through
            ann.search("Lisbon", kinds=["memory"], **bad)


# Owners ------------------------------------------------------------------------------


@pytest.mark.parametrize("strategy", ["keyword", "hybrid", "recent"])
def test_another_owners_messages_in_a_session_of_the_same_id_are_never_found(
    said: MemoryStore, strategy: str
) -> None:
    say(said, ANN, "chat", "My secret password is swordfish")
    say(said, BOB, "chat", "My secret password is marlin")
    query = "secret password swordfish marlin"
    for owner, own in ((ANN, "swordfish"), (BOB, "marlin")):
        for options in ({}, {"session_id": "chat"}, {"kinds": ["message"]}):
            found = memories_for(owner).search(query, strategy=strategy, **options)
            assert contents(found) == [f"My secret password is {own}"], (owner, options)
            assert {item["owner"] for item in found} == {owner}
    assert memories_for("user:carol").search(query, strategy=strategy) == []
    assert memories_for("").search(query, strategy=strategy) == []  # the unowned namespace


# Sessions that end ---------------------------------------------------------------------


def test_an_expired_sessions_messages_are_no_longer_found(said: MemoryStore) -> None:
    ann = said.for_owner(ANN)
    say(said, ANN, "kept", "The Lisbon hotel is on Rua Augusta")

    def found() -> list[str]:
        return sorted(contents(memories_for(ANN).search("Lisbon", strategy="keyword")))

    for attempt in range(5):
        session_id = f"short-{attempt}"
        expires_at = ann.create_session(session_id, ttl_seconds=LIVE_TTL)["expires_at"]
        say(said, ANN, session_id, "The Lisbon flight leaves at nine")
        before = found()
        if time.time() < expires_at:  # else the machine stalled the test past the expiry
            break
    else:
        pytest.fail("the machine stalled every attempt past the session's TTL")
    assert before == ["The Lisbon flight leaves at nine", "The Lisbon hotel is on Rua Augusta"]
    wait_past(expires_at)
    assert found() == ["The Lisbon hotel is on Rua Augusta"]
    assert contents(memories_for(ANN).search("", strategy="recent")) == ["The Lisbon hotel is on Rua Augusta"]
    # The search asked the store about the session its row said had expired.
    assert MemorySession.objects.get(owner=ANN, session_id=session_id).state == MemorySession.State.EXPIRED


def test_a_deleted_sessions_messages_are_no_longer_found(said: MemoryStore) -> None:
    say(said, ANN, "gone", "The Lisbon flight leaves at nine")
    say(said, ANN, "kept", "The Lisbon hotel is on Rua Augusta")
    assert len(memories_for(ANN).search("Lisbon", strategy="keyword")) == 2
    said.for_owner(ANN).delete_session("gone")
    for strategy in ("keyword", "hybrid", "recent"):
        assert contents(memories_for(ANN).search("Lisbon", strategy=strategy)) == [
            "The Lisbon hotel is on Rua Augusta"
        ]
    # A new session under the same id has only its own messages.
    say(said, ANN, "gone", "The Lisbon train leaves at ten")
    found = memories_for(ANN).search("Lisbon", strategy="recent", session_id="gone")
    assert contents(found) == ["The Lisbon train leaves at ten"]


def test_a_forgotten_owners_messages_are_no_longer_found(said: MemoryStore) -> None:
    for owner in (ANN, BOB):
        say(said, owner, "chat", f"{owner} flies to Lisbon")
        memories_for(owner).add(f"{owner} likes Lisbon")
        assert len(memories_for(owner).search("Lisbon")) == 2
    forget_owner(ANN, store=said)
    assert memories_for(ANN).search("Lisbon") == []
    assert not MemoryMessage.objects.filter(conversation__session__owner=ANN).exists()
    assert sorted(contents(memories_for(BOB).search("Lisbon"))) == [
        f"{BOB} flies to Lisbon",
        f"{BOB} likes Lisbon",
    ]


def test_a_session_kept_alive_by_reads_keeps_its_messages_found(configure: Any) -> None:
    """With IDLE_TTL_REFRESH_ON_READ, reads move a session's expiry without marking it for
    the mirror: its row keeps the last write's expiry, and the search asks the store again."""
    store = configure(MIRROR_MODE="deferred", SESSION_IDLE_TTL_SECONDS=IDLE, IDLE_TTL_REFRESH_ON_READ=True)
    ann = store.for_owner(ANN)

    def found() -> list[str]:
        return contents(memories_for(ANN).search("Lisbon", strategy="keyword"))

    for attempt in range(5):  # again under a new id while the machine stalls it past the idle TTL
        session_id = f"read-{attempt}"
        say(store, ANN, session_id, "The Lisbon flight leaves at nine")
        written_expiry = ann.session_info(session_id)["expires_at"]
        first = found()
        if time.time() >= written_expiry:
            continue
        assert first == ["The Lisbon flight leaves at nine"]  # the row has the write's expiry
        try:
            while time.time() < written_expiry + IDLE / 2:  # reads, each well within the idle TTL
                ann.get_messages(session_id)
                time.sleep(IDLE / 5)
            expires_at = ann.session_info(session_id)["expires_at"]
        except SessionNotFound:
            continue
        answer = found()
        if time.time() < expires_at:
            break
    else:
        pytest.fail("the machine stalled every attempt past the idle TTL")
    assert expires_at > written_expiry
    assert answer == ["The Lisbon flight leaves at nine"]
    # And once it expires for good, the search finds it gone (its row says so too).
    wait_past(expires_at)
    assert found() == []
    row = MemorySession.objects.get(owner=ANN, session_id=session_id)
    assert row.state == MemorySession.State.EXPIRED


def test_messages_without_text_are_not_results(said: MemoryStore) -> None:
    """A bare tool call has nothing to read: never found, not even as the newest."""
    call = {"id": "call_1", "type": "function", "function": {"name": "flights", "arguments": "{}"}}
    said.for_owner(ANN).add_messages(
        "chat",
        [
            {"role": "user", "content": "Flights to Lisbon?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
        ],
    )
    for strategy in ("recent", "hybrid"):
        assert contents(memories_for(ANN).search("", strategy=strategy)) == ["Flights to Lisbon?"]
    assert MemoryMessage.objects.filter(content_text="").count() == 1  # mirrored all the same


# The mirror's modes ------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)  # the memory backend's worker writes from its own thread
def test_with_the_default_mirror_a_message_is_found_by_the_next_search(
    configure: Any, backend_name: str
) -> None:
    store = configure(MIRROR_MODE=None)
    assert store.mirror.mode == {"memory": "immediate", "redis": "deferred"}[backend_name]
    say(store, ANN, "chat", "The Lisbon flight leaves at nine")
    if backend_name == "redis":  # nothing has synced it: the search does
        assert not MemoryMessage.objects.exists()
    assert contents(memories_for(ANN).search("Lisbon flight")) == ["The Lisbon flight leaves at nine"]
    say(store, ANN, "chat", "The Lisbon hotel is on Rua Augusta")  # and the next one
    assert len(memories_for(ANN).search("Lisbon")) == 2


def test_with_the_mirror_off_messages_are_not_found_and_memories_are(
    said: MemoryStore, configure: Any
) -> None:
    memories_for(ANN).add("Booked the Lisbon hotel")
    say(said, ANN, "chat", "The Lisbon flight leaves at nine")
    assert len(memories_for(ANN).search("Lisbon")) == 2  # the rows are written
    store = configure()  # MIRROR_MODE "off"
    assert not store.mirror.enabled
    say(store, ANN, "other", "The Lisbon museum opens at ten")
    for strategy in ("keyword", "hybrid", "recent"):
        # Neither the new message nor the rows mirrored before (the mirror no longer
        # follows their sessions: one deleted now would still be found).
        assert contents(memories_for(ANN).search("Lisbon", strategy=strategy)) == ["Booked the Lisbon hotel"]
        assert memories_for(ANN).search("Lisbon", strategy=strategy, kinds=["message"]) == []


# Filters and budgets -----------------------------------------------------------------------


def test_session_id_and_exclude_session_id(said: MemoryStore) -> None:
    ann = memories_for(ANN)
    ann.add("Lisbon trip budget is 900 euros", session_id="trip")
    say(said, ANN, "trip", "The Lisbon flight leaves at nine")
    say(said, ANN, "work", "The Lisbon office opens in May")
    for strategy in ("keyword", "hybrid", "recent"):
        found = ann.search("Lisbon", strategy=strategy, session_id="trip")
        assert sorted(contents(found)) == [
            "Lisbon trip budget is 900 euros",
            "The Lisbon flight leaves at nine",
        ]
        # Only that session's messages are left out: memories are not messages of it.
        found = ann.search("Lisbon", strategy=strategy, exclude_session_id="trip")
        assert sorted(contents(found)) == [
            "Lisbon trip budget is 900 euros",
            "The Lisbon office opens in May",
        ]
        assert (
            ann.search(
                "Lisbon", strategy=strategy, session_id="trip", exclude_session_id="trip", kinds=["message"]
            )
            == []
        )


def test_said_after_and_said_before_keep_to_when_a_message_was_said(said: MemoryStore) -> None:
    first = say(said, ANN, "chat", "The Lisbon flight leaves at nine")
    wait_until(lambda: time.time() > first["created_at"] + 0.01)
    second = say(said, ANN, "chat", "The Lisbon hotel is on Rua Augusta")
    assert second["created_at"] > first["created_at"]
    between = said_at(first) + (said_at(second) - said_at(first)) / 2
    ann = memories_for(ANN)
    for strategy in ("keyword", "hybrid", "recent"):
        assert contents(ann.search("Lisbon", strategy=strategy, said_after=between)) == [second["content"]]
        assert contents(ann.search("Lisbon", strategy=strategy, said_before=between)) == [first["content"]]
        # Inclusive after, exclusive before.
        at_second = ann.search(
            "Lisbon",
            strategy=strategy,
            said_after=said_at(second),
            said_before=said_at(second) + timedelta(seconds=1),
        )
        assert contents(at_second) == [second["content"]]
        assert ann.search("Lisbon", strategy=strategy, said_before=said_at(first)) == []


def test_a_token_budget_mixes_both_kinds_and_keeps_at_least_one(said: MemoryStore) -> None:
    ann = memories_for(ANN)
    ann.add("Booked the Lisbon hotel near the river")
    say(said, ANN, "chat", "The Lisbon flight leaves at nine in the morning")
    full = ann.search("Lisbon", strategy="keyword")
    assert {item["kind"] for item in full} == {"memory", "message"}
    first, second = full
    ids = [(item["kind"], item["id"]) for item in full]
    both = ann.search("Lisbon", strategy="keyword", max_tokens=first["tokens"] + second["tokens"])
    assert [(item["kind"], item["id"]) for item in both] == ids
    for budget in (0, first["tokens"], first["tokens"] + second["tokens"] - 1):
        kept = ann.search("Lisbon", strategy="keyword", max_tokens=budget)
        assert [(item["kind"], item["id"]) for item in kept] == ids[:1], budget


# By meaning ---------------------------------------------------------------------------------

FAKE_EMBEDDER = "tests.test_memories.fake_embedder"


def test_messages_with_vectors_are_found_by_meaning_where_message_embeddings_is_on(configure: Any) -> None:
    store = configure(MIRROR_MODE="deferred", EMBEDDER=FAKE_EMBEDDER)
    espresso = say(store, ANN, "chat", "I drink espresso every morning")
    say(store, BOB, "chat", "I drink espresso at noon")
    memories_for(ANN).add("My dog is called Rex")
    assert message_search.embeds_messages()  # MESSAGE_EMBEDDINGS None: an EMBEDDER is set
    store.mirror.sync_dirty()
    rows = list(MemoryMessage.objects.values_list("pk", flat=True))
    assert message_search.embed_batch(rows, embedder=embedders.current()) == 2
    found = memories_for(ANN).search("Which coffee?", strategy="semantic")
    assert [(item["kind"], item["id"]) for item in found][:1] == [("message", espresso["id"])]
    assert found[0]["score_parts"]["semantic"] == pytest.approx(1.0)
    assert all(item["owner"] == ANN for item in found)
    hybrid = memories_for(ANN).search("Which coffee?", strategy="hybrid", kinds=["message"])
    assert contents(hybrid) == ["I drink espresso every morning"]  # no shared word: by meaning
    configure(MIRROR_MODE="deferred", EMBEDDER=FAKE_EMBEDDER, MESSAGE_EMBEDDINGS=False)
    assert memories_for(ANN).search("Which coffee?", strategy="semantic", kinds=["message"]) == []


def test_messages_written_with_an_embedder_get_vectors_from_memory_embed(configure: Any) -> None:
    """The worker's queue is this process's (and the test's transaction never commits, so
    the mirror hands it nothing): ``memory_embed`` catches up."""
    store = configure(MIRROR_MODE="deferred", EMBEDDER=FAKE_EMBEDDER)
    say(store, ANN, "chat", "I drink espresso every morning")
    store.mirror.sync_dirty()
    assert not MemoryMessage.objects.exclude(embedding_f32__isnull=True).exists()
    call_command("memory_embed", stdout=StringIO(), stderr=StringIO())
    embedded = MemoryMessage.objects.exclude(embedding_f32__isnull=True)
    assert embedded.count() == 1
    assert contents(memories_for(ANN).search("Which coffee?", strategy="semantic")) == [
        "I drink espresso every morning"
    ]


@pytest.mark.django_db(transaction=True)  # the worker reads the rows from its own thread
def test_the_embedding_worker_embeds_messages_once_the_mirror_commits(configure: Any) -> None:
    store = configure(MIRROR_MODE="deferred", EMBEDDER=FAKE_EMBEDDER)
    say(store, ANN, "chat", "I drink espresso every morning")
    say(store, ANN, "chat", "")  # no text: nothing to embed
    store.mirror.sync_dirty()  # its commit hands the new rows to the worker
    current = embedding_worker.worker()
    assert current is not None and current.wait_idle(timeout=60)
    vectors = dict(MemoryMessage.objects.values_list("content_text", "embedding_model"))
    assert vectors == {"I drink espresso every morning": embedders.current().model, "": ""}
    found = memories_for(ANN).search("Which coffee?", strategy="semantic")
    assert contents(found) == ["I drink espresso every morning"]


# Injection --------------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["system", "user"])
def test_an_injected_memory_block_is_never_found(said: MemoryStore, role: str) -> None:
    ann = memories_for(ANN)
    ann.add("I love Lisbon in the spring")
    block = render_memories([{"content": "I love Lisbon in the spring"}], role=role)
    assert block["content"].startswith(HEADER)
    said.for_owner(ANN).add_messages("chat", [block, {"role": "user", "content": "Lisbon or Porto?"}])
    for strategy in ("keyword", "hybrid", "recent"):
        found = ann.search("Lisbon spring", strategy=strategy)
        assert sorted(contents(found)) == ["I love Lisbon in the spring", "Lisbon or Porto?"]
    assert MemoryMessage.objects.filter(content_text__startswith=HEADER).count() == 1  # mirrored, not found


def test_the_enrich_lane_injects_messages_of_earlier_sessions_only(configure: Any) -> None:
    store = configure(MIRROR_MODE="deferred", INJECT_MEMORIES=True)
    earlier = say(store, ANN, "monday", "My sister Maria lives in Porto", name="ann")
    say(store, BOB, "monday", "My sister Maria lives in Oslo")
    say(store, ANN, "today", "Maria is visiting in June")
    lane = MemoryFilter(store.for_owner(ANN))
    question = {"text": "Where does my sister Maria live?", "metadata": {"session_id": "today"}}
    enriched, outcome = lane.enrich(question)
    assert outcome["session_id"] == "today"
    injected = enriched["metadata"]["memories"]
    assert [item["content"] for item in injected] == ["My sister Maria lives in Porto"]
    [item] = injected
    assert item == {
        "kind": "message",
        "id": earlier["id"],
        "session_id": "monday",
        "conversation": "default",
        "role": "user",
        "name": "ann",
        "content": "My sister Maria lives in Porto",
        "score": item["score"],
        "tokens": earlier["tokens"],
        "said_at": item["said_at"],
    }
    assert isinstance(item["said_at"], str)
    assert parse_datetime(item["said_at"]).timestamp() == pytest.approx(earlier["created_at"], abs=1e-5)
    json.dumps(injected)  # JSON-safe, as the lane's metadata must be
    day = said_at(earlier).date().isoformat()
    assert render_memories(injected) == {
        "role": "system",
        "content": f"{HEADER}\n- {day} ann: My sister Maria lives in Porto",
    }
    # The question was recorded in "today": that session's messages match, but the prompt
    # holds them already, so they are left out.
    today = store.for_owner(ANN).get_messages("today")["messages"]
    assert [m["content"] for m in today] == ["Maria is visiting in June", question["text"]]
    everywhere = contents(memories_for(ANN).search(question["text"]))
    assert {"Maria is visiting in June", question["text"]} <= set(everywhere)
    # Without a name, the role speaks.
    assert render_memories([{**item, "name": ""}])["content"].endswith(f"- {day} user: {item['content']}")


# The icontains fallback ----------------------------------------------------------------------


def test_without_full_text_search_messages_are_found_by_their_words(
    said: MemoryStore, monkeypatch: Any
) -> None:
    monkeypatch.setattr("persistent_memory.memories.fulltext.fts_ready", lambda table="pm_memory_fts": False)
    ann = memories_for(ANN)
    ann.add("Booked the Lisbon hotel")
    say(said, ANN, "chat", "The LISBON flight leaves at nine")
    say(said, ANN, "chat", "See you at the airport", name="lisbon_desk", role="assistant")
    say(said, BOB, "chat", "Bob flies to Lisbon")
    with CaptureQueriesContext(connection) as queries:
        found = ann.search("lisbon flight", strategy="keyword", kinds=["message"])
    assert contents(found) == ["The LISBON flight leaves at nine", "See you at the airport"]
    assert found[0]["score"] > found[1]["score"]  # the text's words count more than the name's
    if connection.vendor == "sqlite":
        assert not any("pm_message_fts" in query["sql"] for query in queries)
    assert sorted(contents(ann.search("lisbon", strategy="hybrid"))) == [
        "Booked the Lisbon hotel",
        "See you at the airport",
        "The LISBON flight leaves at nine",
    ]


# Settings checks -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bad",
    [
        {"MEMORY_SEARCH_KINDS": []},
        {"MEMORY_SEARCH_KINDS": "memory"},
        {"MEMORY_SEARCH_KINDS": ["memory", "bogus"]},
        {"MEMORY_SEARCH_KINDS": [["memory"]]},
        {"MEMORY_SEARCH_KINDS": None},
        {"MESSAGE_EMBEDDINGS": "yes"},
        {"MESSAGE_EMBEDDINGS": 1},
    ],
)
def test_checks_report_bad_search_kinds_and_message_embeddings(settings: Any, bad: dict) -> None:
    from persistent_memory.checks import check_settings

    settings.PERSISTENT_MEMORY = bad
    [message] = check_settings()
    assert message.id == "persistent_memory.E012" and next(iter(bad)) in message.msg


@pytest.mark.parametrize(
    "good",
    [
        {"MEMORY_SEARCH_KINDS": ["message"]},
        {"MEMORY_SEARCH_KINDS": ("memory",)},
        {"MEMORY_SEARCH_KINDS": ["message", "memory"]},
        {"MESSAGE_EMBEDDINGS": True},
        {"MESSAGE_EMBEDDINGS": False},
        {"MESSAGE_EMBEDDINGS": None},
    ],
)
def test_checks_accept_good_search_kinds_and_message_embeddings(settings: Any, good: dict) -> None:
    from persistent_memory.checks import check_settings

    settings.PERSISTENT_MEMORY = good
    assert check_settings() == []


# REST ----------------------------------------------------------------------------------------


def search_operation(client: APIClient) -> Any:
    """The search's operation in the schema the site serves (schemathesis checks bodies by it)."""
    schema = schemathesis.openapi.from_dict(client.get("/api/schema/?format=json").json())
    return schema[SEARCH]["POST"]


def conforms(operation: Any, status: int, body: Any) -> bool:
    """Whether a response of ``status`` with the JSON ``body`` is what the schema documents."""
    request = requests.Request("POST", f"http://testserver{SEARCH}").prepare()
    content = json.dumps(body).encode()
    headers = {"content-type": ["application/json"], "content-length": [str(len(content))]}
    response = Response(status, headers, content, request, elapsed=0.0, verify=True)
    try:
        operation.validate_response(response)
    except Exception:  # noqa: BLE001 - schemathesis raises a group of what did not conform
        return False
    return True


def test_rest_search_finds_only_the_callers_messages_and_answers_by_its_schema(said: MemoryStore) -> None:
    ann_user, ann = make_user("ann")
    bob_user, bob = make_user("bob")
    for api, text in ((ann, "My secret password is swordfish"), (bob, "My secret password is marlin")):
        posted = api.post(
            "/api/memory/sessions/chat/messages/",
            {"messages": [{"role": "user", "name": "me", "content": text}], "conversation": "notes"},
            format="json",
        )
        assert posted.status_code in (200, 201), posted.content
        assert (
            api.post("/api/memory/memories/", {"content": f"{text}, remembered"}, format="json").status_code
            == 201
        )
    operation = search_operation(ann)
    assert not conforms(operation, 200, {"results": [{"kind": "message", "id": "m1"}], "strategy": "keyword"})
    for user, api, own in ((ann_user, ann, "swordfish"), (bob_user, bob, "marlin")):
        for strategy in ("keyword", "hybrid", "recent"):
            answer = api.post(
                SEARCH, {"query": "secret password swordfish marlin", "strategy": strategy}, format="json"
            )
            assert answer.status_code == 200, answer.content
            assert conforms(operation, 200, answer.json()), answer.json()
            results = answer.json()["results"]
            assert sorted(r["content"] for r in results) == [
                f"My secret password is {own}",
                f"My secret password is {own}, remembered",
            ]
            [message] = [r for r in results if r["kind"] == "message"]
            assert set(message) == MESSAGE_FIELDS
            assert not conforms(operation, 200, {**answer.json(), "results": [{**message, "seq": "one"}]})
            assert (message["owner"], message["session_id"], message["conversation"], message["name"]) == (
                f"user:{user.pk}",
                "chat",
                "notes",
                "me",
            )
            assert parse_datetime(message["said_at"]) is not None
        only = api.post(SEARCH, {"query": "password", "kinds": ["message"]}, format="json").json()
        assert conforms(operation, 200, only), only
        assert [r["kind"] for r in only["results"]] == ["message"]
        memories = api.post(SEARCH, {"query": "password", "kinds": ["memory"]}, format="json").json()
        assert [r["kind"] for r in memories["results"]] == ["memory"]


@pytest.mark.parametrize(
    "body",
    [
        {"query": "x", "kinds": ["bogus"]},
        {"query": "x", "kinds": []},
        {"query": "x", "kinds": "memory"},
        {"query": "x", "kinds": ["memory", "message", "memory"]},
        {"query": "x", "kinds": [None]},
        {"query": "x", "kinds": 5},
    ],
)
def test_rest_refuses_invalid_kinds_with_a_json_error(said: MemoryStore, body: dict) -> None:
    _, api = make_user("ann")
    answer = api.post(SEARCH, body, format="json")
    assert code_of(answer) == (400, "invalid")
    assert set(answer.json()["errors"]) == {"kinds"}, answer.json()
    assert conforms(search_operation(api), 400, answer.json())


# MCP -------------------------------------------------------------------------------------------


def call_tools(owner: str, calls: list[dict[str, Any]]) -> list[Any]:
    """Each ``search_memories`` call's results (or the ToolError) through ``owner``'s server."""

    async def main() -> list[Any]:
        server = build_server(owner)
        answers: list[Any] = []
        try:
            for arguments in calls:
                try:
                    result = await server.call_tool("search_memories", arguments)
                except ToolError as error:
                    answers.append(error)
                    continue
                assert not result.is_error, result.content
                value = result.structured_content
                answers.append(value["result"] if isinstance(value, dict) and "result" in value else value)
        finally:
            await sync_to_async(connections.close_all)()  # the tools' thread's connections
        return answers

    return anyio.run(main)


@pytest.mark.django_db(transaction=True)  # the tools run in Django's sync thread, on its own connection
def test_mcp_search_finds_only_the_owners_messages_and_refuses_bad_kinds(said: MemoryStore) -> None:
    say(said, ANN, "chat", "My secret password is swordfish", name="ann")
    say(said, BOB, "chat", "My secret password is marlin", name="bob")
    memories_for(ANN).add("Ann's password hint is a fish")
    query = "secret password swordfish marlin"
    for owner, own in ((ANN, "swordfish"), (BOB, "marlin")):
        found, messages, bogus, empty = call_tools(
            owner,
            [
                {"query": query, "strategy": "keyword"},
                {"query": query, "kinds": ["message"]},
                {"query": query, "kinds": ["bogus"]},
                {"query": query, "kinds": []},
            ],
        )
        assert [(r["kind"], r["content"]) for r in messages] == [("message", f"My secret password is {own}")]
        assert [r["content"] for r in found if r["kind"] == "message"] == [f"My secret password is {own}"]
        assert messages[0]["session_id"] == "chat" and messages[0]["owner"] == owner
        assert parse_datetime(messages[0]["said_at"]) is not None  # JSON text
        assert isinstance(bogus, ToolError) and "invalid_memory: Invalid kind 'bogus'" in str(bogus)
        assert isinstance(empty, ToolError) and "invalid_memory: Invalid kinds" in str(empty)


def test_mcp_over_stdio_finds_what_the_owner_said_and_never_another_owners(env: dict[str, str]) -> None:  # noqa: F811
    """The demo's real server processes (Redis, whose mirror is deferred, and an SQLite file
    with FTS5): what one owner's server was told is found by its next search, without
    ``memory_mirror``; another owner's server, with a session of the same id, never finds it."""
    manage(env, "migrate", "--verbosity", "0")

    def tell_and_search(text: str) -> Any:
        async def body(session: Any) -> Any:
            added = await session.call_tool(
                "add_messages", {"session_id": "chat", "messages": [{"role": "user", "content": text}]}
            )
            assert not added.is_error, added.content
            found = await session.call_tool(
                "search_memories", {"query": "secret password", "kinds": ["message"]}
            )
            return stdio_payload(found)

        return body

    for owner, own in (("user:1", "swordfish"), ("user:2", "marlin")):
        found = over_stdio(env, owner, tell_and_search(f"My secret password is {own}"))
        assert [(r["kind"], r["owner"], r["session_id"], r["content"]) for r in found] == [
            ("message", owner, "chat", f"My secret password is {own}")
        ]
