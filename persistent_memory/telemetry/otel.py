"""The OpenTelemetry side of :mod:`persistent_memory.telemetry`: imported only when
``opentelemetry-api`` is installed.

Spans and instruments come from the global providers through the API's proxies, so an
SDK configured after this module is imported (at the project's start, say) is used, and
without one every span is a non-recording one. What each wrapper does past starting its
span is skipped when the span does not record.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import json
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry import trace as _trace_api
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.metrics import _internal as _metrics_api
from opentelemetry.trace import SpanKind

from persistent_memory.telemetry.operations import OPERATIONS, Operation, RoundTrip, Task

#: The instrumentation scope of every span and instrument.
SCOPE = "persistent_memory"
#: The environment variable of the GenAI instrumentations that lets contents into spans.
CAPTURE_CONTENT = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
#: Its values that turn capture on (the GenAI instrumentations' newer modes included).
_CAPTURE_ON = frozenset({"true", "1", "span_only", "span_and_event"})

OPERATION_NAME = "gen_ai.operation.name"
STORE_ID = "gen_ai.memory.store.id"
RECORD_ID = "gen_ai.memory.record.id"
RECORD_COUNT = "gen_ai.memory.record.count"
RECORDS = "gen_ai.memory.records"
QUERY_TEXT = "gen_ai.memory.query.text"
CONVERSATION_ID = "gen_ai.conversation.id"
PROVIDER_NAME = "gen_ai.provider.name"
ERROR_TYPE = "error.type"
#: The store method (or integration method) a span or measurement is of.
METHOD = "persistent_memory.operation"
TASK = "persistent_memory.task"

_tracer = trace.get_tracer(SCOPE)
_meter = metrics.get_meter(SCOPE)

_durations = _meter.create_histogram(
    "persistent_memory.operation.duration",
    unit="s",
    description="How long a memory operation of the store, the memories service or an integration took.",
)
_redis_durations = _meter.create_histogram(
    "db.client.operation.duration", unit="s", description="How long a Redis round trip of the store took."
)
_task_durations = _meter.create_histogram(
    "persistent_memory.task.duration", unit="s", description="How long a unit of background work took."
)
_task_lag = _meter.create_histogram(
    "persistent_memory.task.lag",
    unit="s",
    description=(
        "From the oldest message of an extraction to the extraction starting (the threads);"
        " from a task becoming due to its start (Django's task framework)."
    ),
)
_task_items = _meter.create_counter(
    "persistent_memory.task.items",
    unit="{item}",
    description="What background work did: messages extracted from, memories and messages embedded, "
    "conversations summarized, sessions mirrored.",
)
_task_failures = _meter.create_counter(
    "persistent_memory.task.failures", unit="{failure}", description="Background work that failed."
)


# Where the API keeps the providers set (None until an SDK, or anything, sets one). Read
# directly: the API's getters cost microseconds a call (an environment lookup each), the
# attributes tens of nanoseconds. A provider named by OTEL_PYTHON_*_PROVIDER is loaded at
# the first getter call, and an API without these attributes is asked every time.
_FROM_ENVIRONMENT = any(
    name in os.environ for name in ("OTEL_PYTHON_TRACER_PROVIDER", "OTEL_PYTHON_METER_PROVIDER")
)
_KNOWN = hasattr(_trace_api, "_TRACER_PROVIDER") and hasattr(_metrics_api, "_METER_PROVIDER")


def _configured() -> bool:
    """Whether a tracer or a meter provider is set: without either (the API installed and
    no SDK) the wrappers call straight through, at the cost of this check."""
    if not _KNOWN or _FROM_ENVIRONMENT:
        return True
    return _trace_api._TRACER_PROVIDER is not None or _metrics_api._METER_PROVIDER is not None


def capture_content() -> bool:
    """Whether contents go into spans: ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``,
    read at each call (off unless set)."""
    return os.environ.get(CAPTURE_CONTENT, "").strip().lower() in _CAPTURE_ON


def instrument(cls: type) -> type:
    """Wrap ``cls``'s methods that :data:`OPERATIONS` lists (once: a class met again is left)."""
    if cls.__dict__.get("_persistent_memory_traced"):
        return cls
    for method, what in OPERATIONS.get(cls.__name__, {}).items():
        func = getattr(cls, method)
        if isinstance(what, Operation):
            wrapped = _operation(func, what, method)
        elif isinstance(what, Task):
            wrapped = _task(func, what.task)
        else:
            wrapped = _round_trip(func, what)
        setattr(cls, method, wrapped)
    cls._persistent_memory_traced = True  # type: ignore[attr-defined]
    _observe_backlogs()
    return cls


