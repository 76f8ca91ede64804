"""Summaries and idle TTLs survive what copies a session: export and import, snapshots
restored on the other backend, and the memory backend's restart from the mirror."""

from __future__ import annotations

import json

import pytest

from persistent_memory import get_store
from persistent_memory.backends.conversations import Summary
from persistent_memory.conversations.summaries import summary_tokens
from persistent_memory.models import MemoryConversation
from persistent_memory.operations.maintenance import export_sessions, import_sessions
from persistent_memory.store import MemoryStore, reset_store
from tests.test_conversations_mirror import portable

TEXT = "The user asked about Paris \x00 twice; the answers were short."


def summarized_chat(store: MemoryStore) -> list[Summary]:
    """A session with an idle TTL and a chat of two branches, each with a summary of its
    first turn (the head on the second branch)."""
    store.create_session("chat", ttl_seconds=3600, idle_ttl_seconds=600)
    added = store.add_messages(
        "chat",
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Where is Paris?", "id": "u1"},
            {"role": "assistant", "content": "In France.", "id": "a1"},
            {"role": "user", "content": "And Lyon?", "id": "u2"},
        ],
    )["messages"]
    anchor = added[2]
    first = Summary(TEXT, anchor["id"], anchor["seq"], summary_tokens(TEXT, "o200k_base"), 11)
    assert store.backend.commit_summary("chat", "default", None, first)
    other = store.add_messages(
        "chat",
        [
            {"role": "assistant", "content": "In France, on the Seine.", "id": "a1b"},
            {"role": "user", "content": "And Marseille?", "id": "u2b"},
        ],
        parent_id="u1",
    )["messages"]
    text = "Paris is on the Seine."
    second = Summary(text, other[0]["id"], other[0]["seq"], summary_tokens(text, "o200k_base"), 0)
    # The second branch had no summary of its own: the first one's stays, for its branch.
    assert store.backend.commit_summary("chat", "default", None, second)
    return [
        first._replace(covered_tokens=sum(m["tokens"] for m in added[:3])),
        second._replace(covered_tokens=sum(m["tokens"] for m in [*added[:2], other[0]])),
    ]


def rolling(store: MemoryStore) -> dict[str, dict]:
    """The rolling window of each branch (the head ends on the second, where it was)."""
    windows = {}
    for head in ("u2", "u2b"):
        store.set_head("chat", head)
        windows[head] = store.get_context("chat", strategy="rolling_summary")
    return windows


def test_export_and_import_keep_the_summaries_and_the_idle_ttl(configure, tmp_path):
    store = configure()
    summaries = summarized_chat(store)
    before = rolling(store)
    assert before["u2"]["summary"] == TEXT and before["u2b"]["summary"] == "Paris is on the Seine."
    [record] = list(export_sessions(store=store))
    # As committed: the backend counted the tokens each covers (the first three messages of its branch).
    assert record["conversations"]["default"]["summaries"] == [summary._asdict() for summary in summaries]
    assert record["idle_ttl_seconds"] == 600
    store.delete_session("chat")
    path = tmp_path / "export.jsonl"
    path.write_text(json.dumps(record) + "\n")
    with path.open() as lines:
        assert import_sessions(lines, store=store).imported == 1
    assert rolling(store) == before
    info = store.session_info("chat")
    assert info["idle_ttl_seconds"] == 600 and info["expires_by"] == "idle"


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda summaries: summaries[0].update(anchor="not-a-message"), "summary"),
        (lambda summaries: summaries[1].update(summaries[0]), "same anchor"),
        (lambda summaries: summaries[0].pop("covered_tokens"), "summary"),
    ],
)
def test_an_import_refuses_summaries_anchored_nowhere_or_twice(configure, tmp_path, change, error):
    store = configure()
    summarized_chat(store)
    [record] = list(export_sessions(store=store))
    change(record["conversations"]["default"]["summaries"])
    path = tmp_path / "export.jsonl"
    path.write_text(json.dumps(record) + "\n")
    store.delete_session("chat")
    with path.open() as lines, pytest.raises(ValueError, match=error):
        import_sessions(lines, store=store)
    assert store.list_sessions() == []


def test_an_export_of_one_summary_as_it_was_written_before_branches_had_their_own(configure, tmp_path):
    store = configure()
    first, _ = summarized_chat(store)
    [record] = list(export_sessions(store=store))
    conversation = record["conversations"]["default"]
    conversation["summary"] = conversation.pop("summaries")[0]
    path = tmp_path / "export.jsonl"
    path.write_text(json.dumps(record) + "\n")
    store.delete_session("chat")
    with path.open() as lines:
        assert import_sessions(lines, store=store).imported == 1
    [again] = list(export_sessions(store=store))
    assert again["conversations"]["default"]["summaries"] == [first._asdict()]


def test_a_snapshot_restored_on_the_other_backend_keeps_the_summaries(store, redis_url, settings):
    summarized_chat(store)
    before = rolling(store)
    snapshot = store.backend.snapshots(["chat"])["chat"]
    other = "redis" if store.backend.name == "memory" else "memory"
    settings.PERSISTENT_MEMORY = {"BACKEND": other, "MIRROR_MODE": "off", "REDIS_URL": redis_url}
    target = get_store()
    target.backend.restore_session(snapshot, replace=True)
    assert rolling(target) == before
    restored = target.backend.snapshots(["chat"])["chat"]["conversations"]
    assert portable(restored) == portable(snapshot["conversations"])
    assert (
        target.backend.summary_source("chat", "default").summary
        == store.backend.summary_source("chat", "default").summary
    )


@pytest.mark.django_db(transaction=True)
def test_the_memory_backend_gets_summaries_and_idle_ttls_back_from_the_mirror(settings):
    settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "MIRROR_MODE": "immediate"}
    store = get_store()
    summarized_chat(store)
    before = rolling(store)
    reset_store()  # the process ends: the worker flushes
    fresh = MemoryStore.from_settings()
    try:
        assert rolling(fresh) == before
        assert fresh.session_info("chat")["idle_ttl_seconds"] == 600
    finally:
        fresh.close()


@pytest.mark.django_db(transaction=True)
def test_a_mirror_row_of_one_summary_as_it_was_written_before_branches_had_their_own(settings):
    settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "MIRROR_MODE": "immediate"}
    store = get_store()
    first, _ = summarized_chat(store)
    reset_store()
    MemoryConversation.objects.update(summary=json.dumps(first._asdict()))
    fresh = MemoryStore.from_settings()
    try:
        windows = rolling(fresh)
        assert windows["u2"]["summary"] == TEXT and windows["u2b"]["summary"] is None
    finally:
        fresh.close()


def test_a_snapshot_holds_the_summaries_in_the_order_of_their_anchors(store):
    store.add_messages("chat", [{"role": "user", "content": "Q?", "id": "q"}])
    anchors = []
    for answer, parent in (("zz-first", "q"), ("aa-second", "q")):  # ids sort against their seq
        (added,) = store.add_messages(
            "chat", [{"role": "assistant", "content": "A.", "id": answer}], parent_id=parent
        )["messages"]
        summary = Summary(f"Up to {answer}.", answer, added["seq"], summary_tokens("Up to.", "o200k_base"), 0)
        assert store.backend.commit_summary("chat", "default", None, summary)
        anchors.append(answer)
    held = store.backend.snapshots(["chat"])["chat"]["conversations"]["default"]["summaries"]
    assert [summary["anchor"] for summary in held] == anchors
