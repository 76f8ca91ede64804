"""Upkeep of long-term memories, run by commands: embedding what has no vector of the
current model (``memory_embed``), merging near-duplicates already stored
(``memory_consolidate``), and the forgetting policies (``memory_sweep``). Each works one
owner at a time and never merges or compares across owners. :func:`embed_batch` is also
what the embedding worker's thread and the ``embed`` task run: this module sits below the
service (which queues memories onto the worker) and builds on the rows' conditions of
:mod:`~persistent_memory.memories.lifecycle`, not on the service."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from django.db import transaction
from django.db.models import Count, Q, QuerySet
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone

from persistent_memory.conf import memory_settings
from persistent_memory.memories import embedders, message_search, records, search, vectors
from persistent_memory.memories.lifecycle import current_filter, delete_memories, expired_filter, supersede
from persistent_memory.models import LongTermMemory

Progress = Callable[[int, int], None]


def _scope(owner: str | None) -> QuerySet[LongTermMemory]:
    """Live current memories: superseded versions are never embedded again, merged or
    counted on their own (they keep their vector, and go with their memory)."""
    rows = LongTermMemory.objects.filter(current_filter()).exclude(expired_filter())
    return rows if owner is None else rows.filter(owner=owner)


def unembedded(embedder: embedders.Embedder, owner: str | None = None) -> QuerySet[LongTermMemory]:
    """Live memories without a vector of ``embedder``'s model."""
    return _scope(owner).filter(~Q(embedding_model=embedder.model) | Q(embedding__isnull=True))


def embed_batch(
    ids: list[int],
    *,
    embedder: embedders.Embedder | None = None,
    only_unembedded: bool = True,
    gate: embedders.Circuit | None = None,
    stop: threading.Event | None = None,
) -> int | None:
    """Embed the memories ``ids`` (those still without a vector of the current model,
    unless ``only_unembedded`` is False) in one call of the embedder, with its own
    timeout and retries; how many got a vector, or None when the embedder failed. A
    memory whose content changed meanwhile keeps the vector its own write gave it; a
    vector refused (:func:`~persistent_memory.memories.embedders.refusal`) is not
    stored. Nothing is written once ``stop`` is set. ``gate``: the circuit the outcome
    moves (this process's by default)."""
    embedder = embedder or embedders.current()
    if embedder is None:
        return 0
    rows = LongTermMemory.objects.filter(pk__in=ids)
    if only_unembedded:
        rows = rows.filter(pk__in=unembedded(embedder).values("pk"))
    batch = list(rows.order_by("pk").values_list("pk", "content"))
    if not batch:
        return 0
    found = embedders.embed_or_none([content for _, content in batch], embedder=embedder, gate=gate)
    if found is None:
        return None
    if stop is not None and stop.is_set():
        return 0
    kept = embedders.checked(found, embedder.model)
    for length in {len(vector) for vector in kept if vector}:
        vectors.ensure_index(length)
    embedded = 0
    for (pk, content), vector in zip(batch, kept, strict=True):
        if vector is None:
            continue
        embedded += LongTermMemory.objects.filter(pk=pk, content=content).update(
            **records.vector_fields(vector, embedder.model)
        )
    return embedded


@dataclass
class EmbedReport:
    embedded: int = 0
    failed: int = 0
    #: What still has no vector of the current model.
    pending: int = 0
    vector_backend: str = ""
    #: Mirrored conversation messages (where MESSAGE_EMBEDDINGS gives them vectors).
    messages_embedded: int = 0
    messages_failed: int = 0


def embed_memories(
    *,
    owner: str | None = None,
    everything: bool = False,
    batch_size: int = 64,
    progress: Progress | None = None,
) -> EmbedReport:
    """Embed the memories that have no vector of the configured embedder's model (all of
    them with ``everything``), ``batch_size`` texts a call. A memory whose content changed
    meanwhile keeps the vector its own write gave it. On PostgreSQL, first adds pgvector's
    tables where the server has the extension (see migrations 0014 and 0018)."""
    embedder = embedders.current()
    if embedder is None:
        raise ValueError("No EMBEDDER is configured.")
    vectors.add_vector_table()
    vectors.add_vector_table(kind=message_search.VECTORS)
    rows = _scope(owner) if everything else unembedded(embedder, owner)
    ids = list(rows.order_by("pk").values_list("pk", flat=True))
    report = EmbedReport(vector_backend=vectors.backend())
    for start in range(0, len(ids), batch_size):
        chunk = ids[start : start + batch_size]
        embedded = embed_batch(chunk, embedder=embedder, only_unembedded=False)
        if embedded is None:
            report.failed += len(chunk)
        else:
            report.embedded += embedded
        if progress is not None:
            progress(min(start + batch_size, len(ids)), len(ids))
    report.pending = unembedded(embedder, owner).count()
    if message_search.embeds_messages():
        messages = message_search.unembedded(embedder)
        if owner is not None:
            messages = messages.filter(conversation__session__owner=owner)
        ids = list(messages.order_by("pk").values_list("pk", flat=True))
        for start in range(0, len(ids), batch_size):
            embedded = message_search.embed_batch(ids[start : start + batch_size], embedder=embedder)
            if embedded is None:
                report.messages_failed += len(ids[start : start + batch_size])
            else:
                report.messages_embedded += embedded
    return report


