"""REDIS_TOPOLOGY: the client for one server, Redis Cluster and Sentinel, its description,
and the system checks of the topology settings; against real redis-server processes."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.core.checks import run_checks
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import SlotNotCoveredError
from redis.retry import Retry

from persistent_memory.backends.redis.topology import build_client, cluster_pool, describe, parse_sentinels
from persistent_memory.conf import MemorySettings, redis_layout
from tests.conftest import _free_port

# INCR a key, then keep the server busy for ARGV[1] microseconds: the reply comes long
# after the client has given up waiting, but the increment has happened.
SLOW_INCR = """
local count = redis.call('INCR', KEYS[1])
local now = redis.call('TIME')
local stop = now[1] * 1000000 + now[2] + tonumber(ARGV[1])
repeat now = redis.call('TIME') until now[1] * 1000000 + now[2] >= stop
return count
"""


def check_ids(*, deploy: bool = False) -> list[str]:
    messages = run_checks(include_deployment_checks=deploy, databases=[])
    return sorted(m.id for m in messages if m.id.startswith("persistent_memory"))


def sentinel_settings(servers: Any, **extra: Any) -> dict[str, Any]:
    return {
        "BACKEND": "redis",
        "REDIS_TOPOLOGY": "sentinel",
        "REDIS_SENTINELS": servers.sentinels,
        "REDIS_SENTINEL_SERVICE": servers.service,
        "REDIS_SENTINEL_PASSWORD": getattr(servers, "sentinel_password", None),
        "REDIS_PASSWORD": servers.password,
        "REDIS_SOCKET_TIMEOUT": 10.0,
        **extra,
    }


@pytest.fixture
def closed_address() -> str:
    """A loopback "host:port" where nothing listens."""
    return f"127.0.0.1:{_free_port()}"


class TestSettings:
    def test_layout_follows_the_topology_unless_set(self):
        assert redis_layout(MemorySettings({})) == "node"
        assert redis_layout(MemorySettings({"REDIS_TOPOLOGY": "sentinel"})) == "node"
        assert redis_layout(MemorySettings({"REDIS_TOPOLOGY": "cluster"})) == "cluster"
        assert redis_layout(MemorySettings({"REDIS_LAYOUT": "cluster"})) == "cluster"

    def test_parse_sentinels(self):
        assert parse_sentinels(["a:1", "[::1]:26379"]) == [("a", 1), ("::1", 26379)]
        for bad in (["a"], ["a:"], [":1"], ["a:b"], ["a:70000"], [("a", 1)], "a:1"):
            with pytest.raises(ValueError):
                parse_sentinels(bad)


REDIS = {"BACKEND": "redis", "REDIS_URL": "redis://127.0.0.1:7000/0"}
CLUSTER = {**REDIS, "REDIS_TOPOLOGY": "cluster"}
SENTINEL = {"BACKEND": "redis", "REDIS_TOPOLOGY": "sentinel", "REDIS_SENTINELS": ["127.0.0.1:26379"]}


class TestChecks:
    @pytest.mark.parametrize(
        ("conf", "code"),
        [
            ({**REDIS, "REDIS_TOPOLOGY": "ring"}, "E015"),
            ({**REDIS, "REDIS_TOPOLOGY": None}, "E015"),
            ({**REDIS, "REDIS_LAYOUT": "flat"}, "E015"),
            ({**CLUSTER, "REDIS_LAYOUT": "node"}, "E015"),
            ({**CLUSTER, "REDIS_URL": "redis://127.0.0.1:7000/2"}, "E015"),
            ({**CLUSTER, "REDIS_URL": "redis://127.0.0.1:7000?db=1"}, "E015"),
            ({"BACKEND": "redis", "REDIS_TOPOLOGY": "cluster", "REDIS_HOST": "h", "REDIS_DB": 3}, "E015"),
            ({"BACKEND": "redis", "REDIS_TOPOLOGY": "cluster"}, "E003"),
            ({**SENTINEL, "REDIS_SENTINELS": []}, "E016"),
            ({**SENTINEL, "REDIS_SENTINELS": ["localhost"]}, "E016"),
            ({**SENTINEL, "REDIS_SENTINELS": ["localhost:port"]}, "E016"),
            ({**SENTINEL, "REDIS_SENTINELS": "localhost:26379"}, "E016"),
            ({**SENTINEL, "REDIS_SENTINEL_SERVICE": ""}, "E016"),
            ({**REDIS, "REDIS_WAIT_REPLICAS": -1}, "E017"),
            ({**REDIS, "REDIS_WAIT_REPLICAS": "1"}, "E017"),
            ({**REDIS, "REDIS_WAIT_REPLICAS": 1.5}, "E017"),
            ({**REDIS, "REDIS_WAIT_REPLICAS": True}, "E017"),
            ({**REDIS, "REDIS_WAIT_TIMEOUT_MS": 0}, "E017"),
            ({**REDIS, "REDIS_WAIT_TIMEOUT_MS": -5}, "E017"),
        ],
    )
    def test_each_error(self, settings, conf, code):
        settings.PERSISTENT_MEMORY = conf
        assert check_ids() == [f"persistent_memory.{code}"]

    @pytest.mark.parametrize(
        "conf",
        [
            REDIS,
            {**REDIS, "REDIS_LAYOUT": "cluster", "REDIS_WAIT_REPLICAS": 1, "REDIS_WAIT_TIMEOUT_MS": 500},
            CLUSTER,
            {**CLUSTER, "REDIS_URL": "rediss://:pw@127.0.0.1:7000", "REDIS_LAYOUT": "cluster"},
            {"BACKEND": "redis", "REDIS_TOPOLOGY": "cluster", "REDIS_HOST": "h"},
            SENTINEL,  # no REDIS_URL or REDIS_HOST needed: the sentinels name the master
            {**SENTINEL, "REDIS_URL": "redis://:pw@ignored/3", "REDIS_SENTINELS": ["a:1", "b:2"]},
            # The topology settings are the Redis backend's only.
            {"BACKEND": "memory", "REDIS_TOPOLOGY": "ring", "REDIS_WAIT_REPLICAS": -1, "REDIS_LAYOUT": "x"},
        ],
    )
    def test_good_configurations(self, settings, conf):
        settings.PERSISTENT_MEMORY = conf
        assert check_ids() == []

    def test_unreachable_sentinels_warn_on_deploy(self, settings, closed_address):
        settings.PERSISTENT_MEMORY = {
            **SENTINEL,
            "REDIS_SENTINELS": [closed_address],
            "REDIS_SOCKET_TIMEOUT": 2,
        }
        assert check_ids() == []  # `check` stays offline
        assert "persistent_memory.W007" in check_ids(deploy=True)

    def test_one_answering_sentinel_is_enough(self, settings, redis_sentinel, closed_address):
        conf = sentinel_settings(redis_sentinel)
        settings.PERSISTENT_MEMORY = {**conf, "REDIS_SENTINELS": [closed_address, *redis_sentinel.sentinels]}
        assert "persistent_memory.W007" not in check_ids(deploy=True)


class TestSingle:
    def test_client_and_description(self, redis_url, redis_client):
        client = build_client(MemorySettings({"BACKEND": "redis", "REDIS_URL": redis_url}))
        try:
            assert type(client) is redis.Redis
            assert client.connection_pool.connection_kwargs["retry"].get_retries() == 0
            assert client.incr("pm:topology") == 1
            assert describe(client) == redis_url
        finally:
            client.close()

    def test_host_and_unix_socket(self):
        conf = MemorySettings(
            {"BACKEND": "redis", "REDIS_HOST": "10.0.0.9", "REDIS_PORT": 6390, "REDIS_DB": 3}
        )
        assert describe(build_client(conf)) == "redis://10.0.0.9:6390/3"
        conf = MemorySettings({"BACKEND": "redis", "REDIS_URL": "unix://:pw@/run/redis.sock?db=2"})
        assert describe(build_client(conf)) == "redis+unix:///run/redis.sock"

    def test_cache_alias_takes_precedence(self, settings, redis_url, redis_client):
        settings.CACHES = {
            **settings.CACHES,
            "pm": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": redis_url},
        }
        conf = MemorySettings({"BACKEND": "redis", "REDIS_CACHE_ALIAS": "pm", "REDIS_TOPOLOGY": "cluster"})
        client = build_client(conf)
        assert type(client) is redis.Redis
        assert describe(client) == redis_url


@pytest.fixture
def cluster(redis_cluster: Any) -> Iterator[Any]:
    """The session's cluster, emptied, and healed afterwards (a test may kill a node)."""
    redis_cluster.flush()
    yield redis_cluster
    redis_cluster.heal()


