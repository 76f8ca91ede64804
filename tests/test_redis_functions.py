"""The Redis backend's function library: one FCALL (FCALL_RO for a read) per operation, the
library loaded wherever a call finds it missing (a flushed server, a failover, a new primary),
and the same code by EVALSHA on a server without functions."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from persistent_memory.backends.redis import RedisBackend
from persistent_memory.backends.redis.functions import SOURCE, Library
from persistent_memory.exceptions import CapacityExceeded, SessionExpired, SessionNotFound
from persistent_memory.integrations.redis_bridge import run_bridged
from persistent_memory.store import MemoryStore
from tests.conftest import RedisServer
from tests.redis_topologies import HOST, ClusterServers, poll, redis_binaries_missing

COMMANDS = ("fcall", "fcall_ro", "evalsha")
MESSAGES = [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi there"}]


def calls(client: redis.Redis) -> dict[str, int]:
    """How many FCALL, FCALL_RO and EVALSHA the server ran."""
    table = client.info("commandstats")
    return {
        name: table.get(f"cmdstat_{name}", {}).get("calls", 0) for name in ("fcall", "fcall_ro", "evalsha")
    }


def redis_store(url: str, **options: Any) -> MemoryStore:
    options = {"max_history": 100, "auto_summarize": False, **options}
    return MemoryStore(RedisBackend(client=redis.Redis.from_url(url), **options))


@pytest.fixture
def rstore(redis_client, redis_url) -> Iterator[MemoryStore]:
    store = redis_store(redis_url)
    yield store
    store.close()


def test_the_library_is_named_by_its_version():
    library, changed = Library(SOURCE), Library(SOURCE + "\n-- another release")
    assert library.name.startswith("persistent_memory_") and library.name != changed.name
    assert {library.write, library.read, library.free}.isdisjoint({changed.write, changed.read, changed.free})
    assert f"#!lua name={library.name}\n" == library.code.splitlines(keepends=True)[0]


def test_a_read_is_one_fcall_ro_and_a_write_one_fcall(rstore, redis_client):
    rstore.create_session("s1")
    rstore.put("s1", "k", 1)
    redis_client.config_resetstat()
    rstore.put("s1", "k", 2)
    assert rstore.get("s1", "k") == 2
    assert rstore.get_all("s1") == {"k": 2}
    assert calls(redis_client) == {"fcall": 1, "fcall_ro": 2, "evalsha": 0}


def test_reads_that_move_an_idle_expiry_are_writes(redis_client, redis_url):
    store = redis_store(redis_url, idle_ttl_seconds=60, refresh_on_read=True)
    try:
        store.create_session("s1")
        redis_client.config_resetstat()
        assert store.get_all("s1") == {}
        assert calls(redis_client) == {"fcall": 1, "fcall_ro": 0, "evalsha": 0}
    finally:
        store.close()


def test_a_read_that_meets_an_expired_session_cleans_it_up_as_a_write(rstore, redis_client):
    rstore.create_session("gone", ttl_seconds=0.05)
    rstore.put("gone", "k", 1)
    time.sleep(0.1)
    redis_client.config_resetstat()
    with pytest.raises(SessionExpired):
        rstore.get("gone", "k")
    # The read found it must write (drop the session's leftovers), wrote nothing, and was
    # sent again as a write, which did.
    assert calls(redis_client) == {"fcall": 1, "fcall_ro": 1, "evalsha": 0}
    assert redis_client.keys("*gone*") == []
    with pytest.raises(SessionNotFound):
        rstore.get("gone", "k")


def test_a_read_of_a_session_that_never_was_stays_one_read(rstore, redis_client):
    redis_client.config_resetstat()
    with pytest.raises(SessionNotFound):
        rstore.get_all("never")
    assert calls(redis_client) == {"fcall": 0, "fcall_ro": 1, "evalsha": 0}


def test_a_full_redis_refuses_writes_before_they_start_and_still_deletes(rstore, redis_client):
    rstore.create_session("s1")
    rstore.put("s1", "k", 1)
    policy = redis_client.config_get("maxmemory-policy")["maxmemory-policy"]
    redis_client.config_set("maxmemory-policy", "noeviction")
    redis_client.config_set("maxmemory", 1)
    try:
        with pytest.raises(CapacityExceeded):
            rstore.put("s1", "k", 2)
        assert rstore.get("s1", "k") == 1  # reads run
        rstore.delete_session("s1")  # what frees memory runs too
    finally:
        redis_client.config_set("maxmemory", 0)
        redis_client.config_set("maxmemory-policy", policy)
    assert rstore.list_sessions() == []


def test_function_flush_under_load_loses_no_write(rstore, redis_client):
    """FUNCTION FLUSH again and again while threads write and read: every call finds the
    library, or loads it and is sent again once; no write lost, none run twice, no error."""
    rstore.create_session("s1")
    rstore.add_messages("s1", MESSAGES)
    stop = threading.Event()
    errors: list[BaseException] = []
    done = {"writes": 0, "reads": 0}

    def write() -> None:
        try:
            while not stop.is_set():
                rstore.increment("s1", "n")
                done["writes"] += 1
        except BaseException as exc:
            errors.append(exc)

    def read() -> None:
        try:
            while not stop.is_set():
                assert rstore.get_messages("s1")["messages"][-1]["content"] == "Hi there"  # beside the tail
                assert rstore.get_all("s1")["n"] >= 0
                done["reads"] += 1
        except BaseException as exc:
            errors.append(exc)

    rstore.put("s1", "n", 0)
    threads = [threading.Thread(target=write), threading.Thread(target=write), threading.Thread(target=read)]
    for thread in threads:
        thread.start()
    try:
        for _ in range(20):
            poll(lambda: done["writes"] > 0 or errors, "a write")
            before = dict(done)
            redis_client.function_flush()
            poll(
                lambda before=before: done["writes"] > before["writes"] + 5 or errors,
                "writes after the flush",
            )
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert errors == []
    assert rstore.get("s1", "n") == done["writes"]
    assert done["reads"] > 0
    assert calls(redis_client)["evalsha"] == 0


def test_pipelined_calls_load_the_library_once_and_run(redis_client, redis_url):
    """The cluster layout's listing is 64 calls pipelined: after a flush, each is sent again
    once the library is loaded."""
    store = redis_store(redis_url, layout="cluster")
    try:
        for i in range(5):
            store.create_session(f"s{i}")
        redis_client.function_flush()
        assert store.list_sessions() == [f"s{i}" for i in range(5)]
    finally:
        store.close()


def test_the_async_bridge_loads_the_library(rstore, redis_client):
    rstore.add_messages("s1", MESSAGES)
    redis_client.function_flush()

    async def main() -> tuple[Any, Any]:
        read = await run_bridged(rstore.get_messages, "s1")  # beside the tail
        redis_client.function_flush()
        written = await run_bridged(rstore.put, "s1", "k", 1)
        redis_client.function_flush()
        return read, (written, await run_bridged(rstore.get, "s1", "k"))

    read, (_, value) = asyncio.run(main())
    assert [m["content"] for m in read["messages"]] == ["Hello", "Hi there"] and value == 1


@pytest.fixture(scope="module")
def server_without_functions() -> Iterator[RedisServer]:
    """A Redis 7 whose FUNCTION and FCALL commands are gone, as on Redis 6."""
    server = RedisServer(
        *(f for command in ("FUNCTION", "FCALL", "FCALL_RO") for f in ("--rename-command", command, ""))
    )
    server.start()
    yield server
    server.stop()


def test_a_server_without_functions_runs_the_same_code_by_evalsha(server_without_functions):
    client = redis.Redis.from_url(server_without_functions.url)
    store = redis_store(server_without_functions.url, layout="cluster")
    try:
        store.create_session("s1")
        assert store.increment("s1", "n") == 1
        client.script_flush()
        assert store.increment("s1", "n") == 2  # loaded again, then sent again, run once
        client.script_flush()
        assert store.list_sessions() == ["s1"]  # pipelined
        store.add_messages("s1", MESSAGES)
        client.script_flush()
        assert asyncio.run(run_bridged(store.get, "s1", "n")) == 2
        assert [e["op"] for e in store.get_history("s1", 0)] == ["increment", "increment"]
        assert calls(client)["evalsha"] > 0
    finally:
        store.close()
        client.close()


# Redis Cluster --------------------------------------------------------------------


def cluster_memory(url: str) -> MemoryStore:
    client = redis.cluster.RedisCluster.from_url(url)
    return MemoryStore(RedisBackend(client=client, layout="cluster", max_history=100, auto_summarize=False))


@pytest.fixture
def cluster_store(redis_cluster, redis_cluster_client) -> Iterator[MemoryStore]:
    store = cluster_memory(redis_cluster.url)
    yield store
    store.close()


def _session_port(store: MemoryStore, cluster: Any, session_id: str) -> int:
    return cluster.primary_for_key(store.backend.layout.keys(session_id)[0])[1]


def test_a_cluster_failover_keeps_the_library(cluster_store, redis_cluster):
    store = cluster_store
    store.create_session("s1")
    assert store.increment("s1", "n") == 1
    port = _session_port(store, redis_cluster, "s1")
    with redis_cluster.node(port) as primary:
        replica = int(primary.execute_command("ROLE")[2][0][1])
    redis_cluster.manual_failover(replica)
    assert store.increment("s1", "n") == 2  # the replica had it (FUNCTION LOAD replicates)
    flush_functions(redis_cluster)
    assert store.increment("s1", "n") == 3  # a primary without it: loaded on every one
    assert store.list_sessions() == ["s1"]
    assert store.get("s1", "n") == 3
    store.add_messages("s1", MESSAGES)

    async def bridged() -> tuple[Any, Any]:  # through redis.asyncio's cluster client
        flush_functions(redis_cluster)
        read = await run_bridged(store.get_messages, "s1")
        flush_functions(redis_cluster)
        return read, await run_bridged(store.increment, "s1", "n")

    read, counted = asyncio.run(bridged())
    assert [m["content"] for m in read["messages"]] == ["Hello", "Hi there"] and counted == 4


def flush_functions(cluster: Any) -> None:
    for _host, port in cluster.primaries():
        with cluster.node(port) as node:
            node.function_flush()


@pytest.fixture
def small_cluster() -> Iterator[ClusterServers]:
    """A cluster of this test's own (3 masters, no replicas), to add a node to."""
    missing = redis_binaries_missing()
    if missing:
        pytest.skip(missing)
    cluster = ClusterServers(primaries=3, replicas=0)
    cluster.start()
    yield cluster
    cluster.stop()


