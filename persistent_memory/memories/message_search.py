"""What was said, searchable: an owner's conversation messages, found by the same search
as memories, without any extraction.

The index is the mirror's message rows (:class:`~persistent_memory.models.MemoryMessage`,
written by :mod:`persistent_memory.mirror.conversations`): PostgreSQL's ``search_tsv``
with a GIN index, SQLite's FTS5 table ``pm_message_fts`` (migration 0016), ``icontains``
elsewhere; the speaker's name is searched at half the weight of the text. A message is
searched through its session's row, so it is the owner's alone (``MemorySession.owner``,
resolved on the server), gone when the session expires or is deleted (the sessions'
``state`` and ``expires_at``), and gone with the owner (forgetting an owner deletes
their session rows, and the messages with them). A search first syncs the sessions the
store marked dirty (at most ADMIN_SYNC_LIMIT): it sees every message written before
it. With MIRROR_MODE "off" no message is searchable.

Messages are compared by meaning where MESSAGE_EMBEDDINGS is on (by default, whenever
an EMBEDDER is set), each embedded with its speaker's name ("Caroline: ..."): the
embedding worker takes each new message the mirror writes (its ``messages_mirrored``
signal; :func:`embed_batch` gives them their vectors), and ``memory_embed`` catches
up. Their vectors are compared as memories' are
(:mod:`~persistent_memory.memories.vectors`): on PostgreSQL with pgvector, by the
database, each vector also in ``pm_message_vector`` (migration 0018; written with the
message's bytes, emptied with its rows by triggers) with an HNSW index per length and
iterative scans; with sqlite-vec where it loads; else with numpy over the owner's
newest MEMORY_VECTOR_SCAN_LIMIT messages.

A keyword search ranks every match of the owner's (exact BM25 / ts_rank order): its cost
grows with the matches, not the owner's messages. bench/message_search_bench.py measures
it (docs/performance.md: a few ms at 6,000 messages; on PostgreSQL at a million, 9 ms
for a rare word and 300 to 400 for a question whose words are in a tenth of them).

Memory blocks injected into a conversation (see
:func:`persistent_memory.memories.rendering.is_injected`) are never found: what they say
is found as the memories themselves.
"""

from __future__ import annotations

import logging
from array import array
from datetime import datetime
from typing import Any

from django.core.exceptions import EmptyResultSet, FullResultSet
from django.db import DatabaseError, connection, transaction
from django.db.models import Exists, OuterRef, Q, QuerySet
from django.utils import timezone

from persistent_memory.conf import memory_settings, mirror_mode
from persistent_memory.memories import embedders, fulltext
from persistent_memory.memories import vectors as _vectors
from persistent_memory.memories.rendering import HEADER
from persistent_memory.mirror.signals import search_starting
from persistent_memory.models import MemoryConversation, MemoryMessage, MemorySession

logger = logging.getLogger("persistent_memory.memories")

MESSAGES, CONVERSATIONS, SESSIONS = (
    MemoryMessage._meta.db_table,
    MemoryConversation._meta.db_table,
    MemorySession._meta.db_table,
)
#: The rows a message search reads: each message with its conversation and session.
_JOINS = (
    f"INNER JOIN {CONVERSATIONS} ON ({MESSAGES}.conversation_id = {CONVERSATIONS}.id) "
    f"INNER JOIN {SESSIONS} ON ({CONVERSATIONS}.session_id = {SESSIONS}.id)"
)
_FROM = f"{MESSAGES} {_JOINS}"
#: ts_rank's weights {D, C, B, A}: the text's lexemes D, the speaker's name C at half.
_TS_WEIGHTS = "{0.1, 0.05, 0.4, 1.0}"
#: BM25 weights of the FTS5 columns (text, name).
_BM25_WEIGHTS = "1.0, 0.5"
#: Where messages' vectors are compared: on PostgreSQL with pgvector, a copy of each in
#: ``pm_message_vector`` (migration 0018) that :func:`embed_batch` writes with the bytes.
VECTORS = _vectors.Kind(
    rows=MESSAGES,
    vectors="pm_message_vector",
    key="message_row_id",
    index_prefix="pm_message_hnsw",
    joins=_JOINS,
    newest=("-created_at", "-id"),
)

Ranked = list[tuple[int, float]]


def embeds_messages() -> bool:
    """Whether messages get vectors: MESSAGE_EMBEDDINGS, or (None) whether there is an EMBEDDER."""
    setting = memory_settings.MESSAGE_EMBEDDINGS
    return embedders.current() is not None if setting is None else bool(setting)


