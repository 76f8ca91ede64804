"""The app's background work as tasks of Django's task framework (Django 6's ``django.tasks``,
or the ``django-tasks`` package on Django 5.2: the same API).

With ``PERSISTENT_MEMORY["TASK_BACKEND"]`` naming an alias of ``TASKS``, what worker threads
in the serving process did from in-memory queues is enqueued on that backend instead, and
whatever runs it (``db_worker`` of django-tasks-db, an RQ or Celery backend, or inline with
the ``ImmediateBackend``) does the work:

- :data:`extract_conversation` ``(owner, session_id, conversation)``: the extractors over the
  conversation's messages not extracted yet (a cursor per conversation, in the database);
- :data:`summarize_conversations` ``(limit)``: the rolling summaries of marked conversations;
- :data:`embed` ``(kind, ids)``: vectors of memories (or mirrored messages) written without one;
- :data:`sync_mirror` ``(limit)``: the mirror's catch-up, for a project to run on a schedule.

Each takes ids only (JSON arguments) and is idempotent: run twice, or after
``memory_extract``, ``memory_summarize`` or ``memory_embed`` did the work, it changes nothing.
A write enqueues once its transaction commits. Debouncing: a :class:`BackgroundWork` row per
conversation (and one for the summaries) holds a lease while a task waits, so a burst of
appends enqueues one extraction and one summary; a backend that supports ``run_after``
delays them ``TASK_DEBOUNCE_SECONDS``, so the burst is over when they run.

The work is announced by the layers below, which never import this module: the store's
appends (``messages_added``), writes without a vector (``vectors_wanted``) and, with
``SUMMARIZER_TASKS``, the summarizer thread (``summaries_due``, answered by enqueueing
:data:`summarize_conversations_task` on the framework's default backend). The app loads
this module when either setting is set (``apps.py``, at start-up and when settings change).

Without ``TASK_BACKEND`` or ``SUMMARIZER_TASKS`` (the default) nothing here is used: the
threads run as before, and no task framework is needed. The in-process worker is the
fallback rather than a task backend of the app's own because it is not one: it gathers
writes in memory and never outlives the process, which no backend of the framework may
promise less than.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from datetime import datetime, timedelta
from types import ModuleType
from typing import TYPE_CHECKING, Any

from django.db import router, transaction
from django.db.models import Q
from django.dispatch import receiver
from django.utils import timezone

from persistent_memory.conf import memory_settings, summaries_on
from persistent_memory.conversations.signals import messages_added, summaries_due
from persistent_memory.exceptions import SessionExpired, SessionNotFound
from persistent_memory.memories import message_search, upkeep
from persistent_memory.memories.extraction import (
    ExtractionReport,
    find_candidates,
    message_times,
    write_candidates,
)
from persistent_memory.memories.signals import vectors_wanted
from persistent_memory.store import MemoryStore, get_store

if TYPE_CHECKING:
    from persistent_memory.models import BackgroundWork

logger = logging.getLogger(__name__)

EXTRACT = "extract"
SUMMARIZE = "summarize"
#: A lease older than this no longer holds (its task was lost: a backend without durability).
LEASE_SECONDS = 600.0
#: An extraction running longer than this is taken as dead (its worker killed).
RUN_SECONDS = 300.0
#: The most messages of a conversation one extraction reads (the newest).
LAST_MESSAGES = 200
#: The most passes one extraction task makes over messages appended while it ran.
ROUNDS = 3
#: The roles whose messages are extracted from (as the worker thread's).
ROLES = ("user", "assistant")


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


_framework = task_framework()
if _framework is not None:
    # The tasks' lag and failures, where OpenTelemetry is installed: connected where the
    # framework is loaded anyway (a project without TASK_BACKEND never imports it).
    from persistent_memory.telemetry import connect_tasks

    connect_tasks(_framework)


class TaskFailed(RuntimeError):
    """A task that could not do its work now (an extractor or the embedder failed): the
    backend records it as failed, and the next write or the catch-up command retries."""


def _task(function: Callable[..., Any]) -> Any:
    # Under the function's own name: a worker finds a task by its module path.
    return _framework.task(function) if _framework is not None else function


def backend_alias() -> str | None:
    """The ``TASKS`` alias the app's work goes to (``TASK_BACKEND``); None: the threads."""
    return memory_settings.TASK_BACKEND or None


