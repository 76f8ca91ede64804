"""The summarizer worker's throughput with the extractive summarizer, against a floor.

Seeds ``conversations`` sessions with one conversation of ``messages`` messages each
(every one marked for a summary by its appends, as SUMMARIZE_AFTER_TOKENS has it),
then times ``SummarizerWorker.run_once()`` draining them: each is read, summarized
by the extractive summarizer in the worker's timed call, and committed with its
compare-and-set. The floor, timed in the same run just before, is the extractive
summarizer alone on the very messages the worker folds (read and planned beforehand,
untimed): what is left between the two is the store's part (reads, JSON, commits,
marks, the health record) and the worker's (a thread per call for its timeout).
The mirror is off, so the figures are the worker's own.
"""

from __future__ import annotations

import time
from typing import Any

from conversation_bench import chat
from store_bench import CountingConnection, build_store

from persistent_memory.conversations.summarizing import plan_summary
from persistent_memory.store import MemoryStore

#: bench/run.py's defaults (--summarizer-conversations, --summarizer-messages).
CONVERSATIONS, MESSAGES = 1000, 300
#: About 210 bytes (some 40 tokens) a message: a chat turn of two or three sentences.
TURN = "The user asked about the weather in Paris and wanted a short answer. " * 3
SUMMARY_SETTINGS = {"CONTEXT_STRATEGY": "rolling_summary", "SUMMARIZER_WORKER": False, "MIRROR_MODE": "off"}


def _seed(store: MemoryStore, conversations: int, messages: int) -> list[str]:
    ids = [f"bench-summarize-{i}" for i in range(conversations)]
    for session_id in ids:
        chat(store, session_id, messages, TURN)
    return ids


def _rates(seconds: float, conversations: int, messages: int) -> dict[str, Any]:
    return {
        "seconds": round(seconds, 3),
        "conversations_per_s": round(conversations / seconds, 1) if seconds else 0.0,
        "messages_folded_per_s": round(messages / seconds, 1) if seconds else 0.0,
    }


def summarizer_figures(backend: str, url: str, conversations: int, messages: int) -> dict[str, Any]:
    """The floor and the worker on one backend (see the module's docstring)."""
    store = build_store(backend, url, max_sessions=conversations + 10, **SUMMARY_SETTINGS)
    try:
        ids = _seed(store, conversations, messages)
        worker = store.summarizer_worker
        summarizer, options = worker.summarizer, worker.options
        marked = store.backend.unsummarized_count()
        if marked < conversations:
            after = store.backend.summarize_after_tokens
            raise SystemExit(f"{messages} messages do not pass SUMMARIZE_AFTER_TOKENS ({after}): use more.")
        plans = {}
        for session_id in ids:
            source = store.backend.summary_source(session_id, "default")
            plans[session_id] = plan_summary(
                source.messages, keep_tokens=options.keep_tokens, min_tokens=options.min_tokens
            )
        folded = sum(len(plan.messages) for plan in plans.values() if plan)

        start = time.perf_counter()
        for plan in plans.values():
            if plan:
                summarizer.summarize(None, plan.messages)
        floor = _rates(time.perf_counter() - start, sum(1 for plan in plans.values() if plan), folded)

        CountingConnection.sends = 0
        start = time.perf_counter()
        report = worker.run_once()
        seconds = time.perf_counter() - start
        sends = CountingConnection.sends
        figures = _rates(seconds, report.summarized, folded)

        # The worker folded what the floor summarized: each conversation's anchor is its plan's.
        anchors = {
            session_id: (summary.anchor if summary else None)
            for session_id in ids
            for summary in [store.backend.summary_source(session_id, "default").summary]
        }
        same = all(anchors[sid] == (plan.anchor if plan else None) for sid, plan in plans.items())
        return {
            "marked": marked,
            "messages_folded": folded,
            "floor": floor,
            "worker": {
                **figures,
                **report.as_counts(),
                "ratio_to_floor": round(floor["seconds"] / seconds, 3) if seconds else 0.0,
                "round_trips_per_conversation": round(sends / max(1, report.taken), 2)
                if backend == "redis"
                else 0.0,
                "folded_what_the_floor_summarized": same,
            },
        }
    finally:
        store.close()