# Memory operations ---------------------------------------------------------------------


def _argument(func: Callable[..., Any]) -> Callable[[str | None, tuple[Any, ...], dict[str, Any]], Any]:
    """A reader of ``func``'s arguments by name from a call's ``args`` (``self`` excluded)
    and ``kwargs``: positions found once, here, not at each call."""
    parameters = list(inspect.signature(func).parameters.values())[1:]
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    positions = {p.name: i for i, p in enumerate(parameters) if p.kind in positional}
    defaults = {p.name: p.default for p in parameters if p.default is not p.empty}

    def read(name: str | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if name is None:
            return None
        if name in kwargs:
            return kwargs[name]
        at = positions.get(name)
        if at is not None and at < len(args):
            return args[at]
        return defaults.get(name)

    return read


def _operation(func: Callable[..., Any], op: Operation, method: str) -> Callable[..., Any]:
    read = _argument(func)
    name = f"{op.name} {op.store}"
    base = {OPERATION_NAME: op.name, STORE_ID: op.store, PROVIDER_NAME: SCOPE, METHOD: method}

    def start(args: tuple[Any, ...], kwargs: dict[str, Any]) -> trace.Span:
        span = _tracer.start_span(name, kind=SpanKind.INTERNAL, attributes=base)
        if span.is_recording():
            for attribute, argument in ((CONVERSATION_ID, op.session), (RECORD_ID, op.record)):
                value = read(argument, args, kwargs)
                if value is not None:
                    span.set_attribute(attribute, str(value))
            if capture_content():
                query, content = read(op.query, args, kwargs), read(op.content, args, kwargs)
                if isinstance(query, str):
                    span.set_attribute(QUERY_TEXT, query)
                if content is not None:
                    span.set_attribute(RECORDS, _json(content))
        return span

    def finish(span: trace.Span, began: float, result: Any) -> None:
        _durations.record(time.perf_counter() - began, base)
        if span.is_recording():
            records = _records(result)
            count = _count(records, op.returns_records)
            if count is not None:
                span.set_attribute(RECORD_COUNT, count)
            if op.returns_records and records is not None and capture_content():
                span.set_attribute(RECORDS, _json(records))

    def failed(span: trace.Span, began: float, exc: BaseException) -> None:
        error = _error_type(exc)
        _durations.record(time.perf_counter() - began, {**base, ERROR_TYPE: error})
        span.set_attribute(ERROR_TYPE, error)

    if inspect.iscoroutinefunction(func):

        @functools.wraps(func)
        async def traced_async(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not _configured():
                return await func(self, *args, **kwargs)
            span, began = start(args, kwargs), time.perf_counter()
            with trace.use_span(span, end_on_exit=True):
                try:
                    result = await func(self, *args, **kwargs)
                except BaseException as exc:
                    failed(span, began, exc)
                    raise
                finish(span, began, result)
                return result

        return traced_async

    @functools.wraps(func)
    def traced(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not _configured():
            return func(self, *args, **kwargs)
        span, began = start(args, kwargs), time.perf_counter()
        with trace.use_span(span, end_on_exit=True):
            try:
                result = func(self, *args, **kwargs)
            except BaseException as exc:
                failed(span, began, exc)
                raise
            finish(span, began, result)
            return result

    return traced


def _error_type(exc: BaseException) -> str:
    """The store's error code (what the API answers), else the exception's class."""
    code = getattr(exc, "code", None)
    return code if isinstance(code, str) else type(exc).__qualname__


def _records(result: Any) -> Any:
    """The records in an operation's result: a named tuple's first list or dict (a search's
    results, a page's sessions, an enrichment's values), a context's messages, or itself."""
    if isinstance(result, tuple) and hasattr(result, "_fields"):
        return next((value for value in result if isinstance(value, list | dict)), None)
    if isinstance(result, dict) and isinstance(result.get("messages"), list):
        return result["messages"]
    return result


def _count(records: Any, returns_records: bool) -> int | None:
    if isinstance(records, list | tuple | dict | set):
        return len(records)
    if records is None or isinstance(records, bool):
        return None
    if isinstance(records, int) and not returns_records:  # how many a delete or a fold touched
        return records
    return 1 if returns_records else None


def _json(value: Any) -> str:
    return json.dumps(value, default=str, ensure_ascii=False)


# Redis round trips ----------------------------------------------------------------------


def _op_of(command: tuple[Any, ...]) -> str:
    """The library function a packed FCALL calls: its first argument after the keys."""
    try:
        return str(command[3 + int(command[2])])
    except (IndexError, TypeError, ValueError):
        return str(command[0])


def _server(backend: Any) -> dict[str, Any]:
    """``server.*`` and ``db.namespace`` of a backend on one server (none on a cluster)."""
    options = getattr(getattr(backend.client, "connection_pool", None), "connection_kwargs", None) or {}
    attributes: dict[str, Any] = {}
    if "host" in options:
        attributes["server.address"] = str(options["host"])
        attributes["server.port"] = int(options.get("port", 6379))
    elif "path" in options:
        attributes["server.address"] = str(options["path"])
    if "db" in options:
        attributes["db.namespace"] = str(options["db"])
    return attributes


def _round_trip(func: Callable[..., Any], what: RoundTrip) -> Callable[..., Any]:
    @functools.wraps(func)
    def traced(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not _configured():
            return func(self, *args, **kwargs)
        if what.batch:
            ops = sorted({_op_of(command) for command in args[0]})
            op, size = " ".join(ops), len(args[0])
        else:
            op, size = str(args[0]), 0
        measured = {"db.system.name": "redis", "db.operation.name": op}
        began = time.perf_counter()
        # Only under a span that records: a background thread's polls would otherwise each
        # start a trace of their own.
        if not trace.get_current_span().is_recording():
            try:
                return func(self, *args, **kwargs)
            finally:
                _redis_durations.record(time.perf_counter() - began, measured)
        attributes = {**measured, "db.system": "redis", **_server(self)}
        if size:
            attributes["db.operation.batch.size"] = size
        name = f"BATCH {op}" if what.batch else op
        with _tracer.start_as_current_span(name, kind=SpanKind.CLIENT, attributes=attributes) as span:
            try:
                return func(self, *args, **kwargs)
            except BaseException as exc:
                span.set_attribute(ERROR_TYPE, type(exc).__qualname__)
                raise
            finally:
                _redis_durations.record(time.perf_counter() - began, measured)

    return traced


# Background work -----------------------------------------------------------------------


def _task(func: Callable[..., Any], task: str) -> Callable[..., Any]:
    measure = _TASKS[task]
    attributes = {TASK: task}
    # Extraction and embedding run only when work was queued: a span each. The summarizer's
    # and the mirror's passes run at every poll, work or not: measured, not traced.
    traced_task = task in ("extraction", "embedding")

    @functools.wraps(func)
    def measured(self: Any, *args: Any, **kwargs: Any) -> Any:
        before = measure.before(self)
        lag = measure.lag(args)
        if lag is not None:
            _task_lag.record(lag, attributes)
        began = time.perf_counter()
        span = None
        if traced_task:
            span = _tracer.start_span(task, kind=SpanKind.INTERNAL, attributes=attributes)
        try:
            with trace.use_span(span, end_on_exit=True) if span is not None else contextlib.nullcontext():
                result = func(self, *args, **kwargs)
        except BaseException:
            _task_failures.add(1, attributes)
            raise
        finally:
            _task_durations.record(time.perf_counter() - began, attributes)
        items, failures = measure.after(self, before, args, result)
        if items:
            _task_items.add(items, attributes)
        if failures:
            _task_failures.add(failures, attributes)
        return result

    return measured


class _Measure:
    """How a task's work is read from its worker and its result (no worker code changed)."""

    def before(self, worker: Any) -> Any:
        return None

    def lag(self, args: tuple[Any, ...]) -> float | None:
        return None

    def after(self, worker: Any, before: Any, args: tuple[Any, ...], result: Any) -> tuple[int, int]:
        return 0, 0


class _Extraction(_Measure):
    def before(self, worker: Any) -> Any:
        return worker.failures

    def lag(self, args: tuple[Any, ...]) -> float | None:
        times = [
            message["created_at"]
            for batch in args[0]
            for message in batch.messages
            if isinstance(message.get("created_at"), int | float)
        ]
        return max(0.0, time.time() - min(times)) if times else None

    def after(self, worker: Any, before: Any, args: tuple[Any, ...], result: Any) -> tuple[int, int]:
        return sum(len(batch.messages) for batch in args[0]), worker.failures - before


class _Embedding(_Measure):
    def before(self, worker: Any) -> Any:
        return worker.embedded, worker.failed

    def after(self, worker: Any, before: Any, args: tuple[Any, ...], result: Any) -> tuple[int, int]:
        return worker.embedded - before[0], worker.failed - before[1]


class _Summary(_Measure):
    def after(self, worker: Any, before: Any, args: tuple[Any, ...], result: Any) -> tuple[int, int]:
        return getattr(result, "summarized", 0), getattr(result, "failed", 0)


class _Mirror(_Measure):
    def after(self, worker: Any, before: Any, args: tuple[Any, ...], result: Any) -> tuple[int, int]:
        return getattr(result, "synced", 0), getattr(result, "failed", 0)


_TASKS: dict[str, _Measure] = {
    "extraction": _Extraction(),
    "embedding": _Embedding(),
    "summary": _Summary(),
    "mirror": _Mirror(),
}


# Tasks on Django's task framework (TASK_BACKEND) -------------------------------------------

#: The app's tasks (persistent_memory.tasks) by the work they do.
_APP_TASKS = {
    "persistent_memory.tasks.extract_conversation": "extraction",
    "persistent_memory.tasks.summarize_conversations": "summary",
    "persistent_memory.tasks.embed": "embedding",
    "persistent_memory.tasks.sync_mirror": "mirror",
}


def _app_task(task_result: Any) -> str | None:
    return _APP_TASKS.get(getattr(task_result.task, "module_path", ""))


def _task_started(sender: Any, task_result: Any, **kwargs: Any) -> None:
    """The lag of one of the app's tasks: from when it was due (enqueued, or its
    ``run_after``, the debounce's delay) to when a worker started it."""
    task = _app_task(task_result)
    started, due = task_result.started_at, task_result.enqueued_at
    if task is None or started is None or due is None:
        return
    run_after = getattr(task_result.task, "run_after", None)
    if run_after is not None and run_after > due:
        due = run_after
    _task_lag.record(max(0.0, (started - due).total_seconds()), {TASK: task})


def _task_finished(sender: Any, task_result: Any, **kwargs: Any) -> None:
    """One of the app's tasks that failed (the worker records it; the next write retries)."""
    task = _app_task(task_result)
    if task is not None and str(getattr(task_result.status, "value", task_result.status)) == "FAILED":
        _task_failures.add(1, {TASK: task})


def connect_tasks(framework: Any) -> None:
    """Listen to the task ``framework``'s signals (``django.tasks`` or the ``django_tasks``
    backport, once :mod:`persistent_memory.tasks` has loaded it): every worker and backend
    sends them where the task runs, so lag and failures are measured there."""
    signals = importlib.import_module(f"{framework.__name__}.signals")
    signals.task_started.connect(_task_started, dispatch_uid="persistent_memory.telemetry.lag")
    signals.task_finished.connect(_task_finished, dispatch_uid="persistent_memory.telemetry.failures")


# Backlogs (observable gauges) -------------------------------------------------------------

_observed: list[bool] = []


def _observe_backlogs() -> None:
    """The journal's and the mirror's backlog, the conversations waiting for a summary and
    the background queues, read from the process's store when a reader collects (never
    building one)."""
    if _observed:
        return
    _observed.append(True)
    _meter.create_observable_gauge(
        "persistent_memory.mirror.backlog",
        callbacks=[_gauge(lambda store: store.backend.dirty_count() if store.mirror.enabled else None)],
        unit="{session}",
        description="Sessions written and not yet mirrored to the database.",
    )
    _meter.create_observable_gauge(
        "persistent_memory.journal.backlog",
        callbacks=[_gauge(lambda store: store.backend.journal_size() if store.mirror.enabled else None)],
        unit="By",
        description="The memory backend's journal not yet folded into the database.",
    )
    _meter.create_observable_gauge(
        "persistent_memory.summary.backlog",
        callbacks=[_gauge(lambda store: store.backend.unsummarized_count())],
        unit="{conversation}",
        description="Conversations waiting for a rolling summary.",
    )
    _meter.create_observable_gauge(
        "persistent_memory.extraction.queue",
        callbacks=[_gauge(_extraction_queued)],
        unit="{batch}",
        description="Writes whose messages wait for extraction in this process.",
    )


def _extraction_queued(store: Any) -> int | None:
    worker = vars(store).get("extraction_worker")  # built at first use: never just to read it
    return None if worker is None else worker.queued


#: What reads the process's store for the gauges (see watch_store); none until the store module is loaded.
_watched: list[Callable[[], Any]] = [lambda: None]


def watch_store(read: Callable[[], Any]) -> None:
    """The gauges read the store ``read()`` answers (None: no store, no figure)."""
    _watched[0] = read


def _gauge(read: Callable[[Any], int | None]) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def observe(options: CallbackOptions) -> Iterable[Observation]:
        store = _watched[0]()
        if store is None:
            return []
        try:
            value = read(store)
        except Exception:  # a backend that does not answer: no figure this time
            return []
        return [] if value is None else [Observation(value)]

    return observe
