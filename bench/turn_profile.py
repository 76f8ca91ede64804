"""Where a default turn's Redis time goes, on one server of the benchmark's own.

    python bench/turn_profile.py [--batches 20] [--batch 50]

For a default enrich+store turn at the default window (CONTEXT_MAX_MESSAGES 100) and at
20 messages, the same turn with recording and extraction off, and the reads users run
most (``get_context(max_tokens=2000)``, the Agents SDK session's ``get_messages(limit=20)``),
prints the Redis server time per operation from ``INFO commandstats`` (the script calls
and anything sent beside them), as the quietest and the median of many batches taking
turns (a shared machine's bursts then fall on each alike), the client's operations per
second, and the commands Redis ran per operation. For the default turn it then shows
how the quietest batch's time splits: each command the scripts ran, and what is left
to Lua (building the script's closures, its logic, and turning what commands read and
answer into Lua values and back).

Compare two commits by running it in each checkout in turn (ratios, same load).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(1, str(BENCH.parent))  # the project (bench/ itself is sys.path[0])

import redis  # noqa: E402
from local_redis import redis_url  # noqa: E402
from run import setup_django  # noqa: E402

#: What the client sends for an operation (the rest ran inside the scripts).
SENT = ("evalsha", "fcall", "fcall_ro", "multi", "exec", "lrange")
#: Turns run on each conversation before timing: longer than the default window.
WARM_TURNS = 60


def command_stats(client: redis.Redis) -> dict[str, tuple[int, int]]:
    """Calls and microseconds of each command Redis ran (INFO and CONFIG excluded)."""
    table = client.info("commandstats")
    return {
        name.removeprefix("cmdstat_"): (stat["calls"], stat["usec"])
        for name, stat in table.items()
        if not name.startswith(("cmdstat_info", "cmdstat_config"))
    }


def batch_stats(
    client: redis.Redis, operation: Callable[[], Any], settle: Callable[[], Any], size: int
) -> tuple[dict[str, tuple[float, float]], float]:
    """Per-operation calls and microseconds of each command over ``size`` calls, and the
    calls per second."""
    settle()
    before = command_stats(client)
    start = time.perf_counter()
    for _ in range(size):
        operation()
    seconds = time.perf_counter() - start
    settle()
    after = command_stats(client)
    per_op = {}
    for name, (calls, usec) in after.items():
        calls_before, usec_before = before.get(name, (0, 0))
        if calls > calls_before:
            per_op[name] = ((calls - calls_before) / size, (usec - usec_before) / size)
    return per_op, size / seconds


def server_us(per_op: dict[str, tuple[float, float]]) -> float:
    return sum(usec for name, (_, usec) in per_op.items() if name in SENT)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--batch", type=int, default=50, help="operations per batch")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pm-turn-profile-") as folder, redis_url(use_env=False) as url:
        setup_django(folder)
        from store_bench import _cycle, build_store, fill, turn

        client = redis.Redis.from_url(url)
        stores = []
        operations: dict[str, tuple[Callable[[], Any], Callable[[], Any]]] = {}
        for window in (100, 20):
            store = build_store("redis", url, CONTEXT_MAX_MESSAGES=window)
            stores.append(store)
            ids = fill(store, f"window{window}", 20, 10)
            worker = store.extraction_worker
            operations[f"default turn, window {window}"] = (
                turn(store, ids),
                lambda worker=worker: worker.wait_idle(30),
            )
            if window == 100:
                session = _cycle(ids)
                operations["get_context(max_tokens=2000)"] = (
                    lambda store=store, session=session: store.get_context(session(), max_tokens=2000),
                    lambda: None,
                )
                operations["get_messages(limit=20)"] = (
                    lambda store=store, session=session: store.get_messages(session(), limit=20),
                    lambda: None,
                )
        bare = build_store(
            "redis", url, CONTEXT_MAX_MESSAGES=100, RECORD_CONVERSATION=False, MEMORY_EXTRACTION_WORKER=False
        )
        stores.append(bare)
        operations["turn, recording and extraction off"] = (
            turn(bare, fill(bare, "bare", 20, 10)),
            lambda: None,
        )
        try:
            for name, (operation, settle) in operations.items():
                if name.startswith(("default turn", "turn")):
                    for _ in range(WARM_TURNS * 20):
                        operation()
                settle()
            batches: dict[str, list[tuple[dict[str, tuple[float, float]], float]]] = {
                n: [] for n in operations
            }
            for _ in range(args.batches):
                for name, (operation, settle) in operations.items():
                    batches[name].append(batch_stats(client, operation, settle, args.batch))
            print("| operation | server µs/op (quietest) | (median) | client ops/s (median) | commands/op |")
            print("|---|---|---|---|---|")
            for name, runs in batches.items():
                times = [server_us(per_op) for per_op, _ in runs]
                commands = statistics.median(sum(calls for calls, _ in per_op.values()) for per_op, _ in runs)
                rate = statistics.median(rate for _, rate in runs)
                median = statistics.median(times)
                print(f"| {name} | {min(times):.1f} | {median:.1f} | {rate:.0f} | {commands:.1f} |")
            quietest = min(batches["default turn, window 100"], key=lambda run: server_us(run[0]))[0]
            inside = {name: stat for name, stat in quietest.items() if name not in SENT}
            inside_us = sum(usec for _, usec in inside.values())
            print(
                f"\nDefault turn, window 100, quietest batch: {server_us(quietest):.1f} µs; "
                f"{sum(calls for calls, _ in inside.values()):.1f} commands inside the scripts, "
                f"{inside_us:.1f} µs; Lua {server_us(quietest) - inside_us:.1f} µs"
            )
            for name, (calls, usec) in sorted(inside.items(), key=lambda item: -item[1][1]):
                print(f"  {name}: {calls:g} a turn, {usec:.1f} µs")
        finally:
            for store in stores:
                store.close()
            client.close()


if __name__ == "__main__":
    main()
