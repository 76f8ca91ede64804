"""The Redis backend's checkpoints (the contract in :mod:`.checkpoints`).

Held by :class:`~persistent_memory.backends.redis.RedisBackend` as ``checkpoints``: each
method is one FCALL of the backend's library, whose checkpoint part is ``checkpoints.lua``
(the key layout is described there); both keys are declared (by every call on the
session), in the session's slot.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from persistent_memory.backends.checkpoints import SEP, StoredCheckpoint
from persistent_memory.backends.redis.ttl import ttl_ms as _ttl_ms
from persistent_memory.backends.redis.ttl import ttl_text as _ttl_text


def _stored(reply: list[Any]) -> StoredCheckpoint:
    """A checkpoint from the script's reply: key, record, writes (None: none), then pairs."""
    key, record, writes, *pairs = reply
    ns, _, checkpoint_id = key.decode().rpartition(SEP)
    blobs = {
        pairs[i].decode(): pairs[i + 1].decode() for i in range(0, len(pairs), 2) if pairs[i + 1] is not None
    }
    return StoredCheckpoint(ns, checkpoint_id, record.decode(), writes.decode() if writes else None, blobs)


class RedisCheckpoints:
    """Checkpoints in Redis, one script call per operation (the contract:
    :class:`~persistent_memory.backends.checkpoints.CheckpointBackend`); ``run`` calls the
    backend's library."""

    def __init__(self, *, run: Callable[..., Any]) -> None:
        self._run = run

    def _cp(self, op: str, session_id: str, *args: Any) -> Any:
        return self._run(op, session_id, *args)  # every call on a session declares its checkpoints

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
        pairs = [part for ref, text in blobs.items() for part in (ref, text)]
        self._cp(
            "cp_put",
            session_id,
            ns,
            checkpoint_id,
            record,
            link_text,
            _ttl_text(ttl_seconds),
            _ttl_ms(ttl_seconds),
            *pairs,
        )

    def put_checkpoint_writes(
        self,
        session_id: str,
        ns: str,
        checkpoint_id: str,
        writes: list[list[object]],
        ttl_seconds: float | None,
    ) -> None:
        ttl = (_ttl_text(ttl_seconds), _ttl_ms(ttl_seconds))
        self._cp("cp_writes", session_id, ns, checkpoint_id, json.dumps(writes), *ttl)

    def get_checkpoint(self, session_id: str, ns: str, checkpoint_id: str | None) -> StoredCheckpoint | None:
        reply = self._cp("cp_get", session_id, ns, checkpoint_id or "")
        return _stored(reply) if reply else None

    def list_checkpoints(
        self, session_id: str, ns: str | None, before: str | None, offset: int, limit: int
    ) -> list[StoredCheckpoint]:
        every = "1" if ns is None else ""
        reply = self._cp("cp_list", session_id, ns or "", every, before or "", str(offset), str(limit))
        return [_stored(item) for item in reply] if reply else []

    def checkpoint_chain(self, session_id: str, ns: str, ref: str) -> list[str]:
        reply = self._cp("cp_chain", session_id, ns, ref)
        return [text.decode() for text in reply] if reply else []

    def prune_checkpoints(self, session_id: str) -> int:
        return self._cp("cp_prune", session_id, "latest") or 0

    def delete_checkpoint_runs(self, session_id: str, run_ids: list[str]) -> int:
        return self._cp("cp_prune", session_id, "runs", *run_ids) or 0

    def checkpoint_entries(self, session_id: str) -> dict[str, str]:
        reply = self._cp("cp_entries", session_id)
        return _entries(reply) if reply else {}

    def load_checkpoint_entries(
        self,
        session_id: str,
        entries: dict[str, str],
        ttl_seconds: float | None,
        *,
        replace: bool = False,
    ) -> None:
        pairs = [part for name, text in entries.items() for part in (name, text)]
        how = "replace" if replace else ""
        self._cp("cp_load", session_id, _ttl_text(ttl_seconds), _ttl_ms(ttl_seconds), how, *pairs)


def _entries(flat: list[Any]) -> dict[str, str]:
    return {flat[i].decode(): flat[i + 1].decode() for i in range(0, len(flat), 2)}
