"""The checkpoints part of the backend contract: a session's store of graph checkpoints
(what :mod:`persistent_memory.checkpoints` gives LangGraph's checkpointer).

A session holds checkpoints by namespace and id; each has a *record* (the caller's text),
the *references* of the channel values it was saved with, and the *writes* its tasks
made since. Channel values are stored once per version (a *blob* per ``channel`` and
``version`` of a namespace): a checkpoint whose channel did not change references the
blob an earlier one stored. Texts are opaque here (the store encodes them) and hold
neither separator below.

Both backends keep them as one flat mapping per session (the *entries*), so that a
snapshot, an export and the mirror carry them as they are:

* ``c{ns}\\x1f{id}``: the record;
* ``l{ns}\\x1f{id}``: the run id, then each reference (``{channel}\\x1f{version}``), joined by ``\\x1e``;
* ``w{ns}\\x1f{id}``: the writes, a JSON list of ``[task_id, idx, channel, value, task_path]``;
* ``b{ns}\\x1f{channel}\\x1f{version}``: a channel value. One that starts with
  ``d\\x1d{id}\\x1d{base ref}\\x1d{base id}\\x1d`` extends the value stored under
  ``{base ref}`` (of the same namespace), whose text starts with ``f\\x1d{base id}\\x1d`` or
  ``d\\x1d{base id}\\x1d`` (see :mod:`persistent_memory.integrations.langgraph_values`): a
  put whose base is not so is refused (``CheckpointBaseMissing``), and a value stays while
  a value kept extends it.

Every method is one atomic step (one round trip on Redis) and takes storage ids; the
session's keys expire with it, and deleting, sweeping or forgetting it removes them.

Every entry counts toward ``MAX_SESSION_BYTES`` with the session's values and messages:
its name's and its text's UTF-8 bytes (:func:`entry_bytes`). A write that would take the
session over is refused (``QuotaExceeded``) before anything is written; removing
checkpoints gives their bytes back.
"""

from __future__ import annotations

import json
from abc import abstractmethod
from typing import NamedTuple

#: Between a namespace and an id (or a channel and a version); between the parts of a
#: link; between the parts of a delta value.
SEP, LINK_SEP, DELTA_SEP = "\x1f", "\x1e", "\x1d"


class StoredCheckpoint(NamedTuple):
    """One checkpoint as stored: its namespace, id, record, writes (JSON text, None: none)
    and the values it references (``{channel}\\x1f{version}`` -> text; missing ones left out)."""

    ns: str
    checkpoint_id: str
    record: str
    writes: str | None
    blobs: dict[str, str]


def delta_base(text: str) -> tuple[str, str] | None:
    """The base reference and base id of a delta value's text (None: not a delta)."""
    if not text.startswith("d" + DELTA_SEP):
        return None
    _, _, base_ref, base_id, _ = text.split(DELTA_SEP, 4)
    return base_ref, base_id


def has_id(text: str | None, value_id: str) -> bool:
    """Whether a stored value's text is the whole or delta value ``value_id``."""
    return text is not None and text[:1] in "fd" and text[1:].startswith(f"{DELTA_SEP}{value_id}{DELTA_SEP}")


def text_bytes(text: str) -> int:
    """UTF-8 bytes of ``text`` (Redis counts bytes; a text is nearly always ASCII)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def entry_bytes(name: str, text: str) -> int:
    """What an entry counts toward ``MAX_SESSION_BYTES``: its name and its text."""
    return text_bytes(name) + text_bytes(text)


def checkpoint_key(ns: str, checkpoint_id: str) -> str:
    return f"{ns}{SEP}{checkpoint_id}"


def link(run_id: str | None, refs: list[str]) -> str:
    return LINK_SEP.join([run_id or "", *refs])


def merge_writes(stored: str | None, writes: list[list[object]]) -> str:
    """The rule of ``put_writes``: a write whose ``(task_id, idx)`` is stored is kept as it
    was, but a special write's (negative idx: an error, an interrupt) replaces it."""
    merged = json.loads(stored) if stored else []
    where = {(item[0], item[1]): i for i, item in enumerate(merged)}
    for item in writes:
        at = where.get((item[0], item[1]))
        if at is None:
            where[(item[0], item[1])] = len(merged)
            merged.append(item)
        elif item[1] < 0:  # type: ignore[operator]
            merged[at] = item
    return json.dumps(merged)


class CheckpointBackend:
    """What a backend does with checkpoints."""

    @abstractmethod
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
        """Store a checkpoint and the new channel values (``{channel}\\x1f{version}`` ->
        text), creating the session (with ``ttl_seconds``) when it is not live."""

    @abstractmethod
    def put_checkpoint_writes(
        self,
        session_id: str,
        ns: str,
        checkpoint_id: str,
        writes: list[list[object]],
        ttl_seconds: float | None,
    ) -> None:
        """Merge ``writes`` into the checkpoint's (see :func:`merge_writes`), creating the
        session when it is not live (LangGraph may save a task's writes before the
        checkpoint they belong to is saved)."""

    @abstractmethod
    def get_checkpoint(self, session_id: str, ns: str, checkpoint_id: str | None) -> StoredCheckpoint | None:
        """The checkpoint (None: the newest of ``ns``), or None when there is none."""

    @abstractmethod
    def list_checkpoints(
        self, session_id: str, ns: str | None, before: str | None, offset: int, limit: int
    ) -> list[StoredCheckpoint]:
        """Checkpoints of ``ns`` (None: every namespace), newest id first within a namespace,
        those with an id below ``before`` only when given; ``limit`` of them from ``offset``."""

    @abstractmethod
    def checkpoint_chain(self, session_id: str, ns: str, ref: str) -> list[str]:
        """The value stored under ``ref`` and, while it is a delta, the value it extends, and
        so on ([] when there is none)."""

    @abstractmethod
    def prune_checkpoints(self, session_id: str) -> int:
        """Keep the newest checkpoint of each namespace (its writes and the values it
        references); return how many were removed."""

    @abstractmethod
    def delete_checkpoint_runs(self, session_id: str, run_ids: list[str]) -> int:
        """Remove the checkpoints of these runs, their writes, and values no checkpoint left
        references; return how many were removed."""

    @abstractmethod
    def checkpoint_entries(self, session_id: str) -> dict[str, str]:
        """Every entry of the session's checkpoints ({} when it is not live)."""

    @abstractmethod
    def load_checkpoint_entries(
        self, session_id: str, entries: dict[str, str], ttl_seconds: float | None, *, replace: bool = False
    ) -> None:
        """Add ``entries`` (as :meth:`checkpoint_entries` gives them) to the session's, or
        with ``replace`` put them in place of the session's (its checkpoints are then
        exactly these), creating it (with ``ttl_seconds``) when it is not live."""
