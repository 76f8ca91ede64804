"""Summaries and idle TTLs survive what copies a session: export and import, snapshots
restored on the other backend, and the memory backend's restart from the mirror."""

from __future__ import annotations

import json

import pytest

from persistent_memory import get_store
from persistent_memory.backends.conversations import Summary
from persistent_memory.conversations.summaries import summary_tokens
from persistent_memory.maintenance import export_sessions, import_sessions
from persistent_memory.store import MemoryStore, reset_store

TEXT = "The user asked about Paris \x00 twice; the answers were short."


def summarized_chat(store: MemoryStore) -> Summary:
    """A session with an idle TTL and a chat whose first turn is summarized."""
    store.create_session("chat", ttl_seconds=3600, idle_ttl_seconds=600)
    added = store.add_messages(
        "chat",
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Where is Paris?"},
            {"role": "assistant", "content": "In France."},
            {"role": "user", "content": "And Lyon?"},
        ],
    )["messages"]
    anchor = added[2]
    summary = Summary(TEXT, anchor["id"], anchor["seq"], summary_tokens(TEXT, "o200k_base"), 11)
    assert store.backend.commit_summary("chat", "default", None, summary)
    return summary


def rolling(store: MemoryStore) -> dict:
    return store.get_context("chat", strategy="rolling_summary")


def test_export_and_import_keep_the_summary_and_the_idle_ttl(configure, tmp_path):
    store = configure()
    summary = summarized_chat(store)
    before = rolling(store)
    assert before["summary"] == TEXT
    [record] = list(export_sessions(store=store))
    # As committed: the backend counted the tokens it covers (the first three messages).
    assert record["conversations"]["default"]["summary"] == {**summary._asdict(), "covered_tokens": 19}
    assert record["idle_ttl_seconds"] == 600
    store.delete_session("chat")
    path = tmp_path / "export.jsonl"
    path.write_text(json.dumps(record) + "\n")
    with path.open() as lines:
        assert import_sessions(lines, store=store).imported == 1
    assert rolling(store) == before
    info = store.session_info("chat")
    assert info["idle_ttl_seconds"] == 600 and info["expires_by"] == "idle"


def test_an_import_refuses_a_summary_anchored_nowhere(configure, tmp_path):
    store = configure()
    summarized_chat(store)
    [record] = list(export_sessions(store=store))
    record["conversations"]["default"]["summary"]["anchor"] = "not-a-message"
    path = tmp_path / "export.jsonl"
    path.write_text(json.dumps(record) + "\n")
    store.delete_session("chat")
    with path.open() as lines, pytest.raises(ValueError, match="summary"):
        import_sessions(lines, store=store)
    assert store.list_sessions() == []


def test_a_snapshot_restored_on_the_other_backend_keeps_the_summary(store, redis_url, settings):
    summarized_chat(store)
    before = rolling(store)
    snapshot = store.backend.snapshots(["chat"])["chat"]
    other = "redis" if store.backend.name == "memory" else "memory"
    settings.PERSISTENT_MEMORY = {"BACKEND": other, "MIRROR_MODE": "off", "REDIS_URL": redis_url}
    target = get_store()
    target.backend.restore_session(snapshot, replace=True)
    assert rolling(target) == before
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
