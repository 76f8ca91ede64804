"""Search strategies over one owner's memories: each returns ``[(id, score), ...]``,
best first.

* ``recent``: newest update first (score 1/(1+rank)).
* ``keyword``: full text of the content and the key (the key's parts, split on ``.``,
  ``_`` and ``-``, count half as much as the content's words: ``ui.theme`` is found by
  "theme"). PostgreSQL: ``to_tsvector('english', ...)`` of both (stored in
  ``search_tsv`` with a GIN index, migrations 0010 and 0011) matched by any of the
  query's words, ranked by ``ts_rank``. SQLite: the FTS5 table of migrations 0009 and
  0011, ranked by BM25. Other databases (or SQLite without FTS5): ``icontains`` per
  word, scored by words matched.
* ``semantic``: with an ``EMBEDDER``, cosine similarity computed in Python over the
  owner's stored vectors (a JSON column beside each row; pgvector and sqlite-vec are
  not used, so this suits thousands of memories per owner, not millions).
* ``hybrid``: reciprocal rank fusion (k=60) of keyword with semantic when an embedder
  is configured, else of keyword with recency among the keyword matches (recency
  breaks ties of relevance; unrelated recent memories are not brought in).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from django.core.exceptions import EmptyResultSet, FullResultSet, ImproperlyConfigured
from django.db import DatabaseError, connection
from django.db.models import Q, QuerySet
from django.utils.module_loading import import_string

from persistent_memory.conf import memory_settings
from persistent_memory.models import LongTermMemory

STRATEGIES = ("recent", "keyword", "semantic", "hybrid")
RRF_K = 60
#: How many keyword candidates a search considers before fusion and the token budget.
CANDIDATES = 200
_WORDS = re.compile(r"\w+", re.UNICODE)
#: Weights of ts_rank, in its order {D, C, B, A}: the content's lexemes carry the
#: default D, the key's C at half of that (migration 0011).
_TS_WEIGHTS = "{0.1, 0.05, 0.4, 1.0}"
#: BM25 weights of the FTS5 columns (content, key): the key counts half, as above.
_BM25_WEIGHTS = "1.0, 0.5"
_TABLE = LongTermMemory._meta.db_table

Ranked = list[tuple[int, float]]


#: Left out of queries on every database (PostgreSQL's English configuration drops
#: these and more; SQLite's FTS5 drops none), so a question's "do I" matches nothing.
STOP_WORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "but",
        "by",
        "do",
        "does",
        "did",
        "for",
        "from",
        "had",
        "has",
        "have",
        "how",
        "i",
        "if",
        "in",
        "is",
        "it",
        "its",
        "me",
        "my",
        "of",
        "on",
        "or",
        "our",
        "so",
        "that",
        "the",
        "their",
        "them",
        "they",
        "this",
        "to",
        "was",
        "we",
        "were",
        "what",
        "when",
        "where",
        "which",
        "who",
        "why",
        "will",
        "with",
        "would",
        "you",
        "your",
    ]
)


def query_words(query: str) -> list[str]:
    """The query's words (letters, digits, _) but stop words, deduplicated, at most 32."""
    seen: dict[str, None] = {}
    for word in _WORDS.findall(query.casefold()):
        if word not in STOP_WORDS:
            seen.setdefault(word, None)
    return list(seen)[:32]


def recent(rows: QuerySet[LongTermMemory], limit: int) -> Ranked:
    """Newest update first."""
    ids = rows.order_by("-updated_at", "-id").values_list("id", flat=True)[:limit]
    return [(pk, 1.0 / (1 + rank)) for rank, pk in enumerate(ids)]


def _where(rows: QuerySet[LongTermMemory]) -> tuple[str, list[Any]]:
    """The queryset's WHERE (owner, types, session, expiry), compiled by Django, for a
    query on the memories table itself. Inline, not as ``id IN (subquery)``: that made
    the database list every memory of the owner on each search (at 100,000 memories,
    60 to 90 ms whatever the query matched). Raises ``EmptyResultSet`` when it matches
    nothing."""
    if len(rows.query.alias_map) > 1:  # a join's columns would not resolve in the raw SQL
        raise ValueError("The keyword search filters on the memories table's own columns only.")
    try:
        sql, params = rows.query.get_compiler(connection=connection).compile(rows.query.where)
    except FullResultSet:
        return "1 = 1", []
    return sql or "1 = 1", list(params)


