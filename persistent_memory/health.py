"""What ``health/`` reports: whether each part the API needs answers, probed cheaply.

A report is ``{"status": "ok" | "unavailable", "<part>": {...}, ...}``: each part has
its own ``status``, what it is, its latency when it answered and the error when it did
not. ``status`` is "ok" only when every part is. Anyone may learn the status; the
parts are for staff (the API decides who sees what).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.db import Error as DatabaseError

from persistent_memory.conf import memory_settings
from persistent_memory.exceptions import BackendUnavailable
from persistent_memory.store import MemoryStore

OK = "ok"
UNAVAILABLE = "unavailable"
#: The longest error text a part reports.
ERROR_LIMIT = 500


def _probe(check: Callable[[], object], errors: tuple[type[Exception], ...], code: str) -> dict[str, Any]:
    """``status`` and latency of one call of ``check``, or ``status``, ``detail`` and ``code``."""
    started = time.perf_counter()
    try:
        check()
    except errors as exc:
        return {"status": UNAVAILABLE, "detail": str(exc), "code": code}
    return {"status": OK, "latency_ms": round((time.perf_counter() - started) * 1000, 3)}


def backend_health(store: MemoryStore) -> dict[str, Any]:
    """The store backend: its name, where it keeps the data (no credentials) and a ping."""
    backend = store.backend
    return {
        "name": backend.name,
        "location": backend.describe(),
        **_probe(store.ping, (BackendUnavailable,), BackendUnavailable.code),
    }


def database_health(alias: str = DEFAULT_DB_ALIAS) -> dict[str, Any]:
    """A database connection: connect when there is none, then ``SELECT 1``.

    The API needs the database for authentication (users, tokens, sessions) and the
    mirror; ``SELECT 1`` proves the server answers on this process's connection.
    """
    connection = connections[alias]

    def select_one() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")

    return {
        "alias": alias,
        "vendor": connection.vendor,
        **_probe(select_one, (DatabaseError,), "database_unavailable"),
    }


def mirror_health(store: MemoryStore) -> dict[str, Any]:
    """The ORM mirror: how far behind it is, its last error, the journal it keeps (and the
    journal lines a start skipped, not being records a write made).

    Unavailable while a memory store waits for its database to restore its sessions
    (the store refuses calls until then)."""
    mirror, backend = store.mirror, store.backend
    part: dict[str, Any] = {"mode": mirror.mode, "status": UNAVAILABLE if mirror.restore_pending else OK}
    if not mirror.enabled:
        return part
    try:
        pending = backend.dirty_count()
    except BackendUnavailable:
        pending = None  # the backend part says why
    return {
        **part,
        "pending_sessions": pending,
        "last_sync_at": mirror.last_sync_at,
        "last_error": mirror.last_error,
        "last_error_at": mirror.last_error_at,
        "journal_bytes": backend.journal_size(),
        "idempotency_bytes": backend.idempotency_size(),
        "journal_skipped": backend.journal_skipped(),
    }


def _moment(epoch: Any) -> datetime | None:
    return None if epoch is None else datetime.fromtimestamp(float(epoch), tz=UTC)


def summarizer_health(store: MemoryStore) -> dict[str, Any]:
    """The conversations' summarizers: their health state (see
    :mod:`persistent_memory.conversations.health`), how many conversations wait for a
    summary, the last error and success, and where summaries are made.

    Its ``status`` stays "ok" whatever the state: windows never wait for a summarizer
    (degraded, they keep the last summary and truncate), so the API still works."""
    worker = store.summarizer_worker
    part: dict[str, Any] = {"status": OK, "enabled": worker.enabled}
    if not worker.enabled:
        return part
    part["worker"] = "tasks" if worker.use_tasks else ("thread" if worker.running else "off")
    try:
        record = worker.health.record()
        pending = store.backend.unsummarized_count()
    except BackendUnavailable:
        return {**part, "state": None, "pending": None}  # the backend part says why
    return {
        **part,
        "state": record["state"],
        "pending": pending,
        "failures": int(record.get("failures") or 0),
        "retry_at": _moment(record.get("retry_at")),
        "last_error": record.get("last_error"),
        "last_error_at": _moment(record.get("last_error_at")),
        "last_success_at": _moment(record.get("last_success_at")),
    }


def extraction_health(store: MemoryStore) -> dict[str, Any]:
    """This process's extraction worker (see
    :mod:`persistent_memory.memories.extraction.worker`): whether it runs, what waits in
    its queue, and its counts and last error since it started.

    Its ``status`` stays "ok": writes never wait for extraction, and ``memory_extract``
    catches up with what it dropped or failed."""
    worker = store.extraction_worker
    part: dict[str, Any] = {"status": OK, "enabled": worker.enabled}
    if not worker.enabled:
        return part
    return {
        **part,
        "worker": "thread" if worker.running else ("tasks" if memory_settings.TASK_BACKEND else "off"),
        "queued": worker.queued,
        "queue_size": worker.queue_size,
        "batches": worker.batches,
        "messages": worker.messages,
        "written": worker.written,
        "dropped": worker.dropped,
        "failures": worker.failures,
        "last_error": worker.last_error,
        "last_error_at": _moment(worker.last_error_at),
        "last_success_at": _moment(worker.last_success_at),
    }


def embedder_health() -> dict[str, Any]:
    """Semantic search's embedder in this process: its model, where vectors are compared,
    its circuit (whether requests call it: see :mod:`persistent_memory.memories.embedders`),
    its outcomes since the process started, the background worker's queue, and how many
    memories wait for a vector of the current model (``memory_embed`` embeds them).

    Its ``status`` stays "ok": a failing embedder costs writes nothing (memories are
    stored without vectors and embedded later) and search falls back to keyword."""
    from persistent_memory.memories import embedders, embedding_worker, upkeep, vectors

    embedder = embedders.current()
    if embedder is None:
        return {"status": OK, "enabled": False}
    state, circuit, worker = embedders.health, embedders.circuit(), embedding_worker.worker()
    try:
        pending, backend = upkeep.unembedded(embedder).count(), vectors.backend()
    except DatabaseError:
        pending, backend = None, None  # the database part says why
    return {
        "status": OK,
        "enabled": True,
        "model": embedder.model,
        "vector_backend": backend,
        "pending": pending,
        "circuit": circuit.state,
        "consecutive_failures": circuit.failures,
        "opened_at": _moment(circuit.opened_at),
        "retry_at": _moment(circuit.retry_at()),
        "worker": "off" if worker is None else ("thread" if worker.running else "idle"),
        "queued": worker.queued if worker is not None else 0,
        "dropped": worker.dropped if worker is not None else 0,
        "embedded": state.embedded,
        "failures": state.failures,
        "rejected": state.rejected,
        "skipped": state.skipped,
        "last_error": state.last_error,
        "last_error_at": _moment(state.last_error_at),
        "last_success_at": _moment(state.last_success_at),
    }


def tasks_health() -> dict[str, Any]:
    """Where the background work runs: ``"threads"`` in this process (no ``TASK_BACKEND``),
    or the task backend's alias and class, with the app's tasks waiting on it where the
    backend can tell (``backlog``; None: it cannot). Its ``status`` stays "ok": writes never
    wait for background work."""
    from persistent_memory.tasks import backend_alias, backlog, task_backend

    alias = backend_alias()
    if alias is None:
        return {"status": OK, "runner": "threads"}
    part: dict[str, Any] = {"status": OK, "runner": "tasks", "backend": alias}
    try:
        backend = task_backend()
        part["class"] = f"{type(backend).__module__}.{type(backend).__qualname__}"
        part["backlog"] = backlog()
    except Exception as exc:  # a bad alias (checks say so), the database down: reported, not raised
        part["error"] = f"{type(exc).__name__}: {exc}"[:ERROR_LIMIT]
    return part


def health_report(store: MemoryStore) -> dict[str, Any]:
    """Every part's health, and ``status``: "ok" when every part is."""
    parts = {
        "backend": backend_health(store),
        "database": database_health(),
        "mirror": mirror_health(store),
        "summarizer": summarizer_health(store),
        "extraction": extraction_health(store),
        "embedder": embedder_health(),
        "tasks": tasks_health(),
    }
    status = OK if all(part["status"] == OK for part in parts.values()) else UNAVAILABLE
    return {"status": status, **parts}
