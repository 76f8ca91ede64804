"""Copy every session from one Redis key layout to the other (``memory_relayout``).

The source is the configured Redis backend read in one layout, the target the same
server in the other layout, or another Redis (say a real Redis Cluster) given by URL.
Each session moves whole: :meth:`~RedisBackend.snapshots` reads it in one step and
:meth:`~RedisBackend.restore_session` writes it in one step (values, history,
conversations with their summaries, TTLs as the time left to the same absolute expiry,
idle TTLs with their fixed deadline). What a session is not is not moved: idempotency
records and run bindings are short-lived and are written again by the next requests.

A run is idempotent and resumable without any state of its own: before writing a
session it reads the target's copy and skips it when equal (:func:`same_session`), so a
second run writes nothing and a run started again after Ctrl-C or a kill copies only what
it had not reached (each session's write is atomic, so no half-copied session is left).
Comparing whole snapshots, not just ``created_at`` and the history's length, also
catches a value or a conversation changed since without a history entry; it costs one
pipelined read of the target per batch. Every copy is read back and compared, and only
then, with ``delete_source``, is the source session deleted.

Run it with the application's writers stopped (or pointed at the target): a write to
the source after its session was copied reaches the target only on the next run, and
with ``delete_source`` it is lost.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from persistent_memory.backends import backend_class
from persistent_memory.backends.base import SessionSnapshot, remaining_seconds
from persistent_memory.backends.batches import BATCH_SIZE
from persistent_memory.backends.redis import RedisBackend
from persistent_memory.conf import REDIS_LAYOUTS, MemorySettings, memory_settings, redis_layout
from persistent_memory.exceptions import PersistentMemoryError, SessionNotFound
from persistent_memory.owners import owner_prefix

#: Expiries within this many seconds are the same: a restore sets the time left when it
#: runs, so the copy's absolute expiry differs from the source's by that call's latency.
EXPIRY_TOLERANCE = 1.0

#: Where a target given by URL may be.
TARGET_TOPOLOGIES = ("single", "cluster")


@dataclass
class RelayoutReport:
    """What a relayout did (or would do, in a dry run)."""

    source: str = ""
    target: str = ""
    batches: int = 0
    scanned: int = 0
    copied: int = 0
    up_to_date: int = 0
    expired: int = 0
    #: Copies that did not read back equal to their source (their source is kept).
    failed: int = 0
    deleted_source: int = 0
    #: Stopped by Ctrl-C (KeyboardInterrupt) after the counted sessions: run again to finish.
    interrupted: bool = False


#: Called after each batch with the report so far.
BatchProgress = Callable[[RelayoutReport], None]


def _noop(report: RelayoutReport) -> None:
    pass


def same_session(a: SessionSnapshot, b: SessionSnapshot, tolerance: float = EXPIRY_TOLERANCE) -> bool:
    """Whether two snapshots hold the same session: values, history, conversations,
    checkpoints, creation time, TTLs, what the expiry is from (``expires_by``), and
    absolute expiries within ``tolerance`` seconds."""
    info_a, info_b = a["info"], b["info"]
    compared = ("created_at", "ttl_seconds", "idle_ttl_seconds", "expires_by")
    if any(info_a[name] != info_b[name] for name in compared):
        return False
    expires_a, expires_b = info_a["expires_at"], info_b["expires_at"]
    if (expires_a is None) != (expires_b is None):
        return False
    if expires_a is not None and abs(expires_a - expires_b) > tolerance:  # type: ignore[operator]
        return False
    return (
        a["values"] == b["values"]
        and a["history"] == b["history"]
        and (a.get("conversations") or {}) == (b.get("conversations") or {})
        and (a.get("checkpoints") or {}) == (b.get("checkpoints") or {})
    )


def _redis_backend(conf: MemorySettings) -> RedisBackend:
    cls = backend_class(conf.BACKEND)
    if not issubclass(cls, RedisBackend):
        raise PersistentMemoryError(
            "memory_relayout moves sessions between Redis key layouts: "
            f"BACKEND is {conf.BACKEND!r}, not redis."
        )
    return cls.from_settings(conf)


def relayout_backends(
    *,
    to: str,
    source_layout: str | None = None,
    target_url: str | None = None,
    target_topology: str = "single",
    conf: MemorySettings = memory_settings,
) -> tuple[RedisBackend, RedisBackend]:
    """The source and the target of a relayout to layout ``to``.

    The source is the configured backend in ``source_layout``; by default the layout
    other than ``to`` on the same server, and the configured layout when the target is
    another Redis (``target_url``, a ``target_topology`` server). The target is the same
    settings with the layout ``to`` and, when given, the other server.
    """
    for name, layout in (("--to", to), ("--from", source_layout)):
        if layout is not None and layout not in REDIS_LAYOUTS:
            raise PersistentMemoryError(f"{name} must be one of {', '.join(REDIS_LAYOUTS)}.")
    if target_topology not in TARGET_TOPOLOGIES:
        raise PersistentMemoryError(f"The target topology must be one of {', '.join(TARGET_TOPOLOGIES)}.")
    if source_layout is None:
        source_layout = redis_layout(conf) if target_url else next(n for n in REDIS_LAYOUTS if n != to)
    if not target_url and source_layout == to:
        raise PersistentMemoryError(
            f"The source and the target are the {to} layout of the same server: give --target-url "
            "or the other layout."
        )
    target_overrides: dict[str, Any] = {"REDIS_LAYOUT": to}
    if target_url:
        # Nothing of the configured connection carries over to another server.
        target_overrides.update(
            REDIS_URL=target_url, REDIS_TOPOLOGY=target_topology, REDIS_CACHE_ALIAS=None, REDIS_SENTINELS=[]
        )
        if target_topology == "cluster" and to != "cluster":
            raise PersistentMemoryError(
                "Redis Cluster holds only the cluster layout (a session's keys must share a slot)."
            )
    elif conf.REDIS_TOPOLOGY == "cluster" and "node" in (to, source_layout):
        raise PersistentMemoryError("Redis Cluster holds only the cluster layout: give --target-url.")
    source = _redis_backend(MemorySettings({**conf.user_settings, "REDIS_LAYOUT": source_layout}))
    try:
        target = _redis_backend(MemorySettings({**conf.user_settings, **target_overrides}))
    except BaseException:
        source.close()
        raise
    return source, target


def _label(backend: RedisBackend) -> str:
    return f"the {backend.layout.name} layout on {backend.describe()}"


def relayout(
    source: RedisBackend,
    target: RedisBackend,
    *,
    dry_run: bool = False,
    delete_source: bool = False,
    owner: str | None = None,
    batch_size: int = BATCH_SIZE,
    progress: BatchProgress = _noop,
) -> RelayoutReport:
    """Copy every live session of ``source`` (of ``owner`` only, when given) to ``target``,
    skipping those whose copy is up to date and those expired; with ``delete_source``,
    delete each source session once its copy reads back equal. Ctrl-C ends the run
    after whole sessions, with ``interrupted`` set."""
    report = RelayoutReport(source=_label(source), target=_label(target))
    prefix = owner_prefix(owner)
    cursor = 0
    try:
        while True:
            cursor, ids = source.scan_sessions(cursor, batch_size, prefix)
            if ids:
                _copy_batch(source, target, ids, report, dry_run=dry_run, delete_source=delete_source)
                report.batches += 1
                progress(report)
            if cursor == 0:
                return report
    except KeyboardInterrupt:
        report.interrupted = True
        return report


def _copy_batch(
    source: RedisBackend,
    target: RedisBackend,
    ids: list[str],
    report: RelayoutReport,
    *,
    dry_run: bool,
    delete_source: bool,
) -> None:
    ids = list(dict.fromkeys(ids))  # a SCAN may return an id twice
    report.scanned += len(ids)
    snapshots = source.snapshots(ids, checkpoints=True)
    live = {
        sid: snap
        for sid, snap in snapshots.items()
        if snap is not None and remaining_seconds(snap["info"]) != 0
    }
    report.expired += len(ids) - len(live)
    copies = target.snapshots(list(live), checkpoints=True) if live else {}
    stale = [sid for sid, snap in live.items() if copies[sid] is None or not same_session(snap, copies[sid])]
    report.up_to_date += len(live) - len(stale)
    if dry_run:
        report.copied += len(stale)
        return
    for sid in stale:
        target.restore_session(live[sid], replace=True)
    # Read every copy back: what differs (a write to the target meanwhile) keeps its source.
    written = target.snapshots(stale, checkpoints=True) if stale else {}
    failed = {sid for sid, copy in written.items() if copy is None or not same_session(live[sid], copy)}
    # A copy gone because its time ran out while the batch was written is no failure.
    gone = {sid for sid in failed if written[sid] is None and remaining_seconds(live[sid]["info"]) == 0}
    report.expired += len(gone)
    report.failed += len(failed) - len(gone)
    report.copied += len(stale) - len(failed)
    if delete_source:
        for sid in live.keys() - failed:
            try:
                source.delete_session(sid)
                report.deleted_source += 1
            except SessionNotFound:  # expired since, or deleted by someone else
                pass
