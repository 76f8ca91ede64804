"""REDIS_READ_FROM_REPLICAS on a real cluster with replicas and a real Sentinel setup: the
reads that write nothing (FCALL_RO) reach a replica, counted by the replica's own
``INFO commandstats``; off (the default), every call stays on the primary."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
from django.core.checks import run_checks

from persistent_memory.integrations.openai_agents import PersistentMemorySession
from tests.redis_topologies import poll

pytestmark = pytest.mark.django_db(transaction=True)

READS = 12


def _nodes(backend_name: str, request: pytest.FixtureRequest) -> tuple[list[redis.Redis], list[redis.Redis]]:
    """Plain clients on the setup's primaries and on its replicas."""
    if backend_name == "redis-cluster":
        nodes = request.getfixturevalue("redis_cluster").nodes()
        clients: dict[bool, list[redis.Redis]] = {True: [], False: []}
        for address, node in nodes.items():
            host, port = address.rsplit(":", 1)
            clients["master" in node["flags"]].append(redis.Redis(host=host, port=int(port)))
        return clients[True], clients[False]
    sentinel = request.getfixturevalue("redis_sentinel")
    return [sentinel.data_client(sentinel.primary_port)], [sentinel.data_client(sentinel.replica_port)]


def _read_calls(clients: list[redis.Redis]) -> int:
    return sum(client.info("commandstats").get("cmdstat_fcall_ro", {}).get("calls", 0) for client in clients)


def _reset(clients: list[redis.Redis]) -> None:
    for client in clients:
        client.config_resetstat()


def _replicas_listed(backend_name: str, request: pytest.FixtureRequest) -> None:
    """Until the cluster's slot map lists every primary's replica (a new cluster's replicas
    join it a few seconds after it is ok): a client made before would not know them."""
    if backend_name == "redis-cluster":
        cluster = request.getfixturevalue("redis_cluster")

        def listed() -> bool:
            slots = cluster._ask(cluster.alive()[0], "CLUSTER", "SLOTS")
            return all(len(section) >= 4 for section in slots) or None

        poll(listed, "the replicas in CLUSTER SLOTS")


def _written(configure: Any, backend_name: str, request: pytest.FixtureRequest, **extra: Any) -> Any:
    """A store whose writes wait for a replica (so it holds them and the library), and a
    conversation written through it."""
    _replicas_listed(backend_name, request)
    store = configure(REDIS_WAIT_REPLICAS=1, REDIS_WAIT_TIMEOUT_MS=5000, **extra)
    store.add_messages("replicated", [{"role": "user", "content": "Where is Lyon?"}])
    store.add_messages("replicated", [{"role": "assistant", "content": "In France."}])
    return store


@pytest.mark.parametrize("backend_name", ["redis-cluster", "redis-sentinel"])
def test_reads_reach_a_replica_when_asked(configure, backend_name, request):
    store = _written(configure, backend_name, request, REDIS_READ_FROM_REPLICAS=True)
    primaries, replicas = _nodes(backend_name, request)
    _reset(primaries + replicas)
    for _ in range(READS):
        context = store.get_context("replicated")
        assert [message["content"] for message in context["messages"]] == ["Where is Lyon?", "In France."]
    assert store.get_messages("replicated")["messages"][-1]["content"] == "In France."
    assert _read_calls(replicas) == READS + 1
    assert _read_calls(primaries) == 0


@pytest.mark.parametrize("backend_name", ["redis-cluster", "redis-sentinel"])
def test_an_async_read_reaches_a_replica_too(configure, backend_name, request):
    store = _written(configure, backend_name, request, REDIS_READ_FROM_REPLICAS=True)
    primaries, replicas = _nodes(backend_name, request)
    _reset(primaries + replicas)
    session = PersistentMemorySession("replicated", store=store)
    items = asyncio.run(session.get_items(limit=1))
    assert items == [{"role": "assistant", "content": "In France."}]
    assert _read_calls(replicas) == 1
    assert _read_calls(primaries) == 0


@pytest.mark.parametrize("backend_name", ["redis-cluster", "redis-sentinel"])
def test_reads_stay_on_the_primary_by_default(configure, backend_name, request):
    store = _written(configure, backend_name, request)
    primaries, replicas = _nodes(backend_name, request)
    _reset(primaries + replicas)
    for _ in range(READS):
        store.get_context("replicated")
    assert _read_calls(primaries) == READS
    assert _read_calls(replicas) == 0


@pytest.mark.parametrize("backend_name", ["redis-sentinel"])
def test_a_read_the_replica_cannot_answer_goes_to_the_primary(configure, backend_name, request):
    """A replica without the library (here: flushed of it, as a replica that has not caught
    up yet) does not fail the read: the primary answers it."""
    store = _written(configure, backend_name, request, REDIS_READ_FROM_REPLICAS=True)
    primaries, replicas = _nodes(backend_name, request)
    (replica,) = replicas
    library = store.backend.transport.library.name
    replica.config_set("replica-read-only", "no")  # lets this test delete the library there
    try:
        replica.function_delete(library)
    finally:
        replica.config_set("replica-read-only", "yes")
    _reset(primaries + replicas)
    assert store.get_context("replicated")["messages"][-1]["content"] == "In France."
    assert _read_calls(primaries) == 1


@pytest.mark.parametrize("backend_name", ["redis-cluster", "redis-sentinel"])
def test_writes_stay_on_the_primary(configure, backend_name, request):
    store = _written(configure, backend_name, request, REDIS_READ_FROM_REPLICAS=True)
    primaries, replicas = _nodes(backend_name, request)
    _reset(primaries + replicas)
    store.add_messages("replicated", [{"role": "user", "content": "And Nantes?"}])
    stats = [client.info("commandstats") for client in replicas]
    assert not any("cmdstat_fcall" in stat for stat in stats)


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_the_setting_must_be_a_bool(settings, value):
    settings.PERSISTENT_MEMORY = {"BACKEND": "redis", "REDIS_URL": "redis://127.0.0.1:1/0"}
    settings.PERSISTENT_MEMORY["REDIS_READ_FROM_REPLICAS"] = value
    ids = [message.id for message in run_checks()]
    assert "persistent_memory.E017" in ids