@dataclass
class ConsolidateReport:
    examined: int = 0
    #: Groups of near-duplicates found, and the memories merged into another (deleted).
    groups: int = 0
    merged: int = 0


def consolidate(
    *, owner: str | None = None, distance: float | None = None, dry_run: bool = False
) -> ConsolidateReport:
    """Merge each group of an owner's memories of one type whose vectors lie within
    ``distance`` (default MEMORY_DEDUP_DISTANCE) of the group's oldest memory into that
    one: it keeps its id and key and takes the newest content (the newest not extracted,
    when one was written otherwise: an extraction never overrides another source), the
    metadata merged oldest first, the access counts added up and the replaced contents
    in its history; the others are deleted."""
    embedder = embedders.current()
    if embedder is None:
        raise ValueError("No EMBEDDER is configured.")
    distance = memory_settings.MEMORY_DEDUP_DISTANCE if distance is None else distance
    report = ConsolidateReport()
    if distance is None:
        return report
    current = _scope(owner).filter(embedding_model=embedder.model, embedding__isnull=False)
    for who, type_ in current.values_list("owner", "type").distinct().order_by("owner", "type"):
        rows = current.filter(owner=who, type=type_)
        absorbed: set[int] = set()
        # Read first: the merges below delete rows of this owner and type.
        for pk, vector in list(rows.order_by("created_at", "pk").values_list("pk", "embedding")):
            report.examined += 1
            if pk in absorbed:
                continue
            others = rows.exclude(pk__in=[pk, *absorbed])
            near = vectors.nearest(others, search.compiled_where(others), vector, embedder.model, 100)
            group = [other for other, similarity in near if 1.0 - similarity <= distance]
            if not group:
                continue
            report.groups += 1
            report.merged += len(group)
            absorbed.update(group)
            if not dry_run:
                _merge_group(pk, group)
    return report


def _merge_group(survivor_id: int, others: list[int]) -> None:
    with transaction.atomic():
        members = list(LongTermMemory.objects.select_for_update().filter(pk__in=[survivor_id, *others]))
        survivor = next((row for row in members if row.pk == survivor_id), None)
        if survivor is None:
            return
        by_age = sorted(members, key=lambda row: (row.updated_at, row.pk))
        written = [row for row in by_age if row.source != "extraction"] or by_age
        newest = written[-1]
        if survivor.content != newest.content:  # before anything of it changes
            supersede(survivor, timezone.now())
        for row in by_age:
            if row.content != newest.content and row.content not in [
                h.get("content") for h in survivor.history
            ]:
                survivor.history = records.with_history(survivor.history, row, "consolidated")
        metadata: dict = {}
        for row in by_age:
            metadata.update(row.metadata)
        survivor.metadata = metadata
        for name in ("content", "tokens", "source", *records.vector_fields(None, "")):
            setattr(survivor, name, getattr(newest, name))
        survivor.access_count = sum(row.access_count for row in members)
        accessed = [row.last_accessed_at for row in members if row.last_accessed_at]
        survivor.last_accessed_at = max(accessed) if accessed else None
        survivor.source_messages = list(dict.fromkeys(m for row in by_age for m in row.source_messages))[
            -100:
        ]
        survivor.updated_at = timezone.now()
        delete_memories(
            LongTermMemory.objects.filter(pk__in=[row.pk for row in members if row.pk != survivor_id])
        )
        survivor.save()


@dataclass
class ForgetReport:
    inactive: int = 0
    over_budget: int = 0


def forget_by_policy(*, owner: str | None = None, dry_run: bool = False) -> ForgetReport:
    """Delete the memories unused (neither updated nor accessed) for MEMORY_INACTIVE_DAYS,
    then, per owner, the least recently used beyond MEMORY_MAX_PER_OWNER."""
    report = ForgetReport()
    rows = _scope(owner).annotate(
        last_used=Greatest("updated_at", Coalesce("last_accessed_at", "updated_at"))
    )
    days = memory_settings.MEMORY_INACTIVE_DAYS
    if days:
        stale = rows.filter(last_used__lt=timezone.now() - timedelta(days=days))
        if dry_run:
            report.inactive = stale.count()
            rows = rows.exclude(pk__in=stale.values("pk"))  # as if deleted, for the budget
        else:
            report.inactive = delete_memories(LongTermMemory.objects.filter(pk__in=stale.values("pk")))
    budget = memory_settings.MEMORY_MAX_PER_OWNER
    if budget:
        for who, count in (
            rows.values("owner").annotate(n=Count("pk")).filter(n__gt=budget).values_list("owner", "n")
        ):
            extra = list(
                rows.filter(owner=who)
                .order_by("last_used", "pk")
                .values_list("pk", flat=True)[: count - budget]
            )
            report.over_budget += (
                len(extra) if dry_run else delete_memories(LongTermMemory.objects.filter(pk__in=extra))
            )
    return report
