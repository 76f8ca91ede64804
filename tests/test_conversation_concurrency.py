"""Concurrent writers to one conversation: 16 threads (both backends) and 4 processes
(Redis) appending at once; every message is stored once, seq runs 1..n with no gap and
the thread holds them all, each writer's in the order it wrote them."""

from __future__ import annotations

import multiprocessing
import re
import threading
from collections import defaultdict
from typing import Any

from persistent_memory.store import MemoryStore
from tests import workers
from tests.chat import user
from tests.test_concurrency import _run_processes, _run_threads

THREADS = 16


def writer(store: MemoryStore, session_id: str, prefix: str, times: int, answers: list) -> None:
    """``times`` messages, one at a time and in batches of three."""
    sent = 0
    while sent < times:
        size = 3 if sent % 4 == 1 and times - sent >= 3 else 1
        added = store.add_messages(session_id, [user(f"{prefix}-{sent + i}") for i in range(size)])
        answers.append(added)
        sent += size


def check_thread(store: MemoryStore, session_id: str, expected: set[str]) -> list[dict[str, Any]]:
    read = store.get_messages(session_id)
    messages = read["messages"]
    contents = [m["content"] for m in messages]
    assert len(contents) == len(expected) and set(contents) == expected  # each once, none lost
    assert [m["seq"] for m in messages] == list(range(1, len(expected) + 1))  # no gap, no repeat
    assert [m["parent_id"] for m in messages] == [None, *(m["id"] for m in messages[:-1])]  # one chain
    assert read["head"] == messages[-1]["id"]
    assert len({m["id"] for m in messages}) == len(messages)
    (info,) = store.list_conversations(session_id)
    assert (info["message_count"], info["branch_count"]) == (len(expected), 1)
    # Each writer's messages are in the order it wrote them.
    by_writer: dict[str, list[int]] = defaultdict(list)
    for content in contents:
        writer_name, number = content.rsplit("-", 1)
        by_writer[writer_name].append(int(number))
    assert all(numbers == sorted(numbers) for numbers in by_writer.values())
    return messages


def test_16_threads_append_to_one_conversation(configure):
    store = configure()
    answers: list[dict[str, Any]] = []
    _run_threads(THREADS, lambda index: writer(store, "s1", f"t{index}", 40, answers))
    messages = check_thread(store, "s1", {f"t{i}-{n}" for i in range(THREADS) for n in range(40)})
    # Each append answered the seqs it got: a batch's are consecutive, and they are the stored ones.
    stored = {m["id"]: m for m in messages}
    for added in answers:
        seqs = [m["seq"] for m in added["messages"]]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
        assert all(stored[m["id"]] == m for m in added["messages"])


def test_threads_resending_one_message_store_it_once(configure):
    store = configure()
    store.add_messages("s1", [user("first")])
    answers: list[dict[str, Any]] = []
    lock = threading.Lock()

    def resend(index: int) -> None:
        for attempt in range(20):
            added = store.add_messages("s1", [user("retried", id="m-retried"), user(f"t{index}-{attempt}")])
            with lock:
                answers.append(added["messages"][0])

    _run_threads(THREADS, resend)
    assert len({(m["seq"], m["created_at"]) for m in answers}) == 1  # every thread got the same message
    (info,) = store.list_conversations("s1")
    assert info["message_count"] == 2 + THREADS * 20


def test_4_processes_and_16_threads_append_to_one_conversation(redis_store, redis_url):
    # Redis only: the memory backend is private to its process by design. Each process
    # runs 4 threads, so 16 writers in 4 processes, plus 4 threads here.
    store = redis_store
    store.create_session("s1")
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(target=workers.append_messages, args=(redis_url, "s1", worker, 30, 4))
        for worker in range(4)
    ]
    for process in processes:
        process.start()
    answers: list[dict[str, Any]] = []
    _run_threads(4, lambda index: writer(store, "s1", f"parent-t{index}", 30, answers))
    for process in processes:
        process.join(timeout=120)
    assert [p.exitcode for p in processes] == [0] * 4
    expected = {f"p{w}-t{t}-{n}" for w in range(4) for t in range(4) for n in range(30)}
    expected |= {f"parent-t{t}-{n}" for t in range(4) for n in range(30)}
    messages = check_thread(store, "s1", expected)
    assert len(messages) == 600
    assert all(re.fullmatch(r"[0-9a-f]{28}", m["id"]) for m in messages)


def test_4_processes_append_with_one_process_each(redis_store, redis_url):
    redis_store.create_session("s2")
    _run_processes(workers.append_messages, [(redis_url, "s2", worker, 50, 1) for worker in range(4)])
    check_thread(redis_store, "s2", {f"p{w}-t0-{n}" for w in range(4) for n in range(50)})
