"""Idempotency keys on the memory backend's writes (see :mod:`persistent_memory.idempotency`)."""

from __future__ import annotations

import copy
import functools
import threading
import time
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, TypeVar

from persistent_memory.backends.base import AnswerRecord, IdempotencyRecord
from persistent_memory.backends.conversations import Appended, Enriched, WindowTexts

T = TypeVar("T")


class Recorded(NamedTuple):
    """A write's result kept for its idempotency key until ``expires_at``."""

    fingerprint: str
    result: Any
    expires_at: float


class Records(Protocol):
    """What :func:`idempotent` needs of the backend: its lock and its records."""

    _lock: threading.RLock
    _idempotency: IdempotencyRecord | None

    def _recorded(self, idempotency: IdempotencyRecord) -> Recorded | None: ...

    def _remember(self, idempotency: IdempotencyRecord, result: Any, now: float) -> None: ...


def idempotent(write: Callable[..., T]) -> Callable[..., T]:
    """``write`` with an ``idempotency=`` option: under the lock, a repeat of the key gets the
    recorded result back and writes nothing; otherwise the write runs and its result is
    recorded in the same critical section (a write that raises records nothing). The
    write's journal record carries the key, so a replay records it again; the record
    itself goes to the journal's record files too (see persistent_memory.journal), so it
    lasts its TTL across restarts once the journal's segments are gone."""

    @functools.wraps(write)
    def once(self: Records, *args: Any, idempotency: IdempotencyRecord | None = None, **kwargs: Any) -> T:
        if idempotency is None:
            return write(self, *args, **kwargs)
        with self._lock:  # reentrant: ``write`` takes it again
            recorded = self._recorded(idempotency)
            if recorded is not None:
                return copy.deepcopy(recorded.result)
            self._idempotency = idempotency
            try:
                result = write(self, *args, **kwargs)
            finally:
                self._idempotency = None
            self._remember(idempotency, result, time.time())
            return result

    return once


# The results a memory write can record, by name, so that a record read back from the
# journal's files is the same object the write returned (the store reads their fields).
_TUPLES: dict[str, type] = {cls.__name__: cls for cls in (AnswerRecord, Appended, Enriched, WindowTexts)}


def encoded(result: Any) -> Any:
    """``result`` as JSON that :func:`decoded` gives back exactly.

    Not redis.lua's tagging: that one keeps a script's reply (strings, integers, nil) from
    cjson, which turns integers into doubles; Python's json keeps numbers, strings, None and
    booleans as they were, and what it would change here are tuples (the named results)
    and dicts (SessionInfo), so those two are tagged: ``{"t": [name, items]}`` and
    ``{"d": {...}}``. ``TypeError`` for anything else."""
    if result is None or isinstance(result, str | int | float):  # bool is an int
        return result
    if isinstance(result, list):
        return [encoded(item) for item in result]
    if isinstance(result, dict):
        return {"d": {str(key): encoded(value) for key, value in result.items()}}
    if isinstance(result, tuple):
        name = type(result).__name__ if type(result) is not tuple else ""
        if name and _TUPLES.get(name) is not type(result):
            raise TypeError(f"cannot record a {name}")
        return {"t": [name, [encoded(item) for item in result]]}
    raise TypeError(f"cannot record a {type(result).__name__}")


def decoded(value: Any) -> Any:
    """The result :func:`encoded` made ``value`` of."""
    if isinstance(value, list):
        return [decoded(item) for item in value]
    if isinstance(value, dict):
        if "d" in value:
            return {key: decoded(item) for key, item in value["d"].items()}
        name, items = value["t"]
        items = [decoded(item) for item in items]
        return _TUPLES[name](*items) if name else tuple(items)
    return value
