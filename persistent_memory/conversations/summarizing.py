"""The summarizing step: fold a marked conversation's older turns into its summary.

:func:`summarize_conversation` reads what the summary does not cover yet (one backend
call), chooses the new *anchor*, calls the summarizer outside any lock with a timeout,
fits its answer to ``SUMMARY_MAX_TOKENS`` and commits it with a compare-and-set on the
anchor it read. So an append made meanwhile is never lost (it comes after the new
anchor), and of two summarizers of one conversation one commits; the other's summary
is dropped (the winner's commit marks the conversation again if it still has more than
``SUMMARIZE_AFTER_TOKENS`` pending). A summarizer that fails leaves the conversation
marked: a mark is never lost to a failure.

The new anchor ends a whole turn group (never between a tool call and its results)
and leaves the *pending zone* after it: the newest whole groups holding at least
``keep_tokens`` (half of ``SUMMARIZE_AFTER_TOKENS``) and, always, the newest group
(whose tools may still be running). Nothing is done while the thread after the
current anchor holds ``min_tokens`` (``SUMMARIZE_AFTER_TOKENS``) or fewer, or when
only pinned system messages would be folded.

:func:`summarize_marked` runs the step over marked conversations in batches, asking
the summarizers' health (:mod:`.health`) first and telling it how each went.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from persistent_memory.backends.conversations import Summary, SummaryBackend
from persistent_memory.chat.messages import chat_message
from persistent_memory.conversations.health import SummarizerHealth
from persistent_memory.conversations.signals import send_safely, summary_updated
from persistent_memory.conversations.summaries import fit_summary
from persistent_memory.conversations.summarizers import Summarizer, SummarizerFailed
from persistent_memory.exceptions import PersistentMemoryError, SessionNotFound
from persistent_memory.owners import split_storage_id

if TYPE_CHECKING:
    from persistent_memory.conf import MemorySettings
    from persistent_memory.store import MemoryStore

logger = logging.getLogger(__name__)

#: Marked conversations taken from the backend at a time.
BATCH_SIZE = 10


class SummarizingStopped(Exception):
    """The worker is stopping: the conversation was marked again, untouched."""


@dataclass(frozen=True)
class SummarizeOptions:
    """How a summary is made (see the module's docstring and ``conf.DEFAULTS``)."""

    #: SUMMARY_MAX_TOKENS: what a summary may cost in a window.
    max_tokens: int = 1000
    tokenizer: str = "o200k_base"
    #: SUMMARIZER_TIMEOUT_SECONDS: how long the summarizer may take.
    timeout_seconds: float = 30.0
    #: The pending zone: the newest whole groups of at least this many tokens stay.
    keep_tokens: int = 2000
    #: Nothing to do while the thread after the anchor holds this many tokens or fewer.
    min_tokens: int = 4000

    @classmethod
    def from_settings(cls, conf: MemorySettings) -> SummarizeOptions:
        after = conf.SUMMARIZE_AFTER_TOKENS
        return cls(
            max_tokens=conf.SUMMARY_MAX_TOKENS,
            tokenizer=conf.TOKENIZER,
            timeout_seconds=float(conf.SUMMARIZER_TIMEOUT_SECONDS),
            keep_tokens=after // 2,
            min_tokens=after,
        )


class SummaryPlan(NamedTuple):
    """What a summary folds in: the messages up to ``anchor`` (their ``tokens``, system
    messages included) and, for the summarizer, those that are not system messages."""

    anchor: str
    anchor_seq: int
    tokens: int
    messages: list[dict[str, Any]]


def turn_groups(stored: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The messages of a thread as turn groups, oldest first: a tool message joins the
    assistant call (and results) before it; any other message starts a group."""
    groups: list[list[dict[str, Any]]] = []
    for message in stored:
        previous = groups[-1] if groups else None
        if (
            message["role"] == "tool"
            and previous is not None
            and (previous[0]["role"] == "assistant" and previous[0].get("tool_calls"))
        ):
            previous.append(message)
        else:
            groups.append([message])
    return groups


def plan_summary(texts: list[str], *, keep_tokens: int, min_tokens: int) -> SummaryPlan | None:
    """The summary to make of a thread's messages after the current anchor (stored texts,
    oldest first), or None when there is nothing to do (see the module's docstring)."""
    if not texts:
        return None
    stored = json.loads(f"[{', '.join(texts)}]")
    if sum(message["tokens"] for message in stored) <= min_tokens:
        return None
    groups = turn_groups(stored)
    cut, kept = len(groups) - 1, sum(message["tokens"] for message in groups[-1])  # the newest always stays
    while cut > 0 and kept < keep_tokens:
        cut -= 1
        kept += sum(message["tokens"] for message in groups[cut])
    folded = [message for group in groups[:cut] for message in group]
    chats = [chat_message(message) for message in folded if message["role"] != "system"]
    if not chats:
        return None
    anchor = folded[-1]
    return SummaryPlan(anchor["id"], anchor["seq"], sum(message["tokens"] for message in folded), chats)


def call_with_timeout(
    function: Callable[..., Any], *args: Any, timeout: float, stop: threading.Event | None = None
) -> Any:
    """``function(*args)`` in a daemon thread of its own; :class:`SummarizerFailed` when it
    does not return within ``timeout`` seconds (the thread is abandoned: a hung summarizer
    cannot hold the worker), :class:`SummarizingStopped` as soon as ``stop`` is set."""
    outcome: dict[str, Any] = {}
    done = threading.Event()

    def run() -> None:
        try:
            outcome["value"] = function(*args)
        except BaseException as exc:  # handed to the caller, whatever it is
            outcome["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name="persistent-memory-summarize-call", daemon=True).start()
    deadline = time.monotonic() + timeout
    while not done.wait(min(0.05, max(0.0, deadline - time.monotonic()))):
        if stop is not None and stop.is_set():
            raise SummarizingStopped()
        if time.monotonic() >= deadline:
            message = f"TimeoutError: no summary within {timeout:g} s (SUMMARIZER_TIMEOUT_SECONDS)"
            raise SummarizerFailed(message)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def _backend(store_or_backend: MemoryStore | SummaryBackend) -> SummaryBackend:
    return getattr(store_or_backend, "backend", store_or_backend)  # type: ignore[return-value]


def _summary_text(
    summarizer: Summarizer,
    previous: str | None,
    plan: SummaryPlan,
    options: SummarizeOptions,
    stop: threading.Event | None,
) -> tuple[str, int]:
    """The summarizer's answer fitted to the budget; :class:`SummarizerFailed` for anything else."""
    try:
        text = call_with_timeout(
            summarizer.summarize, previous, plan.messages, timeout=options.timeout_seconds, stop=stop
        )
    except (SummarizerFailed, SummarizingStopped):
        raise
    except Exception as exc:  # a summarizer of the project's may raise anything
        raise SummarizerFailed(f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(text, str) or not text.strip():
        raise SummarizerFailed(f"The summarizer answered no summary ({type(text).__name__} {text!r:.80}).")
    fitted, tokens = fit_summary(text.strip(), options.max_tokens, options.tokenizer)
    if fitted is None:
        raise SummarizerFailed(f"Not a word of the summary fits SUMMARY_MAX_TOKENS={options.max_tokens}.")
    return fitted, tokens


def summarize_conversation(
    store_or_backend: MemoryStore | SummaryBackend,
    storage_id: str,
    conversation: str,
    summarizer: Summarizer,
    options: SummarizeOptions,
    *,
    stop: threading.Event | None = None,
) -> bool:
    """Fold the older turns of one conversation into its summary (see the module's
    docstring); whether a summary was committed. Raises :class:`SummarizerFailed` when
    the summarizer failed (the conversation is marked again), :class:`SummarizingStopped`
    when ``stop`` was set meanwhile, and backend errors as they come."""
    backend = _backend(store_or_backend)
    try:
        source = backend.summary_source(storage_id, conversation)
    except SessionNotFound:
        return False  # gone (or expired) since it was marked
    plan = plan_summary(source.messages, keep_tokens=options.keep_tokens, min_tokens=options.min_tokens)
    if plan is None:
        return False
    previous = source.summary
    try:
        text, tokens = _summary_text(summarizer, previous.text if previous else None, plan, options, stop)
    except (SummarizerFailed, SummarizingStopped):
        backend.mark_unsummarized([(storage_id, conversation)])
        raise
    expected = previous.anchor if previous is not None else None
    # The backend counts the covered tokens itself at the commit (a trim made while the
    # summarizer ran changed them); this is what they were at the read.
    covered = (previous.covered_tokens if previous is not None else 0) + plan.tokens
    summary = Summary(text, plan.anchor, plan.anchor_seq, tokens, covered)
    if not backend.commit_summary(storage_id, conversation, expected, summary):
        return False  # another summarizer committed first (its commit marked what is left), or gone
    owner, session_id = split_storage_id(storage_id)
    send_safely(
        summary_updated,
        summarize_conversation,
        session_id=session_id,
        owner=owner,
        conversation=conversation,
        previous=previous.text if previous else None,
        summary=summary,
    )
    return True


@dataclass
class SummarizeReport:
    """What a pass over marked conversations did."""

    #: Marked conversations taken.
    taken: int = 0
    summarized: int = 0
    #: Taken and left alone: too little pending, gone, or another summarizer was first.
    skipped: int = 0
    #: The summarizer failed (they stay marked).
    failed: int = 0
    #: The pass stopped early: the summarizers' health says wait (marks are kept).
    waiting: bool = False

    def __iadd__(self, other: SummarizeReport) -> SummarizeReport:
        self.taken += other.taken
        self.summarized += other.summarized
        self.skipped += other.skipped
        self.failed += other.failed
        self.waiting = other.waiting
        return self

    def as_counts(self) -> dict[str, Any]:
        return {
            "taken": self.taken,
            "summarized": self.summarized,
            "skipped": self.skipped,
            "failed": self.failed,
            "waiting": self.waiting,
        }


def _mark_again(backend: SummaryBackend, items: list[tuple[str, str]]) -> None:
    if not items:
        return
    try:
        backend.mark_unsummarized(items)
    except PersistentMemoryError:
        # The backend is down: the next append past the threshold marks them again.
        logger.warning("persistent_memory: could not mark %d conversations for a later summary", len(items))


def summarize_marked(
    store_or_backend: MemoryStore | SummaryBackend,
    summarizer: Summarizer,
    options: SummarizeOptions,
    health: SummarizerHealth,
    *,
    limit: int | None = None,
    stop: threading.Event | None = None,
) -> SummarizeReport:
    """Summarize marked conversations (at most ``limit``; None: until none is marked) while
    the summarizers' health allows; the first failure ends the pass (the health then says
    when to try again) and marks again what was taken and not done."""
    backend = _backend(store_or_backend)
    report = SummarizeReport()
    while limit is None or report.taken < limit:
        if stop is not None and stop.is_set():
            break
        if health.wait_seconds() > 0:
            report.waiting = True
            break
        count = BATCH_SIZE if limit is None else min(BATCH_SIZE, limit - report.taken)
        batch = backend.pop_unsummarized(count)
        if not batch:
            break
        report.taken += len(batch)
        health.begin()  # degraded, its wait over, and something to try: recovering
        for index, (storage_id, conversation) in enumerate(batch):
            try:
                done = summarize_conversation(
                    backend, storage_id, conversation, summarizer, options, stop=stop
                )
            except SummarizingStopped:
                _mark_again(backend, batch[index + 1 :])
                return report
            except SummarizerFailed as exc:
                report.failed += 1
                state = health.failed(str(exc))
                logger.warning(
                    "persistent_memory: summarizing conversation %r failed (%s); summarizers are %s",
                    conversation,
                    exc,
                    state,
                )
                _mark_again(backend, batch[index + 1 :])
                report.waiting = True
                return report
            except BaseException:
                _mark_again(backend, batch[index:])
                raise
            if done:
                report.summarized += 1
                health.succeeded()
            else:
                report.skipped += 1
    return report
