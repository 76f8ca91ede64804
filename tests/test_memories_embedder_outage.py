"""An embedder that hangs or fails costs a request one bounded try, not its full timeout
and retries: writes store the memory without a vector at once and the background worker
embeds it once the embedder answers again; searches answer by keyword within the bound
and say so; the circuit opens after failures, lets one call try again after its
cool-down, and closes when it answers; health/ shows it. Vectors with no direction or
not of the model's length are neither stored nor searched with. Against the local
stand-in server (tests/embeddings_server.py, which can hold a request unanswered), on
SQLite and PostgreSQL (DATABASE_URL).

Bounds: the embedder's own timeout is 30 s and a request's 0.5 s; a write or a search
must answer within 15 s (before the circuit, a write took the full timeout and retries)."""

from __future__ import annotations

import threading
import time
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connections
from rest_framework.test import APIClient

from persistent_memory.memories import embedders, embedding_worker, memories_for, vectors
from persistent_memory.memories.records import vector_fields
from persistent_memory.memories.search import compiled_where
from persistent_memory.models import LongTermMemory
from tests.embeddings_server import DIMENSIONS, embed_text, embeddings_server
from tests.test_memories_api import make_user
from tests.test_memories_semantic import PYTHON, QUESTION, _staff_client

# The worker writes from its own thread and connection: the test must not hold a transaction.
pytestmark = pytest.mark.django_db(transaction=True)

#: The embedder's own timeout: what a request waited (times three tries) before.
EMBEDDER_TIMEOUT = 30.0
REQUEST_TIMEOUT = 0.5
#: What a write or a search may take while the embedder hangs: far below EMBEDDER_TIMEOUT,
#: far above REQUEST_TIMEOUT (a loaded machine never fails it).
BOUND = 15.0


@pytest.fixture
def server():
    with embeddings_server() as state:
        yield state


def configure(settings, server, **extra) -> None:
    settings.PERSISTENT_MEMORY = {
        "EMBEDDER": "openai",
        "EMBEDDER_OPTIONS": {
            "base_url": server.url,
            "model": "stand-in",
            "api_key_env": None,
            "timeout": EMBEDDER_TIMEOUT,
            "max_retries": 2,
        },
        "EMBEDDER_REQUEST_TIMEOUT": REQUEST_TIMEOUT,
        **extra,
    }


