"""Tracing and metrics with OpenTelemetry, when ``opentelemetry-api`` is installed.

Whether the API can be imported is asked once, here. Without it nothing is imported and
:func:`instrument` hands back the class it is given, unchanged: the store's methods cost
what they cost before. With it, the methods listed in :mod:`.operations` are wrapped once,
at the class, by :mod:`.otel` (spans after the GenAI conventions for memory, Redis client
spans, duration histograms and the background work's counters).

May import: the standard library and :mod:`.operations`; :mod:`.otel` (which imports
``opentelemetry``) only when the API is there. Nothing here imports the store.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

try:  # once per process: the API alone is enough to trace (an SDK decides where spans go)
    import opentelemetry.trace  # noqa: F401
except ImportError:
    _otel = None
else:
    from persistent_memory.telemetry import otel as _otel

__all__ = ["ENABLED", "connect_tasks", "instrument", "watch_store"]

C = TypeVar("C", bound=type)

#: Whether ``opentelemetry-api`` is installed (and so whether anything is traced).
ENABLED: bool = _otel is not None


def instrument(cls: C) -> C:
    """``cls`` with the operations :mod:`.operations` lists for it traced and timed; ``cls``
    itself, untouched, without OpenTelemetry. Called once, after the class statement."""
    if _otel is None:
        return cls
    return _otel.instrument(cls)


def connect_tasks(framework: Any) -> None:
    """Measure the lag and failures of the app's tasks on Django's task framework (called
    when :mod:`persistent_memory.tasks` is loaded); nothing without OpenTelemetry."""
    if _otel is not None:
        _otel.connect_tasks(framework)


def watch_store(read: Callable[[], Any]) -> None:
    """Have the gauges read the store ``read()`` answers when a reader collects them (None:
    no figure). Called by :mod:`persistent_memory.store` with its process's store: the
    telemetry sits below every part and imports none."""
    if _otel is not None:
        _otel.watch_store(read)