def task_backend() -> Any:
    """The task backend ``TASK_BACKEND`` names (None: the threads are in use)."""
    alias = backend_alias()
    if alias is None or _framework is None:
        return None
    return _framework.task_backends[alias]


def _extraction_on() -> bool:
    return bool(memory_settings.MEMORY_EXTRACTION_WORKER) and bool(memory_settings.MEMORY_EXTRACTORS)


def _summaries_on() -> bool:
    return summaries_on(memory_settings) and bool(memory_settings.SUMMARIZER_WORKER)


# Leases and cursors -------------------------------------------------------------------


def _row(
    kind: str, owner: str = "", session_id: str = "", conversation: str = ""
) -> tuple[BackgroundWork, bool]:
    from persistent_memory.models import BackgroundWork

    return BackgroundWork.objects.get_or_create(
        kind=kind, owner=owner, session_id=session_id, conversation=conversation
    )


def _free_lease(now: datetime) -> Q:
    return Q(enqueued_at__isnull=True) | Q(enqueued_at__lt=now - timedelta(seconds=LEASE_SECONDS))


def _claim(kind: str, owner: str = "", session_id: str = "", conversation: str = "") -> bool:
    """Take the lease of waiting work; whether this caller got it (and so enqueues)."""
    from persistent_memory.models import BackgroundWork

    row, _ = _row(kind, owner, session_id, conversation)
    now = timezone.now()
    return bool(
        BackgroundWork.objects.filter(_free_lease(now), pk=row.pk).update(enqueued_at=now, updated_at=now)
    )


async def _aclaim(kind: str, owner: str = "", session_id: str = "", conversation: str = "") -> bool:
    """:func:`_claim` for async code (Django's async ORM)."""
    from persistent_memory.models import BackgroundWork

    row, _ = await BackgroundWork.objects.aget_or_create(
        kind=kind, owner=owner, session_id=session_id, conversation=conversation
    )
    now = timezone.now()
    leased = BackgroundWork.objects.filter(_free_lease(now), pk=row.pk)
    return bool(await leased.aupdate(enqueued_at=now, updated_at=now))


def _release(kind: str, owner: str = "", session_id: str = "", conversation: str = "") -> BackgroundWork:
    """Give the lease back as a task starts: what is written from now on enqueues again."""
    from persistent_memory.models import BackgroundWork

    row, _ = _row(kind, owner, session_id, conversation)
    BackgroundWork.objects.filter(pk=row.pk).update(enqueued_at=None, updated_at=timezone.now())
    return row


def _start_running(row: BackgroundWork) -> bool:
    """Mark ``row``'s work as running; False when another worker runs it."""
    from persistent_memory.models import BackgroundWork

    now = timezone.now()
    free = Q(running_until__isnull=True) | Q(running_until__lt=now)
    return bool(
        BackgroundWork.objects.filter(free, pk=row.pk).update(
            running_until=now + timedelta(seconds=RUN_SECONDS), updated_at=now
        )
    )


# Enqueueing ---------------------------------------------------------------------------


def _using(task: Any, delay: float) -> Any:
    """``task`` on the configured backend, delayed ``delay`` seconds where it supports that."""
    alias = backend_alias()
    backend = _framework.task_backends[alias]  # type: ignore[union-attr]
    run_after = timezone.now() + timedelta(seconds=delay) if delay > 0 and backend.supports_defer else None
    return task.using(backend=alias, run_after=run_after)


_KEY_FIELDS = ("owner", "session_id", "conversation")


