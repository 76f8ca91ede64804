"""Where summaries are made: a worker thread in the serving process, or one pass at a time.

Every store has a :class:`SummarizerWorker` (``store.summarizer_worker``). When
summaries are on (``conf.summaries_on``) and ``SUMMARIZER_WORKER`` is True,
``MemoryStore.from_settings`` starts its thread, as it starts the mirror's write-behind
worker: it takes marked conversations in small batches, summarizes them, sleeps
``interval`` seconds when there is nothing to do (or until the summarizers' health lets
it try again), and stops at ``store.close()`` (a summary in progress is abandoned and
its conversation marked again). ``memory_summarize --conversations``, the admin and
the tasks of :mod:`persistent_memory.tasks` call :meth:`SummarizerWorker.run_once`. The summarizer is
built at its first use; one that cannot be built (a missing API key) is a failure of
the summarizers' health, so ``health/`` says why, and is tried again with the backoff.

With ``SUMMARIZER_TASKS`` the thread does not summarize: it enqueues
``persistent_memory.tasks.summarize_conversations_task`` on Django's task framework when conversations are
marked (at most one waiting task at a time where the task backend can tell), and a
task worker makes the summaries. With ``TASK_BACKEND`` the thread is not started at all:
appends enqueue :data:`persistent_memory.tasks.summarize_conversations` themselves.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from persistent_memory.conversations.health import HealthPolicy, SummarizerHealth
from persistent_memory.conversations.signals import summaries_due
from persistent_memory.conversations.summarizers import Summarizer, summarizer_from_settings
from persistent_memory.conversations.summarizing import SummarizeOptions, SummarizeReport, summarize_marked
from persistent_memory.telemetry import instrument

if TYPE_CHECKING:
    from persistent_memory.conf import MemorySettings
    from persistent_memory.store import MemoryStore

logger = logging.getLogger(__name__)

#: A task enqueued on a backend that cannot say whether it ran yet is given this long
#: before another is enqueued.
UNKNOWN_RESULT_SECONDS = 30.0

#: How long the thread sleeps when no conversation is marked.
POLL_SECONDS = 1.0


@instrument
class SummarizerWorker:
    """Summarizes one store's marked conversations (see the module's docstring)."""

    def __init__(
        self,
        store: MemoryStore,
        *,
        summarizer: Summarizer | None = None,
        options: SummarizeOptions | None = None,
        policy: HealthPolicy | None = None,
        interval: float = POLL_SECONDS,
        use_tasks: bool = False,
        conf: MemorySettings | None = None,
    ) -> None:
        self.store = store
        if options is None:
            after = store.backend.summarize_after_tokens
            options = (
                SummarizeOptions()
                if after is None
                else SummarizeOptions(keep_tokens=after // 2, min_tokens=after)
            )
        self.options = options
        self.health = SummarizerHealth(store.backend, policy)
        self.interval = interval
        self.use_tasks = use_tasks
        self._summarizer = summarizer
        self._conf = conf
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._summarizer_lock = threading.Lock()
        self._last_task: Any = None
        #: The last pass's report and the last error that ended a pass (for health/ and the admin).
        self.last_report: SummarizeReport | None = None

    @classmethod
    def from_settings(cls, store: MemoryStore, conf: MemorySettings) -> SummarizerWorker:
        return cls(
            store,
            options=SummarizeOptions.from_settings(conf),
            policy=HealthPolicy.from_settings(conf),
            use_tasks=bool(conf.SUMMARIZER_TASKS),
            conf=conf,
        )

    @property
    def enabled(self) -> bool:
        """Whether the backend marks conversations for summaries (summaries are on)."""
        return self.store.backend.summarize_after_tokens is not None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def summarizer(self) -> Summarizer:
        """The summarizer, built from settings on first use (a bad one fails then, not at startup)."""
        with self._summarizer_lock:
            if self._summarizer is None:
                from persistent_memory.conf import memory_settings

                self._summarizer = summarizer_from_settings(self._conf or memory_settings)
            return self._summarizer

    def run_once(self, limit: int | None = None, *, stop: threading.Event | None = None) -> SummarizeReport:
        """Summarize marked conversations now (at most ``limit``) while health allows."""
        if not self.enabled:
            return SummarizeReport()
        if self._summarizer is None:
            if self.health.wait_seconds() > 0:
                return SummarizeReport(waiting=True)
            try:
                self.summarizer  # noqa: B018 (built now, so that a bad configuration is a failure)
            except ImproperlyConfigured as exc:
                # Shown where operators look (health/, summary_state), and retried with the
                # backoff rather than at every poll.
                state = self.health.failed(f"ImproperlyConfigured: {exc}")
                logger.error(
                    "persistent_memory: the summarizer cannot be built (%s); summarizers are %s", exc, state
                )
                return SummarizeReport(waiting=True)
        report = summarize_marked(
            self.store, self.summarizer, self.options, self.health, limit=limit, stop=stop
        )
        self.last_report = report
        return report

    # The thread -------------------------------------------------------------------

    def start(self) -> None:
        """Start the thread (idempotent)."""
        if self._thread is None:
            self._stop.clear()
            thread = threading.Thread(target=self._run, name="persistent-memory-summarizer", daemon=True)
            self._thread = thread
            thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the thread; a summary in progress is abandoned (its conversation marked again)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join(timeout=timeout)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._stop.wait(self._step())
        finally:
            connections.close_all()  # this thread's, should a summarizer or receiver have opened one

    def _step(self) -> float:
        """One round of the thread; how long to sleep before the next."""
        try:
            if self.use_tasks:
                self.enqueue_if_marked()
                return self.interval
            report = self.run_once(stop=self._stop)
        except Exception:  # the worker must survive anything and try again
            logger.exception("persistent_memory: summarizer worker failed; will retry")
            return self.interval
        if report.waiting:  # until the health lets it try again, looking in now and then
            return max(0.05, min(self.interval, self.health.wait_seconds()))
        return 0.0 if report.taken else self.interval

    def enqueue_if_marked(self) -> bool:
        """Enqueue the summarizing task when conversations are marked, the health lets it try,
        and the task enqueued last has run; whether it did."""
        if self._last_task is not None and not finished(self._last_task):
            return False
        if self.health.wait_seconds() > 0 or not self.store.backend.unsummarized_count():
            return False
        # persistent_memory.tasks enqueues the task and answers with it (loaded by the
        # app's ready with SUMMARIZER_TASKS: the tasks are a layer above this one).
        replies = [reply for _, reply in summaries_due.send(sender=SummarizerWorker) if reply is not None]
        if not replies:
            raise ImproperlyConfigured("SUMMARIZER_TASKS: persistent_memory.tasks is not loaded.")
        self._last_task = replies[0]
        return True


def finished(enqueued: tuple[Any, float]) -> bool:
    """Whether a task enqueued at ``enqueued`` (its result and when) has run, or may be taken
    as run: its backend cannot tell, and ``UNKNOWN_RESULT_SECONDS`` went by."""
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
