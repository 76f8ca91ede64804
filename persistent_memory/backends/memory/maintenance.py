"""The memory backend's maintenance in batches: scans, the sweep, forgetting a namespace,
and the mirror's dirty set.

Held by :class:`~persistent_memory.backends.memory.MemoryBackend` as ``maintenance``, which
gives it its session table (:class:`~.sessions.IndexedTable`). Every session is in this
process: a "batch" is all of them at once, under the table's lock.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from persistent_memory.backends.base import SessionInfo
from persistent_memory.exceptions import SessionNotFound

if TYPE_CHECKING:
    from persistent_memory.backends.memory.sessions import IndexedTable


class MemoryMaintenance:
    """The contract's maintenance in batches (``scan_sessions``, ``existing``, ``infos``,
    ``summarize_many``, ``sweep``, ``forget_namespace``) and the dirty set (``pop_dirty``,
    ``dirty_count``, ``mark_dirty``)."""

    def __init__(self, table: IndexedTable) -> None:
        self._table = table

    def scan_sessions(self, cursor: int, count: int, prefix: str = "") -> tuple[int, list[str]]:
        # All at once: at most MAX_SESSIONS ids, and no id is skipped when sessions go
        # between batches.
        with self._table._lock:
            return 0, sorted(sid for sid in self._table._sessions if sid.startswith(prefix))

    def existing(self, session_ids: list[str]) -> set[str]:
        now = time.time()
        with self._table._lock:
            return {
                sid
                for sid in session_ids
                if sid in self._table._sessions and not self._table._sessions[sid].expired(now)
            }

    def infos(self, session_ids: list[str]) -> dict[str, SessionInfo]:
        now = time.time()
        with self._table._lock:
            return {
                sid: self._table._info(sid, self._table._sessions[sid])
                for sid in session_ids
                if sid in self._table._sessions and not self._table._sessions[sid].expired(now)
            }

    def summarize_many(self, session_ids: list[str], max_entries: int) -> dict[str, int]:
        folded: dict[str, int] = {}
        for session_id in session_ids:
            try:
                folded[session_id] = self._table.summarize(session_id, max_entries)
            except SessionNotFound:
                continue
        return folded

    def sweep(self, *, dry_run: bool, batch_size: int, prefix: str = "") -> dict[str, int]:
        now = time.time()
        with self._table._lock:
            expired = [
                sid
                for sid, session in self._table._sessions.items()
                if session.expired(now) and sid.startswith(prefix)
            ]
            stale_runs = [
                r
                for r, (sid, until) in self._table._runs.items()
                if sid.startswith(prefix) and (until <= now or sid not in self._table._sessions)
            ]
            if not dry_run:
                # Idempotency records are not leftovers: only expired ones go, uncounted.
                self._table._records = {
                    ref: r
                    for ref, r in self._table._records.items()
                    if r.expires_at > now or not ref.startswith(prefix)
                }
                for session_id in expired:
                    self._table._drop(session_id)
                    self._table._mark(session_id)
                for run_id in stale_runs:
                    self._table._runs.pop(run_id, None)
                for session_id, session in self._table._sessions.items():
                    if session.runs and session_id.startswith(prefix):
                        self._table._prune_session_runs(session_id, session)
        return {"expired_sessions": len(expired), "leftover_keys": 0, "run_bindings": len(stale_runs)}

    def pop_dirty(self, count: int) -> list[str]:
        with self._table._lock:
            taken = [self._table._dirty.pop() for _ in range(min(count, len(self._table._dirty)))]
        return taken

    def dirty_count(self) -> int:
        return len(self._table._dirty)

    def mark_dirty(self, session_ids: list[str]) -> None:
        with self._table._lock:
            self._table._dirty.update(session_ids)

    def forget_namespace(self, namespace: str) -> int:
        mark = f"{namespace}:"
        with self._table._lock:
            records = [ref for ref in self._table._records if ref.startswith(mark)]
            runs = [ref for ref in self._table._runs if ref.startswith(mark)]
            for ref in records:
                del self._table._records[ref]
            for ref in runs:
                del self._table._runs[ref]
            if self._table.journal is not None:
                self._table.journal.forget_records(mark)
        return len(records) + len(runs)
