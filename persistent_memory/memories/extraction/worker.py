"""Extraction in the background: a worker thread in the serving process.

Every store has an :class:`ExtractionWorker` (``store.extraction_worker``). When
``MEMORY_EXTRACTION_WORKER`` is on and ``MEMORY_EXTRACTORS`` is not empty,
``MemoryStore.from_settings`` starts it, as it starts the summarizer's worker and the
mirror's write-behind worker: it connects to the ``messages_added`` signal, which
``add_messages`` and the enrich and store lanes send after their write, and puts the
new user and assistant messages of the store's writes on a bounded in-process queue.
That put is all a write pays: the receiver never blocks, and when the queue is full
the batch is dropped with a logged warning (``memory_extract`` catches up). The thread
takes what is queued, groups it by owner and runs the extractors over each owner's
messages (:func:`~persistent_memory.memories.extraction.find_candidates`); an extractor
or a database that fails is logged and counted, and the thread goes on. It stops at
``store.close()``. Forgetting an owner (:func:`~persistent_memory.operations.forget.forget_owner`)
first tells the worker to skip what that owner wrote and waits for an extraction of
theirs in progress, and what was found in a session that no longer exists is not
written, so nothing queued brings a forgotten owner's memories back. The worker asks the
backend about a session only then, when its messages yielded a memory to write: the
writes themselves stay one call each (most messages yield nothing).

The queue lives in the process's memory: what is queued (at most
``MEMORY_EXTRACTION_QUEUE_SIZE`` batches, a batch being the messages of one write) when
the process stops or crashes is not extracted. ``manage.py memory_extract`` runs the
extractors over the newest messages of every live session again; extraction upserts by
key and leaves a memory that is already as found untouched, so running it after a
restart (or on a schedule) recovers what was lost and changes nothing else. With
``TASK_BACKEND`` this worker is not started: appends enqueue
:data:`persistent_memory.tasks.extract_conversation` on Django's tasks framework instead.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import TYPE_CHECKING, Any, NamedTuple

from django.db import close_old_connections, connections

from persistent_memory.conversations.signals import messages_added
from persistent_memory.exceptions import SessionExpired, SessionNotFound
from persistent_memory.memories.extraction import (
    ExtractionReport,
    find_candidates,
    message_times,
    write_candidates,
)
from persistent_memory.telemetry import instrument

if TYPE_CHECKING:
    from persistent_memory.conf import MemorySettings
    from persistent_memory.memories.extraction.candidates import Candidate
    from persistent_memory.store import MemoryStore

logger = logging.getLogger(__name__)

#: Batches (the messages of one write) the queue holds by default.
QUEUE_SIZE = 1000
#: The most batches the thread takes at once (grouped by owner before extraction).
TAKE = 1000
#: How long the thread lets writes gather once one has woken it. Woken by every write, it
#: took the interpreter lock from the serving threads once per write (a quarter of a
#: memory-backend turn's time, the extraction itself being a microsecond a write); a
#: write that finds it gathering costs it nothing, and extraction is background work.
GATHER_SECONDS = 0.05
#: The roles whose messages are extracted from.
ROLES = ("user", "assistant")
#: What else of a message an extraction reads: who said it, and when (the memory's said_at).
_KEPT = ("name", "created_at")
#: The longest error text kept for ``health/``.
ERROR_LIMIT = 500


class Batch(NamedTuple):
    """The new messages of one write, as the ``messages_added`` signal reported them (a
    tuple: one is built on every write)."""

    owner: str
    session_id: str
    conversation: str
    messages: list[dict[str, Any]]
    #: Its place in the order of writes queued (see :meth:`ExtractionWorker.forget`).
    seq: int = 0


@instrument
class ExtractionWorker:
    """Extracts memories from one store's new messages (see the module's docstring)."""

    def __init__(self, store: MemoryStore, *, queue_size: int = QUEUE_SIZE, enabled: bool = False) -> None:
        self.store = store
        #: Whether ``from_settings`` starts it (``MEMORY_EXTRACTION_WORKER`` and extractors configured).
        self.enabled = enabled
        self.queue_size = queue_size
        # A deque the writers append to and the thread pops from (both atomic), and an event
        # that wakes the thread, set by the first write after it took what was queued: a
        # write takes one uncontended lock (the counts), never the thread's wake-up.
        self._queue: deque[Batch] = deque()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._pending = 0  # batches queued or being extracted
        self._seq = 0  # the last batch queued
        self._forgotten: dict[str, int] = {}  # owner -> the last batch of theirs not to extract
        self._working: str | None = None  # the owner whose messages are being extracted
        self._dropping = False  # in a run of drops (a warning is logged at its start)
        #: Counts since the worker was built (for ``health/``): batches and messages extracted
        #: from, memories upserted, batches dropped (queue full), failed extractions.
        self.batches = 0
        self.messages = 0
        self.written = 0
        self.dropped = 0
        self.failures = 0
        self.last_error: str | None = None
        self.last_error_at: float | None = None
        self.last_success_at: float | None = None

    @classmethod
    def from_settings(cls, store: MemoryStore, conf: MemorySettings) -> ExtractionWorker:
        enabled = bool(conf.MEMORY_EXTRACTION_WORKER) and bool(conf.MEMORY_EXTRACTORS)
        return cls(store, queue_size=conf.MEMORY_EXTRACTION_QUEUE_SIZE, enabled=enabled)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def queued(self) -> int:
        """Batches waiting in the queue."""
        return len(self._queue)

    # The receiver (the writer's thread) ------------------------------------------

    def _on_messages_added(
        self,
        sender: Any,
        *,
        store: Any = None,
        owner: str = "",
        session_id: str = "",
        conversation: str = "",
        messages: list[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> None:
        """Queue the new user and assistant messages of this worker's store; never block."""
        # Another store's write (each worker extracts what its own store, and the copies
        # for_owner makes of it, write); vars(): a store builds its worker at first use.
        if vars(store).get("extraction_worker") is not self or self._stop.is_set():
            return
        kept = [
            {"id": message.get("id"), "role": message["role"], "content": message.get("content")}
            | {field: message[field] for field in _KEPT if field in message}
            for message in messages or ()
            if isinstance(message, dict) and message.get("role") in ROLES
        ]
        if not kept:
            return
        warn = False
        with self._lock:
            queued = len(self._queue) < self.queue_size
            if queued:
                self._seq += 1
                self._dropping = False
                self._pending += 1
                self._queue.append(Batch(owner, session_id, conversation, kept, self._seq))
            else:
                self.dropped += 1
                warn, self._dropping = not self._dropping, True
        if queued:
            if not self._wake.is_set():  # set once per gathering, not per write
                self._wake.set()
        elif warn:  # one warning per run of drops, not one per write
            logger.warning(
                "persistent_memory: the extraction queue is full (%d batches); new messages are not "
                "extracted in the background until it drains (run `manage.py memory_extract` to "
                "catch up)",
                self.queue_size,
            )

    # The thread ------------------------------------------------------------------

    def start(self) -> None:
        """Connect to ``messages_added`` and start the thread (idempotent)."""
        if self._thread is None:
            self._stop.clear()
            messages_added.connect(self._on_messages_added, weak=False, dispatch_uid=self._uid)
            thread = threading.Thread(target=self._run, name="persistent-memory-extraction", daemon=True)
            self._thread = thread
            thread.start()

    @property
    def _uid(self) -> str:
        return f"persistent_memory.extraction.{id(self)}"

    def stop(self, timeout: float = 10.0) -> None:
        """Disconnect and stop the thread after the batch in progress; what is still queued
        is not extracted (``memory_extract`` catches up)."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        messages_added.disconnect(dispatch_uid=self._uid)
        self._wake.set()
        thread.join(timeout=timeout)
        left = self._discard()
        if left:
            logger.info(
                "persistent_memory: extraction worker stopped with %d batches not extracted "
                "(`manage.py memory_extract` catches up)",
                left,
            )

    def _discard(self) -> int:
        """Empty the queue; how many batches it held."""
        left = 0
        with self._idle:
            while self._queue:
                self._queue.popleft()
                left += 1
            self._pending = 0
            self._idle.notify_all()
        return left

    def wait_idle(self, timeout: float) -> bool:
        """Wait until everything queued has been extracted; whether it was within ``timeout``."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout=timeout)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if not self._wake.wait(timeout=1.0):
                    continue
                self._stop.wait(GATHER_SECONDS)
                # Cleared before taking: a write after this sets it again.
                self._wake.clear()
                taken = []
                while self._queue and len(taken) < TAKE:
                    taken.append(self._queue.popleft())
                if self._queue:
                    self._wake.set()  # more than TAKE were queued
                try:
                    if taken and not self._stop.is_set():
                        self.extract(taken)
                except Exception as exc:  # the thread must survive anything: memory_extract catches up
                    logger.exception("persistent_memory: extraction worker failed; it goes on")
                    self._failed(f"{type(exc).__name__}: {exc}")
                finally:
                    with self._idle:
                        self._pending = max(0, self._pending - len(taken))
                        self._idle.notify_all()
        finally:
            connections.close_all()  # this thread's

    def forget(self, owner: str, timeout: float = 30.0) -> bool:
        """Extract nothing more of what ``owner`` wrote until now (queued batches are skipped)
        and wait for an extraction of theirs in progress to end: called before their memories
        are deleted, so that none comes back. Whether it ended within ``timeout``."""
        with self._idle:
            self._forgotten[owner] = self._seq
            return self._idle.wait_for(lambda: self._working != owner, timeout=timeout)

    def extract(self, batches: list[Batch]) -> None:
        """Run the extractors over ``batches``, one call per owner; failures logged and counted.

        Batches of an owner forgotten since are skipped. What was found in the messages of
        a session deleted since (by ``memory_forget`` in another process, say) is not
        written: whether a session is still there is asked only when its messages yielded
        something to write, so a write whose messages yield nothing costs the backend no
        call of the worker's."""
        by_owner: dict[str, list[Batch]] = {}
        for batch in batches:
            by_owner.setdefault(batch.owner, []).append(batch)
        for owner, owned in by_owner.items():
            with self._idle:
                cutoff = self._forgotten.get(owner, 0)
                kept = [batch for batch in owned if batch.seq > cutoff]
                if not kept:
                    continue
                self._working = owner
            messages = [message for batch in kept for message in batch.messages]
            report = ExtractionReport()
            try:
                candidates = find_candidates(messages, report)
                if candidates:
                    candidates = self._of_live_sessions(candidates, kept)
                if candidates:
                    close_old_connections()  # one the database dropped, as a request would
                    write_candidates(owner, candidates, report, message_times(messages))
            except Exception as exc:  # the worker must survive anything: memory_extract catches up
                logger.exception("persistent_memory: extraction of %d messages failed", len(messages))
                self._failed(f"{type(exc).__name__}: {exc}")
            else:
                if report.failed:
                    self._failed(report.last_error or "an extractor failed")
                else:
                    self.last_success_at = time.time()
            finally:
                with self._idle:
                    self._working = None
                    self._idle.notify_all()
            self.messages += len(messages)
            self.written += report.written
        self.batches += len(batches)

    def _of_live_sessions(self, candidates: list[Candidate], batches: list[Batch]) -> list[Candidate]:
        """``candidates`` but those found only in messages of sessions that no longer exist;
        only the sessions they came from are asked about (all of them for a candidate found
        in no message in particular)."""
        session_of = {message["id"]: batch.session_id for batch in batches for message in batch.messages}
        asked = {session_of.get(source) for candidate in candidates for source in candidate.source_messages}
        if any(not candidate.source_messages for candidate in candidates) or None in asked:
            asked = {batch.session_id for batch in batches}
        owner = batches[0].owner
        gone = {session_id for session_id in asked if not self._session_live(owner, session_id)}
        if not gone:
            return candidates
        live = {batch.session_id for batch in batches} - gone
        return [
            candidate
            for candidate in candidates
            if any(session_of.get(source) in live for source in candidate.source_messages)
        ]

    def _session_live(self, owner: str, session_id: str) -> bool:
        """Whether the session still exists (a backend that does not answer: assumed so)."""
        try:
            self.store.for_owner(owner).session_info(session_id)
        except (SessionNotFound, SessionExpired):
            return False
        except Exception:  # the backend cannot tell: the messages were written, extract them
            return True
        return True

    def _failed(self, error: str) -> None:
        self.failures += 1
        self.last_error, self.last_error_at = error[:ERROR_LIMIT], time.time()
