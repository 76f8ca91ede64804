"""The memory backend's side of the write-ahead journal (:mod:`persistent_memory.journal`):
opening it, replaying it at a start, and the checkpoints the mirror takes of it.

Held by :class:`~persistent_memory.backends.memory.MemoryBackend` as ``journaling``, which
gives it its session table (:class:`~.sessions.IndexedTable`): the replay applies each
record through the table's own write at a given time (its ``_op`` methods and its parts'),
so a replayed write gives the same state as the original.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from persistent_memory.backends.base import Checkpoint, IdempotencyRecord
from persistent_memory.backends.memory.once import Recorded, decoded
from persistent_memory.backends.memory.replay import MalformedRecord, check_record
from persistent_memory.exceptions import PersistentMemoryError
from persistent_memory.journal import Journal

if TYPE_CHECKING:
    from persistent_memory.backends.memory.sessions import IndexedTable

# The backend's logger, as before the journal's part had a module of its own.
logger = logging.getLogger("persistent_memory.backends.memory.backend")


class MemoryJournaling:
    """The contract's journal methods (``replay``, ``restoring``, ``checkpoint``,
    ``drop_segments``, ``journal_size``, ``idempotency_size``, ``journal_skipped``) and
    ``open_journal``; the journal itself is the table's ``journal`` (None: none)."""

    def __init__(self, table: IndexedTable) -> None:
        self._table = table

    def open_journal(self, directory: str | os.PathLike[str]) -> None:
        """Journal every write in ``directory`` from now on (see :meth:`replay`), and take
        back the idempotency records kept there (they outlive the journal's segments)."""
        self._table.journal = Journal(directory)
        with self._table._lock:
            for ref, fingerprint, expires_at, result in self._table.journal.remembered(time.time()):
                try:
                    self._table._records[ref] = Recorded(fingerprint, decoded(result), expires_at)
                except (KeyError, TypeError, ValueError):  # not what encoded() makes
                    # A start must not fail on one bad record: that key is merely not kept.
                    logger.warning("persistent_memory: skipping an idempotency record that does not decode")

    def replay(self, mirrored: dict[str, int]) -> list[str]:
        """Apply the journal's records newer than each session's mirrored point
        (``mirrored``: storage id -> journal seq of its mirror row); return the ids of
        the sessions replayed (marked dirty, so the mirror catches up with them)."""
        journal = self._table.journal
        if journal is None:
            return []
        ops = {
            "create": self._table._create_op,
            "delete": self._table._delete_op,
            "put": self._table._put_op,
            "increment": self._table._increment_op,
            "clear": self._table._clear_op,
            "summarize": self._table._summarize_op,
            "enrich": self._table._enrich_op,
            "answer": self._table._answer_op,
            "restore": self._table.whole_sessions._restore_op,
            "bind": self._table._bind_op,
            "messages": self._table.conversations._messages_op,
            "head": self._table.conversations._head_op,
            "clear_messages": self._table.conversations._clear_messages_op,
            "pop": self._table.conversations._pop_op,
            "thread": self._table.conversations._thread_op,
            "summary": self._table.summaries._summary_op,
            "cp_put": self._table.checkpoints._cp_put_op,
            "cp_writes": self._table.checkpoints._cp_writes_op,
            "cp_prune": self._table.checkpoints._cp_prune_op,
            "cp_load": self._table.checkpoints._cp_load_op,
            "cp_replace": self._table.checkpoints._cp_replace_op,
        }
        replayed: dict[str, None] = {}
        kept = dict(self._table._records)  # read back from the record files by open_journal
        with self._table._lock, self.restoring():
            for seq, (_, op, session_id, now, idempotency, *args), where in journal.entries():
                if op != "bind" and seq <= mirrored.get(session_id, 0):
                    continue
                try:  # all of it, before any of it is applied
                    check_record(op, session_id, args)
                except MalformedRecord as exc:
                    journal.skip(where, str(exc))
                    continue
                try:
                    result = ops[op](now, session_id, *args)
                except PersistentMemoryError:
                    continue  # it failed the same way when it was made
                except Exception as exc:  # a bug: the checks let through what a write cannot make
                    logger.exception("persistent_memory: journal record %s failed to replay", where)
                    journal.skip(where, f"failed to replay: {type(exc).__name__}")
                    continue
                # Its answer may have been lost: a retry gets it. Not one read back from the
                # record files: that is the answer the client got (a replay onto a state the
                # mirror restored may differ), and it is on disk already.
                keyed = IdempotencyRecord(*idempotency) if idempotency is not None else None
                if keyed is not None and keyed.ref not in kept:
                    self._table._remember(keyed, result, now)
                if op != "bind":
                    replayed[session_id] = None
                    self._table._mark(session_id)
        # A write killed between its journal record and its idempotency record: the replay
        # made the record; on disk too, or the next checkpoint would lose it.
        with self._table._lock:
            for ref, recorded in self._table._records.items():
                if kept.get(ref) != recorded:
                    self._table._keep(ref, recorded)
        journal.seq = max(journal.seq, *mirrored.values(), 0)
        return list(replayed)

    @contextmanager
    def restoring(self) -> Iterator[None]:
        # What a restore loads is in the mirror or the journal already. The store
        # refuses calls while it restores, so nothing else writes meanwhile.
        journal, self._table.journal = self._table.journal, None
        self._table._restoring = True
        try:
            yield
        finally:
            self._table.journal = journal
            self._table._restoring = False

    def checkpoint(self) -> Checkpoint | None:
        with self._table._lock:
            journal = self._table.journal
            if journal is None or not journal.owned:
                return None
            if journal.seq == self._table._rotated_at and not self._table._dirty:
                return None  # nothing written since the last checkpoint, and that one worked
            segments = journal.rotate()
            # Run bindings are not mirrored: the new segment carries the live ones.
            now = time.time()
            journal.expire_records(now)
            for run_id, (session_id, until) in self._table._runs.items():
                if until > now:
                    session = self._table._sessions.get(session_id)
                    question = session.questions.get(run_id) if session else None
                    journal.append("bind", run_id, now, None, session_id, until, question)
            self._table._rotated_at = journal.seq
            dirty, self._table._dirty = self._table._dirty, set()
            return Checkpoint(segments, sorted(dirty))

    def drop_segments(self, segments: list[Any]) -> None:
        if self._table.journal is not None:
            self._table.journal.drop(segments)

    def journal_size(self) -> int | None:
        return None if self._table.journal is None else self._table.journal.size()

    def idempotency_size(self) -> int | None:
        return None if self._table.journal is None else self._table.journal.records_size()

    def journal_skipped(self) -> int | None:
        return None if self._table.journal is None else len(self._table.journal.skipped)
