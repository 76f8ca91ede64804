"""The Redis Cluster and Sentinel topologies of ``tests.redis_topologies`` behave like the real
thing: the backends' topology tests rely on it."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis
from redis.crc import key_slot
from redis.exceptions import MovedError

from tests.redis_topologies import HOST, TIMEOUT, SentinelServers, poll


def test_cluster_has_three_masters_with_a_replica_each(redis_cluster: Any) -> None:
    redis_cluster.heal()
    for port in redis_cluster.ports:
        with redis_cluster.node(port) as node:
            assert node.execute_command("CLUSTER INFO")["cluster_state"] == "ok"
    nodes = redis_cluster.nodes()
    masters = {node["node_id"]: node for node in nodes.values() if "master" in node["flags"]}
    replicas = [node for node in nodes.values() if "slave" in node["flags"]]
    assert len(masters) == 3
    assert sorted(node["master_id"] for node in replicas) == sorted(masters)
    # A range of one slot (one moved by another test) is listed as that slot alone.
    ranges = [(int(r[0]), int(r[-1])) for node in masters.values() for r in node["slots"]]
    assert sum(end - start + 1 for start, end in ranges) == 16384


def test_a_key_lives_on_the_primary_of_its_slot(redis_cluster_client: Any, redis_cluster: Any) -> None:
    redis_cluster_client.set("greeting", "hello")
    assert redis_cluster_client.get("greeting") == b"hello"
    _host, port = redis_cluster.primary_for_key("greeting")
    for _host, other in redis_cluster.primaries():
        with redis_cluster.node(other) as node:
            assert node.dbsize() == (1 if other == port else 0)


def test_a_killed_primary_is_replaced_by_its_replica(redis_cluster_client: Any, redis_cluster: Any) -> None:
    redis_cluster_client.set("survivor", "still here")
    _host, port = redis_cluster.primary_for_key("survivor")
    with redis_cluster.node(port) as node:
        assert node.wait(1, 10_000) == 1  # on the replica before the crash
    my_id = redis_cluster.node_id(port)
    (replica,) = [address for address, node in redis_cluster.nodes().items() if node["master_id"] == my_id]
    try:
        new = redis_cluster.failover_kill_primary(port)
        assert f"{new[0]}:{new[1]}" == replica
        # The client still maps the slot to the dead node: it finds the new one.
        assert redis_cluster_client.get("survivor") == b"still here"
        assert redis_cluster_client.set("after", "failover")
    finally:
        redis_cluster.heal()
    with redis_cluster.node(port) as node:
        role = node.execute_command("ROLE")
    assert role[0] == "slave" and role[2] == new[1]


def test_resharding_under_writes_moves_every_key(redis_cluster_client: Any, redis_cluster: Any) -> None:
    slot = key_slot(b"{reshard}")
    _host, source = redis_cluster.primary_for_slot(slot)
    target = next(port for _host, port in redis_cluster.primaries() if port != source)
    preloaded = {f"{{reshard}}:{n}": str(n) for n in range(500)}
    redis_cluster_client.mset_nonatomic(preloaded)
    assert redis_cluster_client.get_node_from_key("{reshard}").port == source

    written: list[str] = []
    errors: list[Exception] = []
    stop = threading.Event()

    def write() -> None:
        client = redis.cluster.RedisCluster.from_url(redis_cluster.url)
        try:
            while not stop.is_set():
                key = f"{{reshard}}:w{len(written)}"
                client.set(key, key)
                client.incr("{reshard}:counter")
                written.append(key)
        except Exception as exc:  # reported by the assertion below
            errors.append(exc)
        finally:
            client.close()

    writer = threading.Thread(target=write)
    writer.start()
    try:
        poll(lambda: len(written) >= 50 or errors, "the writer to get going")
        moved = redis_cluster.migrate_slots([slot], source, target)
        after = len(written)
        poll(lambda: len(written) >= after + 50 or errors, "the writer to write after the move")
    finally:
        stop.set()
        writer.join(TIMEOUT)
    assert errors == []
    assert moved >= len(preloaded)

    with redis_cluster.node(source) as node:
        assert node.execute_command("CLUSTER COUNTKEYSINSLOT", slot) == 0
        with pytest.raises(MovedError, match=f"^{slot} {HOST}:{target}$"):
            node.get("{reshard}:0")
    with redis_cluster.node(target) as node:
        assert node.execute_command("CLUSTER COUNTKEYSINSLOT", slot) == len(preloaded) + len(written) + 1
    # This client still maps the slot to the source: it follows MOVED and learns the new owner.
    keys = [*preloaded, *written]
    assert redis_cluster_client.mget_nonatomic(keys) == [v.encode() for v in (*preloaded.values(), *written)]
    assert redis_cluster_client.get_node_from_key("{reshard}").port == target
    assert int(redis_cluster_client.get("{reshard}:counter")) == len(written)


def _fail_over(servers: SentinelServers) -> None:
    """A client of ``master_for`` keeps working through a failover of ``servers``."""
    sentinel = servers.sentinel(socket_timeout=10)
    old = servers.master_address()
    assert old == (HOST, servers.primary_port)
    assert sentinel.discover_master(servers.service) == old
    replica = servers.replica_port
    master = sentinel.master_for(servers.service, decode_responses=True)
    master.set("before", "failover")
    assert master.wait(1, 10_000) == 1  # on the replica before the crash
    try:
        assert servers.kill_primary() == old
        new = servers.wait_failover(old)
        assert new == (HOST, replica)
        assert master.get("before") == "failover"
        master.set("after", "failover")
        with servers.data_client(replica) as promoted:
            assert promoted.get("after") == "failover"
    finally:
        servers.heal()
    with servers.data_client(old[1]) as former:
        assert former.execute_command("ROLE")[0] == "slave"
    master.close()


def test_sentinel_fails_over_and_master_for_follows(redis_sentinel: SentinelServers) -> None:
    redis_sentinel.flush()
    _fail_over(redis_sentinel)


def test_password_protected_sentinel_fails_over() -> None:
    servers = SentinelServers(password="pm-data-pw", sentinel_password="pm-sentinel-pw")
    try:
        servers.start()
        for port in (servers.primary_port, servers.sentinel_ports[0]):
            with pytest.raises(redis.AuthenticationError), redis.Redis(host=HOST, port=port) as anonymous:
                anonymous.ping()
        _fail_over(servers)
    finally:
        servers.stop()
