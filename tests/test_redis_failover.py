"""A primary failing over under load, on a real Redis Cluster and Sentinel, without
restarting the app: the same store object goes on through the failover, writes succeed
again after it, and with REDIS_WAIT_REPLICAS 1 no acknowledged write is lost.

Writers (``tests.test_cluster_concurrency.Writers``) put a new key per step under an
idempotency key and retry it after BackendUnavailable, the documented answer to a write
whose outcome is unknown. A write is acknowledged when the store answered it; after the
nodes are healed, each acknowledged key is read back. Figures are printed as
``FAILOVER <topology> wait=<n> acked=<n> lost=<n> errors=<n>`` (``pytest -s``).

With REDIS_WAIT_REPLICAS 0 a write is acknowledged once the primary has applied it, so
the writes the dead primary had not yet sent to its replica are lost: that count is
reported, not asserted (it is often 0 on one machine). With 1, each write is
acknowledged only once the replica has it, so none may be lost; while a primary has no
replica, writes answer ReplicasBehind (a BackendUnavailable), applied on the primary, and
their retry under the same idempotency key applies nothing twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
import redis
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from persistent_memory import get_store
from persistent_memory.backends.redis.layout import Layout
from persistent_memory.exceptions import BackendUnavailable, ReplicasBehind
from persistent_memory.idempotency import HEADER, Idempotency
from persistent_memory.owners import storage_id
from tests.redis_topologies import HOST, TIMEOUT, poll, stop_process
from tests.test_api import API, OWNER, USER_PK, error_of
from tests.test_cluster_concurrency import Writers, sessions_by_primary, store_for, topology_conf

T = TypeVar("T")
TOPOLOGIES = ["redis-cluster", "redis-sentinel"]
#: Milliseconds a write waits for its replica when one is asked for: short, since the
#: tests below make it wait in vain on purpose. A write expected to succeed is sent with
#: an idempotency key through :func:`acknowledged`, so that a replica slower than this on
#: a loaded machine costs a retry, not the test.
WAIT_TIMEOUT_MS = 200


def acknowledged(call: Callable[..., T], *args: Any, **options: Any) -> T:
    """``call(*args, **options)`` again after BackendUnavailable until it is answered (for
    at most TIMEOUT seconds); the caller passes an idempotency key, so it applies once."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        try:
            return call(*args, **options)
        except BackendUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@pytest.fixture
def healed(request: pytest.FixtureRequest):
    """Heal both topologies after the test, whatever it killed (later tests need them whole)."""
    yield
    if "redis_cluster" in request.fixturenames:
        request.getfixturevalue("redis_cluster").heal()  # its replicas in sync again
    if "redis_sentinel" in request.fixturenames:
        sentinel = request.getfixturevalue("redis_sentinel")
        sentinel.heal()
        # heal() waits for the sentinels to see the replica, not for its first sync: until
        # that is done, a failover the next test did not ask for would promote an empty node.
        with sentinel.data_client(sentinel.master_address()[1]) as master:
            poll(lambda: replicated(master), "the replica's first sync")


def replicated(client: redis.Redis) -> bool:
    """Whether the primary ``client`` talks to has a replica, and every replica is online (past
    its first sync, which ``connected_slaves`` already counts) with all the primary wrote."""
    info = client.info("replication")
    replicas = [info[f"slave{i}"] for i in range(info["connected_slaves"])]
    return bool(replicas) and all(
        r["state"] == "online" and r["offset"] == info["master_repl_offset"] for r in replicas
    )


class Primary:
    """The primary that serves a test's sessions, on either topology: its port, a client on
    it, killing it (and waiting for the failover) and killing its replica."""

    def __init__(self, name: str, request: pytest.FixtureRequest, storage_ids: list[str]) -> None:
        self.name = name
        if name == "redis-cluster":
            self.servers = request.getfixturevalue("redis_cluster")
            layout = Layout(get_store().backend.key_prefix, cluster=True)
            (self.port,) = {self.servers.primary_for_key(layout.root_of(sid))[1] for sid in storage_ids}
        else:
            self.servers = request.getfixturevalue("redis_sentinel")
            self.port = self.servers.master_address()[1]

    def client(self) -> redis.Redis:
        if self.name == "redis-cluster":
            return self.servers.node(self.port)
        return self.servers.data_client(self.port)

    def wait_replicated(self) -> None:
        with self.client() as client:
            poll(lambda: replicated(client), f"the replica of {self.port} to catch up")

    def epoch(self) -> int:
        """The failover count so far: the epoch a failover raises (Sentinel's config epoch of
        the service, the cluster's current epoch)."""
        if self.name == "redis-cluster":
            with self.servers.node(self.servers.alive()[0]) as node:
                return int(node.execute_command("CLUSTER INFO")["cluster_current_epoch"])
        with self.servers.sentinel_client(self.servers.sentinel_ports[0]) as sentinel:
            return int(sentinel.sentinel_master(self.servers.service)["config-epoch"])

    def fail_over(self) -> int:
        """Kill the primary, wait until its replica has taken over; the new primary's port."""
        if self.name == "redis-cluster":
            return self.servers.failover_kill_primary(self.port)[1]
        return self.servers.wait_failover(self.servers.kill_primary())[1]

    def replica(self) -> subprocess.Popen[bytes]:
        """The process of the primary's replica."""
        if self.name == "redis-sentinel":
            return self.servers.processes[self.servers.replica_port]
        # The primary's own word (ROLE): another node's CLUSTER NODES can still show the
        # replicas as they were before a failover (gossip), though the cluster is ok.
        with self.client() as client:
            replicas = poll(lambda: client.execute_command("ROLE")[2], f"a replica of {self.port}")
        (port,) = {int(replica[1]) for replica in replicas}
        return self.servers.processes[port]


