"""The memory backend's checkpoints (the contract in :mod:`.checkpoints`).

Held by :class:`~persistent_memory.backends.memory.MemoryBackend` as ``checkpoints``, which gives it
its session table (:class:`~.sessions.SessionTable`): each write takes the
backend's lock, journals itself, then changes the session and marks it for the mirror.
The mirror holds what the journal lets go (see :mod:`persistent_memory.mirror.checkpoints`):
each entry carries the session's change counter when it was last written, so a sync
writes only the entries changed since the one before.
"""

from __future__ import annotations

import time
import uuid
from bisect import bisect_left, insort
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from persistent_memory.backends.checkpoints import (
    LINK_SEP,
    SEP,
    StoredCheckpoint,
    checkpoint_key,
    delta_base,
    entry_bytes,
    has_id,
    merge_writes,
)
from persistent_memory.exceptions import CheckpointBaseMissing

if TYPE_CHECKING:
    from persistent_memory.backends.memory.sessions import Session, SessionTable


@dataclass
class Checkpoints:
    """One session's checkpoint entries (names as in :mod:`.checkpoints`)."""

    entries: dict[str, str] = field(default_factory=dict)
    #: Checkpoint keys ('{ns}\x1f{id}'), sorted: a namespace's are together, oldest first.
    index: list[str] = field(default_factory=list)
    #: The change counter, each entry's value of it when last written, and its value at the
    #: last removal (the mirror then rewrites them all). A new epoch (a new session, an
    #: import) is a new count: the mirror rewrites them all then too.
    epoch: str = field(default_factory=lambda: uuid.uuid4().hex)
    seq: int = 0
    seqs: dict[str, int] = field(default_factory=dict)
    removed_at: int = 0
    #: Bytes of the entries (see entry_bytes); the session's ``size`` counts them too.
    size: int = 0

    def set(self, name: str, text: str) -> None:
        self.seq += 1
        old = self.entries.get(name)
        self.size += entry_bytes(name, text) - (0 if old is None else entry_bytes(name, old))
        self.entries[name] = text
        self.seqs[name] = self.seq

    def growth(self, changes: dict[str, str], *, replace: bool = False) -> int:
        """How many bytes writing ``changes`` (name -> text) adds (with ``replace``: in
        place of every entry held)."""
        if replace:
            return sum(entry_bytes(name, text) for name, text in changes.items()) - self.size
        grown = 0
        for name, text in changes.items():
            old = self.entries.get(name)
            grown += entry_bytes(name, text) - (0 if old is None else entry_bytes(name, old))
        return grown

    def _pop(self, name: str) -> None:
        text = self.entries.pop(name, None)
        if text is not None:
            self.size -= entry_bytes(name, text)
        self.seqs.pop(name, None)

    def add(self, key: str, record: str, link_text: str) -> None:
        if "c" + key not in self.entries:
            insort(self.index, key)
        self.set("c" + key, record)
        self.set("l" + key, link_text)

    def stored(self, key: str) -> StoredCheckpoint:
        ns, checkpoint_id = key.rsplit(SEP, 1)
        refs = self.entries["l" + key].split(LINK_SEP)[1:]
        blobs = {ref: text for ref in refs if (text := self.entries.get(f"b{ns}{SEP}{ref}")) is not None}
        return StoredCheckpoint(
            ns, checkpoint_id, self.entries["c" + key], self.entries.get("w" + key), blobs
        )

    def keys_of(self, ns: str | None) -> list[str]:
        """Checkpoint keys of ``ns`` (None: all), oldest first within a namespace."""
        if ns is None:
            return self.index
        start = bisect_left(self.index, ns + SEP)
        end = bisect_left(self.index, ns + chr(ord(SEP) + 1))
        return self.index[start:end]

    def clear(self) -> None:
        """Remove every entry (the mirror then rewrites them all)."""
        self.seq += 1
        self.removed_at = self.seq
        self.entries, self.index, self.seqs, self.size = {}, [], {}, 0

    def remove(self, keys: list[str]) -> int:
        """Remove checkpoints, their writes, and values no checkpoint left references."""
        if not keys:
            return 0
        self.seq += 1
        self.removed_at = self.seq
        gone = set(keys)
        self.index = [key for key in self.index if key not in gone]
        for key in keys:
            for kind in "clw":
                self._pop(kind + key)
        referenced: set[str] = set()
        for key in self.index:
            ns = key.rsplit(SEP, 1)[0]
            for ref in self.entries["l" + key].split(LINK_SEP)[1:]:
                referenced.update(self.chain_names(ns, ref, referenced))
        for name in [name for name in self.entries if name[0] == "b" and name not in referenced]:
            self._pop(name)
        return len(keys)

    def chain_names(self, ns: str, ref: str, known: set[str] | frozenset[str] = frozenset()) -> list[str]:
        """The entry of value ``ref`` and those of the values it extends, in turn, up to one
        in ``known`` (a chain walked already: its rest is known too)."""
        names: list[str] = []
        seen: set[str] = set()
        while (text := self.entries.get(name := f"b{ns}{SEP}{ref}")) is not None:
            if name in seen or name in known:
                break
            names.append(name)
            seen.add(name)
            base = delta_base(text)
            if base is None:
                break
            ref = base[0]
        return names

    def check_bases(self, ns: str, blobs: dict[str, str]) -> None:
        """CheckpointBaseMissing unless each delta among ``blobs`` extends a value held."""
        for ref, text in blobs.items():
            base = delta_base(text)
            if base is not None and not has_id(
                blobs.get(base[0]) or self.entries.get(f"b{ns}{SEP}{base[0]}"), base[1]
            ):
                raise CheckpointBaseMissing(
                    f"The value of {ref!r} extends a value this thread does not hold."
                )

    def snapshot_state(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "seq": self.seq, "removed_at": self.removed_at, "seqs": dict(self.seqs)}

    @classmethod
    def restore(cls, entries: dict[str, str], state: dict[str, Any] | None = None) -> Checkpoints:
        """From entries (and, from the mirror, the counters they were mirrored with; else
        they start a new epoch, which the mirror writes whole)."""
        restored = cls(dict(entries), sorted(name[1:] for name in entries if name[0] == "c"))
        restored.size = sum(entry_bytes(name, text) for name, text in entries.items())
        if state is None:
            restored.seqs = dict.fromkeys(entries, 0)
        else:
            restored.epoch, restored.seq, restored.seqs = state["epoch"], state["seq"], dict(state["seqs"])
        return restored


