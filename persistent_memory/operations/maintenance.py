"""Operations on many sessions at once, shared by the admin actions and the management
commands. They act on the store, whose writes mark their sessions for the mirror,
and work in batches so that memory stays bounded at any number of sessions.

Sessions are named here by storage id (see :mod:`persistent_memory.owners`), so one
call can span every owner; ``owner=`` limits a pass over every session to one owner,
and :func:`named_sessions` turns ids a person typed into storage ids."""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

from django.utils import timezone

from persistent_memory.backends.base import SessionSnapshot, remaining_seconds, session_info
from persistent_memory.backends.batches import BATCH_SIZE, session_batches
from persistent_memory.chat.records import export_conversations, import_conversations
from persistent_memory.checkpoints import validate_entries
from persistent_memory.conf import DEFAULTS
from persistent_memory.exceptions import PersistentMemoryError, SessionExists, SessionNotFound
from persistent_memory.owners import (
    owner_prefix,
    split_storage_id,
    storage_id,
    validate_owner,
)
from persistent_memory.store import MemoryStore, get_store
from persistent_memory.validation import (
    DEFAULT_MAX_DEPTH,
    NUL_ESCAPE,
    encode_value,
    validate_key,
    validate_session_id,
)

#: Called with (sessions done, sessions in all or None when not known).
Progress = Callable[[int, int | None], None]


def _noop(done: int, total: int | None) -> None:
    pass


def named_sessions(session_ids: Iterable[str], owner: str | None = None) -> list[str]:
    """Storage ids of sessions named by id in ``owner``'s namespace (None: the unowned one)."""
    owner = validate_owner(owner or "")
    return [storage_id(owner, validate_session_id(sid)) for sid in dict.fromkeys(session_ids)]


# Export and import ------------------------------------------------------------


def export_record(snapshot: SessionSnapshot) -> dict[str, Any]:
    """A session as export writes it and import reads it (values decoded)."""
    info = snapshot["info"]
    owner, session_id = split_storage_id(info["session_id"])
    return {
        **info,  # what GET sessions/{id}/ answers
        "session_id": session_id,
        "owner": owner,
        "ttl_remaining_seconds": remaining_seconds(info),
        "values": {key: json.loads(text) for key, text in sorted(snapshot["values"].items())},
        "history": snapshot["history"],
        "conversations": export_conversations(snapshot.get("conversations") or {}),
        # A graph thread's checkpoint entries (persistent_memory.backends.checkpoints), as stored.
        **({"checkpoints": snapshot["checkpoints"]} if snapshot.get("checkpoints") else {}),
    }


def export_sessions(
    storage_ids: Iterable[str] | None = None,
    *,
    owner: str | None = None,
    store: MemoryStore | None = None,
    progress: Progress = _noop,
) -> Iterator[dict[str, Any]]:
    """Export records of these live sessions (all, or all of ``owner``, when None), in batches."""
    store = store or get_store()
    done = 0
    for batch in session_batches(store.backend, storage_ids, owner=owner):
        for snapshot in store.backend.snapshots(batch, checkpoints=True).values():
            if snapshot is not None:
                yield export_record(snapshot)
        done += len(batch)
        progress(done, None)


class InvalidRecord(ValueError):
    """A line of an import file that cannot be imported; nothing was written."""


def _number(record: dict[str, Any], name: str, *, nullable: bool = False) -> float | None:
    value = record.get(name)
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise InvalidRecord(f"{name} must be a number of 0 or more{' or null' if nullable else ''}")
    return value


def _check_history(history: list[dict[str, Any]], max_json_depth: int) -> None:
    """Entries go to the mirror as they are: the rules of values, and no U+0000 (the
    store's own entries never hold one; PostgreSQL's jsonb and text columns cannot)."""
    try:
        # Two levels for the list and the entry themselves.
        text = encode_value(history, max_bytes=sys.maxsize, max_depth=max_json_depth + 2)
    except PersistentMemoryError as exc:
        raise InvalidRecord(f"history: {exc}") from None
    if NUL_ESCAPE.search(text):
        raise InvalidRecord("history must not contain U+0000")


