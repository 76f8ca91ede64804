"""The conversation operations, timed beside the others (see store_bench.operations)."""

from __future__ import annotations

import copy
import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

from persistent_memory.backends.conversations import Summary
from persistent_memory.conversations.summaries import summary_tokens
from persistent_memory.owners import storage_id
from persistent_memory.pipeline import MemoryFilter
from persistent_memory.store import MemoryStore

APPEND = "add_messages (1 message)"
CONTEXT = "get_context (20 of 20 messages, about 10 KB)"
#: Messages of the short and the long conversation (run.py's --long-conversation sets LONG).
SIZES = {"short": 100, "long": 10_000}
ROLLING = "get_context rolling_summary (a summary and the 20 messages after it)"
TRUNCATION = "get_context truncation (the same conversations' newest 20)"
CONTEXT_SHORT = "get_context (20 of the short conversation)"
CONTEXT_LONG = "get_context (20 of the long conversation)"
RECORDING_OFF = "recording off"
#: About 500 bytes of text, as a chat turn runs.
TURN = "The user asked about the weather in Paris and wanted a short answer with the temperature. " * 5


def chat(store: MemoryStore, session_id: str, messages: int, text: str = TURN) -> None:
    """A conversation of ``messages`` alternating user and assistant turns of ``text``, in batches."""
    batch: list[dict[str, Any]] = []
    for n in range(messages):
        batch.append({"role": "user" if n % 2 == 0 else "assistant", "content": f"{n}: {text}"})
        if len(batch) == 100:
            store.add_messages(session_id, batch)
            batch = []
    if batch:
        store.add_messages(session_id, batch)


def _summarize_half(store: MemoryStore, session_id: str) -> None:
    """40 messages, the first 20 covered by a summary of about 500 characters."""
    chat(store, session_id, 40)
    thread = store.get_messages(session_id)["messages"]
    anchor = thread[19]
    text = "Earlier: " + TURN
    summary = Summary(text, anchor["id"], anchor["seq"], summary_tokens(text, "o200k_base"), 0)
    storage = storage_id(store.owner, session_id)
    if not store.backend.commit_summary(storage, "default", None, summary):
        raise RuntimeError(f"the bench's summary of {session_id} was not committed")


def conversation_operations(store: MemoryStore, sessions: int) -> dict[str, Callable[[], Any]]:
    """Append and windows, on sessions of their own (the store needs MAX_MESSAGES >= 10,000)."""
    appended = itertools.cycle([f"bench-chat-append-{i}" for i in range(sessions)]).__next__
    windows = [f"bench-chat-window-{i}" for i in range(sessions)]
    for session_id in windows:
        chat(store, session_id, 20)
    window = itertools.cycle(windows).__next__
    chat(store, "bench-chat-short", SIZES["short"])
    chat(store, "bench-chat-long", SIZES["long"])
    summarized = [f"bench-chat-summarized-{i}" for i in range(sessions)]
    for session_id in summarized:
        _summarize_half(store, session_id)
    rolling = itertools.cycle(summarized).__next__
    truncated = itertools.cycle(summarized).__next__
    message = [{"role": "user", "content": "What is the weather in Paris today?"}]
    return {
        ROLLING: lambda: store.get_context(rolling(), max_messages=20, strategy="rolling_summary"),
        TRUNCATION: lambda: store.get_context(truncated(), max_messages=20, strategy="truncation"),
        APPEND: lambda: store.add_messages(appended(), message),
        CONTEXT: lambda: store.get_context(window(), max_messages=20),
        CONTEXT_SHORT: lambda: store.get_context("bench-chat-short", max_messages=20),
        CONTEXT_LONG: lambda: store.get_context("bench-chat-long", max_messages=20),
    }


def lanes_without_recording(
    store: MemoryStore, sessions: int, enrich: str, store_lane: str
) -> dict[str, Callable[[], Any]]:
    """The enrich and store lanes with RECORD_CONVERSATION off: the same store (backend,
    mirror) with that one option changed."""
    unrecorded = copy.copy(store)
    unrecorded.conversation_options = dataclasses.replace(store.conversation_options, record=False)
    lanes = MemoryFilter(unrecorded)
    questions = itertools.cycle(
        [{"text": "Where?", "metadata": {"session_id": f"bench-off-{i}"}} for i in range(sessions)]
    ).__next__
    answers = itertools.cycle(
        [{"text": "In Paris.", "metadata": {"session_id": f"bench-off-{i}"}} for i in range(sessions)]
    ).__next__
    for i in range(sessions):
        unrecorded.create_session(f"bench-off-{i}")
    return {
        f"{enrich} ({RECORDING_OFF})": lambda: lanes.enrich(questions()),
        f"{store_lane} ({RECORDING_OFF})": lambda: lanes.store(answers()),
    }


IDLE_ON = "idle TTL on"


def lanes_with_idle_ttl(
    store: MemoryStore, sessions: int, values: dict[str, Any], enrich: str, store_lane: str
) -> dict[str, Callable[[], Any]]:
    """The enrich and store lanes on sessions made with an idle TTL (each session keeps its
    own, so the store needs no other setting; a shallow copy of a backend with another
    default missed the journal's mirror marks). The enrich lane's sessions hold
    ``values``, as the default lane's do."""
    lanes = MemoryFilter(store)
    asked = [f"bench-idle-q{i}" for i in range(sessions)]
    answered = [f"bench-idle-a{i}" for i in range(sessions)]
    for session_id in asked + answered:
        store.create_session(session_id, idle_ttl_seconds=3600)
    for session_id in asked:
        for key, value in values.items():
            store.put(session_id, key, value)
    questions = itertools.cycle([{"text": "Where?", "metadata": {"session_id": sid}} for sid in asked])
    answers = itertools.cycle([{"text": "In Paris.", "metadata": {"session_id": sid}} for sid in answered])
    return {
        f"{enrich} ({IDLE_ON})": lambda: lanes.enrich(next(questions)),
        f"{store_lane} ({IDLE_ON})": lambda: lanes.store(next(answers)),
    }
