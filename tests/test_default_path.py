"""The default path on Redis: with the default settings (conversations recorded, the
extraction worker running, the deferred mirror), every
lane call and every conversation write is one script call, the background workers'
calls over a window of writes included. Counted by Redis (``INFO commandstats`` on every
primary) and, on one server, by the client (packets sent), in both layouts and on a real
cluster."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from persistent_memory.backends.redis.functions import library_calls
from persistent_memory.conf import DEFAULTS, memory_settings
from persistent_memory.memories import memories_for
from persistent_memory.pipeline import MemoryFilter
from persistent_memory.store import MemoryStore, get_store
from tests.conftest import CountingConnection, topology_settings

# The extraction worker writes from its own thread and connection: no test transaction.
pytestmark = pytest.mark.django_db(transaction=True)

SETUPS = ["redis", "redis-cluster-layout", "redis-cluster"]
#: Turns in the window counted (each an enrich and a store call, then an append).
TURNS = 20


def _servers(setup: str, request: pytest.FixtureRequest) -> list[redis.Redis]:
    """A client on every server that holds the store's keys (every primary of a cluster)."""
    if setup == "redis-cluster":
        cluster = request.getfixturevalue("redis_cluster")
        return [redis.Redis(host=host, port=port) for host, port in cluster.primaries()]
    return [redis.Redis.from_url(request.getfixturevalue("redis_url"))]


def _script_calls(servers: list[redis.Redis]) -> int:
    return sum(library_calls(client.info("commandstats")) for client in servers)


@pytest.fixture(params=SETUPS)
def default_store(
    request: pytest.FixtureRequest, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[MemoryStore, list[redis.Redis], str]]:
    """The process store on ``setup`` with every default but the address."""
    # Its real default (conftest turns it off).
    monkeypatch.setitem(DEFAULTS, "MEMORY_EXTRACTION_WORKER", True)
    memory_settings.reload()
    settings.PERSISTENT_MEMORY = {"BACKEND": "redis", **topology_settings(request.param, request)}
    store = get_store()
    assert store.extraction_worker.running
    servers = _servers(request.param, request)
    client = getattr(store.backend, "client", None)
    if isinstance(client, redis.Redis):  # one server: the client's packets are counted too
        client.connection_pool.disconnect()
        client.connection_pool.connection_class = CountingConnection
    yield store, servers, request.param
    for server in servers:
        server.close()


def _counted(
    store: MemoryStore, servers: list[redis.Redis], sessions: list[str], writes: Callable[[], int]
) -> tuple[int, int, int]:
    """(calls made, script calls Redis ran, packets the client sent) for ``writes`` to
    ``sessions`` and what the background workers did about them."""
    for session_id in sessions:  # not counted: the script loaded on their primaries, connections made
        store.create_session(session_id)
    assert store.extraction_worker.wait_idle(timeout=30)
    before = _script_calls(servers)
    CountingConnection.sends = 0
    calls = writes()
    assert store.extraction_worker.wait_idle(timeout=30), "the extraction worker did not finish"
    store.summarizer_worker.run_once()  # a round of the summarizer's worker, in the window
    return calls, _script_calls(servers) - before, CountingConnection.sends


def test_every_default_write_is_one_script_call_workers_included(default_store):
    store, servers, setup = default_store
    lanes = MemoryFilter(store)

    def turns() -> int:
        for n in range(TURNS):
            session_id = f"s{n % 4}"
            lanes.open()
            metadata = {"session_id": session_id}
            lanes.enrich({"text": f"Where is the tower, question {n}?", "metadata": metadata})
            lanes.store({"text": f"In Paris ({n}).", "metadata": metadata})
            store.add_messages(session_id, [{"role": "user", "content": f"And the weather ({n})?"}])
        return 3 * TURNS

    calls, scripts, sends = _counted(store, servers, [f"s{n}" for n in range(4)], turns)
    assert store.extraction_worker.batches == 3 * TURNS  # the worker saw every write
    assert scripts == calls
    if setup != "redis-cluster":
        assert sends == calls
    # What was recorded is there: every question, answer and appended message.
    assert len(store.get_messages("s0")["messages"]) == 3 * TURNS // 4


def test_a_write_whose_messages_yield_a_memory_costs_the_worker_one_call_per_session(default_store):
    """The one call the worker makes: before writing what it found, whether the session
    is still there (a forgotten owner's memories never come back)."""
    store, servers, _setup = default_store

    def writes() -> int:
        store.add_messages("likes", [{"role": "user", "content": "I really love green tea."}])
        return 1

    calls, scripts, _sends = _counted(store, servers, ["likes"], writes)
    assert scripts == calls + 1
    found = memories_for("").list(limit=10)[1]
    assert [memory["content"] for memory in found] == ["I really love green tea."]
