"""Extraction: the rule-based extractor on a fixed corpus (what each statement must
yield, and questions, negations and hypotheticals that must yield nothing), and
``memory_extract`` over conversations on both store backends: upserts by key, message
ids kept, nothing of another source overwritten, owners kept apart."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from persistent_memory.memories import memories_for
from persistent_memory.memories.extraction import ExtractionReport, extract_messages, write_candidates
from persistent_memory.memories.extraction.candidates import Candidate
from persistent_memory.memories.extraction.rules import MAX_CHARS, extract, extract_text
from persistent_memory.memories.injection import render_memories
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


def _said(text: str, id_: str, at: float) -> dict:
    return {"id": id_, "role": "user", "content": text, "created_at": at}


@pytest.mark.django_db
def test_an_older_statement_never_replaces_a_newer_one_whatever_order_it_is_read_in() -> None:
    owner = "user:a"
    extract_messages(owner, [_said("My family is in Paris.", "new", 2_000_000_000.0)])
    report = ExtractionReport()
    extract_messages(owner, [_said("My family is in Lyon.", "old", 1_900_000_000.0)], report=report)
    memory = memories_for(owner).get_by_key("fact.family")
    assert memory["content"] == "My family is in Paris." and memory["source_messages"] == ["new"]
    assert memory["said_at"] == datetime.fromtimestamp(2_000_000_000, tz=UTC)
    assert report.candidates == 1 and report.written == 0  # read, and left as it was
    # Found in two threads and handed over out of order: the later statement is the one
    # kept, and one memory changed.
    report = ExtractionReport()
    rome = Candidate(
        key="fact.family", type="factual", content="My family is in Rome.", source_messages=["m2"]
    )
    oslo = Candidate(
        key="fact.family", type="factual", content="My family is in Oslo.", source_messages=["m1"]
    )
    write_candidates("user:b", [rome, oslo], report, {"m2": 2_000_000_001.0, "m1": 1.0})
    assert memories_for("user:b").get_by_key("fact.family")["content"] == "My family is in Rome."
    assert report.written == 1
    # A later statement does replace it, and a memory of unknown time is replaced by any.
    extract_messages(owner, [_said("My family is in Nice.", "newer", 2_000_000_002.0)])
    assert memories_for(owner).get_by_key("fact.family")["content"] == "My family is in Nice."
    memories_for("user:c").add("My family is in Bern.", key="fact.family", source="extraction")
    extract_messages("user:c", [_said("My family is in Graz.", "c1", 1.0)])
    assert memories_for("user:c").get_by_key("fact.family")["content"] == "My family is in Graz."


@pytest.mark.django_db
def test_memory_extract_reruns_never_go_back_in_time_and_count_only_changes(store: MemoryStore) -> None:
    alice = store.for_owner("user:alice")
    alice.add_messages("s-old", [{"id": "o1", "role": "user", "content": "My family is in Lyon."}])
    time.sleep(0.01)  # the sessions' messages must have different times
    alice.add_messages(
        "s-new",
        [
            {"id": "n1", "role": "user", "content": "My family is in Paris."},
            {"id": "n2", "role": "user", "content": "Thanks!"},
        ],
    )
    said = alice.get_messages("s-new")["messages"][0]["created_at"]

    def run(*args: str) -> dict:
        out = StringIO()
        call_command("memory_extract", "--json", *args, stdout=out, stderr=StringIO())
        return json.loads(out.getvalue())

    assert run()["written"] == 1  # two statements under one key: one memory written
    memory = memories_for("user:alice").get_by_key("fact.family")
    assert memory["content"] == "My family is in Paris." and memory["source_messages"] == ["n1"]
    assert memory["said_at"] == datetime.fromtimestamp(said, tz=UTC)
    again = run()
    assert again["candidates"] == 2 and again["written"] == 0
    # Only the last message of each conversation: the old session's statement alone is read,
    # and it is older than the memory's.
    assert run("--last", "1")["written"] == 0
    assert memories_for("user:alice").get_by_key("fact.family")["content"] == "My family is in Paris."


def test_both_sides_of_a_recorded_conversation_are_read_with_who_said_it() -> None:
    messages = [
        {"id": "c1", "role": "user", "name": "Caroline", "content": "I love hiking. My dog is called Rex."},
        {"id": "m1", "role": "assistant", "name": "Melanie", "content": "I love hiking too!"},
        {"id": "a1", "role": "assistant", "content": "I always check the docs first."},  # the AI itself
        {"id": "u1", "role": "user", "content": "I prefer tea."},  # the user, unnamed as ever
        {"id": "t1", "role": "tool", "name": "Melanie", "content": "I love spam."},
    ]
    found = {c.key: (c.content, c.source_messages) for c in extract(messages)}
    assert found == {
        "preference.caroline.hiking": ("Caroline: I love hiking.", ["c1"]),
        "fact.caroline.dog": ("Caroline: My dog is called Rex.", ["c1"]),
        "preference.melanie.hiking-too": ("Melanie: I love hiking too.", ["m1"]),
        "preference.tea": ("I prefer tea.", ["u1"]),
    }


@pytest.mark.django_db
def test_memories_injected_into_a_prompt_and_stored_back_are_never_extracted_again() -> None:
    owner = "user:a"
    memories_for(owner).add("I love tea.", key="preference.tea", source="extraction")
    injected = render_memories(memories_for(owner).list()[1], role="user")
    report = ExtractionReport()
    stored_back = [{"id": "i1", **injected}, {"id": "u2", "role": "user", "content": "Hi."}]
    extract_messages(owner, stored_back, report=report)
    assert report.candidates == 0 and report.written == 0
    assert [m["key"] for m in memories_for(owner).list()[1]] == ["preference.tea"]