def rows(
    owner: str,
    *,
    session_id: str | None = None,
    said_after: datetime | None = None,
    said_before: datetime | None = None,
) -> QuerySet[MemoryMessage]:
    """The owner's searchable messages: of live, unexpired sessions, with text (not a bare
    tool call), never an injected memory block; of one session, and said within the
    bounds, when given. None with MIRROR_MODE "off": the rows left from before no longer
    follow their sessions."""
    if mirror_mode(memory_settings) == "off":
        return MemoryMessage.objects.none()
    now = timezone.now()
    found = MemoryMessage.objects.filter(
        conversation__session__owner=owner,
        conversation__session__state=MemorySession.State.LIVE,
    ).filter(Q(conversation__session__expires_at__isnull=True) | Q(conversation__session__expires_at__gt=now))
    found = found.exclude(content_text="").exclude(content_text__startswith=HEADER)
    if session_id is not None:
        found = found.filter(conversation__session__session_id=session_id)
    if said_after is not None:
        found = found.filter(created_at__gte=said_after)
    if said_before is not None:
        found = found.filter(created_at__lt=said_before)
    return found


def catch_up(owner: str | None = None) -> None:
    """Have the store sync what it marked dirty into the mirror (and, given ``owner``, the
    owner's sessions whose rows say they expired), so that a search sees every message
    written before it: the store's receiver of ``search_starting`` does it
    (:meth:`~persistent_memory.mirror.sessions.Mirror.catch_up`). A store or database that
    cannot answer costs the search the newest messages, never the search."""
    if mirror_mode(memory_settings) == "off":
        return
    try:
        search_starting.send(sender=catch_up, owner=owner)
    except Exception as exc:  # noqa: BLE001 - the mirror logs and retries its own failures
        logger.warning("memory: messages not synced before a search: %s", exc)


def _where(found: QuerySet[MemoryMessage]) -> tuple[str, list[Any]]:
    """``found``'s WHERE compiled for a raw query over :data:`_FROM` (Django names each
    table by itself when it is joined once). Raises ``EmptyResultSet`` when nothing can match."""
    compiler = found.query.get_compiler(connection=connection)
    try:
        sql, params = compiler.compile(found.query.where)
    except FullResultSet:
        return "1 = 1", []
    if set(found.query.alias_map) != {MESSAGES, CONVERSATIONS, SESSIONS}:
        raise ValueError("A message search joins each message's conversation and session once.")
    return sql or "1 = 1", list(params)