def test_a_new_primary_given_a_sessions_slot_gets_the_library(small_cluster):
    store = cluster_memory(small_cluster.url)
    try:
        store.create_session("s1")
        store.add_messages("s1", MESSAGES)
        assert store.increment("s1", "n") == 1
        key = store.backend.layout.keys("s1")[0]
        source = _session_port(store, small_cluster, "s1")
        new = small_cluster.add_primary()
        small_cluster.migrate_slots([redis.cluster.key_slot(key.encode())], source, new)
        with small_cluster.node(new) as node:
            assert node.function_list() == []  # nothing loaded it there
        assert store.increment("s1", "n") == 2  # MOVED, then the library loaded on it
        assert small_cluster.primary_for_key(key) == (HOST, new)
        assert [m["content"] for m in store.get_messages("s1")["messages"]] == ["Hello", "Hi there"]
        assert store.list_sessions() == ["s1"]
        with small_cluster.node(new) as node:
            assert len(node.function_list()) == 1
    finally:
        store.close()


def _getkeys_calls(cluster: ClusterServers) -> int:
    """``COMMAND GETKEYS`` run on every node of ``cluster``, as ``INFO commandstats`` counts."""
    total = 0
    for port in cluster.ports:
        with cluster.node(port) as node:
            total += node.info("commandstats").get("cmdstat_command|getkeys", {}).get("calls", 0)
    return total


def test_a_call_sent_again_after_moved_asks_no_node_for_its_keys(small_cluster):
    """After a MOVED the call goes through the user's RedisCluster, which would ask a node
    for an FCALL's keys (COMMAND GETKEYS) on every call: it reads the declared keys."""
    store = cluster_memory(small_cluster.url)
    try:
        store.create_session("s1")
        assert store.increment("s1", "n") == 1
        key = store.backend.layout.keys("s1")[0]
        source = _session_port(store, small_cluster, "s1")
        target = next(port for _, port in small_cluster.primaries() if port != source)
        before = _getkeys_calls(small_cluster)
        small_cluster.migrate_slots([redis.cluster.key_slot(key.encode())], source, target)
        assert store.increment("s1", "n") == 2  # MOVED: sent again through the cluster client
        assert small_cluster.primary_for_key(key)[1] == target
        assert store.get("s1", "n") == 2
        assert _getkeys_calls(small_cluster) == before
    finally:
        store.close()
