"""Summaries on Django's task framework: Django 6's ``django.tasks``, or on Django 5.2 the
``django-tasks`` package (``pip install django-tasks``; the same API, ``django_tasks``).

``summarize_conversations_task`` summarizes marked conversations in whatever runs the
project's task backend (``TASKS``), through the same pass as the worker thread and
``memory_summarize --conversations``. With ``SUMMARIZER_TASKS = True`` the serving
process's worker thread enqueues it when conversations are marked instead of summarizing
itself (see :mod:`.worker`); it can also be enqueued on a schedule of the project's.
Without either framework installed, ``summarize_conversations_task`` is the plain function.
"""

from __future__ import annotations

import time
from types import ModuleType
from typing import Any

#: A task enqueued on a backend that cannot say whether it ran yet is given this long
#: before another is enqueued.
UNKNOWN_RESULT_SECONDS = 30.0


def task_framework() -> ModuleType | None:
    """``django.tasks`` (Django 6), else ``django_tasks`` (the package), else None."""
    try:
        import django.tasks as framework
    except ImportError:
        try:
            import django_tasks as framework
            import django_tasks.signals  # noqa: F401 (resets its backends when TASKS changes)
        except ImportError:
            return None
    return framework


def summarize_conversations_task(limit: int | None = 1000) -> dict[str, Any]:
    """Summarize up to ``limit`` marked conversations of the process's store; the counts
    (see ``SummarizeReport``)."""
    from persistent_memory.store import get_store

    return get_store().summarizer_worker.run_once(limit).as_counts()


_framework = task_framework()
if _framework is not None:
    # Under the function's own name: a task worker finds the task by the function's path.
    summarize_conversations_task = _framework.task(summarize_conversations_task)  # type: ignore[assignment]


def enqueue_summarizing() -> Any:
    """Enqueue :data:`summarize_conversations_task`; its result (with when it was enqueued)."""
    if _framework is None:
        raise RuntimeError("SUMMARIZER_TASKS needs django.tasks (Django 6) or the django-tasks package.")
    result = summarize_conversations_task.enqueue()
    return (result, time.monotonic())


def finished(enqueued: tuple[Any, float]) -> bool:
    """Whether a task :func:`enqueue_summarizing` enqueued has run (or may be taken as run:
    its backend cannot tell, and ``UNKNOWN_RESULT_SECONDS`` went by)."""
    result, at = enqueued
    if result.is_finished:
        return True
    backend = result.task.get_backend()
    if not getattr(backend, "supports_get_result", False):
        return time.monotonic() - at >= UNKNOWN_RESULT_SECONDS
    try:
        result.refresh()
    except Exception:  # gone from the backend's store: as good as finished
        return True
    return result.is_finished