def _postgresql(found: QuerySet[MemoryMessage], words: list[str], limit: int) -> Ranked:
    tsquery = " | ".join(f"'{word}'" for word in words)  # \w+ words: plain lexemes
    where, params = _where(found)
    sql = (
        f"SELECT {MESSAGES}.id, ts_rank(%s::float4[], {MESSAGES}.search_tsv, q) AS score "  # noqa: S608 - constants and Django's own SQL
        f"FROM {_FROM}, to_tsquery('english', %s) q "
        f"WHERE {MESSAGES}.search_tsv @@ q AND {where} "
        f"ORDER BY score DESC, {MESSAGES}.created_at DESC LIMIT %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [_TS_WEIGHTS, tsquery, *params, limit])
        return [(pk, float(score)) for pk, score in cursor.fetchall()]


def _sqlite(found: QuerySet[MemoryMessage], words: list[str], limit: int) -> Ranked:
    match = " OR ".join(f'"{word}"' for word in words)  # \w+ words: plain FTS5 strings
    where, params = _where(found)
    # CROSS JOIN keeps SQLite's order: the full-text matches first, each message then
    # found by its id (as the memories' search does).
    sql = (
        f"SELECT {MESSAGES}.id, -bm25(pm_message_fts, {_BM25_WEIGHTS}) AS score FROM pm_message_fts "  # noqa: S608 - as above
        f"CROSS JOIN {MESSAGES} ON ({MESSAGES}.id = pm_message_fts.rowid) {_JOINS} "
        f"WHERE pm_message_fts MATCH %s AND {where} ORDER BY score DESC, {MESSAGES}.created_at DESC LIMIT %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [match, *params, limit])
        return [(pk, float(score)) for pk, score in cursor.fetchall()]


def _icontains(found: QuerySet[MemoryMessage], words: list[str], limit: int) -> Ranked:
    any_word = Q()
    for word in words:
        any_word |= Q(content_text__icontains=word) | Q(name__icontains=word)
    scored = []
    for pk, text, name in (
        found.filter(any_word)
        .order_by("-created_at", "-id")
        .values_list("id", "content_text", "name")[: limit * 5]
    ):
        folded, folded_name = text.casefold(), name.casefold()
        scored.append(
            (pk, sum(1.0 if word in folded else 0.5 if word in folded_name else 0.0 for word in words))
        )
    scored.sort(key=lambda item: -item[1])  # stable: newest first among equals
    return scored[:limit]


def keyword(found: QuerySet[MemoryMessage], words: list[str], limit: int) -> Ranked:
    """The messages of ``found`` matching any of ``words``, best first, with the
    database's own score (BM25, ts_rank, or words matched: see the memories' search)."""
    if not words:
        return []
    try:
        if connection.vendor == "postgresql":
            return _postgresql(found, words, limit)
        if connection.vendor == "sqlite" and fulltext.fts_ready("pm_message_fts"):
            try:
                return _sqlite(found, words, limit)
            except DatabaseError:  # a query FTS5 cannot parse: fall back, never fail
                pass
    except EmptyResultSet:
        return []
    return _icontains(found, words, limit)


def semantic(found: QuerySet[MemoryMessage], vector: list[float], model: str, limit: int) -> Ranked:
    """The messages of ``found`` whose vectors (of ``model``) are nearest ``vector``."""
    try:
        where: tuple[str, list[Any]] | None = _where(found)
    except EmptyResultSet:
        where = None
    return _vectors.nearest(found, where, vector, model, limit, VECTORS)


def recent(found: QuerySet[MemoryMessage], limit: int) -> Ranked:
    """Newest first (score 1/(1+rank))."""
    ids = found.order_by("-created_at", "-id").values_list("id", flat=True)[:limit]
    return [(pk, 1.0 / (1 + place)) for place, pk in enumerate(ids)]


#: The columns a found message is described by (see :func:`described`).
FIELDS = (
    "pk",
    "message_id",
    "role",
    "name",
    "content_text",
    "created_at",
    "seq",
    "tokens",
    "conversation__name",
    "conversation__session__session_id",
    "conversation__session__owner",
)


def described(row: dict[str, Any]) -> dict[str, Any]:
    """A message as search results give it (without score), from its :data:`FIELDS`."""
    return {
        "kind": "message",
        "id": row["message_id"],
        "owner": row["conversation__session__owner"],
        "session_id": row["conversation__session__session_id"],
        "conversation": row["conversation__name"],
        "role": row["role"],
        "name": row["name"],
        "content": row["content_text"],
        "said_at": row["created_at"],
        "seq": row["seq"],
        "tokens": row["tokens"],
    }


def as_dicts(ids: list[int]) -> dict[int, dict[str, Any]]:
    """The messages ``ids`` as search results give them (without score), by id."""
    return {row["pk"]: described(row) for row in MemoryMessage.objects.filter(pk__in=ids).values(*FIELDS)}


def conversations(owner: str) -> list[tuple[str, str]]:
    """The owner's conversations holding a searchable message: (session_id, name) pairs.
    Each conversation is probed for one message (by its index), never the messages read."""
    searchable = rows(owner).filter(conversation=OuterRef("pk"))
    return list(
        MemoryConversation.objects.filter(session__owner=owner)
        .filter(Exists(searchable))
        .order_by()
        .values_list("session__session_id", "name")
    )


def unembedded(embedder: embedders.Embedder) -> QuerySet[MemoryMessage]:
    """Messages with text and no vector of ``embedder``'s model."""
    return MemoryMessage.objects.exclude(content_text="").filter(
        ~Q(embedding_model=embedder.model) | Q(embedding_f32__isnull=True)
    )


def row_ids(conversation_messages: list[tuple[int, str]]) -> list[int]:
    """The rows of the mirrored messages ``conversation_messages`` (``(conversation row
    id, message id)``, as :data:`~persistent_memory.mirror.signals.messages_mirrored`
    names them)."""
    wanted = set(conversation_messages)
    ids: list[int] = []
    for start in range(0, len(wanted), 500):  # within any database's limit of parameters
        chunk = list(wanted)[start : start + 500]
        found = MemoryMessage.objects.filter(
            conversation_id__in={c for c, _ in chunk}, message_id__in={m for _, m in chunk}
        ).values_list("pk", "conversation_id", "message_id")
        ids += [pk for pk, conversation, message in found if (conversation, message) in wanted]
    return ids


def embed_batch(
    ids: list[int], *, embedder: embedders.Embedder, gate: Any = None, stop: Any = None
) -> int | None:
    """Embed the messages ``ids`` still without a vector of the embedder's model in one
    call; how many got one, or None when the embedder failed. Nothing is written once
    ``stop`` (an Event) is set."""
    batch = list(
        unembedded(embedder).filter(pk__in=ids).order_by("pk").values_list("pk", "content_text", "name")
    )
    if not batch:
        return 0
    # The speaker is part of what was said: "What did Caroline adopt?" is nearer
    # "Caroline: We adopted a puppy" than the text alone.
    texts = [f"{name}: {text}" if name else text for _, text, name in batch]
    found = embedders.embed_or_none(texts, embedder=embedder, gate=gate)
    if found is None:
        return None
    if stop is not None and stop.is_set():
        return 0
    written: list[tuple[int, list[float]]] = []
    # pgvector's copy in the same transaction as the bytes: a trigger cannot read float32
    # bytes back into numbers.
    with transaction.atomic():
        for (pk, *_), vector in zip(batch, embedders.checked(found, embedder.model), strict=True):
            if vector is not None and MemoryMessage.objects.filter(pk=pk).update(
                embedding_f32=array("f", vector).tobytes(),
                embedding_model=embedder.model,
                embedding_dimensions=len(vector),
            ):
                written.append((pk, vector))
        _vectors.write_vectors(written, VECTORS)
    return len(written)