def parse_record(
    line: str,
    *,
    max_value_bytes: int,
    max_json_depth: int = DEFAULT_MAX_DEPTH,
    max_message_bytes: int = DEFAULTS["MAX_MESSAGE_BYTES"],
    owner: str | None = None,
) -> SessionSnapshot:
    """One export line as a snapshot ready to restore, or ``InvalidRecord`` saying why not.

    The session goes back to the record's ``owner`` (none: unowned), or to ``owner`` when given.
    """
    try:
        record = json.loads(line)
    except ValueError as exc:
        raise InvalidRecord(f"not JSON ({exc})") from None
    if not isinstance(record, dict):
        raise InvalidRecord("not a JSON object")
    try:
        session_id = validate_session_id(record.get("session_id"))
        session_owner = validate_owner(record.get("owner") or "" if owner is None else owner)
        values = record.get("values")
        if not isinstance(values, dict):
            raise InvalidRecord("values must be an object")
        encoded = {
            validate_key(key): encode_value(value, max_bytes=max_value_bytes, max_depth=max_json_depth)
            for key, value in values.items()
        }
    except PersistentMemoryError as exc:
        raise InvalidRecord(str(exc)) from None
    history = record.get("history")
    if not isinstance(history, list) or not all(
        isinstance(e, dict) and isinstance(e.get("op"), str) and _number(e, "timestamp") is not None
        for e in history
    ):
        raise InvalidRecord("history must be a list of objects with a string op and a numeric timestamp")
    _check_history(history, max_json_depth)
    try:
        conversations = import_conversations(
            record.get("conversations", {}), max_message_bytes=max_message_bytes, max_depth=max_json_depth
        )
        checkpoints = validate_entries(record.get("checkpoints", {}))
    except PersistentMemoryError as exc:
        raise InvalidRecord(str(exc)) from None
    created_at = _number(record, "created_at")
    remaining = _number(record, "ttl_remaining_seconds", nullable=True)
    ttl = _number(record, "ttl_seconds", nullable=True) if "ttl_seconds" in record else remaining
    info = session_info(
        storage_id(session_owner, session_id),
        created_at=created_at,
        ttl_seconds=ttl or None,
        expires_at=None if remaining is None else time.time() + remaining,
        key_count=len(encoded),
        history_length=len(history),
        idle_ttl_seconds=_number(record, "idle_ttl_seconds", nullable=True)
        if "idle_ttl_seconds" in record
        else None,
    )
    snapshot: SessionSnapshot = {
        "info": info,
        "values": encoded,
        "history": history,
        "conversations": conversations,
    }
    if checkpoints:
        snapshot["checkpoints"] = checkpoints
    return snapshot


@dataclass
class ImportReport:
    """What an import did (or would do, in a dry run)."""

    lines: int = 0
    imported: int = 0
    replaced: int = 0
    skipped_expired: int = 0


def import_sessions(
    lines: Iterable[str],
    *,
    replace: bool = False,
    dry_run: bool = False,
    owner: str | None = None,
    store: MemoryStore | None = None,
    progress: Progress = _noop,
) -> ImportReport:
    """Restore sessions from export lines: values, history, conversations and remaining TTL exactly.

    Each session goes back to its record's owner, or to ``owner`` when given. Every
    line is checked first (``InvalidRecord`` names the first bad line number),
    and so is whether a session exists (``SessionExists`` unless ``replace``), before
    anything is written; should a write fail part way (capacity, Redis gone), what
    was written is undone and replaced sessions are put back.
    """
    store = store or get_store()
    snapshots: list[SessionSnapshot] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            snapshots.append(
                parse_record(
                    line,
                    max_value_bytes=store.max_value_bytes,
                    max_json_depth=store.max_json_depth,
                    max_message_bytes=store.conversation_options.max_message_bytes,
                    owner=owner,
                )
            )
        except InvalidRecord as exc:
            raise InvalidRecord(f"line {number}: {exc}") from None
    ids = [s["info"]["session_id"] for s in snapshots]
    if len(set(ids)) != len(ids):
        raise InvalidRecord("the file holds a session id of one owner more than once")
    existing = set().union(*(store.backend.existing(batch) for batch in session_batches(store.backend, ids)))
    if existing and not replace:
        named = listing([_label(sid) for sid in sorted(existing)])
        raise SessionExists(f"{len(existing):,} sessions exist already (pass --replace): {named}")
    report = ImportReport(lines=len(snapshots))
    wanted = [s for s in snapshots if remaining_seconds(s["info"]) != 0]
    report.skipped_expired = len(snapshots) - len(wanted)
    report.imported = len(wanted)
    report.replaced = sum(1 for s in wanted if s["info"]["session_id"] in existing)
    if dry_run:
        return report
    # Keep what is replaced, so that a failure part way can put everything back.
    previous = {
        sid: snap
        for batch in session_batches(
            store.backend, [s["info"]["session_id"] for s in wanted if s["info"]["session_id"] in existing]
        )
        for sid, snap in store.backend.snapshots(batch, checkpoints=True).items()
    }
    written: list[str] = []
    try:
        for snapshot in wanted:
            store.backend.restore_session(snapshot, replace=replace)
            written.append(snapshot["info"]["session_id"])
            progress(len(written), len(wanted))
    except BaseException:
        _undo_import(store, written, previous)
        raise
    return report