def session_ids_for(name: str, request: pytest.FixtureRequest) -> list[str]:
    """Three sessions on one primary (on a cluster, each in a bucket of its own)."""
    if name == "redis-sentinel":
        return ["f0", "f1", "f2"]
    layout = Layout(get_store().backend.key_prefix, cluster=True)
    cluster = request.getfixturevalue("redis_cluster")
    return sorted(sessions_by_primary(cluster, layout, 3).items())[0][1]


@pytest.mark.parametrize("wait", [0, 1])
@pytest.mark.parametrize("name", TOPOLOGIES)
def test_writes_go_on_through_a_failover(name, wait, settings, request, healed, capsys):
    topology_conf(name, settings, request, REDIS_WAIT_REPLICAS=wait, REDIS_WAIT_TIMEOUT_MS=WAIT_TIMEOUT_MS)
    store = get_store()
    session_ids = session_ids_for(name, request)
    primary = Primary(name, request, session_ids)
    primary.wait_replicated()
    for sid in session_ids:
        acknowledged(store.create_session, sid, idempotency=Idempotency.of(f"create-{sid}"))
    primary.wait_replicated()  # the sessions themselves are not at stake
    epoch = primary.epoch()
    with Writers(store, session_ids) as writers:
        writers.wait_for(20)
        new_port = primary.fail_over()
        if not wait:  # a lone new primary serves writes that wait for no replica
            writers.wait_for(20)
        primary.servers.heal()  # the old primary back, as the new one's replica
        writers.wait_for(20)
    if primary.epoch() > epoch + 1:
        # A stall of the machine longer than the fixtures' failure detection (1 s) made the
        # servers fail over again, possibly to a replica still in its first sync: the figures
        # would measure that, not the failover under test.
        pytest.skip(f"{primary.epoch() - epoch} failovers instead of 1 (the machine stalled)")
    assert not writers.failures, writers.failures
    assert store is get_store()
    assert new_port != primary.port
    acked = lost = 0
    for sid in session_ids:
        stored = store.get_all(sid)
        acked += len(writers.acked[sid])
        lost += sum(stored.get(f"k{step}") != step for step in writers.acked[sid])
        if wait:
            assert stored["counter"] == len(writers.counted[sid])
            assert sorted(writers.counted[sid]) == list(range(1, len(writers.counted[sid]) + 1))
    errors = sum(writers.retries.values())
    with capsys.disabled():
        print(
            f"\nFAILOVER {name.removeprefix('redis-')} wait={wait} acked={acked} lost={lost} "
            f"errors={errors} ({dict(writers.retries)})"
        )
    if wait:
        assert lost == 0
    assert errors > 0  # the writers did meet the failover


@pytest.fixture
def api_client(db: Any) -> APIClient:
    """DRF's client, authenticated as tests.test_api's user (whose sessions are OWNER's)."""
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_user("failover", password="pw-for-tests", pk=USER_PK)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


@pytest.mark.parametrize("name", TOPOLOGIES)
def test_a_write_without_its_replica_is_applied_and_answers_replicas_behind(
    name, settings, request, healed, api_client
):
    """REDIS_WAIT_REPLICAS 1 with the replica down: the write is applied on the primary and
    answers ReplicasBehind (a BackendUnavailable; the API: 503 replicas_behind) after the timeout; its retry
    under the same idempotency key applies nothing again, and once the replica is back it
    is answered as the first time."""
    topology_conf(name, settings, request, REDIS_WAIT_REPLICAS=1, REDIS_WAIT_TIMEOUT_MS=WAIT_TIMEOUT_MS)
    store = get_store().for_owner(OWNER)
    sid = "w1"
    primary = Primary(name, request, [storage_id(OWNER, sid)])
    primary.wait_replicated()
    acknowledged(store.create_session, sid, idempotency=Idempotency.of("create-w1"))
    stop_process(primary.replica(), signal.SIGKILL)
    once = Idempotency.of("count-1")
    for _attempt in range(2):
        with pytest.raises(ReplicasBehind, match="0 of 1 replicas"):
            store.increment(sid, "counter", idempotency=once)
        assert store.get(sid, "counter") == 1  # applied on the primary, once

    def put_city() -> Any:
        url = API + f"sessions/{sid}/memory/city/"
        return api_client.put(url, {"value": "Paris"}, format="json", headers={HEADER: "put-city"})

    for _attempt in range(2):
        response = put_city()
        assert error_of(response) == (503, "replicas_behind")
        assert response["Retry-After"]
        assert store.get(sid, "city") == "Paris"
    primary.servers.heal()
    primary.wait_replicated()
    assert acknowledged(store.increment, sid, "counter", idempotency=once) == 1
    poll(lambda: put_city().status_code == 200, "the PUT's retry to be acknowledged")
    assert store.get(sid, "counter") == 1
    assert [e["op"] for e in store.get_history(sid, 0)].count("increment") == 1


