"""Embedding in the background: a worker thread in the serving process.

A write that could not get its memory's vector within ``EMBEDDER_REQUEST_TIMEOUT`` (the
embedder failed, timed out, or the circuit was open: see
:mod:`persistent_memory.memories.embedders`) stores the memory without one and, once
its transaction commits, puts the memory's id on this process's :class:`EmbeddingWorker`
queue (bounded by ``EMBEDDER_QUEUE_SIZE``; that put is all the write pays, and when the
queue is full the id is dropped with a warning: ``memory_embed`` catches up). The
thread, started at the first put when ``EMBEDDER_WORKER`` is on, takes the ids in
batches and embeds the memories that still have no vector of the current model with the
embedder's own timeout and retries (:func:`persistent_memory.memories.upkeep.embed_batch`).
While the circuit is open it waits for the cool-down; a batch that fails is kept and
tried again then, so a memory gets its vector once the embedder answers again. The
conversation messages the mirror writes are queued the same way where messages get
vectors (MESSAGE_EMBEDDINGS): this module receives the mirror's ``messages_mirrored``
signal (connected when the app is ready), and the thread embeds them with
:func:`persistent_memory.memories.message_search.embed_batch`.

It is kept small on purpose: one queue, one thread, one function it calls. With
``TASK_BACKEND`` the write sends :data:`~persistent_memory.memories.signals.vectors_wanted`
instead, which :mod:`persistent_memory.tasks` answers by enqueueing its ``embed`` task on
Django's task framework (the same ``embed_batch``).
The queue lives in the process's memory: what is queued when the process stops is
embedded by ``manage.py memory_embed``. The worker stops at a settings change and when
the process exits.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import queue
import threading
from typing import TYPE_CHECKING, Any

from django.core.signals import setting_changed
from django.db import close_old_connections, connections, router, transaction
from django.dispatch import receiver

from persistent_memory.conf import RELOADED_BY, memory_settings
from persistent_memory.memories import embedders, message_search, upkeep
from persistent_memory.memories.signals import vectors_wanted
from persistent_memory.mirror.signals import messages_mirrored
from persistent_memory.telemetry import instrument

if TYPE_CHECKING:
    from django.db.models import Model

logger = logging.getLogger("persistent_memory.memories")

#: The most memories embedded in one call of the embedder.
BATCH = 64
#: Seconds the thread waits between looks at a circuit another caller is trying.
POLL_SECONDS = 0.05


@instrument
class EmbeddingWorker:
    """Embeds the memories writes stored without a vector (see the module's docstring)."""

    def __init__(
        self,
        *,
        queue_size: int = 10_000,
        embedder: embedders.Embedder | None = None,
        gate: embedders.Circuit | None = None,
    ) -> None:
        self.queue_size = queue_size
        # The settings' embedder and circuit when it was built: a thread still in a call
        # after a settings change never records into the new ones.
        self.embedder = embedder or embedders.current()
        self.gate = gate or embedders.circuit()
        # (kind, row id): "memory" or "message" (see message_search).
        self._queue: queue.Queue[tuple[str, int] | None] = queue.Queue(maxsize=queue_size)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._pending = 0  # ids queued or being embedded
        self._dropping = False
        #: Counts since the worker was built (for ``health/``).
        self.embedded = 0
        self.dropped = 0
        #: Tries that failed (the embedder or the database): their ids are tried again.
        self.failed = 0

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def queued(self) -> int:
        """Memories waiting for the thread (the batch it holds included)."""
        return self._pending

    def enqueue(self, memory_id: int, kind: str = "memory") -> bool:
        """Queue one memory (or, with ``kind`` "message", one mirrored message) and start
        the thread; whether it was queued. Never blocks."""
        self.start()
        with self._lock:
            try:
                self._queue.put_nowait((kind, memory_id))
            except queue.Full:
                self.dropped += 1
                warn, self._dropping = not self._dropping, True
            else:
                self._pending += 1
                self._dropping = False
                return True
        if warn:  # one warning per run of drops
            logger.warning(
                "persistent_memory: the embedding queue is full (%d memories); memories written "
                "without a vector wait for `manage.py memory_embed` until it drains",
                self.queue_size,
            )
        return False

    def start(self) -> None:
        """Start the thread (idempotent)."""
        if self._thread is None:
            with self._lock:
                if self._thread is None:
                    self._stop.clear()
                    self._thread = threading.Thread(
                        target=self._run, name="persistent-memory-embedding", daemon=True
                    )
                    self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread; what is queued is left to ``memory_embed``. A call to the
        embedder in progress is not waited for beyond ``timeout`` (the thread is a daemon
        and writes nothing once stopped)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)  # wake the thread
        thread.join(timeout=timeout)
        with self._idle:
            self._pending = 0
            self._idle.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until everything queued has been embedded (or found embedded already);
        whether it was within ``timeout``."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout=timeout)

    def _take(self) -> list[tuple[str, int]]:
        try:
            first = self._queue.get(timeout=1.0)
        except queue.Empty:
            return []
        ids = [first] if first is not None else []
        while len(ids) < BATCH:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                ids.append(item)
        return ids

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                ids = self._take()
                while ids and not self._stop.is_set():
                    if self._embed(ids):
                        with self._idle:
                            self._pending = max(0, self._pending - len(ids))
                            self._idle.notify_all()
                        ids = []
        finally:
            connections.close_all()  # this thread's

    def _embed(self, keys: list[tuple[str, int]]) -> bool:
        """One try at ``keys`` when the circuit lets it; whether they are done (embedded,
        refused, or gone), False to try again after the cool-down."""
        gate = self.gate
        wait = gate.wait_seconds()
        if wait > 0:
            self._stop.wait(min(wait, 1.0))
            return False
        if not gate.allow():  # a request is trying the embedder: its outcome decides
            self._stop.wait(POLL_SECONDS)
            return False
        try:
            close_old_connections()  # one the database dropped, as a request would
            outcome: int | None = 0
            for kind, embed in (("memory", upkeep.embed_batch), ("message", message_search.embed_batch)):
                ids = [pk for of, pk in keys if of == kind]
                done = embed(ids, embedder=self.embedder, gate=gate, stop=self._stop) if ids else 0
                outcome = None if done is None or outcome is None else outcome + done
        except Exception:  # the thread must survive anything: memory_embed catches up
            self.failed += 1
            logger.exception("persistent_memory: background embedding failed; memory_embed catches up")
            return True
        if outcome is None:
            self.failed += 1
            return self._stop.is_set()
        self.embedded += outcome
        return True


