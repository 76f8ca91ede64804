"""Functions run in child processes by the concurrency tests (importable for spawn)."""

from __future__ import annotations

import redis

from persistent_memory.backends.redis import RedisBackend
from persistent_memory.store import MemoryStore


def _store(url: str, max_history: int) -> MemoryStore:
    return MemoryStore(
        RedisBackend(client=redis.Redis.from_url(url), max_history=max_history, auto_summarize=True)
    )


def increment_many(url: str, session_id: str, times: int) -> None:
    store = _store(url, 100)
    for _ in range(times):
        store.increment(session_id, "counter")
    store.close()


def put_many(url: str, session_id: str, worker: int, times: int, max_history: int) -> None:
    store = _store(url, max_history)
    for i in range(times):
        store.put(session_id, f"w{worker}", i)
    store.close()
