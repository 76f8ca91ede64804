"""History entries and the summarization rule (the Redis backend runs the same rule in Lua).

Every put, increment and clear appends ``{"op", "key", "timestamp"}``. When a history
grows past ``max_entries``, the newest ``max_entries // 2`` entries stay and everything
older becomes one ``summary`` entry. An older summary folded into a new one adds its
counts, so ``sum(summarized_count) + non-summary entries`` always equals the number of
operations ever recorded.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

SUMMARY_OP = "summary"


def entry(op: str, key: str | None, timestamp: float, **extra: Any) -> dict[str, Any]:
    """One history record; field order matches the original node's JSON."""
    return {"op": op, "key": key, **extra, "timestamp": timestamp}


def _count(value: Any, *, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def operation_count(entries: list[dict[str, Any]]) -> int:
    """How many operations a history stands for (summaries count what they folded)."""
    return sum(e.get("summarized_count", 1) if e.get("op") == SUMMARY_OP else 1 for e in entries)


def fold(entries: list[dict[str, Any]], max_entries: int, timestamp: float) -> list[dict[str, Any]] | None:
    """The history after summarization, or None when it is within ``max_entries``."""
    if len(entries) <= max_entries:
        return None
    keep = max_entries // 2
    old, recent = (entries[:-keep], entries[-keep:]) if keep else (entries, [])
    count = 0
    op_counts: Counter[str] = Counter()
    keys: set[str] = set()
    for item in old:
        if item.get("op") == SUMMARY_OP:
            # Tolerant of summaries written by others, like the Lua version.
            count += _count(item.get("summarized_count"), default=1)
            counts = item.get("op_counts")
            if isinstance(counts, dict):
                op_counts.update({str(op): _count(n, default=0) for op, n in counts.items()})
            touched = item.get("keys_touched")
            if isinstance(touched, list):
                keys.update(k for k in touched if isinstance(k, str))
        else:
            count += 1
            op = item.get("op")
            op_counts[op if isinstance(op, str) else "unknown"] += 1
            if isinstance(item.get("key"), str) and item["key"]:
                keys.add(item["key"])
    summary = {
        "op": SUMMARY_OP,
        "summarized_count": count,
        "op_counts": dict(sorted(op_counts.items())),
        "keys_touched": sorted(keys),
        "timestamp": timestamp,
    }
    return [summary, *recent]
