"""Concurrent writers on a real Redis Cluster: counters and conversations stay exact across
processes and threads, and no acknowledged write is lost while slots move between primaries.

Each child process builds its own store from the same PERSISTENT_MEMORY dict (the cluster
client the app builds, with no retries), so the processes share nothing but the cluster.
"""

from __future__ import annotations

import multiprocessing
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from redis.crc import key_slot

from persistent_memory import get_store
from persistent_memory.backends.memory.history import operation_count
from persistent_memory.backends.redis import RedisBackend
from persistent_memory.backends.redis.layout import Layout, bucket_of
from persistent_memory.conf import MemorySettings
from persistent_memory.exceptions import BackendUnavailable
from persistent_memory.idempotency import Idempotency
from persistent_memory.store import MemoryStore
from tests.conftest import memory_settings_for, topology_settings
from tests.redis_topologies import poll
from tests.test_concurrency import _run_threads
from tests.test_conversation_concurrency import check_thread

PROCESSES = 3
THREADS = 4
INCREMENTS = 60
MESSAGES = 24


def topology_conf(name: str, settings: Any, request: pytest.FixtureRequest, **extra: Any) -> dict[str, Any]:
    """The PERSISTENT_MEMORY dict of Redis setup ``name`` ("redis-cluster", "redis-sentinel":
    whole and flushed), applied to settings."""
    conf = {**memory_settings_for("redis"), **topology_settings(name, request), **extra}
    settings.PERSISTENT_MEMORY = conf
    return conf


def store_for(conf: dict[str, Any]) -> MemoryStore:
    """A store of this process's own from a PERSISTENT_MEMORY dict (no Django settings needed)."""
    return MemoryStore(RedisBackend.from_settings(MemorySettings(conf)))


def cluster_worker(conf: dict[str, Any], session_id: str, worker: int, threads: int) -> None:
    """Run in a child process: ``threads`` threads, each INCREMENTS increments of one counter
    and MESSAGES appends to the session's conversation (one at a time and in threes)."""
    store = store_for(conf)
    try:
        _run_threads(threads, lambda thread: mixed_writer(store, session_id, f"p{worker}-t{thread}"))
    finally:
        store.close()


def mixed_writer(store: MemoryStore, session_id: str, name: str) -> None:
    """INCREMENTS increments, with MESSAGES messages appended in between (some in threes,
    as tests.test_conversation_concurrency.writer sends them)."""
    sent = 0
    for step in range(INCREMENTS):
        store.increment(session_id, "counter")
        if step % 2 and sent < MESSAGES:
            size = 3 if sent % 4 == 1 and MESSAGES - sent >= 3 else 1
            batch = [{"role": "user", "content": f"{name}-{sent + i}"} for i in range(size)]
            store.add_messages(session_id, batch)
            sent += size
    while sent < MESSAGES:  # the rest, should INCREMENTS be short
        store.add_messages(session_id, [{"role": "user", "content": f"{name}-{sent}"}])
        sent += 1


def test_processes_and_threads_on_one_session(settings, request):
    """PROCESSES processes x THREADS threads, plus THREADS threads here, increment one counter
    and append to one conversation of one session: the counter and the history count every
    increment, and the conversation holds every message once, in one chain."""
    conf = topology_conf("redis-cluster", settings, request, MAX_HISTORY=50)
    store = get_store()
    store.create_session("s1")
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(target=cluster_worker, args=(conf, "s1", worker, THREADS))
        for worker in range(PROCESSES)
    ]
    for process in processes:
        process.start()
    _run_threads(THREADS, lambda thread: mixed_writer(store, "s1", f"parent-t{thread}"))
    for process in processes:
        process.join(timeout=180)
    assert [p.exitcode for p in processes] == [0] * PROCESSES
    writers = [f"p{w}-t{t}" for w in range(PROCESSES) for t in range(THREADS)]
    writers += [f"parent-t{t}" for t in range(THREADS)]
    assert store.get("s1", "counter") == len(writers) * INCREMENTS
    assert operation_count(store.get_history("s1", 0)) == len(writers) * INCREMENTS
    check_thread(store, "s1", {f"{name}-{n}" for name in writers for n in range(MESSAGES)})


# Resharding under load ------------------------------------------------------------------

SESSIONS = 6
#: Keys each session holds before the migration starts, so that moving it takes several
#: MIGRATE batches while the writers go on.
PRELOAD = 300


def sessions_by_primary(cluster: Any, layout: Layout, count: int) -> dict[int, list[str]]:
    """``count`` session ids per primary port, each in a bucket of its own."""
    by_port: dict[int, list[str]] = {port: [] for _host, port in cluster.primaries()}
    buckets: set[int] = set()
    n = 0
    while min(len(ids) for ids in by_port.values()) < count:
        sid = f"r{n}"
        n += 1
        if bucket_of(sid) in buckets:
            continue
        _host, port = cluster.primary_for_key(layout.root_of(sid))
        if len(by_port[port]) < count:
            by_port[port].append(sid)
            buckets.add(bucket_of(sid))
    return by_port


