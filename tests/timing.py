"""Waiting in tests without assuming how fast the machine is: wait for the condition, or
for the moment the store itself reported, never for a fixed time followed by a state."""

from __future__ import annotations

import time
from collections.abc import Callable

#: A TTL long enough for the few calls a test makes before its session expires, however
#: loaded the machine; the expiry itself is waited for with ``wait_past``.
LIVE_TTL = 2.0


def wait_past(expires_at: float, margin: float = 0.05) -> None:
    """Sleep until the wall clock (which both backends expire by) is ``margin`` past
    ``expires_at``, an epoch the store reported (``session_info(...)["expires_at"]``)."""
    while (left := expires_at + margin - time.time()) > 0:
        time.sleep(left)


def wait_until(condition: Callable[[], object], seconds: float = 60.0, interval: float = 0.02) -> None:
    """Poll ``condition`` until it is true; fail after ``seconds`` (a deadline no healthy
    run comes near, there only so that a broken one ends)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {seconds} s"
        time.sleep(interval)