class Clock:
    """The circuit's clock, moved on by the test: a cool-down passes when the test says."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset

    def pass_cooldown(self) -> None:
        self.offset += embedders.circuit().cooldown


@pytest.fixture
def clock(settings, server) -> Clock:
    configure(settings, server)
    embedders.current()  # built (the openai package imported): not what the tests time
    clock = Clock()
    embedders.circuit().clock = clock
    return clock


def timed(call):
    started = time.perf_counter()
    result = call()
    return result, time.perf_counter() - started


def embedder_part() -> dict:
    from django.contrib.auth import get_user_model

    staff = get_user_model().objects.filter(username="staff-embed").first()
    client = _staff_client() if staff is None else APIClient()
    if staff is not None:
        client.force_authenticate(staff)
    return client.get("/api/memory/health/").json()["embedder"]


def vector_of(memory_id: int) -> list[float] | None:
    return LongTermMemory.objects.get(pk=memory_id).embedding


def test_a_write_stores_at_once_while_the_embedder_hangs_and_gets_its_vector_after(server, clock) -> None:
    _, alice = make_user("alice")
    assert alice.get("/api/memory/memories/").status_code == 200  # the API loaded: not what is timed
    server.hang()
    first, first_seconds = timed(
        lambda: alice.post("/api/memory/memories/", {"content": PYTHON}, format="json")
    )
    assert first.status_code == 201 and first.json()["content"] == PYTHON
    assert first_seconds < BOUND  # one try of REQUEST_TIMEOUT, not 3 x EMBEDDER_TIMEOUT
    assert vector_of(first.json()["id"]) is None
    # A PATCH, and more writes: the circuit opens after three failures in a row.
    patched, patch_seconds = timed(
        lambda: alice.patch(
            f"/api/memory/memories/{first.json()['id']}/", {"content": PYTHON + " Always."}, format="json"
        )
    )
    assert patched.status_code == 200 and patch_seconds < BOUND
    more = [
        alice.post("/api/memory/memories/", {"content": f"Drinks tea, cup {n}."}, format="json")
        for n in (1, 2)
    ]
    assert [answer.status_code for answer in more] == [201, 201]
    part = embedder_part()
    assert part["circuit"] == "open" and part["status"] == "ok" and part["pending"] == 3
    assert part["retry_at"] is not None and part["last_error"]
    # While it is open, a write does not call the embedder at all.
    asked = len(server.requests)
    skipped = embedders.health.skipped
    _, open_seconds = timed(
        lambda: alice.post("/api/memory/memories/", {"content": "Has a dog called Rex."}, format="json")
    )
    assert open_seconds < BOUND and embedders.health.skipped > skipped
    assert len(server.requests) == asked
    server.recover()
    clock.pass_cooldown()  # the worker tries again, and finds it answering
    worker = embedding_worker.worker()
    assert worker is not None and worker.wait_idle(timeout=120)
    rows = LongTermMemory.objects.filter(owner=first.json()["owner"])
    assert rows.count() == 4 and all(row.embedding is not None for row in rows)
    assert vector_of(first.json()["id"]) == pytest.approx(embed_text(PYTHON + " Always."))
    part = embedder_part()
    assert part["circuit"] == "closed" and part["pending"] == 0 and part["queued"] == 0
    print(f"\nwrite while hanging: {first_seconds:.2f} s (first), {open_seconds:.3f} s (circuit open)")


def test_searches_answer_by_keyword_within_the_bound_and_the_circuit_closes_again(server, clock) -> None:
    owner = memories_for("user:a")
    python = owner.add(PYTHON)
    owner.add("Drinks green tea in the morning.")
    assert owner.search_results(QUESTION, strategy="semantic").strategy == "semantic"
    server.hang()
    # Eight searches at once (a gunicorn's eight threads): each answers within the bound,
    # even those that found the embedder hanging first. Queries matching no word: reads
    # only, so SQLite's shared test database is never locked by a search's access count.
    answers: list[tuple[str, float]] = []

    def one(strategy: str) -> None:
        try:
            found, seconds = timed(lambda: owner.search_results("Which one, then?", strategy=strategy))
            answers.append((found.strategy, seconds))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=one, args=(("semantic", "hybrid")[n % 2],)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert len(answers) == 8 and all(used == "keyword" for used, _ in answers), answers
    assert max(seconds for _, seconds in answers) < BOUND, answers
    assert embedder_part()["circuit"] == "open"
    # Over REST: the results by keyword, and the strategy that found them.
    _, client = make_user("bob")
    assert client.get("/api/memory/memories/").status_code == 200  # the API loaded
    client.post("/api/memory/memories/", {"content": PYTHON}, format="json")  # stored, no vector
    answer, seconds = timed(
        lambda: client.post(
            "/api/memory/memories/search/",
            {"query": "python", "strategy": "hybrid", "max_tokens": 200},
            format="json",
        )
    )
    assert answer.status_code == 200 and seconds < BOUND
    assert answer.json()["strategy"] == "keyword" and len(answer.json()["results"]) == 1
    semantic = client.post(
        "/api/memory/memories/search/", {"query": QUESTION, "strategy": "semantic"}, format="json"
    )
    assert semantic.json() == {"results": [], "strategy": "keyword"}
    server.recover()
    assert owner.search_results(QUESTION, strategy="semantic").strategy == "keyword"  # still open
    # After the cool-down one search tries again, finds it answering and closes the circuit
    # (unless bob's memory's worker tried first: then the search finds it closed).
    clock.pass_cooldown()
    found = owner.search_results(QUESTION, strategy="semantic")
    assert found.strategy == "semantic" and found.results[0]["id"] == python["id"]
    assert embedder_part()["circuit"] == "closed"
    worker = embedding_worker.worker()
    assert worker is not None and worker.wait_idle(timeout=120)  # bob's memory, embedded
    hybrid = client.post("/api/memory/memories/search/", {"query": QUESTION}, format="json").json()
    assert hybrid["strategy"] == "hybrid" and hybrid["results"][0]["content"] == PYTHON
    print(
        f"\nsearch while hanging: {max(s for _, s in answers):.2f} s (slowest of 8 at once), {seconds:.3f} s"
    )


def test_the_circuit_opens_after_failures_and_lets_one_call_try_after_the_cool_down() -> None:
    now = [100.0]
    gate = embedders.Circuit(threshold=3, cooldown=30.0, clock=lambda: now[0])
    gate.failed()
    gate.failed()
    assert gate.state == embedders.CLOSED and gate.allow()
    gate.succeeded()  # failures count in a row
    for _ in range(3):
        gate.failed()
    assert gate.state == embedders.OPEN and not gate.allow() and gate.wait_seconds() == 30.0
    now[0] += 30.0
    assert gate.allow() and gate.state == embedders.HALF_OPEN
    assert not gate.allow()  # one call tries; the others do not
    gate.failed()  # its failure opens it again at once
    assert gate.state == embedders.OPEN and not gate.allow()
    now[0] += 30.0
    assert gate.allow()
    now[0] += 30.0  # the one trying never said how it went: another may try
    assert gate.allow()
    gate.succeeded()
    assert gate.state == embedders.CLOSED and gate.allow() and gate.retry_at() is None
    gate.failed(decisive=True)  # the worker's failure, after its own retries
    assert gate.state == embedders.OPEN


def test_the_worker_waits_for_memory_embed_when_off(settings, server) -> None:
    configure(settings, server, EMBEDDER_WORKER=False)
    server.hang()
    memory = memories_for("user:a").add("Drinks espresso daily.")
    assert embedding_worker.worker() is None and embedder_part()["worker"] == "off"
    server.recover()
    assert vector_of(memory["id"]) is None
    out = StringIO()
    call_command("memory_embed", stdout=out, stderr=StringIO())
    assert vector_of(memory["id"]) == pytest.approx(embed_text("Drinks espresso daily."))


#: What the shaped embedder answers for a text containing each word.
SHAPES = {
    "zero": lambda: [0.0] * DIMENSIONS,
    "huge": lambda: [0.001] * 200_000,
    "short": lambda: [0.5] * 8,
}


def shaped(texts: list[str]) -> list[list[float]]:
    """A custom embedder answering the stand-in's vectors, or a misshapen one (SHAPES)."""
    return [
        next((make() for word, make in SHAPES.items() if word in text), None) or embed_text(text)
        for text in texts
    ]