def _undo_import(store: MemoryStore, written: list[str], previous: dict[str, SessionSnapshot | None]) -> None:
    for session_id in reversed(written):
        with contextlib.suppress(PersistentMemoryError):
            earlier = previous.get(session_id)
            if earlier is None:
                store.backend.delete_session(session_id)
            else:
                store.backend.restore_session(earlier, replace=True)


# Actions on sessions ------------------------------------------------------------


#: Items a message lists before it ends with "and N more".
LISTED = 10


def listing(items: list[str], shown: int = LISTED) -> str:
    """``items`` joined with commas: the first ``shown``, then "and N more" for the rest."""
    rest = len(items) - shown
    listed = ", ".join(items[:shown])
    return f"{listed} and {rest:,} more" if rest > 0 else listed


def _label(sid: str) -> str:
    owner, session_id = split_storage_id(sid)
    return f"{session_id} (owner {owner})" if owner else session_id


def _owned(store: MemoryStore, sid: str) -> tuple[MemoryStore, str]:
    """The store scoped to a storage id's owner, and its session id."""
    owner, session_id = split_storage_id(sid)
    return store.for_owner(owner), session_id


def delete_sessions(storage_ids: Iterable[str], *, store: MemoryStore | None = None) -> int:
    """Delete sessions from the store; return how many existed."""
    store = store or get_store()
    deleted = 0
    for sid in storage_ids:
        scoped, session_id = _owned(store, sid)
        try:
            scoped.delete_session(session_id)
            deleted += 1
        except SessionNotFound:
            pass
    return deleted


def clear_sessions(storage_ids: Iterable[str], *, store: MemoryStore | None = None) -> int:
    """Clear every key of each session; return how many keys were removed."""
    store = store or get_store()
    cleared = 0
    for sid in storage_ids:
        scoped, session_id = _owned(store, sid)
        with contextlib.suppress(SessionNotFound):
            cleared += len(scoped.clear(session_id))
    return cleared


@dataclass
class SummarizeReport:
    """What a summarization pass did (or would do, in a dry run)."""

    scanned: int = 0
    summarized: int = 0
    folded: int = 0


