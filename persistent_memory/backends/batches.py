"""Sessions in batches: the given storage ids, or every session of a backend (of one
owner) read with its cursor. What the operations over every session and the mirror's
full sync walk, so that memory stays bounded at any number of sessions."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from persistent_memory.owners import owner_prefix

if TYPE_CHECKING:
    from persistent_memory.backends.base import BaseBackend

BATCH_SIZE = 500


def _chunks(ids: list[str], size: int) -> Iterator[list[str]]:
    for start in range(0, len(ids), size):
        yield ids[start : start + size]


def session_batches(
    backend: BaseBackend,
    storage_ids: Iterable[str] | None = None,
    *,
    owner: str | None = None,
    batch_size: int = BATCH_SIZE,
) -> Iterator[list[str]]:
    """The given sessions, or every session (of ``owner`` when given) read with a cursor,
    ``batch_size`` at a time."""
    if storage_ids is not None:
        yield from _chunks(list(dict.fromkeys(storage_ids)), batch_size)
        return
    prefix = owner_prefix(owner)
    cursor = 0
    while True:
        cursor, ids = backend.scan_sessions(cursor, batch_size, prefix)
        if ids:
            yield ids
        if cursor == 0:
            return
