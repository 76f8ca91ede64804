"""Search strategies over one owner's memories and (see
:mod:`persistent_memory.memories.message_search`) what was said in their conversations:
each ranks :class:`Hit` s of both kinds in one list, best first.

* ``recent``: newest first, a memory by its last update, a message by when it was said
  (score 1/(1+rank)).
* ``keyword``: full text of the content and the key (the key's parts, split on ``.``,
  ``_`` and ``-``, count half as much as the content's words: ``ui.theme`` is found by
  "theme"). PostgreSQL: ``to_tsvector('english', ...)`` of both (stored in
  ``search_tsv`` with a GIN index, migrations 0010 and 0011) matched by any of the
  query's words, ranked by ``ts_rank``. SQLite: the FTS5 table of migrations 0009 and
  0011, ranked by BM25. Other databases (or SQLite without FTS5): ``icontains`` per
  word, scored by words matched. Memories and messages are ranked by those scores in
  one list, given relative to the best match's (1).
* ``semantic``: with an ``EMBEDDER``, the vectors nearest the query's, compared where
  :mod:`persistent_memory.memories.vectors` says (pgvector, sqlite-vec or numpy); when
  no query vector comes within EMBEDDER_REQUEST_TIMEOUT (or the embedder's circuit is
  open, or its vector has no direction), keyword instead, and :class:`Ranking` says so.
* ``hybrid``: with an embedder that answers, semantic's scores scaled to 0..1 (min-max)
  weigh ``MEMORY_HYBRID_ALPHA``, and each keyword match adds ``1 - MEMORY_HYBRID_ALPHA``
  times the share of the question's information it holds (:func:`fuse`: the question's
  words weighed by their rarity among the texts both lists found, so a speaker's name,
  in half of a conversation's turns, weighs little). Reciprocal rank fusion let any
  memory sharing a word with the question outrank the one that answered it in other
  words (recall@5 0.76 against 0.90 on bench/semantic_bench.py's set). The keyword part
  counts only when the matches together hold at least half of the question's
  information (:data:`REACH`): when most of what a question asks is in no text that
  shares a word with it, it is worded unlike what was said (a paraphrase), its matches
  are on incidental words, and meaning alone ranks. Without an embedder, keyword's own
  ranking, recency breaking only its ties (a newer memory never outranks a better
  match; unrelated recent memories are not brought in). Each fused score is then
  weighed by use (MEMORY_HALF_LIFE_DAYS, MEMORY_ACCESS_WEIGHT). A hit's ``parts`` say
  what it scored: ``keyword`` and ``semantic`` (None: not found that way),
  ``relevance`` (the fusion), ``recency`` and ``frequency``.
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from functools import lru_cache
from typing import Any, NamedTuple, TypeVar

from django.core.exceptions import EmptyResultSet, FullResultSet
from django.db import DatabaseError, connection
from django.db.models import Q, QuerySet
from django.utils import timezone

from persistent_memory.conf import memory_settings
from persistent_memory.memories import embedders, fulltext, message_search
from persistent_memory.memories import vectors as _vectors
from persistent_memory.memories.embedders import Embedder
from persistent_memory.models import LongTermMemory

STRATEGIES = ("recent", "keyword", "semantic", "hybrid")
#: How many keyword candidates a search considers before fusion and the token budget.
CANDIDATES = 200
#: The share of a question's information (see :func:`fuse`) that hybrid search's keyword
#: matches must hold together to count: less, and the question is worded unlike what
#: was said, its matches on incidental words.
REACH = 0.5
_WORDS = re.compile(r"\w+", re.UNICODE)
#: Weights of ts_rank, in its order {D, C, B, A}: the content's lexemes carry the
#: default D, the key's C at half of that (migration 0011).
_TS_WEIGHTS = "{0.1, 0.05, 0.4, 1.0}"
#: BM25 weights of the FTS5 columns (content, key): the key counts half, as above.
_BM25_WEIGHTS = "1.0, 0.5"
_TABLE = LongTermMemory._meta.db_table

Ranked = list[tuple[int, float]]
_T = TypeVar("_T")


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
    """The query's words (letters, digits, _) but stop words and single letters,
    deduplicated, at most 32. A single letter is mostly what a possessive or a
    contraction leaves ("Grace's": "grace" and "s"), and matched every "that's"."""
    seen: dict[str, None] = {}
    for word in _WORDS.findall(query.casefold()):
        if word not in STOP_WORDS and (len(word) > 1 or word.isdigit()):
            seen.setdefault(word, None)
    return list(seen)[:32]


def _where(rows: QuerySet[LongTermMemory]) -> tuple[str, list[Any]]:
    """The queryset's WHERE (owner, types, session, expiry), compiled by Django, for a
    query on the memories table itself. Inline, not as ``id IN (subquery)``: that made
    the database list every memory of the owner on each search (at 100,000 memories,
    60 to 90 ms whatever the query matched). Raises ``EmptyResultSet`` when it matches
    nothing."""
    # A join's columns would not resolve in the raw SQL (a join Django set up for a foreign
    # key's own column, ``superseded_by__isnull``, then trimmed, is none: it has no references).
    if sum(1 for alias in rows.query.alias_map if rows.query.alias_refcount[alias]) > 1:
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


def _relative(ranked: list[tuple[_T, float]]) -> list[tuple[_T, float]]:
    """Scores as fractions of the best one (1 for the best match): the databases' own
    ranks mean little to a reader (SQLite's BM25 gives ``2e-06`` in a small collection,
    where every word is in half the memories) and differ between databases. The order,
    and the fusions (by rank, or scaled to 0..1), are the same."""
    best = max((score for _, score in ranked), default=0.0)
    return [(pk, score / best) for pk, score in ranked] if best > 0 else ranked


def _keyword(rows: QuerySet[LongTermMemory], query: str, limit: int) -> Ranked:
    words = query_words(query)
    if not words:
        return []
    try:
        if connection.vendor == "postgresql":
            return _postgresql(rows, words, limit)
        if connection.vendor == "sqlite" and fulltext.fts_ready():
            try:
                return _sqlite(rows, words, limit)
            except DatabaseError:  # a query FTS5 cannot parse: fall back, never fail
                pass
    except EmptyResultSet:  # filters nothing can pass (no types): no query needed
        return []
    return _icontains(rows, words, limit)


def embedder() -> Embedder | None:
    """The configured EMBEDDER, or None."""
    return embedders.current()


def compiled_where(rows: QuerySet[LongTermMemory]) -> tuple[str, list[Any]] | None:
    try:
        return _where(rows)
    except EmptyResultSet:
        return None


def query_vector(query: str) -> tuple[list[float], str] | None:
    """The query's vector and its model, within the request's bound (see
    :func:`~persistent_memory.memories.embedders.request_vectors`); None without an
    embedder, while it is failing, or when its vector is refused (no direction, or not
    the model's length: there is nothing to compare it with)."""
    current = embedder()
    if current is None or not query.strip():
        return None
    found = embedders.request_vectors([query])
    vector = embedders.checked(found, current.model)[0] if found else None
    return (vector, current.model) if vector else None


def _normalized(ranking: Scored) -> dict[Key, float]:
    """Scores scaled to 0..1 over the list (min-max): 1 for a list of one."""
    if not ranking:
        return {}
    low, high = min(score for _, score in ranking), max(score for _, score in ranking)
    return {key: (score - low) / (high - low) if high > low else 1.0 for key, score in ranking}


MEMORY, MESSAGE = "memory", "message"
KINDS = (MEMORY, MESSAGE)
#: A candidate of either kind: ``(kind, row id)``.
Key = tuple[str, int]
Scored = list[tuple[Key, float]]


class Hit(NamedTuple):
    """One found memory or message: its row id, its score (higher is better), the
    score's parts, and its kind."""

    id: int
    score: float
    parts: dict[str, float | None]
    kind: str = MEMORY


def _tagged(kind: str, ranked: Ranked) -> Scored:
    return [((kind, pk), score) for pk, score in ranked]


def _best_first(scored: Scored, limit: int) -> Scored:
    return sorted(scored, key=lambda item: -item[1])[:limit]  # stable: memories first among equals


class Pool(NamedTuple):
    """What one search looks through: the owner's memories and (None: not searched) messages."""

    memories: QuerySet[LongTermMemory] | None
    messages: QuerySet[Any] | None = None

    def recent(self, limit: int) -> Scored:
        """Newest first: a memory by its last update, a message by when it was said."""
        dated: list[tuple[Key, datetime]] = []
        for kind, rows, moment in (
            (MEMORY, self.memories, "updated_at"),
            (MESSAGE, self.messages, "created_at"),
        ):
            if rows is not None:
                found = rows.order_by(f"-{moment}", "-id").values_list("id", moment)[:limit]
                dated += [((kind, pk), at) for pk, at in found]
        dated.sort(key=lambda item: item[1], reverse=True)
        return [(key, 1.0 / (1 + place)) for place, (key, _) in enumerate(dated[:limit])]

    def keyword(self, query: str, limit: int) -> Scored:
        """Full-text matches of either kind, by the database's own scores, relative to the best."""
        scored: Scored = []
        if self.memories is not None:
            scored += _tagged(MEMORY, _keyword(self.memories, query, limit))
        if self.messages is not None:
            scored += _tagged(MESSAGE, message_search.keyword(self.messages, query_words(query), limit))
        return _relative(_best_first(scored, limit))

    def semantic(self, query: str, limit: int) -> Scored | None:
        """Nearest by meaning, of either kind (messages where they have vectors); None
        without a query vector (see :func:`query_vector`)."""
        found = query_vector(query)
        if found is None:
            return None
        scored: Scored = []
        if self.memories is not None:
            near = _vectors.nearest(self.memories, compiled_where(self.memories), *found, limit)
            scored += _tagged(MEMORY, near)
        if self.messages is not None and message_search.embeds_messages():
            scored += _tagged(MESSAGE, message_search.semantic(self.messages, *found, limit))
        return _best_first(scored, limit)


@lru_cache(maxsize=256)
def _start(word: str) -> re.Pattern[str]:
    """Where a text holds ``word``: the word, or for a word of five letters or more its
    first letters but the last three (at least four), at the start of one of the text's
    words ("adopting" is held by "adopted", as the databases' stemming would find it)."""
    stem = word if len(word) < 5 else word[: max(4, len(word) - 3)]
    return re.compile(r"(?<!\w)" + re.escape(stem))


def held_words(words: list[str], text: str) -> set[str]:
    """Which of ``words`` (:func:`query_words`) ``text`` holds (see :func:`_start`)."""
    folded = text.casefold()
    return {word for word in words if _start(word).search(folded)}


def coverage(query: str, text: str) -> float:
    """The share of the query's words (:func:`query_words`) that ``text`` holds (see
    :func:`held_words`)."""
    words = query_words(query)
    return len(held_words(words, text)) / len(words) if words else 0.0


def word_weights(words: list[str], held: list[set[str]]) -> dict[str, float]:
    """How much each word tells among texts that hold the ``held`` words: its BM25 IDF,
    ln(1 + (n - df + 0.5) / (df + 0.5)) for df texts of n. A speaker's name, in half of
    a conversation's turns, weighs about a seventh of a word no text holds."""
    n = len(held)
    return {
        word: math.log(1 + (n - df + 0.5) / (df + 0.5))
        for word, df in ((word, sum(word in found for found in held)) for word in words)
    }


def fuse(matches: Scored, near: Scored, words: list[str], texts: dict[Key, str], alpha: float) -> Scored:
    """Hybrid's fusion, best first: ``alpha`` times the semantic scores scaled to 0..1,
    plus for each keyword match ``1 - alpha`` times the share of the question's
    information (``words`` weighed by :func:`word_weights` among ``texts``, what both
    lists found) that it holds; the keyword part only when the matches together hold at
    least :data:`REACH` of it."""
    held = {key: held_words(words, text) for key, text in texts.items()}
    weights = word_weights(words, list(held.values()))
    total = sum(weights.values())

    def share(found: set[str]) -> float:
        return sum(weights[word] for word in found) / total

    scores = {key: alpha * score for key, score in _normalized(near).items()}
    matched = [key for key, _ in matches if key in held]
    if matched and share(set().union(*(held[key] for key in matched))) >= REACH:
        for key in matched:
            scores[key] = scores.get(key, 0.0) + (1 - alpha) * share(held[key])
    return sorted(scores.items(), key=lambda item: -item[1])


def _texts(keys: set[Key]) -> dict[Key, str]:
    """What keyword search reads of each candidate: a memory's content and key, a
    message's text and speaker's name."""
    from persistent_memory.models import MemoryMessage

    found: dict[Key, str] = {}
    for kind, model, fields in (
        (MEMORY, LongTermMemory, ("content", "key")),
        (MESSAGE, MemoryMessage, ("content_text", "name")),
    ):
        ids = [pk for of, pk in keys if of == kind]
        if ids:
            for pk, *text in model.objects.filter(pk__in=ids).order_by().values_list("id", *fields):
                found[kind, pk] = " ".join(text).replace(".", " ").replace("_", " ")
    return found


def _hits(ranked: Scored, name: str) -> list[Hit]:
    return [Hit(pk, score, {name: round(score, 6)}, kind) for (kind, pk), score in ranked]


def _usage(fused: Scored, parts: dict[Key, dict[str, float | None]], limit: int) -> list[Hit]:
    """``fused`` with each score times its recency decay (MEMORY_HALF_LIFE_DAYS, from a
    memory's last update or access, a message's time) and a memory's access weight
    (MEMORY_ACCESS_WEIGHT), best first."""
    from persistent_memory.models import MemoryMessage

    half_life, weight = memory_settings.MEMORY_HALF_LIFE_DAYS, memory_settings.MEMORY_ACCESS_WEIGHT
    usage: dict[Key, tuple[datetime, datetime | None, int]] = {}
    if half_life or weight:
        ids = {kind: [pk for (of, pk), _ in fused if of == kind] for kind in (MEMORY, MESSAGE)}
        usage = {
            (MEMORY, pk): (updated, accessed, count)
            for pk, updated, accessed, count in LongTermMemory.objects.filter(pk__in=ids[MEMORY])
            .order_by()
            .values_list("id", "updated_at", "last_accessed_at", "access_count")
        }
        if half_life and ids[MESSAGE]:
            usage.update(
                ((MESSAGE, pk), (said, None, 0))
                for pk, said in MemoryMessage.objects.filter(pk__in=ids[MESSAGE])
                .order_by()
                .values_list("id", "created_at")
            )
    now = timezone.now()
    hits = []
    for key, relevance in fused:
        recency, frequency = 1.0, 1.0
        if key in usage:
            updated, accessed, count = usage[key]
            if half_life:
                days = max(0.0, (now - max(updated, accessed or updated)).total_seconds() / 86400)
                recency = 0.5 ** (days / half_life)
            frequency = 1.0 + weight * math.log1p(count)
        hits.append(
            Hit(
                key[1],
                relevance * recency * frequency,
                {
                    **parts.get(key, {}),
                    "relevance": round(relevance, 6),
                    "recency": round(recency, 6),
                    "frequency": round(frequency, 6),
                },
                key[0],
            )
        )
    hits.sort(key=lambda hit: -hit.score)
    return hits[:limit]


class Ranking(NamedTuple):
    """A search's hits and the strategy that ranked them: the one asked for, or
    ``"keyword"`` when the semantic part had no query vector (``"recent"`` for hybrid
    without an embedder and with no words to match)."""

    hits: list[Hit]
    strategy: str


def hybrid(pool: Pool, query: str, limit: int) -> Ranking:
    """Keyword fused with semantic (with an embedder that answers) or with recency among
    the matches, then weighed by use; each hit's parts say what it scored in each list."""
    if not query.strip() or (not query_words(query) and embedder() is None):
        return Ranking(_hits(pool.recent(limit), "recent"), "recent")
    matches = pool.keyword(query, CANDIDATES) if query_words(query) else []
    near = pool.semantic(query, CANDIDATES) if embedder() is not None else None
    parts: dict[Key, dict[str, float | None]] = {}
    for name, ranking in (("keyword", matches), ("semantic", near or [])):
        for key, score in ranking:
            parts.setdefault(key, {"keyword": None, "semantic": None})[name] = round(score, 6)
    if near is not None:
        # Each match adds what it holds of the question's information, and only when the
        # matches hold at least half of it: a paraphrased question's matches are on its
        # incidental words (a speaker's name, in half the turns; a common verb), and
        # weighed in they outranked the answer found by meaning (recall@5 0.60-0.66
        # against semantic's 0.68; bench/results/2026-11-29-recall-paraphrase.md).
        texts = _texts({key for key, _ in matches} | {key for key, _ in near})
        fused = fuse(matches, near, query_words(query), texts, memory_settings.MEMORY_HYBRID_ALPHA)
        return Ranking(_usage(fused, parts, limit), "hybrid")
    # Keyword's order, recency breaking its ties only: fused with equal weight, the newest
    # memories naming a speaker outranked the one that answered (recall@5 0.18 against
    # keyword's 0.53 on real conversations). The matches are rows already: looked up by id
    # alone (with the owner's filters again, SQLite without table statistics walks every
    # memory of the owner instead).
    from persistent_memory.models import MemoryMessage

    ids = {kind: [pk for (of, pk), _ in matches if of == kind] for kind in (MEMORY, MESSAGE)}
    newest = Pool(
        LongTermMemory.objects.filter(id__in=ids[MEMORY]),
        MemoryMessage.objects.filter(id__in=ids[MESSAGE]) if ids[MESSAGE] else None,
    ).recent(CANDIDATES)
    place = {key: place for place, (key, _) in enumerate(newest)}
    ordered = sorted(matches, key=lambda match: (-match[1], place.get(match[0], len(place))))
    return Ranking(_usage(ordered, parts, limit), "keyword")


def rank(
    rows: QuerySet[LongTermMemory] | None,
    query: str,
    strategy: str,
    limit: int,
    messages: QuerySet[Any] | None = None,
) -> Ranking:
    """The strategy's hits among the memories ``rows`` and the messages ``messages``
    (either None: not searched) and the strategy that ranked them: "semantic" and
    "hybrid" answer by keyword when there is no query vector (the embedder does not answer
    in time, or its circuit is open)."""
    pool = Pool(rows, messages)
    if strategy == "recent":
        return Ranking(_hits(pool.recent(limit), "recent"), "recent")
    if strategy == "keyword":
        return Ranking(_hits(pool.keyword(query, limit), "keyword"), "keyword")
    if strategy == "semantic":
        near = pool.semantic(query, limit)
        if near is not None:
            return Ranking(_hits(near, "semantic"), "semantic")
        return Ranking(_hits(pool.keyword(query, limit), "keyword"), "keyword")
    return hybrid(pool, query, limit)
