"""Concurrent writers: counters stay exact and no history entry is lost."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable

from persistent_memory.backends.memory.history import operation_count
from tests import workers


def _run_threads(count: int, target: Callable[[int], None]) -> None:
    errors: list[BaseException] = []
    barrier = threading.Barrier(count)

    def run(index: int) -> None:
        try:
            barrier.wait()
            target(index)
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def _run_processes(target: Callable[..., None], args: list[tuple]) -> None:
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=target, args=a) for a in args]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
    assert [p.exitcode for p in processes] == [0] * len(processes)


def test_16_threads_x_250_increments(configure):
    store = configure(MAX_HISTORY=50)
    store.create_session("s1")
    _run_threads(16, lambda _: [store.increment("s1", "counter") for _ in range(250)])
    assert store.get("s1", "counter") == 4000
    assert operation_count(store.get_history("s1", 0)) == 4000


def test_concurrent_puts_keep_history_invariant(configure):
    store = configure(MAX_HISTORY=10)
    store.create_session("s1")
    seen_during: list[int] = []

    def writer(index: int) -> None:
        for i in range(150):
            store.put("s1", f"t{index}", i)
            if index == 0 and i % 10 == 0:
                seen_during.append(operation_count(store.get_history("s1", 0)))

    _run_threads(8, writer)
    entries = store.get_history("s1", 0)
    assert len(entries) <= 10
    assert operation_count(entries) == 8 * 150
    assert sum(1 for e in entries if e["op"] == "summary") <= 1
    assert seen_during == sorted(seen_during)  # every read saw a whole history
    assert store.get_all("s1") == {f"t{i}": 149 for i in range(8)}


def test_4_processes_x_500_increments(redis_store, redis_url):
    # Redis only: the memory backend is private to its process by design.
    store = redis_store
    store.create_session("s1")
    _run_processes(workers.increment_many, [(redis_url, "s1", 500)] * 4)
    assert store.get("s1", "counter") == 2000
    assert operation_count(store.get_history("s1", 0)) == 2000


def test_processes_keep_history_invariant(redis_store, redis_url):
    # Redis only: the memory backend is private to its process by design.
    store = redis_store
    store.create_session("s1")
    _run_processes(workers.put_many, [(redis_url, "s1", w, 300, 10) for w in range(4)])
    entries = store.get_history("s1", 0)
    assert len(entries) <= 10
    assert operation_count(entries) == 1200
