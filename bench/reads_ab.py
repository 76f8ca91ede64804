"""Reads awaited in one running loop, in interleaved slices of one process (N=100 or 10000):

    N=100 python bench/reads_ab.py

``RedisSession.get_items(limit=20)`` beside our Agents SDK session's ``get_items(limit=20)``
as it reads now (plain items stored without entries, chat fields and metadata parsed) and
as it read before 2026-11-29's reads work (entries on every message, every field parsed,
then rebuilt), and ``get_context(max_tokens=2000)`` (sync). Prints markdown rows: ops/s
(median slice), p50 µs, rate ratio to RedisSession (median over slices), p50 ratio.
"""

import asyncio
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent)]
from local_redis import redis_url  # noqa: E402
from run import setup_django  # noqa: E402

TEXT = "Paris is mild today: 18 degrees, light wind from the west and no rain expected. " * 5
N = int(os.environ.get("N", "100"))
ROUNDS, SLICE = 15, 150
BASE = "RedisSession.get_items(20)"


async def measure(store: Any, url: str) -> None:
    from agents.extensions.memory.redis_session import RedisSession
    from redis.asyncio import Redis as AsyncRedis

    from persistent_memory.integrations import off_the_loop
    from persistent_memory.integrations.openai_agents import PersistentMemorySession, items_of

    client = AsyncRedis.from_url(url)
    peer = RedisSession("rs", redis_client=client)
    session = PersistentMemorySession("new", store=store)
    for batch in batches():
        await peer.add_items(batch)
        await session.add_items(batch)

    def before() -> list[Any]:  # the read as it was: every field parsed, then the entries
        read = store.get_messages("old", limit=20)
        return [item for message in read["messages"] for item in items_of(message)]

    async def old() -> list[Any]:
        return await off_the_loop(store, before)

    async def context() -> Any:
        return store.get_context("ctx", max_tokens=2000)

    operations = {
        BASE: lambda: peer.get_items(limit=20),
        "our session get_items(20), now": lambda: session.get_items(limit=20),
        "our session get_items(20), before": old,
        "get_context(max_tokens=2000), sync": context,
    }
    expected = await peer.get_items(limit=20)
    if await session.get_items(limit=20) != expected or await old() != expected:
        raise RuntimeError("the reads compared do not answer the same items")
    latencies: dict[str, list[float]] = {name: [] for name in operations}
    rates: dict[str, list[float]] = {name: [] for name in operations}
    names = list(operations)
    for number in range(ROUNDS + 1):
        shift = number % len(names)
        for name in names[shift:] + names[:shift]:
            start, taken = time.perf_counter(), []
            for _ in range(SLICE):
                before_call = time.perf_counter()
                await operations[name]()
                taken.append(time.perf_counter() - before_call)
            if number:  # the first round warms up
                latencies[name] += taken
                rates[name].append(SLICE / (time.perf_counter() - start))
    base_p50 = statistics.median(latencies[BASE])
    for name in names:
        ratio = statistics.median(a / b for a, b in zip(rates[name], rates[BASE], strict=True))
        p50 = statistics.median(latencies[name])
        rate = statistics.median(rates[name])
        print(f"| {N} | {name} | {rate:,.0f} | {p50 * 1e6:.0f} | {ratio:.2f} | {base_p50 / p50:.2f} |")
    await client.aclose()


def batches(metadata: bool = False) -> Iterator[list[dict[str, Any]]]:
    """The thread, 100 messages a batch; with ``metadata``, each with the entries the
    session wrote for every item before."""
    from persistent_memory.integrations.openai_agents import KEY

    chat = [{"role": "user" if i % 2 == 0 else "assistant", "content": TEXT} for i in range(N)]
    if metadata:
        chat = [{**m, "metadata": {KEY: [{"m": {"role": m["role"], "content": None}}]}} for m in chat]
    for i in range(0, N, 100):
        yield chat[i : i + 100]


def main() -> None:
    with tempfile.TemporaryDirectory() as folder, redis_url(use_env=False) as url:
        setup_django(folder)
        from persistent_memory.conf import MemorySettings
        from persistent_memory.store import MemoryStore

        conf = {"BACKEND": "redis", "REDIS_URL": url, "MAX_MESSAGES": 20_000, "MAX_SESSION_BYTES": None}
        store = MemoryStore.from_settings(MemorySettings(conf))
        for plain, entries in zip(batches(), batches(metadata=True), strict=True):
            store.add_messages("ctx", plain)
            store.add_messages("old", entries)
        print(f"load {os.getloadavg()[0]:.1f}", file=sys.stderr)
        asyncio.run(measure(store, url))
        print(f"load {os.getloadavg()[0]:.1f}", file=sys.stderr)
        store.close()


if __name__ == "__main__":
    main()