class MemoryCheckpoints:
    """Checkpoints held in each session's ``checkpoints``."""

    def __init__(self, table: SessionTable) -> None:
        self._table = table

    def _checkpoints(self, session: Session) -> Checkpoints:
        if session.checkpoints is None:
            session.checkpoints = Checkpoints()
        return session.checkpoints

    def _live_or_created(self, session_id: str, now: float, op: str, *args: Any) -> Session:
        """The live session, else a new one (``args[-1]``: its TTL), once ``op`` is journaled."""
        live = self._table._is_live(session_id, now)
        if not live:
            self._table._admit(session_id, now)
        self._table._log(op, session_id, now, *args)
        return self._table._sessions[session_id] if live else self._table._create(session_id, args[-1], now)

    def _held_now(self, session_id: str, now: float) -> tuple[Session | None, Checkpoints]:
        """The live session (None: none) and its checkpoints (empty ones: none), for a write
        to check before it writes."""
        session = self._table._sessions[session_id] if self._table._is_live(session_id, now) else None
        held = session.checkpoints if session is not None else None
        return session, held if held is not None else Checkpoints()

    def _cp_room(self, session: Session | None, grown: int) -> None:
        """QuotaExceeded when ``grown`` more bytes would take the session (None: a new one)
        over ``max_session_bytes``: its checkpoints count with its values and messages."""
        self._table._within_cap((session.size if session is not None else 0) + grown)

    def _written(self, session_id: str, session: Session, now: float, before: int) -> None:
        """After a write that took the session's checkpoints from ``before`` bytes."""
        session.size += self._checkpoints(session).size - before
        self._table._touch(session, now)
        self._table._mark(session_id)

    def put_checkpoint(
        self,
        session_id: str,
        ns: str,
        checkpoint_id: str,
        record: str,
        link_text: str,
        blobs: dict[str, str],
        ttl_seconds: float | None,
    ) -> None:
        with self._table._lock:
            self._cp_put_op(time.time(), session_id, ns, checkpoint_id, record, link_text, blobs, ttl_seconds)

    def _cp_put_op(
        self,
        now: float,
        session_id: str,
        ns: str,
        checkpoint_id: str,
        record: str,
        link_text: str,
        blobs: dict[str, str],
        ttl_seconds: float | None,
    ) -> None:
        live, held = self._held_now(session_id, now)
        held.check_bases(ns, blobs)
        key = checkpoint_key(ns, checkpoint_id)
        changes = {f"b{ns}{SEP}{ref}": text for ref, text in blobs.items()}
        changes.update({"c" + key: record, "l" + key: link_text})
        self._cp_room(live, held.growth(changes))
        args = (ns, checkpoint_id, record, link_text, blobs, ttl_seconds)
        session = self._live_or_created(session_id, now, "cp_put", *args)
        checkpoints = self._checkpoints(session)
        before = checkpoints.size
        for ref, text in blobs.items():
            checkpoints.set(f"b{ns}{SEP}{ref}", text)
        checkpoints.add(key, record, link_text)
        self._written(session_id, session, now, before)

    def put_checkpoint_writes(
        self,
        session_id: str,
        ns: str,
        checkpoint_id: str,
        writes: list[list[object]],
        ttl_seconds: float | None,
    ) -> None:
        with self._table._lock:
            self._cp_writes_op(time.time(), session_id, ns, checkpoint_id, writes, ttl_seconds)

    def _cp_writes_op(
        self,
        now: float,
        session_id: str,
        ns: str,
        checkpoint_id: str,
        writes: list[list[object]],
        ttl_seconds: float | None,
    ) -> None:
        live, held = self._held_now(session_id, now)
        name = "w" + checkpoint_key(ns, checkpoint_id)
        merged = merge_writes(held.entries.get(name), writes)
        self._cp_room(live, held.growth({name: merged}))
        session = self._live_or_created(session_id, now, "cp_writes", ns, checkpoint_id, writes, ttl_seconds)
        checkpoints = self._checkpoints(session)
        before = checkpoints.size
        checkpoints.set(name, merged)
        self._written(session_id, session, now, before)

    def get_checkpoint(self, session_id: str, ns: str, checkpoint_id: str | None) -> StoredCheckpoint | None:
        with self._table._lock:
            checkpoints = self._held(session_id)
            if checkpoints is None:
                return None
            if checkpoint_id is None:
                keys = checkpoints.keys_of(ns)
                return checkpoints.stored(keys[-1]) if keys else None
            key = checkpoint_key(ns, checkpoint_id)
            return checkpoints.stored(key) if "c" + key in checkpoints.entries else None

    def _held(self, session_id: str) -> Checkpoints | None:
        """The live session's checkpoints for a read (None: no session, or none)."""
        now = time.time()
        if not self._table._is_live(session_id, now):
            return None
        return self._table._read(session_id, now).checkpoints

    def list_checkpoints(
        self, session_id: str, ns: str | None, before: str | None, offset: int, limit: int
    ) -> list[StoredCheckpoint]:
        with self._table._lock:
            checkpoints = self._held(session_id)
            if checkpoints is None:
                return []
            keys = checkpoints.keys_of(ns)
            if ns is not None:
                chosen = reversed(keys[: bisect_left(keys, checkpoint_key(ns, before))] if before else keys)
            else:  # namespace by namespace, each newest first (the order Redis's index gives)
                chosen = (key for key in reversed(keys) if before is None or key.rsplit(SEP, 1)[1] < before)
            page = []
            for position, key in enumerate(chosen):
                if position >= offset + limit:
                    break
                if position >= offset:
                    page.append(checkpoints.stored(key))
            return page

    def checkpoint_chain(self, session_id: str, ns: str, ref: str) -> list[str]:
        with self._table._lock:
            checkpoints = self._held(session_id)
            if checkpoints is None:
                return []
            return [checkpoints.entries[name] for name in checkpoints.chain_names(ns, ref)]

    def prune_checkpoints(self, session_id: str) -> int:
        with self._table._lock:
            return self._cp_prune_op(time.time(), session_id, None)

    def delete_checkpoint_runs(self, session_id: str, run_ids: list[str]) -> int:
        with self._table._lock:
            return self._cp_prune_op(time.time(), session_id, run_ids)

    def _cp_prune_op(self, now: float, session_id: str, run_ids: list[str] | None) -> int:
        """Without ``run_ids``: keep the newest of each namespace; with them: remove theirs."""
        if not self._table._is_live(session_id, now):
            return 0
        session = self._table._sessions[session_id]
        checkpoints = session.checkpoints
        if checkpoints is None:
            return 0
        if run_ids is None:
            newest = {key.rsplit(SEP, 1)[0]: key for key in checkpoints.index}
            doomed = [key for key in checkpoints.index if newest[key.rsplit(SEP, 1)[0]] != key]
        else:
            runs = set(run_ids)
            doomed = [
                key for key in checkpoints.index if checkpoints.entries["l" + key].split(LINK_SEP)[0] in runs
            ]
        if not doomed:
            return 0
        self._table._log("cp_prune", session_id, now, run_ids)
        before = checkpoints.size
        removed = checkpoints.remove(doomed)
        self._written(session_id, session, now, before)
        return removed

    def checkpoint_entries(self, session_id: str) -> dict[str, str]:
        with self._table._lock:
            checkpoints = self._held(session_id)
            return dict(checkpoints.entries) if checkpoints is not None else {}

    def load_checkpoint_entries(
        self,
        session_id: str,
        entries: dict[str, str],
        ttl_seconds: float | None,
        *,
        replace: bool = False,
    ) -> None:
        with self._table._lock:
            if replace:
                self._cp_replace_op(time.time(), session_id, entries, ttl_seconds)
            else:
                self._cp_load_op(time.time(), session_id, entries, ttl_seconds)

    def _cp_load_op(
        self,
        now: float,
        session_id: str,
        entries: dict[str, str],
        ttl_seconds: float | None,
        *,
        replace: bool = False,
    ) -> None:
        # What is written: a record with its link (an empty one when not given), and every
        # other entry but a link without its record.
        changes = {name: text for name, text in entries.items() if name[0] != "l"}
        changes.update(
            {"l" + name[1:]: entries.get("l" + name[1:], "") for name in entries if name[0] == "c"}
        )
        live, held = self._held_now(session_id, now)
        self._cp_room(live, held.growth(changes, replace=replace))
        op = "cp_replace" if replace else "cp_load"
        session = self._live_or_created(session_id, now, op, entries, ttl_seconds)
        checkpoints = self._checkpoints(session)
        before = checkpoints.size
        if replace:
            checkpoints.clear()
        for name, text in entries.items():
            if name[0] == "c":
                checkpoints.add(name[1:], text, changes["l" + name[1:]])
            elif name[0] != "l":
                checkpoints.set(name, text)
        self._written(session_id, session, now, before)

    def _cp_replace_op(
        self, now: float, session_id: str, entries: dict[str, str], ttl_seconds: float | None
    ) -> None:
        self._cp_load_op(now, session_id, entries, ttl_seconds, replace=True)
