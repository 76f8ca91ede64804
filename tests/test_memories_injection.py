"""Injection on both store backends: with INJECT_MEMORIES on, the enrich lane attaches
the owner's relevant memories within MEMORY_MAX_TOKENS (never another owner's), and
render_memories makes a system or user message of them."""

from __future__ import annotations

import pytest

from persistent_memory.memories import memories_for
from persistent_memory.memories.injection import HEADER, render_memories
from persistent_memory.pipeline import MemoryFilter
from persistent_memory.store import MemoryStore

pytestmark = pytest.mark.django_db


def question(text: str) -> dict:
    return {"text": text, "metadata": {"session_id": "chat"}}


def test_off_by_default(store: MemoryStore) -> None:
    memories_for("user:a").add("I prefer tea over coffee")
    enriched, _ = MemoryFilter(store.for_owner("user:a")).enrich(question("tea or coffee?"))
    assert "memories" not in enriched["metadata"]


def test_enrich_attaches_the_owners_relevant_memories_within_budget(store: MemoryStore, settings) -> None:
    settings.PERSISTENT_MEMORY = {
        **settings.PERSISTENT_MEMORY,
        "INJECT_MEMORIES": True,
        "MEMORY_MAX_TOKENS": 30,
    }
    alice = memories_for("user:alice")
    long = alice.add("Tea once, then " + "many other words " * 30, key="tea.long")
    tea = alice.add("I prefer green tea in the afternoon")
    alice.add("My dog is called Rex")
    memories_for("user:bob").add("Bob prefers black tea")
    filter_ = MemoryFilter(store.__class__.from_settings().for_owner("user:alice"))
    enriched, outcome = filter_.enrich(question("Which tea do I like?"))
    injected = enriched["metadata"]["memories"]
    # The long one matches too but is over the budget; the dog and Bob's never come.
    assert [m["id"] for m in injected] == [tea["id"]] and long["tokens"] > 30
    assert set(injected[0]) == {"kind", "id", "key", "type", "content", "score", "tokens"}
    assert outcome["session_id"] == "chat"
    nothing = filter_.enrich(question("Where is the Louvre?"))[0]
    assert nothing["metadata"]["memories"] == []
    bob = MemoryFilter(store.__class__.from_settings().for_owner("user:bob")).enrich(question("tea"))[0]
    assert [m["content"] for m in bob["metadata"]["memories"]] == ["Bob prefers black tea"]


def test_render_memories() -> None:
    memories = [{"content": "I prefer tea."}, {"content": "My dog is Rex."}]
    assert render_memories(memories) == {
        "role": "system",
        "content": f"{HEADER}\n- I prefer tea.\n- My dog is Rex.",
    }
    assert render_memories(memories, role="user")["role"] == "user"
    assert render_memories([]) is None
    with pytest.raises(ValueError):
        render_memories(memories, role="tool")
