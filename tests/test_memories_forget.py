"""``memory_forget --owner``: afterwards nothing of the owner is left in the store (Redis
keys scanned, the memory backend's records), the database (mirror rows, memories) or
the memory backend's journal files; other owners keep everything."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from persistent_memory.idempotency import Idempotency
from persistent_memory.memories import memories_for
from persistent_memory.memories.forget import forget_owner
from persistent_memory.models import LongTermMemory, MemorySession
from persistent_memory.store import MemoryStore

GONE, KEPT = "user:gone", "user:kept"


def fill(store: MemoryStore, owner: str) -> None:
    """Sessions with values, history, a conversation, an idempotency record, a run
    binding, and long-term memories."""
    scoped = store.for_owner(owner)
    scoped.create_session("s1")
    scoped.put("s1", "name", f"secret of {owner}", idempotency=Idempotency.of("idem-1", "PUT", owner))
    scoped.enrich("s2", run_id="run-1")
    scoped.add_messages("s1", [{"role": "user", "content": f"I love tea, says {owner}"}])
    memories_for(owner).add(f"{owner} loves tea", key="tea")


def forget(owner: str) -> dict[str, Any]:
    out = StringIO()
    call_command("memory_forget", "--owner", owner, "--yes", "--json", stdout=out, stderr=StringIO())
    return json.loads(out.getvalue())


def backend_keys(store: MemoryStore, request: pytest.FixtureRequest) -> list[str]:
    """Every key (Redis) or record reference (memory backend) the store holds."""
    backend = store.backend
    if backend.name == "redis":
        client = request.getfixturevalue("redis_client")
        return [key.decode() for key in client.scan_iter(match="*")]
    return [*backend._sessions, *backend._records, *backend._runs]


@pytest.mark.django_db
def test_forget_leaves_nothing_of_the_owner_and_everything_of_others(
    configure: Any, request: pytest.FixtureRequest
) -> None:
    store = configure()
    fill(store, GONE)
    fill(store, KEPT)
    assert any(GONE in key for key in backend_keys(store, request))
    counts = forget(GONE)
    assert (
        counts["sessions"] == 2 and counts["memories"] == 1 and counts["records"] >= 1
    )  # the idempotency record (run bindings go with their session)
    assert [key for key in backend_keys(store, request) if GONE in key] == []
    assert not LongTermMemory.objects.filter(owner=GONE).exists()
    assert store.for_owner(GONE).list_sessions() == []
    # The other owner keeps all of it.
    kept = store.for_owner(KEPT)
    assert kept.list_sessions() == ["s1", "s2"] and kept.get("s1", "name") == f"secret of {KEPT}"
    assert memories_for(KEPT).list()[0] == 1
    again = kept.put("s1", "name", "other", idempotency=Idempotency.of("idem-1", "PUT", KEPT))
    assert again is None and kept.get("s1", "name") == f"secret of {KEPT}"  # its record answered
    assert forget(GONE)["sessions"] == 0


@pytest.mark.django_db
def test_forget_needs_an_owner(configure: Any) -> None:
    configure()
    with pytest.raises(CommandError):
        call_command("memory_forget", "--yes", stdout=StringIO(), stderr=StringIO())
    with pytest.raises(CommandError):
        call_command("memory_forget", "--owner", "", "--yes", stdout=StringIO(), stderr=StringIO())


@pytest.mark.django_db(transaction=True)
def test_forget_on_the_memory_backend_clears_mirror_rows_and_journal(settings: Any, tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    settings.PERSISTENT_MEMORY = {
        "BACKEND": "memory",
        "MIRROR_MODE": "immediate",
        "JOURNAL_DIR": str(journal),
    }
    store = MemoryStore.from_settings()
    store.mirror.stop()  # the test decides when the mirror syncs
    try:
        fill(store, GONE)
        fill(store, KEPT)
        store.mirror.sync_dirty()
        assert MemorySession.objects.filter(owner=GONE).count() == 2
        assert any(GONE in path.read_text() for path in journal.glob("*") if path.is_file())
        counts = forget_owner(GONE, store=store)
        assert counts["mirror_rows"] == 2 and counts["journal_checkpointed"] is True
        assert not MemorySession.objects.filter(owner=GONE).exists()
        assert MemorySession.objects.filter(owner=KEPT).count() == 2
        leftovers = [
            p.name for p in journal.glob("*") if p.is_file() and GONE in p.read_text(errors="replace")
        ]
        assert leftovers == []
    finally:
        store.close()
