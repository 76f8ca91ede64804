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


def append_messages(url: str, session_id: str, worker: int, times: int, threads: int) -> None:
    """Append ``times`` messages from each of ``threads`` threads of this process, some one at
    a time and some in batches of three, to the default conversation."""
    import threading

    store = _store(url, 100)
    barrier = threading.Barrier(threads)
    errors: list[BaseException] = []

    def run(thread: int) -> None:
        try:
            barrier.wait()
            sent = 0
            while sent < times:
                size = 3 if sent % 4 == 1 and times - sent >= 3 else 1
                batch = [{"role": "user", "content": f"p{worker}-t{thread}-{sent + i}"} for i in range(size)]
                store.add_messages(session_id, batch)
                sent += size
        except BaseException as exc:
            errors.append(exc)

    pool = [threading.Thread(target=run, args=(thread,)) for thread in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    store.close()
    if errors:
        raise errors[0]
