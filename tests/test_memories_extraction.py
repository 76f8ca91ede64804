"""Extraction: the rule-based extractor on a fixed corpus (what each statement must
yield, and questions, negations and hypotheticals that must yield nothing), and
``memory_extract`` over conversations on both store backends: upserts by key, message
ids kept, nothing of another source overwritten, owners kept apart."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from persistent_memory.memories import memories_for
from persistent_memory.memories.extraction import extract_messages
from persistent_memory.memories.extraction.rules import MAX_CHARS, extract, extract_text
from persistent_memory.store import MemoryStore

CORPUS = json.loads((Path(__file__).parent / "data" / "extraction_corpus.json").read_text())


@pytest.mark.parametrize("case", CORPUS, ids=[case["text"][:40] for case in CORPUS])
def test_corpus(case: dict) -> None:
    assert [list(found) for found in extract_text(case["text"])] == case["yields"]


def test_corpus_covers_yields_and_refusals() -> None:
    assert sum(bool(c["yields"]) for c in CORPUS) >= 12 and sum(not c["yields"] for c in CORPUS) >= 15


def test_only_user_messages_deduplicated_latest_wins_and_capped() -> None:
    messages = [
        {"id": "m1", "role": "user", "content": "I love tea."},
        {"id": "m2", "role": "assistant", "content": "I prefer coffee myself."},
        {"id": "m3", "role": "user", "content": [{"type": "text", "text": "I   hate tea."}]},
        {"id": "m4", "role": "user", "content": "I prefer " + "very " * 200 + "long things"},
    ]
    found = {c.key: c for c in extract(messages)}
    assert set(found) == {"preference.tea", "preference.very-very-very-very-very-very-very-very"}
    assert found["preference.tea"].content == "I hate tea." and found["preference.tea"].source_messages == [
        "m1",
        "m3",
    ]
    long = found["preference.very-very-very-very-very-very-very-very"].content
    assert len(long) <= MAX_CHARS + 1 and long.endswith("…")


@pytest.mark.django_db
def test_extraction_upserts_and_never_overwrites_another_source() -> None:
    owner = "user:a"
    memories_for(owner).add("My editor is Emacs (set by hand).", key="fact.editor", source="admin")
    extract_messages(owner, [{"id": "m1", "role": "user", "content": "My editor is vim. I love tea."}])
    extract_messages(owner, [{"id": "m2", "role": "user", "content": "I hate tea."}])
    count, rows = memories_for(owner).list()
    by_key = {m["key"]: m for m in rows}
    assert count == 2
    assert by_key["fact.editor"]["content"] == "My editor is Emacs (set by hand)."
    assert by_key["fact.editor"]["source"] == "admin"
    assert by_key["preference.tea"]["content"] == "I hate tea."
    assert by_key["preference.tea"]["source"] == "extraction"
    assert by_key["preference.tea"]["source_messages"] == ["m2"]


@pytest.mark.django_db
def test_memory_extract_command_reads_conversations_of_every_owner(store: MemoryStore) -> None:
    alice, bob = store.for_owner("user:alice"), store.for_owner("user:bob")
    alice.add_messages(
        "chat",
        [
            {"id": "a1", "role": "user", "content": "We decided to ship on Mondays. Do I like jazz?"},
            {"id": "a2", "role": "assistant", "content": "Noted."},
        ],
    )
    jazz = [{"id": "a3", "role": "user", "content": "I love jazz."}]
    alice.add_messages("chat", jazz, conversation="music")
    bob.add_messages("other", [{"id": "b1", "role": "user", "content": "My dog is called Rex."}])
    out = StringIO()
    call_command("memory_extract", "--json", stdout=out, stderr=StringIO())
    counts = json.loads(out.getvalue())
    assert counts["sessions"] == 2 and counts["messages"] == 4 and counts["written"] == 3
    alice_memories = {m["key"]: m for m in memories_for("user:alice").list()[1]}
    assert set(alice_memories) == {"decision.ship-on-mondays", "preference.jazz"}
    assert alice_memories["preference.jazz"]["source_messages"] == ["a3"]
    assert [m["key"] for m in memories_for("user:bob").list()[1]] == ["fact.dog"]
    before = memories_for("user:bob").list()[1][0]["updated_at"]
    call_command("memory_extract", "--owner", "user:bob", stdout=StringIO(), stderr=StringIO())
    assert memories_for("user:bob").list()[1][0]["updated_at"] == before  # nothing changed: untouched
    with pytest.raises(CommandError):
        call_command("memory_extract", "--last", "0", stdout=StringIO(), stderr=StringIO())
