"""A memory's rows over its life, the conditions every read of memories is built from and
the writes that keep versions: live (not :func:`expired_filter`), current (not a superseded
version: :func:`current_filter`), true at a moment (:func:`as_of_filter`), said before or
after one (:func:`said_filter`); a superseded version kept (:func:`supersede`) and a memory
deleted with its versions (:func:`delete_memories`).

Below the service and the upkeep, which both build on them (see
:mod:`persistent_memory.memories.service` for what a version is)."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from persistent_memory.conf import memory_settings
from persistent_memory.models import LongTermMemory


def expired_filter(now: datetime | None = None) -> Q:
    """Memories past their ``expires_at`` or, with MEMORY_RETENTION_DAYS, not updated
    for that long: gone for reads, deleted by ``memory_sweep``."""
    now = now or timezone.now()
    condition = Q(expires_at__lte=now)
    days = memory_settings.MEMORY_RETENTION_DAYS
    if days:
        condition |= Q(updated_at__lt=now - timedelta(days=days))
    return condition


def current_filter() -> Q:
    """Current memories: not a superseded version of another."""
    return Q(superseded_by__isnull=True)


def said_filter(lookup: str, bound: datetime) -> Q:
    """Memories said ``lookup`` (gte, lt, lte) ``bound``: by ``said_at``, or ``created_at``
    where that is unknown."""
    return Q(**{f"said_at__{lookup}": bound}) | Q(said_at__isnull=True, **{f"created_at__{lookup}": bound})


def as_of_filter(moment: datetime) -> Q:
    """The versions (current memories and superseded ones) true at ``moment``: said by then
    (``said_at``, else ``created_at``), not superseded by then, and of each memory only
    the version superseded first after it (one a memory, even where writes gave said_at
    out of order). Conditions on the memories' table alone (EXISTS on itself), so the
    search strategies' SQL takes them as it takes the owner's filters."""
    said = said_filter("lte", moment)
    # Superseded versions true then: each hides the versions of its memory that ended later.
    true_then = LongTermMemory.objects.filter(said, valid_until__gt=moment)
    return said & (
        (current_filter() & ~Exists(true_then.filter(superseded_by=OuterRef("pk"))))
        | (
            Q(valid_until__gt=moment)
            & ~Exists(
                true_then.filter(
                    superseded_by=OuterRef("superseded_by"), valid_until__lt=OuterRef("valid_until")
                )
            )
        )
    )


def supersede(row: LongTermMemory, until: datetime) -> None:
    """Keep what ``row`` says now as a superseded version of it, true until ``until``
    (with MEMORY_KEEP_SUPERSEDED): the caller then writes the new content into ``row``,
    which keeps its id. The version keeps the vector it had (a search as of then finds
    it by meaning too) and has no expiry of its own: it goes with its memory."""
    if not memory_settings.MEMORY_KEEP_SUPERSEDED:
        return
    kept = {field.attname: getattr(row, field.attname) for field in LongTermMemory._meta.concrete_fields}
    kept.pop(LongTermMemory._meta.pk.attname)
    LongTermMemory.objects.create(
        **{**kept, "superseded_by_id": row.pk, "valid_until": until, "expires_at": None}
    )


def delete_memories(rows: QuerySet[LongTermMemory]) -> int:
    """Delete the memories of ``rows`` (current ones) with their superseded versions; how
    many memories (the versions are not counted)."""
    LongTermMemory.objects.filter(superseded_by__in=rows.values("pk")).delete()
    return rows.delete()[0]