@pytest.mark.parametrize("name", TOPOLOGIES)
def test_a_retry_answered_from_its_record_still_waits_for_the_replica(name, settings, request, healed):
    """A retry that only replays the idempotency record (sent by another app process, on a
    connection of its own) is acknowledged only once the replica has the original write:
    with the replica stopped (connected, not acknowledging) it answers ReplicasBehind too."""
    conf = topology_conf(
        name, settings, request, REDIS_WAIT_REPLICAS=1, REDIS_WAIT_TIMEOUT_MS=WAIT_TIMEOUT_MS
    )
    store = get_store()
    primary = Primary(name, request, ["r1"])
    primary.wait_replicated()
    acknowledged(store.create_session, "r1", idempotency=Idempotency.of("create-r1"))
    replica = primary.replica()
    replica.send_signal(signal.SIGSTOP)
    try:
        once = Idempotency.of("count-1")
        with pytest.raises(ReplicasBehind):
            store.increment("r1", "counter", idempotency=once)
        other = store_for(conf)
        try:
            with pytest.raises(ReplicasBehind):
                other.increment("r1", "counter", idempotency=once)
            assert other.get("r1", "counter") == 1  # the retry was answered, not applied
        finally:
            other.close()
    finally:
        replica.send_signal(signal.SIGCONT)
    primary.servers.heal()
    primary.wait_replicated()
    assert acknowledged(store.increment, "r1", "counter", idempotency=once) == 1
    assert store.get("r1", "counter") == 1


def test_sentinel_errors_name_the_master_in_use(settings, request, healed, redis_sentinel):
    """After a failover the store's description, and so its BackendUnavailable messages,
    name the master the sentinels promoted (host:port), not only the service."""
    topology_conf("redis-sentinel", settings, request)
    store = get_store()
    store.create_session("s1")
    Primary("redis-sentinel", request, []).wait_replicated()  # s1 outlives the failover
    old = redis_sentinel.master_address()
    assert store.backend.describe() == f"redis-sentinel://{redis_sentinel.service}@{HOST}:{old[1]}/0"
    new = redis_sentinel.wait_failover(redis_sentinel.kill_primary())
    # The first write after the failover may meet a pooled connection to the dead master
    # (BackendUnavailable, the write not re-sent); the next one asks the sentinels.
    with contextlib.suppress(BackendUnavailable):
        store.put("s1", "k", 1)
    store.put("s1", "k", 1)
    assert store.backend.describe() == f"redis-sentinel://{redis_sentinel.service}@{HOST}:{new[1]}/0"
    # The new master has no replica (the old one is dead): make it refuse writes for that.
    with redis_sentinel.data_client(new[1]) as master:
        master.config_set("min-replicas-to-write", 1)
        try:
            with pytest.raises(BackendUnavailable) as refused:
                store.put("s1", "k", 2)
        finally:
            master.config_set("min-replicas-to-write", 0)
    message = str(refused.value)
    assert f"{HOST}:{new[1]}" in message and f":{old[1]}" not in message
    assert "NOREPLICAS" in message


@pytest.mark.parametrize("name", TOPOLOGIES)
def test_async_sessions_go_on_through_a_failover(name, settings, request, healed):
    """An Agents SDK session's async calls, awaited on the event loop (the bridge's own
    connections, not the store's), meet the failover as errors of the store and then reach
    the new primary, without a restart."""
    from persistent_memory.integrations.openai_agents import PersistentMemorySession

    topology_conf(name, settings, request)
    (session_id, *_) = session_ids_for(name, request)
    primary = Primary(name, request, [session_id])
    session = PersistentMemorySession(session_id)
    primary.wait_replicated()

    async def write(text: str) -> bool:
        try:
            await session.add_items([{"role": "user", "content": text}])
        except BackendUnavailable:
            return False
        return True

    async def main() -> tuple[int, list[str]]:
        assert all([await write(f"before {i}") for i in range(5)])
        failing_over = asyncio.ensure_future(asyncio.to_thread(primary.fail_over))
        errors = 0
        while not failing_over.done():  # the loop goes on while the primary dies
            errors += not await write("during")
            await asyncio.sleep(0.02)
        await failing_over
        deadline = time.monotonic() + TIMEOUT
        while not await write("after 0"):  # the first call on a dead connection may fail
            errors += 1
            assert time.monotonic() < deadline, "no write reached the new primary"
        assert all([await write(f"after {i}") for i in range(1, 6)])
        items = await session.get_items(limit=6)
        return errors, [item["content"] for item in items]

    errors, newest = asyncio.run(main())
    assert newest == [f"after {i}" for i in range(6)]
    assert errors > 0  # the calls did meet the failover