_worker: list[EmbeddingWorker] = []
_worker_lock = threading.Lock()


def worker() -> EmbeddingWorker | None:
    """This process's worker (None with ``EMBEDDER_WORKER`` off)."""
    if not memory_settings.EMBEDDER_WORKER:
        return None
    with _worker_lock:
        if not _worker:
            _worker.append(EmbeddingWorker(queue_size=memory_settings.EMBEDDER_QUEUE_SIZE))
        return _worker[0]


def embed_later(memory_id: int) -> None:
    """Have the worker embed ``memory_id`` once the caller's transaction commits (a
    thread of its own cannot see the row before)."""
    from persistent_memory.models import LongTermMemory

    _later("memory", [memory_id], LongTermMemory)


def embed_messages_later(ids: list[int]) -> None:
    """Have the worker embed the mirrored messages ``ids`` once the caller's transaction
    commits (the mirror's sync, which wrote them)."""
    from persistent_memory.models import MemoryMessage

    _later("message", list(ids), MemoryMessage)


def _later(kind: str, ids: list[int], model: type[Model]) -> None:
    # With TASK_BACKEND a task embeds them: persistent_memory.tasks receives the signal
    # (the app loads it with that setting). Should nothing receive it, this process's
    # worker does the work rather than nobody.
    if memory_settings.TASK_BACKEND and memory_settings.EMBEDDER_WORKER:
        if vectors_wanted.send(sender=EmbeddingWorker, kind=kind, ids=ids):
            return
        logger.warning(
            "memory: TASK_BACKEND is set but persistent_memory.tasks is not loaded; embedding here"
        )

    def put() -> None:
        current = worker()
        for pk in ids if current is not None else ():
            current.enqueue(pk, kind)

    transaction.on_commit(put, using=router.db_for_write(model))


@receiver(messages_mirrored)
def _embed_mirrored(sender: Any, *, messages: list[tuple[int, str]], **kwargs: Any) -> None:
    """Have the worker embed the mirror's new message rows (``(conversation row id,
    message id)``) once the mirror's transaction commits, where messages get vectors
    (:func:`~persistent_memory.memories.message_search.embeds_messages`). Connected when
    the app is ready (see apps.py)."""
    if not messages or not message_search.embeds_messages():
        return
    embed_messages_later(message_search.row_ids(messages))


def stop_worker() -> None:
    with _worker_lock:
        stopped, _worker[:] = list(_worker), []
    for item in stopped:
        item.stop()


atexit.register(stop_worker)


@receiver(setting_changed)
def _stop_on_settings_change(*, setting: str, **kwargs: Any) -> None:
    if setting in RELOADED_BY:
        stop_worker()
