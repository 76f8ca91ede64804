"""The Redis backend's listing of sessions: every id, every info, or one page.

A namespace's sessions are listed from its indexes (two sorted sets in each bucket, by
creation time and by name: see :mod:`.layout`): in one script up to
``ONE_STEP_LIST_LIMIT`` sessions, else in batches of a scan; a page is sought by the
script in the node layout's one index, and merged from every bucket's in the cluster
layout's (:meth:`RedisListing._merged`). Also here: :func:`info_of`, a session's info as
the library's replies give it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

from persistent_memory.backends.base import SessionInfo, session_info
from persistent_memory.backends.redis.layout import Layout
from persistent_memory.backends.redis.transport import RedisTransport, _TooMany
from persistent_memory.exceptions import SessionExpired
from persistent_memory.owners import namespace_of

# The backend's logger, as before the listing had a module of its own: logging set up for
# it still shows the listing's warnings.
logger = logging.getLogger("persistent_memory.backends.redis.backend")

#: Up to this many sessions, listing them is one script; beyond, batches (see redis.lua).
ONE_STEP_LIST_LIMIT = 2000


def _position(after: tuple[float, str] | None) -> tuple[str, str]:
    """ARGV of a page's start (see indexes.lua): a creation time as the text Redis parses
    back to the same double (``repr``), and an id; empty for the first page."""
    return ("", "") if after is None else (repr(after[0]), after[1])


def _page_order(info: Any) -> tuple[float, str]:
    """The listing's order, as the time index sorts it (score, then the id's bytes)."""
    return info["created_at"], info["session_id"]


def _scored(reply: list[Any]) -> list[tuple[bytes, Any]]:
    """The (member, score) pairs of a WITHSCORES reply: flat in RESP2, pairs in RESP3 (and
    from the cluster client, which parses it)."""
    if reply and isinstance(reply[0], list | tuple):
        return [(pair[0], pair[1]) for pair in reply]
    return list(zip(reply[::2], reply[1::2], strict=True))


def _log_damaged(count: int) -> None:
    logger.warning("A listing skipped %d session(s) whose Redis keys are not of their type.", count)


def _parse_ttl(raw: bytes | None) -> float | None:
    if raw is None or raw == b"None":
        return None
    text = raw.decode()
    return int(text) if text.lstrip("-").isdigit() else float(text)


def _seconds(ms: str) -> float | int | None:
    """Milliseconds as the script writes them ('' for none) in seconds."""
    if not ms:
        return None
    seconds = int(ms) / 1000
    return int(seconds) if seconds.is_integer() else seconds


def info_of(session_id: str, reply: list[Any]) -> SessionInfo:
    """A session's info from its six fields in a reply of the library ('info', 'create',
    and each session of a listing's)."""
    created_at, ttl, key_count, history_length, expire_ms, idle = reply[:6]
    if created_at is None:  # the meta expired between the script's commands
        raise SessionExpired(f"Session {session_id!r} has expired.")
    idle_ms, _, deadline_ms = idle.decode().partition(" ")
    return session_info(
        session_id,
        created_at=float(created_at),
        ttl_seconds=_parse_ttl(ttl),
        expires_at=expire_ms / 1000 if expire_ms >= 0 else None,
        key_count=key_count,
        history_length=history_length,
        idle_ttl_seconds=_seconds(idle_ms),
        deadline=_seconds(deadline_ms),
    )


def _page_of(reply: list[Any], *, ids_only: bool, first: int = 2) -> tuple[int, list[SessionInfo]]:
    """The count and the sessions of a 'page' reply (of a 'bucket_page' reply: its
    sessions start at ``first``); ``ids_only``: each one's id and creation time alone."""
    step = 2 if ids_only else 7
    infos: list[Any] = []
    for i in range(first, len(reply), step):
        session_id = reply[i].decode()
        if ids_only:
            infos.append({"session_id": session_id, "created_at": float(reply[i + 1])})
        else:
            infos.append(info_of(session_id, reply[i + 1 : i + 7]))
    return reply[0], infos