def cluster_client(servers: Any, **extra: Any) -> RedisCluster:
    conf = {"BACKEND": "redis", "REDIS_TOPOLOGY": "cluster", "REDIS_URL": servers.url, **extra}
    client = build_client(MemorySettings(conf))
    assert isinstance(client, RedisCluster)
    return client


def addresses(pairs: list[tuple[str, int]]) -> str:
    return ",".join(f"{host}:{port}" for host, port in sorted(pairs))


class TestCluster:
    def test_client_and_description(self, cluster):
        client = cluster_client(cluster)
        try:
            for number in range(20):  # keys on every primary
                client.set(f"pm:{number}", number)
            assert [int(client.get(f"pm:{number}")) for number in range(20)] == list(range(20))
            assert describe(client) == f"redis-cluster://{addresses(cluster.primaries())}"
        finally:
            client.close()

    def test_moved_is_followed(self, cluster):
        client = cluster_client(cluster)
        try:
            client.set("pm:moved", "here")
            slot = client.keyslot("pm:moved")
            _host, source = cluster.primary_for_key("pm:moved")
            target = next(port for _host, port in cluster.primaries() if port != source)
            cluster.migrate_slots([slot], source, target)
            # The client's slot map still names the source, which answers MOVED.
            assert client.nodes_manager.get_node_from_slot(slot).port == source
            assert client.get("pm:moved") == b"here"
            assert client.nodes_manager.get_node_from_slot(slot).port == target
        finally:
            client.close()

    def test_a_keys_pool_is_its_slots_primarys_as_the_map_says_now(self, cluster):
        """cluster_pool answers what the client's own lookup does (keys on every primary,
        hash tags, non-ASCII), and follows the slot map as it changes: its cache is of
        slots only."""
        client = cluster_client(cluster)
        slot = None
        try:
            keys = [f"pm:{n}" for n in range(40)] + [f"pm:{{t{n}}}:meta" for n in range(40)] + ["pm:{é}:x"]
            for key in keys * 2:  # computed, then cached
                node = client.get_node_from_key(key)
                assert cluster_pool(client, key) is client.get_redis_connection(node).connection_pool
            key = "pm:pool"
            slot = client.keyslot(key)
            _host, source = cluster.primary_for_key(key)
            target = next(port for _host, port in cluster.primaries() if port != source)
            assert cluster_pool(client, key).connection_kwargs["port"] == source
            cluster.migrate_slots([slot], source, target)
            client.set(key, 1)  # MOVED: the client patches its map
            assert cluster_pool(client, key).connection_kwargs["port"] == target
            client.nodes_manager.slots_cache.pop(slot)
            with pytest.raises(SlotNotCoveredError):
                cluster_pool(client, key)
        finally:
            client.close()
            if slot is not None and cluster.primary_for_key(key)[1] != source:
                # The cluster is shared by the session's tests: its slots as they were.
                cluster.migrate_slots([slot], target, source)

    def test_a_timed_out_command_is_not_sent_again(self, cluster, monkeypatch):
        """The script ran but its reply came after the socket timeout: the caller gets the
        TimeoutError, and the script was sent, and ran, once. The control, a client with
        retries, sends it again once the node answers, and it runs twice or more."""
        sent: list[Any] = []
        send_command = redis.connection.AbstractConnection.send_command

        def counting(self: Any, *args: Any, **kwargs: Any) -> None:
            if str(args[0]).upper() == "EVALSHA":
                sent.append(args)
            send_command(self, *args, **kwargs)

        monkeypatch.setattr(redis.connection.AbstractConnection, "send_command", counting)
        _host, port = cluster.primary_for_key("pm:slow")
        nodes = [cluster.node(node_port) for node_port in cluster.alive()]
        timeout_ms = nodes[0].config_get("cluster-node-timeout")["cluster-node-timeout"]
        # The busy node must not be taken for dead meanwhile (and failed over).
        for node in nodes:
            node.config_set("cluster-node-timeout", 60_000)
        checker = cluster.node(port)
        ours = cluster_client(cluster, REDIS_SOCKET_TIMEOUT=0.25)
        # Each retry of the control reconnects; the handshake times out while the node is
        # busy, so enough of them for one to come after the script, however slow the machine.
        control = RedisCluster.from_url(cluster.url, socket_timeout=0.25, retry=Retry(NoBackoff(), 20))
        spin_us = 1_500_000  # six socket timeouts

        def run(client: RedisCluster) -> None:
            script = client.register_script(SLOW_INCR)
            script(keys=["pm:slow"], args=[0])  # loaded on the node now
            checker.delete("pm:slow")
            sent.clear()
            with pytest.raises(redis.TimeoutError):
                script(keys=["pm:slow"], args=[spin_us])

        def count() -> int:
            return int(checker.get("pm:slow") or 0)  # waits until the node is done with a script

        try:
            run(ours)
            assert len(sent) == 1
            poll_until(lambda: count() == 1)  # it did run: the reply was lost, not the command
            run(control)
            assert len(sent) >= 2
            poll_until(lambda: count() >= 2)
        finally:
            for client in (ours, control):
                client.close()
            for node in nodes:
                node.config_set("cluster-node-timeout", timeout_ms)
                node.close()
            checker.close()

    def test_failover_is_followed(self, cluster):
        client = cluster_client(cluster)
        try:
            client.set("pm:failover", 1)
            _host, port = cluster.primary_for_key("pm:failover")
            _host, new = cluster.failover_kill_primary(port)
            assert new != port
            try:
                client.incr("pm:failover")
            except redis.ConnectionError:
                client.incr("pm:failover")  # the slot map is fresh now: at most one error
            assert client.nodes_manager.get_node_from_slot(client.keyslot("pm:failover")).port == new
            assert describe(client) == f"redis-cluster://{addresses(cluster.primaries())}"
            assert f"127.0.0.1:{port}" not in describe(client)
        finally:
            client.close()


