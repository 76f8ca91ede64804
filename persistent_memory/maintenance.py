"""Operations on many sessions at once, shared by the admin actions and the management
commands. Each acts on the store first, then brings the mirror up to date."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from persistent_memory.backends.base import SessionSnapshot, remaining_seconds
from persistent_memory.exceptions import SessionNotFound
from persistent_memory.store import MemoryStore, get_store

BATCH_SIZE = 200


def _batches(session_ids: list[str]) -> Iterator[list[str]]:
    for start in range(0, len(session_ids), BATCH_SIZE):
        yield session_ids[start : start + BATCH_SIZE]


def _after(store: MemoryStore, session_ids: list[str]) -> None:
    if store.mirror.enabled and session_ids:
        store.mirror.sync_sessions(session_ids)


def export_record(snapshot: SessionSnapshot) -> dict[str, Any]:
    """A session as export writes it and import reads it (values decoded)."""
    info = snapshot["info"]
    return {
        "session_id": info["session_id"],
        "created_at": info["created_at"],
        "ttl_seconds": info["ttl_seconds"],
        "ttl_remaining_seconds": remaining_seconds(info),
        "values": {key: json.loads(text) for key, text in sorted(snapshot["values"].items())},
        "history": snapshot["history"],
    }


def export_sessions(
    session_ids: Iterable[str] | None = None, *, store: MemoryStore | None = None
) -> Iterator[dict]:
    """Export records of the named live sessions (all when None), read in batches."""
    store = store or get_store()
    ids = sorted(session_ids) if session_ids is not None else store.list_sessions()
    for batch in _batches(ids):
        for snapshot in store.backend.snapshots(batch).values():
            if snapshot is not None:
                yield export_record(snapshot)


def delete_sessions(session_ids: Iterable[str], *, store: MemoryStore | None = None) -> int:
    """Delete sessions from the store; return how many existed."""
    store = store or get_store()
    ids, deleted = list(session_ids), 0
    for session_id in ids:
        try:
            store.delete_session(session_id)
            deleted += 1
        except SessionNotFound:
            pass
    _after(store, ids)
    return deleted


def clear_sessions(session_ids: Iterable[str], *, store: MemoryStore | None = None) -> int:
    """Clear every key of each session; return how many keys were removed."""
    store = store or get_store()
    ids, cleared = list(session_ids), 0
    for session_id in ids:
        with contextlib.suppress(SessionNotFound):
            cleared += len(store.clear(session_id))
    _after(store, ids)
    return cleared


@dataclass
class SummarizeReport:
    """What a summarization pass did."""

    scanned: int = 0
    summarized: int = 0
    folded: int = 0


def summarize_sessions(
    session_ids: Iterable[str], *, max_history: int | None = None, store: MemoryStore | None = None
) -> SummarizeReport:
    """Apply the summarization rule to each session now."""
    store = store or get_store()
    ids, report = list(session_ids), SummarizeReport()
    for session_id in ids:
        try:
            folded = store.fold_history(session_id, max_history)
        except SessionNotFound:
            continue
        report.scanned += 1
        if folded:
            report.summarized += 1
            report.folded += folded
    _after(store, ids)
    return report
