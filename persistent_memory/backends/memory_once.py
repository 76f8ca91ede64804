"""Idempotency keys on the memory backend's writes (see :mod:`persistent_memory.idempotency`)."""

from __future__ import annotations

import copy
import functools
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from persistent_memory.backends.base import IdempotencyRecord

if TYPE_CHECKING:
    from persistent_memory.backends.memory import MemoryBackend

T = TypeVar("T")


class Recorded(NamedTuple):
    """A write's result kept for its idempotency key until ``expires_at``."""

    fingerprint: str
    result: Any
    expires_at: float


def idempotent(write: Callable[..., T]) -> Callable[..., T]:
    """``write`` with an ``idempotency=`` option: under the lock, a repeat of the key gets the
    recorded result back and writes nothing; otherwise the write runs and its result is
    recorded in the same critical section (a write that raises records nothing). The
    write's journal record carries the key, so a replay records it again."""

    @functools.wraps(write)
    def once(
        self: MemoryBackend, *args: Any, idempotency: IdempotencyRecord | None = None, **kwargs: Any
    ) -> T:
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
