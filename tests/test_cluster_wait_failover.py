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

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from redis.crc import key_slot

from persistent_memory import get_store
from persistent_memory.backends.redis_layout import Layout
from persistent_memory.exceptions import BackendUnavailable
from persistent_memory.idempotency import Idempotency
from persistent_memory.store import MemoryStore
from tests.redis_topologies import TIMEOUT, poll
from tests.test_cluster_concurrency import store_for, topology_conf
from tests.test_redis_failover import Primary, acknowledged, healed  # noqa: F401 - a fixture

pytestmark = pytest.mark.usefixtures("healed")

#: Long on purpose: a write that waited it out would show.
TIMEOUT_MS = 10_000
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


def fail_over(primary: Primary, slot: int, how: str) -> None:
    """Fail ``primary`` (which serves ``slot``) over, ``how``: CLUSTER FAILOVER on its
    replica, or kill -9 and a restart of the killed node, which rejoins as the new primary's
    replica; then wait until the cluster is whole and the new primary's replica in sync."""
    cluster = primary.servers
    if how == "kill":
        cluster.failover_kill_primary(primary.port)
        cluster.restart(primary.port)
    else:
        replica = primary.replica()
        port = next(port for port, process in cluster.processes.items() if process is replica)
        with cluster.node(port) as node:
            node.execute_command("CLUSTER FAILOVER")
        poll(lambda: cluster.primary_for_slot(slot)[1] == port, "the replica to take over")
        cluster.wait_ok()
    new_port = cluster.primary_for_slot(slot)[1]
    assert new_port != primary.port
    with cluster.node(new_port) as client:  # online: past its first sync (writes go on meanwhile)
        poll(lambda: client.execute_command("ROLE")[2], "the new primary's replica to be online")


def on_one_primary(request: pytest.FixtureRequest, count: int, name: Callable[[str], str]) -> list[str]:
    """``count`` session ids whose storage ids (``name(sid)``) are in buckets of their own
    on one primary (the first one's)."""
    cluster = request.getfixturevalue("redis_cluster")
    layout = Layout(get_store().backend.key_prefix, cluster=True)
    target = cluster.primaries()[0][1]
    chosen: list[str] = []
    roots: set[str] = set()
    for n in itertools.count():  # pragma: no branch - ends by returning
        sid = f"wf{n}"
        root = layout.root_of(name(sid))
        if root not in roots and cluster.primary_for_key(root)[1] == target:
            chosen.append(sid)
            roots.add(root)
            if len(chosen) == count:
                return chosen
    raise AssertionError("unreachable")


def slot_of(storage_id: str) -> int:
    """The cluster slot of a session's keys."""
    return key_slot(Layout(get_store().backend.key_prefix, cluster=True).root_of(storage_id).encode())


def lost_of(acked: list[tuple[str, int]], read: Callable[[str], dict[str, Any]]) -> int:
    """The acknowledged steps whose key is not there (``read(session_id)``: its values)."""
    stored = {sid: read(sid) for sid in {sid for sid, _ in acked}}
    return sum(stored[sid].get(f"k{step}") != step for sid, step in acked)


def report(via: str, how: str, wait: int, run: Run, lost: int, moment: float, idle: float) -> None:
    kinds = sorted({code for _, code in run.errors})
    print(
        f"\nWAITFAILOVER {via} {how} wait={wait} acked={len(run.acked)} lost={lost} "
        f"errors={len(run.errors)} {kinds} error_s={run.error_seconds():.2f} "
        f"after_whole_s={run.first_success_after(moment):.3f} idle_first_write_s={idle:.3f}"
    )


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


def failover_with_writers(
    how: str,
    session_ids: list[str],
    write: Callable[[str, int], None],
    idle_write: Callable[[], None],
    read: Callable[[str], dict[str, Any]],
    request: pytest.FixtureRequest,
) -> tuple[Run, int, float, float]:
    """A writer (``write``) going on through a failover of the primary of ``session_ids``,
    then the first write (``idle_write``) of a process idle through it; the writer's run,
    the acknowledged writes lost (read back with ``read``), the moment the cluster was whole
    again and the seconds the idle process's first write took."""
    primary = Primary("redis-cluster", request, session_ids)
    primary.wait_replicated()
    with Writer(write, session_ids) as writer:
        writer.successes_after(0, 20)
        fail_over(primary, slot_of(session_ids[0]), how)
        whole = time.monotonic()
        writer.successes_after(whole, 20)
    idle_seconds = first_write(idle_write)
    lost = lost_of(writer.run.acked, read)
    request.getfixturevalue("redis_cluster").heal()
    return writer.run, lost, whole, idle_seconds


def assert_figures(via: str, how: str, runs: dict[int, tuple[Run, int, float, float]]) -> None:
    """Print the figures of WAIT 0 and 1; nothing acknowledged lost (but by kill -9 with
    WAIT 0, which loses what the replica did not have yet), and the writes failing for
    about as long with WAIT 1 as with WAIT 0."""
    for wait, (run, lost, whole, idle_seconds) in runs.items():
        kinds = sorted({code for _, code in run.errors})
        print(
            f"\nWAITFAILOVER {via} {how} wait={wait} acked={len(run.acked)} lost={lost} "
            f"errors={len(run.errors)} {kinds} error_s={run.error_seconds():.2f} "
            f"after_whole_s={run.first_success_after(whole):.3f} idle_first_write_s={idle_seconds:.3f}"
        )
    for wait, (_run, lost, _whole, _idle) in runs.items():
        if wait or how == "cluster-failover":
            assert lost == 0
    assert runs[1][0].error_seconds() <= 2 * runs[0][0].error_seconds() + 3.0


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
            REDIS_WAIT_TIMEOUT_MS=TIMEOUT_MS,
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

            runs[wait] = failover_with_writers(how, session_ids, write, idle_write, fresh.get_all, request)
            assert fresh.get(session_ids[0], "idle") == 1
        finally:
            for each in (store, idle, fresh):
                each.close()
    with capsys.disabled():
        assert_figures("store", how, runs)