def poll_until(condition: Any, seconds: float = 60.0) -> None:
    from tests.redis_topologies import poll

    poll(condition, "the condition", seconds)


@pytest.fixture
def sentinel(redis_sentinel: Any) -> Iterator[Any]:
    """The session's sentinels, whole before and healed afterwards (a test may kill the primary)."""
    redis_sentinel.heal()
    yield redis_sentinel
    redis_sentinel.heal()


@pytest.fixture(scope="module")
def password_sentinel() -> Iterator[Any]:
    """Sentinels that require a password, over a primary and replica that require another."""
    from tests.redis_topologies import SentinelServers

    servers = SentinelServers(password="pm-secret", sentinel_password="pm-sentinels")
    try:
        servers.start()
        yield servers
    finally:
        servers.stop()


class TestSentinel:
    def test_client_and_description(self, sentinel):
        client = build_client(MemorySettings(sentinel_settings(sentinel)))
        try:
            assert client.incr("pm:sentinel") >= 1
            host, port = sentinel.master_address()
            assert port == sentinel.primary_port
            assert describe(client) == f"redis-sentinel://{sentinel.service}@{host}:{port}/0"
            assert client.connection_pool.connection_kwargs["retry"].get_retries() == 0
        finally:
            client.close()

    def test_the_url_gives_credentials_and_database(self, sentinel):
        password = f":{sentinel.password}@" if sentinel.password else ""
        conf = sentinel_settings(sentinel, REDIS_PASSWORD=None, REDIS_URL=f"redis://{password}elsewhere:1/3")
        client = build_client(MemorySettings(conf))
        direct = redis.Redis(port=sentinel.primary_port, password=sentinel.password, db=3)
        try:
            client.set("pm:db3", "yes")
            assert direct.get("pm:db3") == b"yes"
            assert describe(client).endswith(f":{sentinel.primary_port}/3")
        finally:
            client.close()
            direct.close()

    def test_failover_is_followed(self, sentinel):
        client = build_client(MemorySettings(sentinel_settings(sentinel)))
        try:
            client.set("pm:before", 1)
            old = sentinel.kill_primary()
            new = sentinel.wait_failover(old)
            try:
                client.incr("pm:after")
            except redis.ConnectionError:
                client.incr("pm:after")  # a new connection asks the sentinels: at most one error
            assert describe(client) == f"redis-sentinel://{sentinel.service}@{new[0]}:{new[1]}/0"
            with redis.Redis(port=new[1], password=sentinel.password) as direct:
                assert direct.exists("pm:after") == 1
        finally:
            client.close()

    def test_passwords(self, password_sentinel):
        servers = password_sentinel
        conf = sentinel_settings(
            servers, REDIS_URL=f"redis://:{servers.password}@ignored/0", REDIS_PASSWORD=None
        )
        client = build_client(MemorySettings(conf))
        try:
            assert client.incr("pm:password") == 1
            assert servers.password not in describe(client)
            assert describe(client).endswith(f":{servers.primary_port}/0")
        finally:
            client.close()
        client = build_client(MemorySettings({**conf, "REDIS_URL": None, "REDIS_PASSWORD": "wrong"}))
        with pytest.raises(redis.AuthenticationError):
            client.ping()
        client = build_client(MemorySettings({**conf, "REDIS_SENTINEL_PASSWORD": "wrong"}))
        assert describe(client) == f"redis-sentinel://{servers.service} (master unknown)"

    def test_sentinel_password_in_the_deploy_check(self, settings, password_sentinel):
        settings.PERSISTENT_MEMORY = sentinel_settings(password_sentinel)
        assert "persistent_memory.W007" not in check_ids(deploy=True)
        settings.PERSISTENT_MEMORY = sentinel_settings(password_sentinel, REDIS_SENTINEL_PASSWORD="wrong")
        assert "persistent_memory.W007" in check_ids(deploy=True)

    def test_description_without_sentinels(self, closed_address):
        conf = {**SENTINEL, "REDIS_SENTINELS": [closed_address], "REDIS_SOCKET_TIMEOUT": 2}
        client = build_client(MemorySettings(conf))
        assert describe(client) == "redis-sentinel://mymaster (master unknown)"
        with pytest.raises(redis.ConnectionError):
            client.ping()
