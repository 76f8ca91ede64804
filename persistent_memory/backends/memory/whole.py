"""The memory backend's whole sessions, for the mirror, export and import: a session's
snapshot (its info, values, history, conversations and checkpoints) and its restore.

Held by :class:`~persistent_memory.backends.memory.MemoryBackend` as ``whole_sessions``,
which gives it its session table (:class:`~.sessions.IndexedTable`); a restore is
journaled, and replayed, as the table's other writes are.
"""

from __future__ import annotations

import copy
import time
from typing import TYPE_CHECKING

from persistent_memory.backends.base import SessionSnapshot
from persistent_memory.backends.memory.checkpoints import Checkpoints
from persistent_memory.backends.memory.tree import Tree
from persistent_memory.exceptions import SessionExists

if TYPE_CHECKING:
    from persistent_memory.backends.memory.sessions import IndexedTable


class MemoryWholeSessions:
    """The contract's ``snapshots`` and ``restore_session``."""

    def __init__(self, table: IndexedTable) -> None:
        self._table = table

    def snapshots(
        self, session_ids: list[str], *, checkpoints: bool = True
    ) -> dict[str, SessionSnapshot | None]:
        now = time.time()
        result: dict[str, SessionSnapshot | None] = {}
        with self._table._lock:
            seq = self._table.journal.seq if self._table.journal is not None else 0
            for session_id in session_ids:
                session = self._table._sessions.get(session_id)
                if session is None or session.expired(now):
                    result[session_id] = None
                    continue
                # Entries are never changed once appended, and snapshot readers (the
                # mirror, export) only read them: a copy of each entry is enough, and a
                # deep copy of every history was most of a mirror sync's reading time.
                result[session_id] = {
                    "info": self._table._info(session_id, session),
                    "values": dict(session.values),
                    "history": [dict(entry) for entry in session.history],
                    "conversations": {name: tree.snapshot() for name, tree in session.conversations.items()},
                    "journal_seq": seq,
                }
                if session.checkpoints is not None:
                    result[session_id]["checkpoints"] = dict(session.checkpoints.entries)
                    result[session_id]["checkpoint_state"] = session.checkpoints.snapshot_state()
        return result

    def restore_session(self, snapshot: SessionSnapshot, *, replace: bool) -> None:
        with self._table._lock:
            self._restore_op(time.time(), snapshot["info"]["session_id"], snapshot, replace)

    def _restore_op(self, now: float, session_id: str, snapshot: SessionSnapshot, replace: bool) -> None:
        if self._table._is_live(session_id, now) and not replace:
            raise SessionExists(f"Session {session_id!r} already exists.")
        info = snapshot["info"]
        kept = {
            key: snapshot[key]
            for key in ("info", "values", "history", "conversations", "checkpoints")
            if key in snapshot
        }
        self._table._admit(session_id, now)  # replacing a live session takes no new place
        self._table._log("restore", session_id, now, kept, replace)
        self._table._drop(session_id)
        session = self._table._create(session_id, info["ttl_seconds"], now, created_at=info["created_at"])
        session.expires_at = info["expires_at"]
        session.idle_ttl_seconds = info.get("idle_ttl_seconds")
        if session.idle_ttl_seconds and info["ttl_seconds"]:
            session.deadline = info["created_at"] + info["ttl_seconds"]
        session.values = dict(snapshot["values"])
        session.size = sum(len(key) + len(text) for key, text in session.values.items())
        session.history = copy.deepcopy(snapshot["history"])
        for name, conversation in snapshot.get("conversations", {}).items():
            tree = session.conversations[name] = Tree.restore(conversation)
            session.size += tree.size
        if snapshot.get("checkpoints"):
            # The mirror's counters only when loading the mirror (see mirror_checkpoints).
            state = snapshot.get("checkpoint_state") if self._table._restoring else None
            session.checkpoints = Checkpoints.restore(snapshot["checkpoints"], state)
            session.size += session.checkpoints.size
