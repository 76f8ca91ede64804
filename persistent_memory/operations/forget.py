"""Forgetting an owner: everything the app holds about them, deleted, with counts.

In order: the owner's sessions through the store (values, history, conversations and
summaries go with them), what expired but was not swept yet, the owner's records that
are no session's (idempotency records, run bindings), the mirror rows, what this
process's extraction worker holds of theirs, the long-term memories, and on the memory
backend the journal segments that held their writes (two checkpoints: the first drops
the segments with the data once the mirror has caught up, the second the one with the
deletes).
"""

from __future__ import annotations

import logging
from typing import Any

from persistent_memory.exceptions import InvalidOwner
from persistent_memory.memories.service import memories_for
from persistent_memory.operations.maintenance import sweep
from persistent_memory.owners import owner_namespace, storage_id, validate_owner
from persistent_memory.store import MemoryStore, get_store

logger = logging.getLogger(__name__)


def _forgettable(owner: str) -> str:
    if validate_owner(owner) == "":
        raise InvalidOwner("Forgetting needs an owner: the unowned namespace is everyone's.")
    return owner


def owner_holdings(owner: str, *, store: MemoryStore | None = None) -> dict[str, Any]:
    """What :func:`forget_owner` would delete about ``owner``, counted: live sessions in the
    store, rows in the admin's mirror, long-term memories (expired ones and superseded
    versions too). Idempotency records and run bindings are not counted (they are found
    only by deleting them)."""
    from persistent_memory.models import LongTermMemory, MemorySession

    _forgettable(owner)
    store = store or get_store()
    return {
        "owner": owner,
        "sessions": len(store.for_owner(owner).list_sessions()),
        "mirror_rows": MemorySession.objects.filter(owner=owner).count(),
        "memories": LongTermMemory.objects.filter(owner=owner).count(),
    }


def forget_owner(owner: str, *, store: MemoryStore | None = None) -> dict[str, Any]:
    """Delete everything held about ``owner`` (never ``""``, the unowned namespace); the counts."""
    from persistent_memory.models import BackgroundWork, MemorySession

    _forgettable(owner)
    store = store or get_store()
    scoped = store.for_owner(owner)
    session_ids = scoped.list_sessions()
    for session_id in session_ids:
        scoped.delete_session(session_id)
    swept = sweep(owner=owner, store=store)
    records = store.backend.forget_namespace(owner_namespace(owner))
    if store.mirror.enabled:
        # The deletes reach the mirror now, so no later sync writes a row back.
        store.mirror.sync_sessions([storage_id(owner, session_id) for session_id in session_ids])
    rows = MemorySession.objects.filter(owner=owner)
    mirror_rows = rows.count()
    rows.delete()  # values, history, conversations and messages cascade
    BackgroundWork.objects.filter(owner=owner).delete()  # the tasks' cursors in their conversations
    # Nothing the extraction worker holds of theirs may write a memory after this.
    if not store.extraction_worker.forget(owner):
        logger.warning("persistent_memory: an extraction of %s's messages is still running", owner)
    memories = memories_for(owner).delete_all()
    journal = getattr(store.backend, "journal", None) is not None
    if journal and store.mirror.enabled:
        store.mirror.checkpoint()
        store.mirror.checkpoint()
    return {
        "owner": owner,
        "sessions": len(session_ids),
        "expired_sessions": swept.expired_sessions + swept.leftover_keys,
        "records": records + swept.run_bindings,
        "mirror_rows": mirror_rows,
        "memories": memories,
        "journal_checkpointed": journal,
    }