def test_vectors_with_no_direction_or_the_wrong_length_are_neither_stored_nor_searched(settings) -> None:
    settings.PERSISTENT_MEMORY = {"EMBEDDER": "tests.test_memories_embedder_outage.shaped"}
    owner = memories_for("user:a")
    python = owner.add(PYTHON)
    assert len(vector_of(python["id"])) == DIMENSIONS  # the first vector: the model's length
    rejected = embedders.health.rejected
    for text in ("A zero of a fact.", "A huge fact.", "A short fact."):
        memory = owner.add(text)
        assert memory["content"] == text and vector_of(memory["id"]) is None, text
    assert embedders.health.rejected == rejected + 3
    assert "200000 dimensions" in embedders.health.last_error or "refused" in embedders.health.last_error
    # A query whose vector has no direction (or the wrong length) is searched by keyword.
    found = owner.search_results("python zero", strategy="semantic")
    assert found.strategy == "keyword" and python["id"] in [m["id"] for m in found.results]
    assert owner.search_results("short python", strategy="hybrid").strategy == "keyword"
    assert owner.search_results(QUESTION, strategy="semantic").strategy == "semantic"
    # memory_embed refuses them too: they stay without a vector, counted as pending.
    out = StringIO()
    call_command("memory_embed", stdout=out, stderr=StringIO())
    assert LongTermMemory.objects.filter(owner="user:a", embedding__isnull=True).count() == 3
    # A zero vector stored before these checks is near nothing (numpy answered every memory
    # at score 0), nor is a query of one.
    LongTermMemory.objects.filter(pk=python["id"]).update(**vector_fields([0.0] * DIMENSIONS, "stand-in"))
    assert owner.similar(python["id"]) == []
    rows = LongTermMemory.objects.filter(owner="user:a")
    for bad in ([0.0] * DIMENSIONS, [float("nan")] * DIMENSIONS, []):
        assert vectors.nearest(rows, compiled_where(rows), bad, "stand-in", 10) == []