def _keys(kind: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """The lease's row of a task's arguments: the conversation's, or the store's (summaries)."""
    return args if kind == EXTRACT else ()


def _enqueue_leased(task: Any, kind: str, *args: Any, delay: float | None = None) -> bool:
    """Enqueue ``task(*args)`` when its lease is free; whether it was enqueued."""
    keys = _keys(kind, args)
    if not _claim(kind, *keys):
        return False
    try:
        _using(task, memory_settings.TASK_DEBOUNCE_SECONDS if delay is None else delay).enqueue(*args)
    except BaseException:
        _release(kind, *keys)  # not enqueued: the next write tries
        raise
    return True


async def _aenqueue_leased(task: Any, kind: str, *args: Any) -> bool:
    keys = _keys(kind, args)
    if not await _aclaim(kind, *keys):
        return False
    try:
        await _using(task, memory_settings.TASK_DEBOUNCE_SECONDS).aenqueue(*args)
    except BaseException:
        from persistent_memory.models import BackgroundWork

        await BackgroundWork.objects.filter(
            kind=kind, **dict(zip(_KEY_FIELDS, keys or ("", "", ""), strict=True))
        ).aupdate(enqueued_at=None)
        raise
    return True


def _enqueue_conversation(owner: str, session_id: str, conversation: str, *, extract: bool) -> None:
    if extract and _extraction_on():
        _enqueue_leased(extract_conversation, EXTRACT, owner, session_id, conversation)
    if _summaries_on():
        _enqueue_leased(summarize_conversations, SUMMARIZE)


def conversation_changed(owner: str, session_id: str, conversation: str, *, extract: bool = True) -> None:
    """Enqueue the extraction of a conversation's new messages and the summaries (each once
    per burst), when the caller's transaction commits (at once outside of one)."""
    from persistent_memory.models import BackgroundWork

    transaction.on_commit(
        lambda: _enqueue_conversation(owner, session_id, conversation, extract=extract),
        using=router.db_for_write(BackgroundWork),
        robust=True,  # the write stands: a failure to enqueue is logged (memory_extract catches up)
    )


async def aconversation_changed(
    owner: str, session_id: str, conversation: str, *, extract: bool = True
) -> None:
    """:func:`conversation_changed` for async code (``aenqueue``)."""
    if extract and _extraction_on():
        await _aenqueue_leased(extract_conversation, EXTRACT, owner, session_id, conversation)
    if _summaries_on():
        await _aenqueue_leased(summarize_conversations, SUMMARIZE)


def embed_later(kind: str, ids: list[int]) -> None:
    """Enqueue :data:`embed` of ``ids`` once the caller's transaction commits (the rows must
    be visible to the worker)."""
    from persistent_memory.models import LongTermMemory

    transaction.on_commit(
        lambda: _using(embed, 0).enqueue(kind, list(ids)),
        using=router.db_for_write(LongTermMemory),
        robust=True,  # the write stands: memory_embed catches up
    )


# The receivers ------------------------------------------------------------------------
# What the layers below announce (they never import this module): an append, memories or
# messages written without a vector, marked conversations for SUMMARIZER_TASKS. The app's
# ready loads this module when TASK_BACKEND or SUMMARIZER_TASKS is set.

_pending: set[asyncio.Task[Any]] = set()  # kept until done: the loop holds tasks weakly


def _spawn(coroutine: Coroutine[Any, Any, Any]) -> None:
    future = asyncio.get_running_loop().create_task(coroutine)
    _pending.add(future)
    future.add_done_callback(_pending.discard)


@receiver(messages_added, dispatch_uid="persistent_memory.tasks.messages_added")
def _on_messages_added(
    sender: Any,
    *,
    store: Any = None,
    owner: str = "",
    session_id: str = "",
    conversation: str = "",
    messages: list[dict[str, Any]] | None = None,
    **kwargs: Any,
) -> None:
    """Enqueue the work of an append by a store that hands its work to tasks (built with
    ``TASK_BACKEND``); a store with worker threads does it itself."""
    if not getattr(store, "hands_work_to_tasks", False):
        return
    extract = any(isinstance(m, dict) and m.get("role") in ROLES for m in messages or ())
    try:
        asyncio.get_running_loop()
    except RuntimeError:  # sync code (a request, a thread): after the commit
        conversation_changed(owner, session_id, conversation, extract=extract)
    else:  # inside an event loop, where the ORM may not be called
        _spawn(aconversation_changed(owner, session_id, conversation, extract=extract))


@receiver(vectors_wanted, dispatch_uid="persistent_memory.tasks.vectors_wanted")
def _on_vectors_wanted(sender: Any, *, kind: str, ids: list[int], **kwargs: Any) -> None:
    embed_later(kind, ids)


@receiver(summaries_due, dispatch_uid="persistent_memory.tasks.summaries_due")
def _on_summaries_due(sender: Any, **kwargs: Any) -> tuple[Any, float]:
    return enqueue_summarizing()


# The tasks ----------------------------------------------------------------------------


def _after_cursor(messages: list[dict[str, Any]], row: BackgroundWork) -> list[dict[str, Any]]:
    """The messages after the last one extracted (all when none was)."""
    if row.cursor_id:
        for index, message in enumerate(messages):
            if message.get("id") == row.cursor_id:
                return messages[index + 1 :]
        if row.cursor_at is not None:  # trimmed away, or the head moved: by time
            return [
                message
                for message in messages
                if isinstance(message.get("created_at"), int | float)
                and message["created_at"] > row.cursor_at
            ]
    return messages


@_task
def extract_conversation(owner: str, session_id: str, conversation: str) -> dict[str, int]:
    """Run the extractors over the conversation's messages not extracted yet and upsert what
    they find; ``{"messages", "written"}``. A message is read once: the cursor moves past it
    only when every extractor succeeded (else this raises :class:`TaskFailed`)."""
    from persistent_memory.models import BackgroundWork

    row = _release(EXTRACT, owner, session_id, conversation)
    totals = {"messages": 0, "written": 0}
    if not _start_running(row):
        # Another worker is at it: once more after it, where the backend can delay (inline,
        # it would only meet the same run again; the running one looks again before it ends).
        backend = task_backend()
        if backend is not None and backend.supports_defer:
            _enqueue_leased(extract_conversation, EXTRACT, owner, session_id, conversation)
        return totals
    try:
        for _ in range(ROUNDS):  # again while appends came in during the extraction
            row.refresh_from_db()
            found = _extract_new(row)
            if found is None:
                BackgroundWork.objects.filter(pk=row.pk).delete()  # the session is gone
                break
            totals = {key: totals[key] + found[key] for key in totals}
            if not found["read"]:
                break
    finally:
        BackgroundWork.objects.filter(pk=row.pk).update(running_until=None, updated_at=timezone.now())
    return totals


def _extract_new(row: BackgroundWork) -> dict[str, int] | None:
    """Extract the messages after ``row``'s cursor and move it past them; the counts (with
    ``read``, the messages the cursor moved past), None when the session is gone."""
    from persistent_memory.models import BackgroundWork

    scoped = get_store().for_owner(row.owner)
    try:
        got = scoped.get_messages(row.session_id, conversation=row.conversation, limit=LAST_MESSAGES)
    except (SessionNotFound, SessionExpired):
        return None
    new = _after_cursor(got["messages"], row)
    if not new:
        return {"messages": 0, "written": 0, "read": 0}
    kept = [message for message in new if message.get("role") in ROLES]
    report = ExtractionReport(messages=len(kept))
    candidates = find_candidates(kept, report) if kept else []
    if report.failed:
        raise TaskFailed(report.last_error or "an extractor failed")
    if candidates and _live(scoped, row.session_id):
        write_candidates(row.owner, candidates, report, message_times(kept))
    at = new[-1].get("created_at")
    row.cursor_id, row.cursor_at = new[-1].get("id") or "", at if isinstance(at, int | float) else None
    BackgroundWork.objects.filter(pk=row.pk).update(cursor_id=row.cursor_id, cursor_at=row.cursor_at)
    return {"messages": len(kept), "written": report.written, "read": len(new)}


def _live(scoped: MemoryStore, session_id: str) -> bool:
    """Whether the session is still there (forgotten meanwhile: nothing is written)."""
    try:
        scoped.session_info(session_id)
    except (SessionNotFound, SessionExpired):
        return False
    return True


@_task
def summarize_conversations(limit: int | None = 1000) -> dict[str, Any]:
    """Summarize up to ``limit`` marked conversations (the same pass as the worker thread and
    ``memory_summarize --conversations``); the counts. While the summarizers' health says
    wait, this enqueues itself for then (on a backend that supports ``run_after``)."""
    _release(SUMMARIZE)
    worker = get_store().summarizer_worker
    report = worker.run_once(limit)
    wait = worker.health.wait_seconds()
    if report.waiting and wait > 0 and task_backend() is not None and task_backend().supports_defer:
        _enqueue_leased(summarize_conversations, SUMMARIZE, delay=wait)
    return report.as_counts()


@_task
def embed(kind: str, ids: list[int]) -> dict[str, int]:
    """Embed the memories (``kind`` "memory") or mirrored messages ("message") ``ids`` that
    still have no vector of the current model; ``{"embedded"}``. Raises :class:`TaskFailed`
    when the embedder failed (``memory_embed`` catches up)."""
    batch = upkeep.embed_batch if kind == "memory" else message_search.embed_batch
    embedded = batch(ids)
    if embedded is None:
        raise TaskFailed(f"the embedder failed on {len(ids)} {kind}s")
    return {"embedded": embedded}


@_task
def sync_mirror(limit: int | None = None) -> dict[str, int]:
    """Copy the sessions written since their last sync into the mirror (``MIRROR_MODE``
    "deferred" leaves that to the admin and ``memory_mirror``); the counts."""
    result = get_store().mirror.sync_dirty(limit)
    return {"synced": result.synced, "gone": result.gone, "failed": result.failed}


# SUMMARIZER_TASKS --------------------------------------------------------------------


def summarize_conversations_task(limit: int | None = 1000) -> dict[str, Any]:
    """Summarize up to ``limit`` marked conversations of the process's store; the counts
    (see ``SummarizeReport``). What the summarizer thread enqueues with ``SUMMARIZER_TASKS``
    (on the framework's default backend), and a project may enqueue on a schedule."""
    return get_store().summarizer_worker.run_once(limit).as_counts()


# Under the function's own name: a task worker finds the task by the function's path (the
# old one, persistent_memory.conversations.tasks, finds this module: MOVED_MODULES).
summarize_conversations_task = _task(summarize_conversations_task)


def enqueue_summarizing() -> tuple[Any, float]:
    """Enqueue :data:`summarize_conversations_task`; its result, with when it was enqueued."""
    if _framework is None:
        raise RuntimeError("SUMMARIZER_TASKS needs django.tasks (Django 6) or the django-tasks package.")
    return (summarize_conversations_task.enqueue(), time.monotonic())


# Health ------------------------------------------------------------------------------


def backlog() -> int | None:
    """The app's tasks waiting on the backend, where it can tell (None: it cannot)."""
    backend = task_backend()
    if backend is None:
        return None
    if type(backend).__module__.startswith("django_tasks_db"):
        from django_tasks_db.models import DBTaskResult

        return DBTaskResult.objects.filter(
            status="READY", backend_name=backend.alias, task_path__startswith=f"{__name__}."
        ).count()
    results = getattr(backend, "results", None)  # the DummyBackend keeps what was enqueued
    if isinstance(results, list):
        return sum(1 for result in results if str(result.status) == "READY")
    return None
