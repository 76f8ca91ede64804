"""REDIS_WAIT_REPLICAS and a failover on a real 3+3 Redis Cluster, in a process whose slot
map predates the failover; and a write whose primary has fewer replicas than WAIT asks for.

A demoted primary answers the script with MOVED and then refuses its WAIT ("WAIT cannot
be used with replica instances"): the MOVED must still be followed, the slot map patched
and the write sent to the new primary with a WAIT of its own. Each scenario runs with WAIT
0 and 1, by ``CLUSTER FAILOVER`` on the replica and by ``kill -9`` of the primary (then
restarted: it rejoins as the new primary's replica, without which WAIT 1 could never be
met). A writer goes on through it on the same store object (or API client), and a second
store, or the API's, that did nothing during the failover writes after it. Every write the
store or the API acknowledged is read back from the new primaries. Figures are printed as
``WAITFAILOVER <via> <how> wait=<n> acked=<n> lost=<n> errors=<n> error_s=<s> ...``
(``pytest -s``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from redis.crc import key_slot

from persistent_memory import get_store
from persistent_memory.backends.redis.layout import Layout
from persistent_memory.exceptions import BackendUnavailable, ReplicasBehind
from persistent_memory.idempotency import HEADER, Idempotency
from persistent_memory.owners import storage_id
from persistent_memory.store import MemoryStore
from tests.redis_topologies import TIMEOUT, poll, stop_process
from tests.servers import Server, demo_env, prepare_database, serve
from tests.test_api import API, OWNER, error_of
from tests.test_cluster_concurrency import store_for, topology_conf
from tests.test_redis_failover import Primary, acknowledged, api_client, healed  # noqa: F401 - fixtures

pytestmark = pytest.mark.usefixtures("healed")

#: Long on purpose: a write that waited it out would show. The socket timeout is longer
#: still, so that a read never times out first.
TIMEOUT_MS = 10_000
WAITING = {"REDIS_WAIT_TIMEOUT_MS": TIMEOUT_MS, "REDIS_SOCKET_TIMEOUT": 2 * TIMEOUT_MS / 1000}
HOWS = ["cluster-failover", "kill"]


class _Failed(Exception):
    """A write the API did not acknowledge (its status and code)."""


@dataclass
class Run:
    """What a writer saw: the steps acknowledged, and when each attempt failed or succeeded."""

    acked: list[tuple[str, int]] = field(default_factory=list)
    errors: list[tuple[float, str]] = field(default_factory=list)
    successes: list[float] = field(default_factory=list)

    def error_seconds(self) -> float:
        """From the first failed attempt to the first success after the last one (0: none failed)."""
        if not self.errors:
            return 0.0
        last = self.errors[-1][0]
        after = [t for t in self.successes if t > last]
        return (after[0] if after else float("inf")) - self.errors[0][0]

    def first_success_after(self, moment: float) -> float:
        """Seconds from ``moment`` to the first success at or after it (inf: none)."""
        after = [t for t in self.successes if t >= moment]
        return after[0] - moment if after else float("inf")


class Writer:
    """A thread writing a new key per step (``write(session_id, step)``, which raises on an
    error), each step retried under its own idempotency key until acknowledged, round robin
    over ``session_ids``, until stopped."""

    def __init__(self, write: Callable[[str, int], None], session_ids: list[str]) -> None:
        self.write = write
        self.session_ids = session_ids
        self.run = Run()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        for step, sid in zip(itertools.count(), itertools.cycle(self.session_ids)):
            while True:
                if self.stop.is_set():
                    return
                try:
                    self.write(sid, step)
                except (BackendUnavailable, _Failed) as exc:
                    self.run.errors.append((time.monotonic(), getattr(exc, "code", str(exc))))
                    time.sleep(0.02)  # not a hot loop against a node that refuses
                    continue
                self.run.successes.append(time.monotonic())
                self.run.acked.append((sid, step))
                break

    def successes_after(self, moment: float, count: int) -> None:
        """Wait (for at most TIMEOUT seconds) until ``count`` writes succeeded after ``moment``."""
        poll(lambda: sum(t >= moment for t in self.run.successes) >= count, f"{count} writes acknowledged")

    def __enter__(self) -> Writer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(TIMEOUT)


def fail_over(primary: Primary, how: str) -> float:
    """Fail ``primary`` over (``primary.slot``: one of its slots), ``how``: CLUSTER FAILOVER on its
    replica, or kill -9 and a restart of the killed node, which rejoins as the new primary's
    replica; then wait until the cluster is whole and the new primary's replica online.
    The moment the new primary was seen serving the slot (its replica not back yet)."""
    cluster, slot = primary.servers, primary.slot
    if how == "kill":
        cluster.failover_kill_primary(primary.port)
        promoted = time.monotonic()
        cluster.restart(primary.port)
    else:
        replica = primary.replica()
        port = next(port for port, process in cluster.processes.items() if process is replica)
        cluster.manual_failover(port)
        poll(lambda: cluster.primary_for_slot(slot)[1] == port, "the replica to take over")
        promoted = time.monotonic()
        cluster.wait_ok()
    new_port = cluster.primary_for_slot(slot)[1]
    assert new_port != primary.port
    with cluster.node(new_port) as client:  # online: past its first sync (writes go on meanwhile)
        poll(lambda: client.execute_command("ROLE")[2], "the new primary's replica to be online")
    return promoted


def on_one_primary(
    request: pytest.FixtureRequest, count: int, name: Callable[[str], str], prefix: str = "wf"
) -> list[str]:
    """``count`` session ids (``prefix`` and a number) whose storage ids (``name(sid)``) are
    in buckets of their own on one primary (the first one's)."""
    cluster = request.getfixturevalue("redis_cluster")
    layout = Layout(get_store().backend.key_prefix, cluster=True)
    target = cluster.primaries()[0][1]
    chosen: list[str] = []
    roots: set[str] = set()
    for n in itertools.count():  # pragma: no branch - ends by returning
        sid = f"{prefix}{n}"
        root = layout.root_of(name(sid))
        if root not in roots and cluster.primary_for_key(root)[1] == target:
            chosen.append(sid)
            roots.add(root)
            if len(chosen) == count:
                return chosen
    raise AssertionError("unreachable")


def primary_of(request: pytest.FixtureRequest, storage_ids: list[str]) -> Primary:
    """The primary of sessions ``storage_ids`` (all on one), ``slot`` one of their slots."""
    primary = Primary("redis-cluster", request, storage_ids)
    root = Layout(get_store().backend.key_prefix, cluster=True).root_of(storage_ids[0])
    primary.slot = key_slot(root.encode())
    return primary


def lost_of(acked: list[tuple[str, int]], read: Callable[[str], dict[str, Any]]) -> int:
    """The acknowledged steps whose key is not there (``read(session_id)``: its values)."""
    stored = {sid: read(sid) for sid in {sid for sid, _ in acked}}
    return sum(stored[sid].get(f"k{step}") != step for sid, step in acked)


def first_write(write: Callable[[], None]) -> float:
    """Seconds until ``write`` (retried after an error) is acknowledged: at most TIMEOUT."""
    start = time.monotonic()
    while True:
        try:
            write()
            return time.monotonic() - start
        except (BackendUnavailable, _Failed):
            assert time.monotonic() - start < TIMEOUT, "the write never reached the new primary"
            time.sleep(0.02)


@dataclass
class Outcome:
    """A failover with writers (see :func:`failover_with_writers`)."""

    run: Run
    lost: int
    #: When the new primary was seen serving, and when its replica was online again.
    promoted: float
    whole: float
    #: Seconds the first write of a process idle through the failover took.
    idle_seconds: float


def failover_with_writers(
    how: str,
    primary: Primary,
    session_ids: list[str],
    write: Callable[[str, int], None],
    idle_write: Callable[[], None],
    read: Callable[[str], dict[str, Any]],
    request: pytest.FixtureRequest,
) -> Outcome:
    """A writer (``write``) on ``session_ids`` going on through a failover of their ``primary``,
    then the first write (``idle_write``) of a process idle through it; the acknowledged
    writes are read back with ``read``."""
    primary.wait_replicated()
    with Writer(write, session_ids) as writer:
        writer.successes_after(0, 20)
        promoted = fail_over(primary, how)
        whole = time.monotonic()
        writer.successes_after(whole, 20)
    idle_seconds = first_write(idle_write)
    lost = lost_of(writer.run.acked, read)
    request.getfixturevalue("redis_cluster").heal()
    return Outcome(writer.run, lost, promoted, whole, idle_seconds)


def assert_figures(via: str, how: str, outcomes: dict[int, Outcome]) -> None:
    """Print the figures of WAIT 0 and 1; assert that nothing acknowledged was lost (but by
    kill -9 with WAIT 0, which loses what the replica did not have yet), and that writes
    succeed again about as soon with WAIT 1 as with WAIT 0 once the cluster can take them:
    with WAIT 0 once the new primary serves, with WAIT 1 once it has its replica too (a
    kill -9 leaves it none until the killed node is back: those writes answer replicas_behind)."""
    recovery = {}
    for wait, outcome in outcomes.items():
        run = outcome.run
        recovery[wait] = run.first_success_after(outcome.whole if wait else outcome.promoted)
        kinds = sorted({code for _, code in run.errors})
        print(
            f"\nWAITFAILOVER {via} {how} wait={wait} acked={len(run.acked)} lost={outcome.lost} "
            f"errors={len(run.errors)} {kinds} error_s={run.error_seconds():.2f} "
            f"without_replica_s={outcome.whole - outcome.promoted:.2f} recovery_s={recovery[wait]:.3f} "
            f"idle_first_write_s={outcome.idle_seconds:.3f}"
        )
        if wait or how == "cluster-failover":
            assert outcome.lost == 0
    assert recovery[1] <= 3 * recovery[0] + 2.0


@pytest.mark.parametrize("how", HOWS)
def test_a_store_with_wait_goes_on_through_a_failover(how, settings, request, capsys):
    """Through the store: with WAIT 0 then 1, a writer on a store made before the failover
    goes on through it, and a store idle through it writes as soon as the cluster is whole."""
    runs = {}
    for wait in (0, 1):
        conf = topology_conf(
            "redis-cluster",
            settings,
            request,
            REDIS_WAIT_REPLICAS=wait,
            **WAITING,
        )
        session_ids = on_one_primary(request, 3, str)
        store, idle, fresh = store_for(conf), store_for(conf), store_for(conf)
        try:
            for sid in session_ids:
                acknowledged(store.create_session, sid, idempotency=Idempotency.of(f"create-{sid}"))
            acknowledged(idle.put, session_ids[0], "idle", 0, idempotency=Idempotency.of("idle-0"))

            def write(sid: str, step: int, store: MemoryStore = store, wait: int = wait) -> None:
                store.put(sid, f"k{step}", step, idempotency=Idempotency.of(f"{wait}-{sid}-{step}"))

            def idle_write(idle: MemoryStore = idle, sid: str = session_ids[0]) -> None:
                idle.put(sid, "idle", 1, idempotency=Idempotency.of("idle-1"))

            primary = primary_of(request, session_ids)
            runs[wait] = failover_with_writers(
                how, primary, session_ids, write, idle_write, fresh.get_all, request
            )
            assert fresh.get(session_ids[0], "idle") == 1
        finally:
            for each in (store, idle, fresh):
                each.close()
    with capsys.disabled():
        assert_figures("store", how, runs)


#: The owner of the server process's token: the first user of its fresh database.
SERVER_OWNER = "user:1"


@pytest.mark.usefixtures("transactional_db")  # api_client's user committed: the writer thread sees it
@pytest.mark.parametrize("how", HOWS)
def test_the_api_with_wait_goes_on_through_a_failover(how, settings, request, tmp_path, capsys):
    """Over the API: with WAIT 0 then 1, a writer on DRF's client in this process goes on
    through the failover, and a gunicorn started before it, idle through it, answers its
    first write once the cluster is whole."""
    api = request.getfixturevalue("api_client")
    runs = {}
    for wait in (0, 1):
        conf = topology_conf("redis-cluster", settings, request, REDIS_WAIT_REPLICAS=wait, **WAITING)
        session_ids = on_one_primary(request, 3, lambda sid: storage_id(OWNER, sid), f"w{wait}-")
        (server_sid,) = on_one_primary(request, 1, lambda sid: storage_id(SERVER_OWNER, sid), f"s{wait}-")
        env = demo_env(
            DATABASE_URL=f"sqlite:///{tmp_path / f'db{wait}.sqlite3'}",
            DJANGO_SETTINGS_MODULE="tests.settings_cluster_wait",
            PM_TEST_PERSISTENT_MEMORY=json.dumps(conf),
        )
        token = prepare_database(env)
        idle_path = f"{API}sessions/{server_sid}/memory/idle/"

        def sent(response: Any) -> Any:
            status = getattr(response, "status_code", None) or response.status
            if status >= 300:
                raise _Failed(f"{status} {response.json().get('code')}")
            return response

        def write(sid: str, step: int, wait: int = wait) -> None:
            url = f"{API}sessions/{sid}/memory/k{step}/"
            sent(api.put(url, {"value": step}, format="json", headers={HEADER: f"{wait}-{sid}-{step}"}))

        with serve("gunicorn", env, tmp_path / f"gunicorn{wait}.log") as server:

            def idle_write(server: Server = server, token: str = token, path: str = idle_path) -> None:
                sent(server.request("PUT", path, {"value": 1}, token=token, headers={HEADER: "idle-1"}))

            for sid in session_ids:
                sent(api.post(API + "sessions/", {"session_id": sid}, format="json"))
            sent(server.request("POST", f"{API}sessions/", {"session_id": server_sid}, token=token))
            sent(server.request("PUT", idle_path, {"value": 0}, token=token))
            fresh = store_for(conf)
            try:
                primary = primary_of(request, [storage_id(OWNER, sid) for sid in session_ids])
                runs[wait] = failover_with_writers(
                    how, primary, session_ids, write, idle_write, fresh.for_owner(OWNER).get_all, request
                )
                assert fresh.for_owner(SERVER_OWNER).get(server_sid, "idle") == 1
            finally:
                fresh.close()
    with capsys.disabled():
        assert_figures("api", how, runs)


def timed(call: Callable[..., Any], *args: Any, **options: Any) -> tuple[float, Any]:
    """Seconds ``call(*args, **options)`` took, and what it returned or raised."""
    start = time.monotonic()
    try:
        outcome = call(*args, **options)
    except Exception as exc:  # noqa: BLE001 - the caller checks it
        outcome = exc
    return time.monotonic() - start, outcome


@pytest.mark.usefixtures("transactional_db")
@pytest.mark.parametrize("name", ["redis-cluster", "redis-sentinel"])
def test_a_primary_without_its_replica_answers_at_once(name, settings, request):
    """REDIS_WAIT_REPLICAS 1 with the primary's replica gone (killed: the primary sees it
    leave): a write is applied and answers replicas_behind at once, not after the whole
    REDIS_WAIT_TIMEOUT_MS, through the store, the API and the async bridge; its retry under
    the same idempotency key applies nothing again, and once the replica is back it is
    acknowledged, with everything acknowledged before still there."""
    from persistent_memory.integrations.openai_agents import PersistentMemorySession

    api = request.getfixturevalue("api_client")
    topology_conf(name, settings, request, REDIS_WAIT_REPLICAS=1, **WAITING)
    store = get_store().for_owner(OWNER)
    sid = "nr1"
    primary = Primary(name, request, [storage_id(OWNER, sid)])
    primary.wait_replicated()
    acknowledged(store.create_session, sid, idempotency=Idempotency.of("create-nr1"))
    acknowledged(store.put, sid, "before", 1, idempotency=Idempotency.of("put-before"))
    stop_process(primary.replica(), signal.SIGKILL)
    with primary.client() as client:
        poll(lambda: not client.execute_command("ROLE")[2], "the primary to see its replica gone")
    once = Idempotency.of("count-1")
    half = TIMEOUT_MS / 2000
    for _attempt in range(2):
        seconds, outcome = timed(store.increment, sid, "counter", idempotency=once)
        assert seconds < half, f"{seconds:.2f} s"
        assert isinstance(outcome, ReplicasBehind), outcome
        assert "0 of 1 replicas" in str(outcome) and "connected" in str(outcome)
        assert store.get(sid, "counter") == 1  # applied on the primary, once
    url = f"{API}sessions/{sid}/memory/city/"
    city = {HEADER: "put-city"}
    seconds, response = timed(api.put, url, {"value": "Paris"}, format="json", headers=city)
    assert error_of(response) == (503, "replicas_behind")
    assert seconds < half, f"{seconds:.2f} s"
    session = PersistentMemorySession(sid, owner=OWNER)
    seconds, outcome = timed(asyncio.run, session.add_items([{"role": "user", "content": "hello"}]))
    assert isinstance(outcome, ReplicasBehind), outcome
    assert seconds < half, f"{seconds:.2f} s"
    print(f"\nNOREPLICA {name} replicas_behind after {seconds:.3f} s (timeout {TIMEOUT_MS} ms)")
    primary.servers.heal()
    with primary.client() as client:
        poll(lambda: client.execute_command("ROLE")[2], "the replica to be online again")
    assert acknowledged(store.increment, sid, "counter", idempotency=once) == 1
    assert store.get(sid, "counter") == 1
    assert store.get(sid, "before") == 1
    assert store.get(sid, "city") == "Paris"


def test_a_user_refused_role_still_waits_for_its_replicas(settings, request, redis_cluster):
    """ROLE is an @admin command: for a Redis user without it (an ACL, a managed service)
    the first write learns that from the refusal and WAIT alone decides from then on, as
    before: a write with its replica is acknowledged, one without waits out the timeout."""
    user = ("waiter", "pw-for-tests")
    for port in redis_cluster.alive():
        with redis_cluster.node(port) as node:
            node.acl_setuser(user[0], enabled=True, passwords=[f"+{user[1]}"], keys="*", channels="*",
                             commands=["+@all", "-role"])  # fmt: skip
    try:
        url = redis_cluster.url.replace("redis://", f"redis://{user[0]}:{user[1]}@")
        topology_conf("redis-cluster", settings, request, REDIS_WAIT_REPLICAS=1, REDIS_WAIT_TIMEOUT_MS=300)
        settings.PERSISTENT_MEMORY = {**settings.PERSISTENT_MEMORY, "REDIS_URL": url}
        store = get_store()
        primary = Primary("redis-cluster", request, ["acl1"])
        primary.wait_replicated()
        acknowledged(store.create_session, "acl1", idempotency=Idempotency.of("create-acl1"))
        assert store.backend.transport.ask_role is False
        acknowledged(store.put, "acl1", "k", 1, idempotency=Idempotency.of("put-k"))
        stop_process(primary.replica(), signal.SIGKILL)
        with primary.client() as client:
            poll(lambda: not client.execute_command("ROLE")[2], "the primary to see its replica gone")
        seconds, outcome = timed(store.put, "acl1", "k", 2)
        assert isinstance(outcome, ReplicasBehind), outcome
        assert "within 300 ms" in str(outcome)
        assert seconds >= 0.3  # WAIT waited: nothing told the store the replica was gone
        assert store.get("acl1", "k") == 2
    finally:
        for port in redis_cluster.alive():  # a killed node comes back without the user
            with redis_cluster.node(port) as node:
                node.acl_deluser(user[0])
