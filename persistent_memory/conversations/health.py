"""The summarizers' health: seed 003's four states, kept in the backend's shared record.

* ``healthy``: summaries are made as conversations are marked.
* ``retry``: a summary failed (the summarizer raised, timed out or answered garbage);
  the next attempt waits ``SUMMARIZER_BACKOFF_SECONDS``, doubled at each failure in a row.
* ``degraded``: ``SUMMARIZER_RETRY_ATTEMPTS`` failures in a row; nothing is tried for
  ``SUMMARIZER_DEGRADED_SECONDS``. Windows never waited for a summarizer: they keep the
  last summary and the messages after it (truncated to the budget), which is plain
  truncation for conversations never summarized.
* ``recovering``: the degraded wait is over and a summary is being tried again; a
  success makes it ``healthy``, a failure ``degraded`` again.

Marked conversations stay marked while the summarizers wait. The record (a dict of
JSON values: ``state``, ``failures`` in a row, ``retry_at``, ``last_error``,
``last_error_at``, ``last_success_at``, ``changed_at``; times are Unix epochs) is one
per backend: every process and worker on a Redis backend reads and writes the same one,
the last writer winning. Every rolling window shows its ``state`` as ``summary_state``.
A change of state sends ``summarizer_health_changed``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from persistent_memory.conversations.signals import send_safely, summarizer_health_changed
from persistent_memory.conversations.summaries import HEALTH_STATES

if TYPE_CHECKING:
    from persistent_memory.backends.conversations import SummaryBackend
    from persistent_memory.conf import MemorySettings

HEALTHY, RETRY, DEGRADED, RECOVERING = HEALTH_STATES
#: The longest error text the record keeps.
ERROR_LIMIT = 500


@dataclass(frozen=True)
class HealthPolicy:
    """How long the summarizers wait after failures (see the module's docstring)."""

    retry_attempts: int = 3
    backoff_seconds: float = 1.0
    degraded_seconds: float = 300.0

    @classmethod
    def from_settings(cls, conf: MemorySettings) -> HealthPolicy:
        return cls(
            retry_attempts=conf.SUMMARIZER_RETRY_ATTEMPTS,
            backoff_seconds=conf.SUMMARIZER_BACKOFF_SECONDS,
            degraded_seconds=conf.SUMMARIZER_DEGRADED_SECONDS,
        )

    def backoff(self, failures: int) -> float:
        """The wait after ``failures`` failures in a row (1: the first retry's)."""
        return min(self.backoff_seconds * 2 ** max(0, failures - 1), self.degraded_seconds)


class SummarizerHealth:
    """The state machine over one backend's health record."""

    def __init__(
        self,
        backend: SummaryBackend,
        policy: HealthPolicy | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.backend = backend
        self.policy = policy or HealthPolicy()
        self.clock = clock

    def record(self) -> dict[str, Any]:
        """The record as stored, with ``state`` ("healthy" when none was ever written)."""
        record = self.backend.summarizer_health()
        record.setdefault("state", HEALTHY)
        return record

    @property
    def state(self) -> str:
        return self.record()["state"]

    def wait_seconds(self, record: dict[str, Any] | None = None) -> float:
        """How long before a summary may be tried (0: now)."""
        record = self.record() if record is None else record
        retry_at = record.get("retry_at")
        if record["state"] == HEALTHY or retry_at is None:
            return 0.0
        return max(0.0, float(retry_at) - self.clock())

    def begin(self) -> bool:
        """Whether a summary may be tried now (called with one to try): a degraded record
        whose wait is over becomes ``recovering``."""
        record = self.record()
        if self.wait_seconds(record) > 0:
            return False
        if record["state"] == DEGRADED:
            self._write(record, RECOVERING)
        return True

    def succeeded(self) -> None:
        """A summary was committed: ``healthy``, the failures forgotten."""
        record = self.record()
        now = self.clock()
        if record["state"] == HEALTHY and not record.get("failures"):
            # Most successes change nothing but the time: written at most once a second.
            if now - float(record.get("last_success_at") or 0) >= 1:
                self.backend.set_summarizer_health({**record, "last_success_at": now})
            return
        self._write({**record, "failures": 0, "retry_at": None, "last_success_at": now}, HEALTHY)

    def failed(self, error: str) -> str:
        """A summary failed with ``error``: ``retry`` with a backoff, or ``degraded`` after
        ``retry_attempts`` failures in a row (at once when recovering). Returns the state."""
        record = self.record()
        now = self.clock()
        failures = int(record.get("failures") or 0) + 1
        policy = self.policy
        if record["state"] in (HEALTHY, RETRY) and failures < policy.retry_attempts:
            state, wait = RETRY, policy.backoff(failures)
        else:
            state, wait = DEGRADED, policy.degraded_seconds
        fields = {"failures": failures, "retry_at": now + wait, "last_error": error[:ERROR_LIMIT]}
        self._write({**record, **fields, "last_error_at": now}, state)
        return state

    def reset(self) -> None:
        """Forget every failure (an operator's "try now"): ``healthy``."""
        self._write({**self.record(), "failures": 0, "retry_at": None}, HEALTHY)

    def _write(self, record: dict[str, Any], state: str) -> None:
        previous = record["state"]
        changed = previous != state
        record = {**record, "state": state}
        if changed:
            record["changed_at"] = self.clock()
        self.backend.set_summarizer_health(record)
        if changed:
            send_safely(summarizer_health_changed, type(self), previous=previous, state=state, health=record)