def _postgresql(rows: QuerySet[LongTermMemory], words: list[str], limit: int) -> Ranked:
    # Words are \w+ only: quoted, they are plain lexemes in to_tsquery's syntax.
    tsquery = " | ".join(f"'{word}'" for word in words)
    where, params = _where(rows)
    # The table is a constant and `where` Django's own SQL with its parameters apart.
    # search_tsv is the stored vector of the content and the key (migrations 0010, 0011):
    # the GIN index serves the match, and the rank reads it instead of parsing every match.
    sql = (
        f"SELECT {_TABLE}.id, ts_rank(%s::float4[], {_TABLE}.search_tsv, q) AS score "  # noqa: S608
        f"FROM {_TABLE}, to_tsquery('english', %s) q "
        f"WHERE {_TABLE}.search_tsv @@ q AND {where} "
        f"ORDER BY score DESC, {_TABLE}.updated_at DESC LIMIT %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [_TS_WEIGHTS, tsquery, *params, limit])
        return [(pk, float(score)) for pk, score in cursor.fetchall()]


def _sqlite(rows: QuerySet[LongTermMemory], words: list[str], limit: int) -> Ranked:
    # Words are \w+ only: double-quoted, they are plain FTS5 strings.
    match = " OR ".join(f'"{word}"' for word in words)
    where, params = _where(rows)
    # CROSS JOIN keeps SQLite's join order: the full-text matches first, each memory
    # then found by its id (never the owner's memories scanned, each looked up in FTS5).
    sql = (
        f"SELECT {_TABLE}.id, -bm25(pm_memory_fts, {_BM25_WEIGHTS}) AS score FROM pm_memory_fts "  # noqa: S608 - as above
        f"CROSS JOIN {_TABLE} ON {_TABLE}.id = pm_memory_fts.rowid "
        f"WHERE pm_memory_fts MATCH %s AND {where} ORDER BY score DESC, {_TABLE}.updated_at DESC LIMIT %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [match, *params, limit])
        return [(pk, float(score)) for pk, score in cursor.fetchall()]


def _icontains(rows: QuerySet[LongTermMemory], words: list[str], limit: int) -> Ranked:
    any_word = Q()
    for word in words:
        any_word |= Q(content__icontains=word) | Q(key__icontains=word)
    scored = []
    for pk, content, key in (
        rows.filter(any_word).order_by("-updated_at", "-id").values_list("id", "content", "key")[: limit * 5]
    ):
        folded, folded_key = content.casefold(), key.casefold()
        # Substrings, as the filter matched them; a word of the key counts half, as above.
        scored.append(
            (pk, sum(1.0 if word in folded else 0.5 if word in folded_key else 0.0 for word in words))
        )
    scored.sort(key=lambda item: -item[1])  # stable: newest first among equals
    return scored[:limit]


@lru_cache(maxsize=1)
def _sqlite_fts_ready(alias: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'pm_memory_fts'")
        return cursor.fetchone() is not None


def keyword(rows: QuerySet[LongTermMemory], query: str, limit: int) -> Ranked:
    """Full-text matches of any of the query's words, best first."""
    words = query_words(query)
    if not words:
        return []
    try:
        if connection.vendor == "postgresql":
            return _postgresql(rows, words, limit)
        if connection.vendor == "sqlite" and _sqlite_fts_ready(connection.alias):
            try:
                return _sqlite(rows, words, limit)
            except DatabaseError:  # a query FTS5 cannot parse: fall back, never fail
                pass
    except EmptyResultSet:  # filters nothing can pass (no types): no query needed
        return []
    return _icontains(rows, words, limit)


def embedder() -> Callable[[list[str]], list[list[float]]] | None:
    """The configured EMBEDDER, or None."""
    path = memory_settings.EMBEDDER
    if not path:
        return None
    try:
        function = import_string(path) if isinstance(path, str) else path
    except ImportError as exc:
        raise ImproperlyConfigured(f"PERSISTENT_MEMORY: EMBEDDER {path!r} cannot be imported: {exc}") from exc
    if not callable(function):
        raise ImproperlyConfigured(f"PERSISTENT_MEMORY: EMBEDDER {path!r} is not callable.")
    return function


def embed(texts: list[str]) -> list[list[float]] | None:
    """Vectors of ``texts`` by the EMBEDDER (None without one)."""
    function = embedder()
    if function is None or not texts:
        return None
    return [[float(x) for x in vector] for vector in function(texts)]


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=False))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else 0.0


def semantic(rows: QuerySet[LongTermMemory], query: str, limit: int) -> Ranked:
    """Cosine similarity of the query's vector to every stored vector of the owner."""
    vectors = embed([query]) if query.strip() else None
    if not vectors:
        return []
    target = vectors[0]
    scored = [
        (pk, _cosine(target, vector))
        for pk, vector in rows.filter(embedding__isnull=False).values_list("id", "embedding").iterator()
        if vector
    ]
    scored.sort(key=lambda item: -item[1])
    return scored[:limit]


def fuse(*rankings: Ranked) -> Ranked:
    """Reciprocal rank fusion: each id scores the sum of 1/(k + rank) over the lists."""
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, (pk, _score) in enumerate(ranking):
            scores[pk] = scores.get(pk, 0.0) + 1.0 / (RRF_K + rank + 1)
    return sorted(scores.items(), key=lambda item: -item[1])


def hybrid(rows: QuerySet[LongTermMemory], query: str, limit: int) -> Ranked:
    """Keyword fused with semantic (with an embedder) or with recency among the matches."""
    if not query_words(query):
        return recent(rows, limit)
    matches = keyword(rows, query, CANDIDATES)
    if embedder() is not None:
        return fuse(matches, semantic(rows, query, CANDIDATES))[:limit]
    # The matches are rows already: looked up by id alone (with the owner's filters again,
    # SQLite without table statistics walks every memory of the owner instead).
    by_recency = recent(LongTermMemory.objects.filter(id__in=[pk for pk, _ in matches]), CANDIDATES)
    return fuse(matches, by_recency)[:limit]


def rank(rows: QuerySet[LongTermMemory], query: str, strategy: str, limit: int) -> Ranked:
    """The strategy's ranking (candidates: the budget is applied by the service)."""
    if strategy == "recent":
        return recent(rows, limit)
    if strategy == "keyword":
        return keyword(rows, query, limit)
    if strategy == "semantic":
        return semantic(rows, query, limit)
    return hybrid(rows, query, limit)
