"""The checkpoints service: the store's methods for graph checkpoints.

:class:`CheckpointMethods` is mixed into :class:`~persistent_memory.store.MemoryStore`, so
``get_store()`` and ``for_owner(...)`` stores have these methods, scoped to the store's
owner like every other. A session holds the checkpoints of one graph thread; records,
channel values and writes are texts the caller encodes (LangGraph's checkpointer in
:mod:`persistent_memory.integrations.langgraph_saver`), stored as they are. Each method
checks its arguments, then makes one backend call (one round trip on Redis).

Every stored entry counts toward ``MAX_SESSION_BYTES`` with the session's values and
messages: a put, a task's writes or a load that would take the session over it raises
``QuotaExceeded`` (507 ``capacity_exceeded``) and writes nothing; pruning or deleting
checkpoints gives their bytes back. The backend checks that in the write's own step; what
one call sends that is over the cap by itself is refused here, before it is sent (so a
20 MB value never reaches Redis, nor its script's JSON merge).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from persistent_memory.backends.checkpoints import (
    LINK_SEP,
    SEP,
    StoredCheckpoint,
    checkpoint_key,
    entry_bytes,
    link,
    text_bytes,
)
from persistent_memory.exceptions import InvalidValue, QuotaExceeded, SessionExpired, SessionNotFound

if TYPE_CHECKING:
    from persistent_memory.store import MemoryStore

#: Longest namespace, id, channel or version (LangGraph's are short: a namespace is ""
#: or "node:task-id|node:task-id"); an entry's name holds three, and is a unique column.
MAX_NAME = 512
ENTRY_KINDS = "clwb"
#: Session id prefixes of LangGraph threads (see persistent_memory.integrations.langgraph_saver).
THREAD_PREFIXES = ("lgt_", "lgh_")


def _name(value: Any, what: str, *, empty: bool = False) -> str:
    if not isinstance(value, str) or (not value and not empty) or len(value) > MAX_NAME:
        raise InvalidValue(f"{what} must be a string of 1 to {MAX_NAME} characters.")
    if SEP in value or LINK_SEP in value:
        raise InvalidValue(f"{what} must not hold the characters \\x1e or \\x1f.")
    return value


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise InvalidValue(f"{what} must be a string.")
    return value


def validate_entries(entries: Any) -> dict[str, str]:
    """Checkpoint entries as :meth:`CheckpointMethods.checkpoint_entries` gives them."""
    if not isinstance(entries, dict):
        raise InvalidValue("checkpoints must be an object of entries.")
    for name, text in entries.items():
        if not isinstance(name, str) or not name or name[0] not in ENTRY_KINDS or SEP not in name:
            raise InvalidValue(f"Invalid checkpoint entry name {name!r}.")
        _text(text, f"checkpoint entry {name!r}")
    return entries


class CheckpointMethods:
    """Checkpoints of the graph thread a session holds."""

    def _under_cap(self: MemoryStore, size: int) -> None:
        """QuotaExceeded when ``size`` bytes that one call sends are over MAX_SESSION_BYTES
        by themselves (the backend's own check, in the write's step, counts the rest)."""
        cap = self.backend.max_session_bytes
        if cap is not None and size > cap:
            raise QuotaExceeded(
                f"The session would hold at least {size} bytes, over MAX_SESSION_BYTES ({cap})."
            )

    def put_checkpoint(
        self: MemoryStore,
        session_id: str,
        ns: str,
        checkpoint_id: str,
        record: str,
        *,
        run_id: str | None = None,
        refs: list[str] = (),  # type: ignore[assignment]
        blobs: dict[str, str] | None = None,
        ttl_seconds: float | None = None,
    ) -> None:
        """Store a checkpoint of namespace ``ns``: its ``record``, the ``refs``
        (``{channel}\\x1f{version}``) of the channel values it was saved with, and the new
        values among them (``blobs``); creates the session (``ttl_seconds``, None: the
        default) when it does not exist."""
        _name(ns, "checkpoint_ns", empty=True)
        _name(checkpoint_id, "checkpoint_id")
        _text(record, "record")
        for ref in refs:
            channel, _, version = ref.partition(SEP)
            _name(channel, "channel")
            _name(version, "channel version")
        for ref, text in (blobs or {}).items():
            if ref not in refs:
                raise InvalidValue(f"The value of {ref!r} is not one the checkpoint references.")
            _text(text, "channel value")
        link_text = link(_name(run_id, "run_id") if run_id else None, list(refs))
        key = checkpoint_key(ns, checkpoint_id)
        sent = entry_bytes("c" + key, record) + entry_bytes("l" + key, link_text)
        sent += sum(entry_bytes(f"b{ns}{SEP}{ref}", text) for ref, text in (blobs or {}).items())
        self._under_cap(sent)
        ttl = self._ttl(ttl_seconds)
        with self._session(session_id) as sid:
            self.backend.put_checkpoint(sid, ns, checkpoint_id, record, link_text, dict(blobs or {}), ttl)

    def put_checkpoint_writes(
        self: MemoryStore,
        session_id: str,
        ns: str,
        checkpoint_id: str,
        writes: list[tuple[str, int, str, str, str]],
        *,
        ttl_seconds: float | None = None,
    ) -> None:
        """Add a task's writes ``(task_id, idx, channel, value, task_path)`` to a checkpoint;
        a write whose ``(task_id, idx)`` is stored is kept, but one with a negative ``idx``
        (an error, an interrupt) replaces it."""
        _name(ns, "checkpoint_ns", empty=True)
        _name(checkpoint_id, "checkpoint_id")
        items = []
        for task_id, idx, channel, value, task_path in writes:
            if isinstance(idx, bool) or not isinstance(idx, int):
                raise InvalidValue("A write's idx must be an integer.")
            items.append(
                [
                    _text(task_id, "task_id"),
                    idx,
                    _text(channel, "channel"),
                    _text(value, "value"),
                    _text(task_path, "task_path"),
                ]
            )
        self._under_cap(sum(text_bytes(item[3]) for item in items))
        if items:
            ttl = self._ttl(ttl_seconds)
            with self._session(session_id) as sid:
                self.backend.put_checkpoint_writes(sid, ns, checkpoint_id, items, ttl)

    def get_checkpoint(
        self: MemoryStore, session_id: str, ns: str, checkpoint_id: str | None = None
    ) -> StoredCheckpoint | None:
        """The checkpoint (None: the newest of ``ns``); None when there is none."""
        _name(ns, "checkpoint_ns", empty=True)
        if checkpoint_id is not None:
            _name(checkpoint_id, "checkpoint_id")
        with self._session(session_id) as sid:
            return self.backend.get_checkpoint(sid, ns, checkpoint_id)

    def list_checkpoints(
        self: MemoryStore,
        session_id: str,
        ns: str | None = None,
        *,
        before: str | None = None,
        offset: int = 0,
        limit: int = 100,
    ) -> list[StoredCheckpoint]:
        """Checkpoints of ``ns`` (None: all namespaces), newest first within a namespace,
        with ids below ``before`` when given: ``limit`` of them from ``offset``."""
        if ns is not None:
            _name(ns, "checkpoint_ns", empty=True)
        if before is not None:
            _name(before, "before")
        with self._session(session_id) as sid:
            return self.backend.list_checkpoints(sid, ns, before, offset, limit)

    def checkpoint_chain(self: MemoryStore, session_id: str, ns: str, ref: str) -> list[str]:
        """The value stored under ``ref`` (``{channel}\\x1f{version}``) and, while it is a
        delta, the value it extends, and so on: one call."""
        _name(ns, "checkpoint_ns", empty=True)
        ref = _text(ref, "ref")
        with self._session(session_id) as sid:
            return self.backend.checkpoint_chain(sid, ns, ref)

    def prune_checkpoints(self: MemoryStore, session_id: str) -> int:
        """Keep only the newest checkpoint of each namespace; how many were removed."""
        with self._session(session_id) as sid:
            return self.backend.prune_checkpoints(sid)

    def delete_checkpoint_runs(self: MemoryStore, session_id: str, run_ids: list[str]) -> int:
        """Remove the checkpoints these runs made; how many were removed."""
        runs = [_name(run_id, "run_id") for run_id in run_ids]
        if not runs:
            return 0
        with self._session(session_id) as sid:
            return self.backend.delete_checkpoint_runs(sid, runs)

    def checkpoint_entries(self: MemoryStore, session_id: str) -> dict[str, str]:
        """Every stored entry of the session's checkpoints ({}: none, or no session)."""
        with self._session(session_id) as sid:
            return self.backend.checkpoint_entries(sid)

    def load_checkpoint_entries(
        self: MemoryStore,
        session_id: str,
        entries: dict[str, str],
        *,
        ttl_seconds: float | None = None,
        replace: bool = False,
    ) -> None:
        """Add entries (as :meth:`checkpoint_entries` gives them: a copy of another thread's)
        to the session's, or with ``replace`` put them in place of the session's checkpoints
        (one atomic step: no mix of the two), creating it (``ttl_seconds``, None: the
        default) when it does not exist."""
        validate_entries(entries)
        self._under_cap(sum(entry_bytes(name, text) for name, text in entries.items()))
        ttl = self._ttl(ttl_seconds)
        with self._session(session_id) as sid:
            self.backend.load_checkpoint_entries(sid, entries, ttl, replace=replace)

    def delete_checkpoints(self: MemoryStore, session_id: str) -> bool:
        """Delete the session and its checkpoints; whether there was one."""
        try:
            self.delete_session(session_id)
        except (SessionNotFound, SessionExpired):
            return False
        return True
