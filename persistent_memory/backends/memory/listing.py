"""The memory backend's listing of sessions: every id, every info, or one page.

Held by :class:`~persistent_memory.backends.memory.MemoryBackend` as ``listing``, which
gives it its session table (:class:`~.sessions.IndexedTable`): the sessions, and the
listing's indexes the table keeps sorted per owner namespace, by creation time and by id
(a page is a range of one of them, never a sort of every session).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Iterable
from itertools import islice
from typing import TYPE_CHECKING

from persistent_memory.backends.base import SessionInfo
from persistent_memory.owners import namespace_of

if TYPE_CHECKING:
    from persistent_memory.backends.memory.sessions import IndexedTable


class MemoryListing:
    """The contract's ``list_sessions``, ``list_session_infos`` and ``list_session_page``."""

    def __init__(self, table: IndexedTable) -> None:
        self._table = table

    def list_sessions(self) -> list[str]:
        with self._table._lock:
            self._table._prune(time.time())
            return sorted(self._table._sessions)

    def list_session_infos(self, prefix: str = "") -> list[SessionInfo]:
        with self._table._lock:
            self._table._prune(time.time())
            return [
                self._table._info(sid, s)
                for sid, s in self._table._sessions.items()
                if sid.startswith(prefix)
            ]

    def list_session_page(
        self, prefix: str, offset: int, limit: int, *, after: tuple[float, str] | None = None
    ) -> tuple[int, list[SessionInfo]]:
        namespace = namespace_of(prefix)
        now = time.time()
        page: list[SessionInfo] = []
        with self._table._lock:
            ordered = self._table._by_time.get(namespace, [])
            names = self._table._by_name.get(namespace, [])
            first = bisect_left(names, prefix)
            total = bisect_left(names, prefix + "\U0010ffff", first) - first
            # Newest first from the position after ``after``: indexes below ``top``, down.
            top = len(ordered) if after is None else bisect_left(ordered, after)
            if total == len(ordered):  # no search, or every id matches: a range of the time order
                position = top - 1 - offset
                while len(page) < limit and position >= 0:
                    # A dropped one leaves the ones below it where they were.
                    if not self._add_live(page, ordered[position][1], now):
                        total -= 1
                    position -= 1
                return total, page
            matches: Iterable[str]
            if total * 8 > len(ordered):  # a wide search: filtering the time order costs less
                matches = (ordered[i][1] for i in range(top - 1, -1, -1) if ordered[i][1].startswith(prefix))
            else:  # a narrow one: sort the matches
                narrow = [
                    sid
                    for sid in names[first : first + total]
                    if after is None or (self._table._sessions[sid].created_at, sid) < after
                ]
                matches = sorted(
                    narrow, key=lambda sid: (self._table._sessions[sid].created_at, sid), reverse=True
                )
            for session_id in islice(matches, offset, None):
                if len(page) == limit:
                    break
                if not self._add_live(page, session_id, now):
                    total -= 1
            return total, page

    def _add_live(self, page: list[SessionInfo], session_id: str, now: float) -> bool:
        """Add a live session's info to ``page``; drop an expired one (False)."""
        session = self._table._sessions[session_id]
        if session.expired(now):
            self._table._drop(session_id)
            self._table._mark(session_id)
            return False
        page.append(self._table._info(session_id, session))
        return True