class _Stopped(Exception):
    """The writers were stopped while a write was still being retried (it is not counted)."""


class Writers:
    """One thread per session writing until stopped: each step puts a new key and increments
    the session's counter, each under an idempotency key of its own, and is retried with the
    same key after BackendUnavailable (the only error allowed), so a retry of a write that
    was applied is answered from its record and applies nothing again."""

    def __init__(self, store: MemoryStore, session_ids: list[str]) -> None:
        self.store = store
        self.session_ids = session_ids
        self.acked: dict[str, list[int]] = {sid: [] for sid in session_ids}
        self.counted: dict[str, list[int]] = {sid: [] for sid in session_ids}
        self.retries: Counter[str] = Counter()
        #: The message of the first error of each class, for the report.
        self.first_error: dict[str, str] = {}
        self.failures: list[BaseException] = []
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(sid,)) for sid in session_ids]

    def _until_done(self, call: Callable[..., Any], *args: Any, **options: Any) -> Any:
        while True:
            try:
                return call(*args, **options)
            except BackendUnavailable as exc:
                self.retries[type(exc).__name__] += 1
                self.first_error.setdefault(type(exc).__name__, str(exc))
                if self.stop.wait(0.02):  # not a hot loop against a node that refuses
                    raise _Stopped from None

    def _run(self, sid: str) -> None:
        try:
            step = 0
            while not self.stop.is_set():
                once = Idempotency.of(f"{sid}-p{step}", step)
                self._until_done(self.store.put, sid, f"k{step}", step, idempotency=once)
                self.acked[sid].append(step)
                once = Idempotency.of(f"{sid}-i{step}")
                self.counted[sid].append(
                    self._until_done(self.store.increment, sid, "counter", idempotency=once)
                )
                step += 1
        except _Stopped:
            pass
        except BaseException as exc:  # reported in the test's thread
            self.failures.append(exc)

    def writes(self) -> int:
        return sum(len(steps) + len(self.counted[sid]) for sid, steps in self.acked.items())

    def wait_for(self, more: int, timeout: float = 120) -> None:
        """Until every session has ``more`` acknowledged steps beyond what it has now."""
        targets = {sid: len(steps) + more for sid, steps in self.acked.items()}

        def reached() -> bool:
            return all(len(self.acked[sid]) >= n for sid, n in targets.items()) or bool(self.failures)

        poll(reached, f"the writers to reach {targets}", timeout)
        assert not self.failures, self.failures

    def __enter__(self) -> Writers:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=120)


def test_resharding_under_load_loses_no_acknowledged_write(settings, request, redis_cluster, capsys):
    """Writers on sessions of every primary go on while the buckets of some of them move from
    one primary to another: each acknowledged put is there, each session's counter equals its
    acknowledged increments (and they answered 1..n, none twice), and the only errors the
    callers saw were BackendUnavailable, retried under the same idempotency key."""
    topology_conf("redis-cluster", settings, request)
    store = get_store()
    layout = Layout(store.backend.key_prefix, cluster=True)
    by_port = sessions_by_primary(redis_cluster, layout, SESSIONS // 3)
    source, target, _other = sorted(by_port)
    moving = by_port[source]
    session_ids = [sid for ids in by_port.values() for sid in ids]
    for sid in session_ids:
        store.create_session(sid)
        for i in range(PRELOAD):
            store.put(sid, f"preload{i}", i)
    redirected = Counter()
    follow = store.backend.transport.redirected

    def counting(command: tuple[Any, ...], wait: int, redirect: Exception) -> Any:
        redirected[key_slot(command[3].encode())] += 1
        return follow(command, wait, redirect)

    store.backend.transport.redirected = counting
    slots = sorted({key_slot(layout.root_of(sid).encode()) for sid in moving})
    with Writers(store, session_ids) as writers:
        writers.wait_for(20)
        before = writers.writes()
        moved = redis_cluster.migrate_slots(slots, source, target, batch=5)
        during = writers.writes() - before
        writers.wait_for(20)  # the slot map learnt, and writes going on
    assert not writers.failures, writers.failures
    for sid in moving:
        assert redis_cluster.primary_for_key(layout.root_of(sid)) == ("127.0.0.1", target)
    assert moved >= len(moving) * PRELOAD
    assert set(redirected) <= set(slots) and redirected  # the moved slots' writes were redirected
    for sid in session_ids:
        stored = store.get_all(sid)
        assert {f"k{step}": step for step in writers.acked[sid]}.items() <= stored.items()
        assert sorted(writers.counted[sid]) == list(range(1, len(writers.counted[sid]) + 1))
        assert stored["counter"] == len(writers.counted[sid])
    with capsys.disabled():
        print(
            f"\nRESHARD cluster slots={len(slots)} keys_moved={moved} writes={writers.writes()} "
            f"during_migration={during} redirected={sum(redirected.values())} "
            f"retries={sum(writers.retries.values())} ({dict(writers.retries)}) first={writers.first_error}"
        )
