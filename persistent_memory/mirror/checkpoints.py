"""The mirror's copy of the memory backend's checkpoints: what its restart loads.

The memory backend's snapshot gives a session's checkpoint entries and their change
counters (see :mod:`persistent_memory.backends.memory.checkpoints`); a row remembers the
epoch and the counter it was written at. A sync writes only the entries changed since,
unless something was removed or the epoch is new (a new session, an import): then it
writes them all. Redis holds its own checkpoints: its snapshots for the mirror have none.
"""

from __future__ import annotations

from typing import Any

from persistent_memory.backends.base import SessionSnapshot

BATCH = 500


def checkpoint_columns(snapshot: SessionSnapshot) -> tuple[str, int]:
    """A row's ``checkpoint_epoch`` and ``checkpoint_seq`` for ``snapshot``."""
    state = snapshot.get("checkpoint_state")
    return (state["epoch"], state["seq"]) if state else ("", 0)


def write_checkpoints(
    pks: dict[str, int], live: dict[str, SessionSnapshot], previous: dict[str, tuple[str, int]]
) -> None:
    """Write the entries of ``live`` snapshots; ``previous``: each row's columns before."""
    from persistent_memory.models import CheckpointEntry

    rewrite, changed = [], []
    for sid, snapshot in live.items():
        epoch, seq = previous.get(sid, ("", 0))
        state = snapshot.get("checkpoint_state")
        if state is None:
            if epoch:
                rewrite.append(pks[sid])
            continue
        entries = snapshot.get("checkpoints") or {}
        if state["epoch"] != epoch or state["removed_at"] > seq:
            rewrite.append(pks[sid])
            changed.extend((pks[sid], name, text) for name, text in entries.items())
        else:
            changed.extend(
                (pks[sid], name, entries[name])
                for name, at in state["seqs"].items()
                if at > seq and name in entries
            )
    if rewrite:
        CheckpointEntry.objects.filter(session_id__in=rewrite).delete()
    if changed:
        CheckpointEntry.objects.bulk_create(
            [CheckpointEntry(session_id=pk, name=name, value=text) for pk, name, text in changed],
            batch_size=BATCH,
            update_conflicts=True,
            unique_fields=["session", "name"],
            update_fields=["value"],
        )


def snapshot_checkpoints(row: Any) -> dict[str, Any]:
    """A mirrored row's checkpoints as the memory backend's snapshot gives them (the row's
    ``checkpoint_entries`` prefetched); {} when it has none."""
    if not row.checkpoint_epoch:
        return {}
    entries = {entry.name: entry.value for entry in row.checkpoint_entries.all()}
    seq = row.checkpoint_seq
    return {
        "checkpoints": entries,
        "checkpoint_state": {
            "epoch": row.checkpoint_epoch,
            "seq": seq,
            "removed_at": 0,
            "seqs": dict.fromkeys(entries, seq),
        },
    }
