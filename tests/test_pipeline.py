"""The node's two lanes (MemoryFilter) on both backends."""

from __future__ import annotations

import copy
import logging

import pytest

from persistent_memory.exceptions import InvalidValue
from persistent_memory.pipeline import MemoryFilter


def question(session_id=None, text="What did I say?", **extra):
    metadata = {} if session_id is None else {"session_id": session_id}
    return {"text": text, "metadata": {**metadata, **extra}, "id": 7}


def answer(session_id=None, text="You said hi."):
    entry = {"text": text, "metadata": {}}
    if session_id is not None:
        entry["metadata"]["session_id"] = session_id
    return entry


@pytest.fixture
def lanes(store):
    return MemoryFilter(store)


def test_default_store_is_the_process_store(store):
    assert MemoryFilter().memory_store is store


def test_first_question_creates_session_unchanged(lanes, store):
    original = question("s1")
    out, outcome = lanes.enrich(original)
    assert outcome == {"status": "unchanged", "session_id": "s1", "keys": []}
    # The window before the first question: empty.
    assert out["metadata"].pop("conversation") == {"messages": [], "tokens": 0, "truncated": False}
    assert out == original and out is not original
    assert "memory_context" not in out["metadata"]
    assert store.list_sessions() == ["s1"]


def test_round_trip_enriches_next_question(lanes, store):
    lanes.enrich(question("s1"))
    _, stored = lanes.store(answer("s1", "Paris"))
    assert stored == {"status": "stored", "session_id": "s1", "answer_count": 1}
    store.put("s1", "topic", {"city": "Paris"})
    original = question("s1", lang="en")
    snapshot = copy.deepcopy(original)
    out, outcome = lanes.enrich(original)
    assert outcome == {
        "status": "enriched",
        "session_id": "s1",
        "keys": ["answer_count", "last_answer", "topic"],
    }
    assert out["metadata"]["memory_context"] == {
        "answer_count": 1,
        "last_answer": "Paris",
        "topic": {"city": "Paris"},
    }
    # Everything else comes back as it was, and the original is untouched.
    assert {k: v for k, v in out.items() if k != "metadata"} == {"text": "What did I say?", "id": 7}
    assert out["metadata"]["lang"] == "en" and out["metadata"]["session_id"] == "s1"
    assert original == snapshot
    out["metadata"]["memory_context"]["topic"]["city"] = "Rome"
    assert store.get("s1", "topic") == {"city": "Paris"}


def test_answers_count_up(lanes, store):
    for n in range(1, 4):
        _, outcome = lanes.store(answer("s1", f"a{n}"))
        assert outcome["answer_count"] == n
    assert store.get("s1", "last_answer") == "a3"


def test_answer_without_session_falls_back_to_last_question(lanes, store):
    lanes.open()
    lanes.enrich(question("s1"))
    _, outcome = lanes.store(answer(None, "fallback"))
    assert outcome["session_id"] == "s1" and outcome["status"] == "stored"
    assert store.get("s1", "last_answer") == "fallback"


def test_open_resets_the_fallback(lanes, store):
    lanes.enrich(question("s1"))
    lanes.open()
    out, outcome = lanes.store(answer(None, "lost"))
    assert outcome["status"] == "skipped" and outcome["session_id"] is None
    assert "session_id" in outcome["reason"]
    assert store.list_keys("s1") == []


def test_question_without_session_passes_through(lanes, store):
    for entry in (question(None), {"text": "no metadata"}, {"text": "x", "metadata": None}, question("")):
        out, outcome = lanes.enrich(entry)
        assert out == entry and outcome["status"] == "skipped"
    assert store.list_sessions() == []


@pytest.mark.parametrize("bad", ["bad id", "a:b", "x" * 129, 42, ["s1"], "__meta__"])
def test_malformed_session_id_passes_through_and_logs(lanes, store, bad, caplog):
    with caplog.at_level(logging.DEBUG, logger="persistent_memory.pipeline"):
        out, outcome = lanes.enrich(question(bad))
        out2, outcome2 = lanes.store(answer(bad))
    assert out == question(bad) and out2 == answer(bad)
    assert outcome["status"] == outcome2["status"] == "skipped"
    assert "Invalid session_id" in outcome["reason"]
    assert any("Invalid session_id" in r.getMessage() for r in caplog.records)
    assert store.list_sessions() == []


def test_malformed_answer_session_does_not_fall_back(lanes, store):
    lanes.enrich(question("s1"))
    _, outcome = lanes.store(answer("bad id"))
    assert outcome["status"] == "skipped"
    assert store.list_keys("s1") == []


def test_answer_text_must_be_a_string(lanes, store):
    with pytest.raises(InvalidValue):
        lanes.store({"text": {"not": "text"}, "metadata": {"session_id": "s1"}})
    with pytest.raises(InvalidValue):
        lanes.store({"metadata": {"session_id": "s1"}})
    assert store.list_sessions() == []  # refused before the session was created


def test_run_id_carries_the_session_across_filters(store):
    # One HTTP call per lane: a new filter each time, tied together by run_id.
    MemoryFilter(store).enrich(question("s1"), run_id="run-7")
    out, outcome = MemoryFilter(store).store(answer(None, "via run"), run_id="run-7")
    assert outcome == {"status": "stored", "session_id": "s1", "answer_count": 1}
    assert store.get("s1", "last_answer") == "via run"
    _, outcome = MemoryFilter(store).store(answer(None, "no run"), run_id="run-8")
    assert outcome["status"] == "skipped" and "run-8" in outcome["reason"]