def test_dimensions_set_the_length_and_the_cap_bounds_it(settings, server) -> None:
    configure(settings, server, EMBEDDER_MAX_DIMENSIONS=12)
    owner = memories_for("user:a")
    memory = owner.add(PYTHON)  # the stand-in answers 16 numbers: over the cap
    assert vector_of(memory["id"]) is None
    assert "EMBEDDER_MAX_DIMENSIONS" in embedders.health.last_error
    options = {**settings.PERSISTENT_MEMORY["EMBEDDER_OPTIONS"], "dimensions": 8}
    settings.PERSISTENT_MEMORY = {
        **settings.PERSISTENT_MEMORY,
        "EMBEDDER_MAX_DIMENSIONS": 4096,
        "EMBEDDER_OPTIONS": options,
    }
    assert embedders.expected_length("stand-in") == 8
    assert embedders.refusal([0.1] * 16, "stand-in") == "16 dimensions, where this model's vectors have 8"
    assert len(vector_of(owner.add("Drinks espresso daily.")["id"])) == 8


def test_checks_refuse_bad_circuit_settings(settings) -> None:
    from persistent_memory.checks import check_settings

    for bad in (
        {"EMBEDDER_REQUEST_TIMEOUT": 0},
        {"EMBEDDER_CIRCUIT_SECONDS": -1},
        {"EMBEDDER_CIRCUIT_FAILURES": 0},
        {"EMBEDDER_MAX_DIMENSIONS": 1.5},
        {"EMBEDDER_QUEUE_SIZE": 0},
        {"EMBEDDER_WORKER": "yes"},
        {
            "EMBEDDER": "openai",
            "EMBEDDER_OPTIONS": {"dimensions": 8192, "api_key_env": None},
            "EMBEDDER_MAX_DIMENSIONS": 4096,
        },
    ):
        settings.PERSISTENT_MEMORY = bad
        assert check_settings(), bad
    settings.PERSISTENT_MEMORY = {
        "EMBEDDER": "openai",
        "EMBEDDER_OPTIONS": {"dimensions": 1024, "api_key_env": None},
        "EMBEDDER_REQUEST_TIMEOUT": 0.5,
        "EMBEDDER_CIRCUIT_SECONDS": 10,
        "EMBEDDER_CIRCUIT_FAILURES": 1,
        "EMBEDDER_MAX_DIMENSIONS": 1024,
        "EMBEDDER_QUEUE_SIZE": 1,
        "EMBEDDER_WORKER": False,
    }
    assert check_settings() == []


#: Released by the test: until then the blocking embedder does not answer.
UNBLOCK = threading.Event()


def blocking(texts: list[str]) -> list[list[float]]:
    """A custom embedder that hangs until the test releases it (no timeout of its own)."""
    UNBLOCK.wait(120)
    return [embed_text(text) for text in texts]


def test_a_custom_embedder_that_hangs_is_bounded_too(settings) -> None:
    settings.PERSISTENT_MEMORY = {
        "EMBEDDER": "tests.test_memories_embedder_outage.blocking",
        "EMBEDDER_REQUEST_TIMEOUT": REQUEST_TIMEOUT,
    }
    UNBLOCK.clear()
    owner = memories_for("user:a")
    try:
        memory, seconds = timed(lambda: owner.add(PYTHON))
        assert seconds < BOUND and vector_of(memory["id"]) is None
        found, seconds = timed(lambda: owner.search_results("python", strategy="semantic"))
        assert seconds < BOUND and found.strategy == "keyword" and found.results[0]["id"] == memory["id"]
    finally:
        UNBLOCK.set()  # the pool's threads and the worker's call answer now
    worker = embedding_worker.worker()
    assert worker is not None and worker.wait_idle(timeout=120)
    assert vector_of(memory["id"]) == pytest.approx(embed_text(PYTHON))