def summarize_sessions(
    storage_ids: Iterable[str] | None = None,
    *,
    owner: str | None = None,
    max_history: int | None = None,
    dry_run: bool = False,
    store: MemoryStore | None = None,
    progress: Progress = _noop,
) -> SummarizeReport:
    """Apply the summarization rule now to these sessions (every one, or ``owner``'s, when None).

    Each session is summarized atomically by the backend, so writers may go on
    writing meanwhile without an entry being lost.
    """
    store = store or get_store()
    limit = store.backend.max_history if max_history is None else max_history
    report = SummarizeReport()
    for batch in session_batches(store.backend, storage_ids, owner=owner):
        if dry_run:
            infos = store.backend.infos(batch)
            report.scanned += len(infos)
            longer = [info["history_length"] for info in infos.values() if info["history_length"] > limit]
            report.summarized += len(longer)
            report.folded += sum(length - limit // 2 for length in longer)
        else:
            folded = store.backend.summarize_many(batch, limit)
            report.scanned += len(folded)
            report.summarized += sum(1 for n in folded.values() if n)
            report.folded += sum(folded.values())
        progress(report.scanned, None)
    return report


# The TTL sweep ------------------------------------------------------------------


@dataclass
class SweepReport:
    """What a sweep removed (or would remove, in a dry run)."""

    expired_sessions: int = 0
    leftover_keys: int = 0
    run_bindings: int = 0
    mirror_marked_gone: int = 0
    mirror_deleted: int = 0
    #: Long-term memories past their expires_at or MEMORY_RETENTION_DAYS (set by
    #: memory_sweep, which calls :func:`sweep_memories` too: the store's sweep needs no database).
    memories_deleted: int = 0


def sweep_memories(*, dry_run: bool = False, owner: str | None = None) -> int:
    """Delete the long-term memories that expired, with their superseded versions (of
    ``owner`` only, when given); how many memories."""
    from persistent_memory.memories.lifecycle import current_filter, delete_memories, expired_filter
    from persistent_memory.models import LongTermMemory

    # A version expires with its memory, never by its own times.
    rows = LongTermMemory.objects.filter(current_filter()).filter(expired_filter())
    if owner is not None:
        rows = rows.filter(owner=owner)
    return rows.count() if dry_run else delete_memories(rows)


def sweep(
    *,
    dry_run: bool = False,
    batch_size: int = BATCH_SIZE,
    mirror_retention_days: float = 30,
    owner: str | None = None,
    store: MemoryStore | None = None,
) -> SweepReport:
    """Remove what expired from the store (of ``owner`` only, when given), then mark it
    gone in the mirror and delete mirrored sessions gone for longer than
    ``mirror_retention_days``."""
    from persistent_memory.models import MemorySession

    store = store or get_store()
    prefix = owner_prefix(owner)
    report = SweepReport(**store.backend.sweep(dry_run=dry_run, batch_size=batch_size, prefix=prefix))
    if not store.mirror.enabled:
        return report
    rows_of_owner = (
        MemorySession.objects.all() if owner is None else MemorySession.objects.filter(owner=owner)
    )
    live_rows = rows_of_owner.filter(state=MemorySession.State.LIVE).order_by("pk")
    last_pk = 0
    while True:
        rows = list(live_rows.filter(pk__gt=last_pk).values_list("pk", "owner", "session_id")[:batch_size])
        if not rows:
            break
        last_pk = rows[-1][0]
        ids = [storage_id(row_owner, session_id) for _, row_owner, session_id in rows]
        gone = sorted(set(ids) - store.backend.existing(ids))
        report.mirror_marked_gone += len(gone)
        if gone and not dry_run:
            store.mirror.sync_sessions(gone)
    old = rows_of_owner.exclude(state=MemorySession.State.LIVE).filter(
        gone_at__lt=timezone.now() - timedelta(days=mirror_retention_days)
    )
    report.mirror_deleted = old.count()
    if not dry_run:
        old.delete()
    return report


def as_counts(report: Any) -> dict[str, Any]:
    """A report dataclass as the plain dict the commands print."""
    return asdict(report)


def summarize_conversations_now(
    storage_ids: Iterable[str], *, store: MemoryStore | None = None
) -> tuple[int, int]:
    """Fold the older turns of every conversation of these sessions into its rolling summary
    now, with the configured summarizer; (summaries committed, conversations tried).
    ``PersistentMemoryError`` when summaries are off or the summarizer fails."""
    from persistent_memory.conversations.summarizers import SummarizerFailed
    from persistent_memory.conversations.summarizing import summarize_conversation

    store = store or get_store()
    worker = store.summarizer_worker
    if not worker.enabled:
        raise PersistentMemoryError(
            "Rolling summaries are off: set CONTEXT_STRATEGY to 'rolling_summary' or a SUMMARIZER."
        )
    committed = tried = 0
    for sid in storage_ids:
        try:
            conversations = store.backend.list_conversations(sid)
        except SessionNotFound:
            continue
        for info in conversations:
            tried += 1
            try:
                done = summarize_conversation(
                    store.backend, sid, info["conversation"], worker.summarizer, worker.options
                )
            except SummarizerFailed as exc:
                raise PersistentMemoryError(f"The summarizer failed: {exc}") from exc
            committed += done
    return committed, tried
