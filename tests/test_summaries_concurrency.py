"""Concurrent appenders while two summarizer workers run, on both backends: no message is
lost (each is stored, or covered by the summary and trimmed), seq runs 1..n with no gap,
and every committed summary replaced exactly the one before it (a compare-and-set on the
anchor: two summaries made from the same anchor never both commit)."""

from __future__ import annotations

import itertools
import threading
import time
from typing import Any

from persistent_memory.conversations.signals import summary_updated
from persistent_memory.conversations.worker import SummarizerWorker
from tests.chat import assistant, user
from tests.test_concurrency import _run_threads

APPENDERS = 8
TURNS = 25
#: Summaries committed while the appends go on: the appenders write past TURNS until
#: there are this many (a loaded machine gets there later, not never).
OVERLAPPING_COMMITS = 3


class Slow:
    """A summarizer that takes a moment (so appends and the other worker overlap it) and
    answers a text naming the call."""

    counter = itertools.count()

    def summarize(self, previous_summary: str | None, messages: list[dict[str, Any]]) -> str:
        time.sleep(0.01)
        return f"summary {next(self.counter)} of {len(messages)} messages"


def test_two_workers_and_eight_appenders(configure):
    store = configure(
        CONTEXT_STRATEGY="rolling_summary",
        SUMMARIZER_WORKER=False,
        SUMMARIZE_AFTER_TOKENS=80,
        MAX_MESSAGES=30,
    )
    commits: list[tuple[str | None, str]] = []
    lock = threading.Lock()

    def on_summary(sender, previous, summary, **kwargs):
        with lock:
            commits.append((previous, summary.text))

    summary_updated.connect(on_summary, weak=False)
    workers = [SummarizerWorker(store, summarizer=Slow(), interval=0.005) for _ in range(2)]
    workers[0].options = workers[1].options = store.summarizer_worker.options
    appended: dict[str, dict[str, Any]] = {}
    turns = [0] * APPENDERS

    def appender(index: int) -> None:
        deadline = time.monotonic() + 120  # only so that a broken run ends
        while turns[index] < TURNS or len(commits) < OVERLAPPING_COMMITS:
            assert time.monotonic() < deadline, f"{len(commits)} summaries while appending"
            turn = turns[index]
            batch = [
                user(f"t{index} question {turn}. More words here."),
                assistant(f"t{index} answer {turn}."),
            ]
            for message in store.add_messages("s", batch)["messages"]:
                with lock:
                    appended[message["id"]] = message
            turns[index] += 1
            time.sleep(0.005)  # the writers' pace: summaries are made between their turns

    try:
        for worker in workers:
            worker.start()
        _run_threads(APPENDERS, appender)
        # Let the workers catch up with the last marks, then stop them.
        deadline = time.monotonic() + 60
        while store.backend.unsummarized_count():
            assert time.monotonic() < deadline
            time.sleep(0.02)
    finally:
        for worker in workers:
            worker.stop()
        summary_updated.disconnect(on_summary)

    assert len(appended) == sum(turns) * 2 >= APPENDERS * TURNS * 2
    # seq runs 1..n with no gap and no repeat.
    assert sorted(message["seq"] for message in appended.values()) == list(range(1, len(appended) + 1))
    source = store.backend.summary_source("s", "default")
    summary = source.summary
    assert summary is not None
    stored = {message["id"]: message for message in store.get_messages("s")["messages"]}
    # Each message is stored, or covered by the summary (the thread is one chain: by seq).
    for message_id, message in appended.items():
        assert message_id in stored or message["seq"] <= summary.anchor_seq, message
    assert summary.anchor in stored
    # Every stored message after the anchor is in an unlimited window after the summary.
    after = [m for m in stored.values() if m["seq"] > summary.anchor_seq]
    context = store.get_context("s", max_tokens=10**9, max_messages=10**9)
    assert context["summary"] == summary.text and not context["truncated"]
    assert [m["content"] for m in context["messages"]] == [m["content"] for m in after]
    # The commits form one chain: each replaced the summary before it, none was based on
    # a summary another commit had already replaced.
    assert commits and commits[-1][1] == summary.text
    bases = [previous for previous, _ in commits]
    assert len(set(bases)) == len(bases)
    chain, texts = [None], {previous: text for previous, text in commits}
    while chain[-1] in texts:
        chain.append(texts[chain[-1]])
    assert len(chain) == len(commits) + 1 and chain[-1] == summary.text
    assert len(commits) >= OVERLAPPING_COMMITS  # summaries were made while the appends went on