class RedisListing:
    """The sessions of a namespace, listed (the contract's ``list_sessions``,
    ``list_session_infos`` and ``list_session_page``), through the calls the backend
    gives it: ``run`` and ``command`` (a call of the library, sent or built),
    ``each_root`` (a call in every bucket), ``scan_sessions`` and ``infos`` (the walk
    of many sessions in batches)."""

    def __init__(
        self,
        *,
        layout: Layout,
        transport: RedisTransport,
        run: Callable[..., Any],
        command: Callable[..., tuple[Any, ...]],
        each_root: Callable[..., list[Any]],
        scan_sessions: Callable[[int, int, str], tuple[int, list[str]]],
        infos: Callable[[list[str]], dict[str, SessionInfo]],
    ) -> None:
        self._layout = layout
        self._transport = transport
        self._run = run
        self._command = command
        self._each_root = each_root
        self._scan_sessions = scan_sessions
        self._infos = infos

    def list_sessions(self) -> list[str]:
        try:
            replies = self._each_root("list", "", str(ONE_STEP_LIST_LIMIT))
        except _TooMany:
            return sorted(info["session_id"] for info in self._scan_infos(""))
        return sorted(item.decode() for reply in replies for item in reply)

    def list_session_infos(self, prefix: str = "") -> list[SessionInfo]:
        try:
            replies = self._each_root(
                "list_info", prefix, str(ONE_STEP_LIST_LIMIT), namespace=namespace_of(prefix)
            )
        except _TooMany:
            return self._scan_infos(prefix)
        return [
            info_of(flat[i].decode(), flat[i + 1 : i + 7]) for flat in replies for i in range(0, len(flat), 7)
        ]

    def _scan_infos(self, prefix: str) -> list[SessionInfo]:
        """Many sessions: SSCAN and one pipelined step per batch, so Redis is never held long."""
        infos: list[SessionInfo] = []
        cursor = 0
        while True:
            cursor, ids = self._scan_sessions(cursor, 500, prefix)
            wanted = [sid for sid in dict.fromkeys(ids) if sid.startswith(prefix)]
            infos.extend(self._infos(wanted).values())
            if cursor == 0:
                return list({info["session_id"]: info for info in infos}.values())

    def list_session_page(
        self, prefix: str, offset: int, limit: int, *, after: tuple[float, str] | None = None
    ) -> tuple[int, list[SessionInfo]]:
        namespace = namespace_of(prefix)
        roots = self._layout.roots()
        if len(roots) == 1:  # one index: the script seeks the page itself
            position = _position(after)
            reply = self._run(
                "page", "", prefix, str(offset), str(limit), *position, "", root=roots[0], namespace=namespace
            )
            if reply[1]:
                _log_damaged(reply[1])
            return _page_of(reply, ids_only=False)
        if offset:
            # The cluster layout: where the page starts (an offset counts index positions,
            # as in the node layout), read as ids alone; then the page from there.
            passed = self._passed(prefix, offset, after)
            if len(passed) < offset:  # past the end: the count alone
                return self._merged(0, after, self._bucket_pages(prefix, ids_only=False))[0], []
            after = _page_order(passed[-1])
        return self._merged(limit, after, self._bucket_pages(prefix, ids_only=False))

    def _passed(self, prefix: str, offset: int, after: tuple[float, str] | None) -> list[Any]:
        """The first ``offset`` entries of the listing's indexes after ``after`` (ids and
        creation times). From the top without a search, plain rank ranges of the time
        indexes (a script costs several times their reading); else 'bucket_page'."""
        namespace = namespace_of(prefix)
        if after is not None or prefix != namespace:
            return self._merged(offset, after, self._bucket_pages(prefix, ids_only=True))[1]
        by_time = {root: self._layout.bucket_keys(root, namespace)[5] for root in self._layout.roots()}

        def read(asked: dict[str, tuple[Any, float, int]]) -> dict[str, Any]:
            ranges = {root: (start or 0, keep) for root, (start, _, keep) in asked.items()}
            commands = [
                ("ZREVRANGE", by_time[root], str(first), str(first + keep - 1), "WITHSCORES")
                for root, (first, keep) in ranges.items()
            ]
            replies = self._transport.checked(
                self._transport.redirected_again(commands, self._transport.batch(commands))
            )
            answers = {}
            for (root, (first, keep)), reply in zip(ranges.items(), replies, strict=True):
                entries = [{"session_id": i.decode(), "created_at": float(t)} for i, t in _scored(reply)]
                more = (first + keep, _page_order(entries[-1])) if len(entries) == keep else None
                answers[root] = (0, 0, entries, more)  # the count of the page is its own
            return answers

        return self._merged(offset, None, read)[1]

    def _bucket_pages(self, prefix: str, *, ids_only: bool) -> Callable[[dict[str, Any]], dict[str, Any]]:
        """A reader for :meth:`_merged`: each bucket's 'bucket_page' (indexes.lua) from its
        position, the damaged sessions skipped logged."""
        namespace = namespace_of(prefix)

        def read(asked: dict[str, tuple[Any, float, int]]) -> dict[str, Any]:
            commands = [
                self._command(
                    "bucket_page",
                    "",
                    (prefix, repr(part), str(keep), *_position(start), "1" if ids_only else ""),
                    root=root,
                    namespace=namespace,
                )
                for root, (start, part, keep) in asked.items()
            ]
            replies = self._transport.checked(self._transport.run_many(commands))
            damaged = sum(reply[1] for reply in replies)
            if damaged:
                _log_damaged(damaged)
            answers = {}
            for root, reply in zip(asked, replies, strict=True):
                count, infos = _page_of(reply, ids_only=ids_only, first=5)
                last = (float(reply[3]), reply[4].decode()) if reply[4] else None
                answers[root] = (count, reply[1] + reply[2], infos, last and (last, last))
            return answers

        return read

    def _merged(
        self, want: int, after: tuple[float, str] | None, read: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> tuple[int, list[Any]]:
        """The ``want`` first sessions (or entries) after ``after`` over every bucket, and
        the count (of a ``read`` of index ranges: how far they reached).

        Each bucket is asked for its part of the page, twice its even part (the ids of a
        namespace are spread evenly over the buckets by a hash), and for at most two
        sessions more; ``read`` answers, for each bucket asked, its count, how many of it
        it found gone or damaged, what it found and, unless it holds nothing more, where
        to read on and the position (time, id) of the last id it examined. A bucket whose
        position would still be on the merged page may hold more of it, and is asked
        again from there for twice as much, until none can: a bucket reads about ``want``
        ids (of a search's matches) at most, and a page usually needs one round trip.
        """
        roots = self._layout.roots()
        found: dict[str, list[Any]] = {root: [] for root in roots}
        counts: dict[str, int] = {}
        parts = dict.fromkeys(roots, 2 * want / len(roots))
        pending: dict[str, Any] = dict.fromkeys(roots, after)
        while pending:
            answers = read(
                {
                    root: (start, parts[root], min(want, math.ceil(parts[root]) + 2))
                    for root, start in pending.items()
                }
            )
            reached = {}
            for root, (count, dropped, entries, more) in answers.items():
                # a bucket asked again counts on from its first count
                counts[root] = counts.get(root, count) - dropped
                found[root].extend(entries)
                if more is not None:
                    reached[root] = more
            merged = sorted(
                (entry for entries in found.values() for entry in entries), key=_page_order, reverse=True
            )[:want]
            end = _page_order(merged[-1]) if len(merged) == want and want else None
            pending = {}
            for root, (start, last) in reached.items():
                if end is None or last > end:
                    pending[root] = start
                    parts[root] = min(want, parts[root] * 2)
        return sum(counts.values()), merged
