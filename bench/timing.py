"""Timing of a single-threaded loop: operations per second and latency percentiles."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def percentile(sorted_values: list[float], share: float) -> float:
    """The nearest-rank percentile of values sorted ascending (``share`` in 0..1)."""
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, max(0, round(share * len(sorted_values)) - 1))
    return sorted_values[index]


def summary(latencies_s: list[float], count: int, seconds: float) -> dict[str, Any]:
    """The figures every section reports, latencies in microseconds."""
    ordered = sorted(latencies_s)
    return {
        "ops": count,
        "seconds": round(seconds, 3),
        "ops_per_s": round(count / seconds, 1) if seconds else 0.0,
        "p50_us": round(percentile(ordered, 0.50) * 1e6, 1),
        "p99_us": round(percentile(ordered, 0.99) * 1e6, 1),
    }


def timed(
    operations: dict[str, Callable[[], Any]], duration: float, *, slices: int = 10, warmup: int = 200
) -> dict[str, dict[str, Any]]:
    """Call each operation back to back for ``duration`` seconds in all, timing each call.

    The operations take turns in ``slices`` slices each, so that a machine getting
    slower or faster during the run shifts them all alike and their ratios hold.
    Operations per second are calls over the loops' wall time, timing included, so
    they can only be understated.
    """
    clock = time.perf_counter
    latencies: dict[str, list[float]] = {name: [] for name in operations}
    spent = dict.fromkeys(operations, 0.0)
    for operation in operations.values():
        for _ in range(warmup):
            operation()
    for _ in range(slices):
        for name, operation in operations.items():
            record = latencies[name].append
            start = now = clock()
            deadline = start + duration / slices
            while now < deadline:
                for _ in range(20):  # look at the deadline every 20 calls
                    before = clock()
                    operation()
                    now = clock()
                    record(now - before)
            spent[name] += now - start
    return {name: summary(latencies[name], len(latencies[name]), spent[name]) for name in operations}
