"""One owner's long-term memories: add (upsert by key), read, change, delete, search.

Every query starts from :meth:`MemoryService._rows`, which filters by the owner and
leaves out expired memories and superseded versions, so no method reads, finds or
changes another owner's. A write that replaces a memory's content keeps the old content
as a superseded version (MEMORY_KEEP_SUPERSEDED): a row of its own pointing at the memory
(``superseded_by``), true until ``valid_until``; the memory keeps its id. Only
:meth:`MemoryService.get` and the ``as_of`` reads see versions
(:meth:`MemoryService._versions`); which rows a read sees, and how a version is kept, is
:mod:`persistent_memory.memories.lifecycle`. Memories are dicts (see
:data:`persistent_memory.memories.records.FIELDS`) whose times are aware datetimes.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, NamedTuple

from django.db import IntegrityError, connections, router, transaction
from django.db.models import Count, F, Q, QuerySet, Sum
from django.utils import timezone

from persistent_memory.chat.tokens import text_counter
from persistent_memory.conf import memory_settings
from persistent_memory.exceptions import InvalidMemory, MemoryKeyExists, MemoryNotFound
from persistent_memory.memories import embedders, embedding_worker, message_search, records, search, vectors
from persistent_memory.memories.lifecycle import (
    as_of_filter,
    current_filter,
    expired_filter,
    said_filter,
    supersede,
)
from persistent_memory.models import LongTermMemory
from persistent_memory.owners import validate_owner
from persistent_memory.telemetry import instrument
from persistent_memory.validation import validate_int

#: The fields :meth:`MemoryService.update` may change.
UPDATABLE = (
    "content",
    "type",
    "key",
    "session_id",
    "metadata",
    "expires_at",
    "source",
    "source_messages",
    "said_at",
    "happened_at",
)
MAX_LIMIT = 1000


def memories_for(owner: str) -> MemoryService:
    """The memories of ``owner`` (``""``: the unowned namespace)."""
    return MemoryService(owner)


def _count_tokens(content: str) -> int:
    return text_counter(memory_settings.TOKENIZER)(content)


def _said_between(after: datetime | None, before: datetime | None) -> Q:
    """Memories said at or after ``after`` and before ``before`` (either may be None).
    Plain column conditions, so the search strategies' SQL takes them as it takes the
    owner's filters."""
    condition = Q()
    for bound, lookup in ((after, "gte"), (before, "lt")):
        if bound is not None:
            condition &= said_filter(lookup, bound)
    return condition


def _checked(
    content: Any,
    *,
    type_: Any,
    session_id: Any,
    metadata: Any,
    source: Any,
    source_messages: Any,
    said_at: Any,
    happened_at: Any,
    expires_at: Any = None,
) -> dict[str, Any]:
    """A memory's written fields, each checked (:class:`InvalidMemory` otherwise), and its tokens."""
    content = records.validate_content(content)
    return {
        "session_id": records.validate_memory_session(session_id),
        "type": records.validate_choice(type_, name="type", choices=records.TYPES),
        "content": content,
        "metadata": records.validate_metadata(metadata),
        "source": records.validate_choice(source, name="source", choices=records.SOURCES),
        "source_messages": records.validate_source_messages(source_messages),
        "expires_at": records.validate_expires_at(expires_at),
        "said_at": records.validate_said_at(said_at),
        "happened_at": records.validate_happened_at(happened_at),
        "tokens": _count_tokens(content),
    }


def _kept(row: LongTermMemory, fields: dict[str, Any]) -> bool:
    """Whether an extraction leaves ``row`` as it is: a memory of another source, or an
    extracted one said later than the new statement (so a re-run, or sessions read out of
    order, never put an older statement back)."""
    if fields["source"] != "extraction":
        return False
    if row.source != "extraction":
        return True
    said, held = fields["said_at"], row.said_at
    return said is not None and held is not None and said < held


def _types(types: Iterable[str] | None) -> list[str] | None:
    if types is None:
        return None
    if isinstance(types, str):
        types = [types]
    elif not isinstance(types, Iterable):
        raise InvalidMemory(f"Invalid types: must be a list of {', '.join(records.TYPES)}.")
    return [records.validate_choice(t, name="type", choices=records.TYPES) for t in types]


class SearchResults(NamedTuple):
    """What :meth:`MemoryService.search_results` found, and the strategy that ranked it."""

    results: list[dict[str, Any]]
    strategy: str


@instrument
class MemoryService:
    """The long-term memories of one owner."""

    def __init__(self, owner: str) -> None:
        self.owner = validate_owner(owner)

    def _rows(self) -> QuerySet[LongTermMemory]:
        return (
            LongTermMemory.objects.filter(owner=self.owner).filter(current_filter()).exclude(expired_filter())
        )

    def _versions(self) -> QuerySet[LongTermMemory]:
        """The owner's live memories and their superseded versions (an expired memory's go
        with it)."""
        return LongTermMemory.objects.filter(owner=self.owner).filter(
            current_filter() & ~expired_filter() | Q(superseded_by__in=self._rows().values("pk"))
        )

    def rows(self) -> QuerySet[LongTermMemory]:
        """The owner's live memories, for an integration that filters them further (the
        LangGraph store): never another owner's, never an expired one, never a superseded
        version."""
        return self._rows()

    def _row(self, memory_id: Any, *, versions: bool = False) -> LongTermMemory:
        # Out of the id column's range is no memory either (and no database error).
        if isinstance(memory_id, bool) or not isinstance(memory_id, int) or not 0 < memory_id < 2**63:
            raise MemoryNotFound(f"No memory {memory_id!r}.")
        try:
            return (self._versions() if versions else self._rows()).get(pk=memory_id)
        except LongTermMemory.DoesNotExist:
            raise MemoryNotFound(f"No memory {memory_id}.") from None

    def _filtered(
        self,
        *,
        types: Iterable[str] | None = None,
        session_id: str | None = None,
        source: str | None = None,
        as_of: datetime | None = None,
    ) -> QuerySet[LongTermMemory]:
        as_of = records.validate_moment(as_of, name="as_of")
        rows = self._rows() if as_of is None else self._versions().filter(as_of_filter(as_of))
        type_list = _types(types)
        if type_list is not None:
            rows = rows.filter(type__in=type_list)
        if session_id is not None:
            rows = rows.filter(session_id=records.validate_memory_session(session_id))
        if source is not None:
            rows = rows.filter(source=records.validate_choice(source, name="source", choices=records.SOURCES))
        return rows

    def add(
        self,
        content: str,
        *,
        type: str = "factual",  # noqa: A002 - the memory's field name
        key: str | None = None,
        session_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        source: str = "api",
        source_messages: Iterable[str] = (),
        expires_at: datetime | None = None,
        said_at: datetime | None = None,
        happened_at: datetime | None = None,
    ) -> dict[str, Any]:
        """Create the memory, or update the owner's memory with the same key (derived from
        type and content when None). An extraction never changes a memory of another
        source, nor an extracted one said later than it: that memory comes back unchanged.
        New content under a key keeps the old as a superseded version, true until the new
        ``said_at`` (else now)."""
        return self.upsert(
            content,
            type=type,
            key=key,
            session_id=session_id,
            metadata=metadata,
            source=source,
            source_messages=source_messages,
            expires_at=expires_at,
            said_at=said_at,
            happened_at=happened_at,
        )[0]

    def upsert(
        self,
        content: str,
        *,
        type: str = "factual",  # noqa: A002 - the memory's field name
        key: str | None = None,
        session_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        source: str = "api",
        source_messages: Iterable[str] = (),
        expires_at: datetime | None = None,
        said_at: datetime | None = None,
        happened_at: datetime | None = None,
    ) -> tuple[dict[str, Any], bool]:
        """:meth:`add`, and whether it changed anything (False: the memory was already so,
        or it was left as it was)."""
        fields = _checked(
            content,
            type_=type,
            session_id=session_id,
            metadata=metadata,
            source=source,
            source_messages=source_messages,
            expires_at=expires_at,
            said_at=said_at,
            happened_at=happened_at,
        )
        content, type_ = fields["content"], fields["type"]
        key_given = key is not None
        key = records.validate_memory_key(key) if key_given else records.derive_key(type_, content)
        # Embedded before the transaction (a network call holds no row lock), unless the
        # memory under the key already has this content's vector of the current model.
        known = (
            LongTermMemory.objects.filter(owner=self.owner, key=key)
            .filter(current_filter())
            .values_list("content", "embedding_model")
        )
        current, later = search.embedder(), False
        if current is not None and (content, current.model) not in set(known):
            found = _vector_of(content)
            fields.update(found or {})
            later = found is None
        duplicate = None if key_given else self._duplicate(fields, type_, key)
        for _attempt in range(2):  # a concurrent insert of the same key: update it instead
            try:
                with transaction.atomic():
                    written = self._merge(duplicate, fields) if duplicate is not None else None
                    if written is None:
                        written = self._upsert(key, fields)
            except IntegrityError:
                continue
            row, changed = written
            if later:
                _embed_later(row)
            return records.as_dict(row), changed
        raise InvalidMemory(f"Could not write memory {key!r}: it is being written concurrently.")

    def _duplicate(self, fields: dict[str, Any], type_: str, key: str) -> int | None:
        """The id of the owner's memory of this type (under another key) nearest the new
        one's vector within MEMORY_DEDUP_DISTANCE (None: none, no vector, or merging off)."""
        distance, vector = memory_settings.MEMORY_DEDUP_DISTANCE, fields.get("embedding")
        if distance is None or not vector:
            return None
        rows = self._rows().filter(type=type_).exclude(key=key)
        near = vectors.nearest(rows, search.compiled_where(rows), vector, fields["embedding_model"], 1)
        return near[0][0] if near and 1.0 - near[0][1] <= distance else None

    def _merge(self, memory_id: int, fields: dict[str, Any]) -> tuple[LongTermMemory, bool] | None:
        """Write the new memory's content, metadata (merged over the old) and vector into
        the near-duplicate ``memory_id``, keeping its key and what it said in its history;
        the row and whether it changed. None when that memory is gone meanwhile (the
        caller adds a row instead)."""
        row = self._rows().select_for_update().filter(pk=memory_id).first()
        if row is None:
            return None
        if _kept(row, fields):
            return row, False
        if row.content != fields["content"]:
            supersede(row, fields["said_at"] or timezone.now())
            row.history = records.with_history(row.history, row, "merged")
        row.metadata = {**row.metadata, **fields["metadata"]}
        for name in ("content", "tokens", *records.vector_fields(None, "")):
            if name in fields:
                setattr(row, name, fields[name])
        row.source_messages = list(dict.fromkeys([*row.source_messages, *fields["source_messages"]]))[-100:]
        row.said_at = fields["said_at"] or row.said_at
        row.happened_at = fields["happened_at"] or row.happened_at
        row.updated_at = timezone.now()
        row.save()
        return row, True

    def _upsert(self, key: str, fields: dict[str, Any]) -> tuple[LongTermMemory, bool]:
        now = timezone.now()
        row = (
            LongTermMemory.objects.select_for_update()
            .filter(owner=self.owner, key=key)
            .filter(current_filter())
            .first()
        )
        if row is None:
            row = LongTermMemory(owner=self.owner, key=key, created_at=now, **fields)
            content_changed = True
        else:
            gone = self._gone(row, now)
            if not gone and _kept(row, fields):
                return row, False
            if gone:  # an expired memory under the key: it starts afresh, without its versions
                row.created_at, row.access_count, row.last_accessed_at = now, 0, None
                row.superseded.all().delete()
            if not gone and all(getattr(row, name) == value for name, value in fields.items()):
                return row, False  # the same again (a re-run extraction): not even updated_at moves
            content_changed = row.content != fields["content"]
            if content_changed and not gone:
                supersede(row, fields["said_at"] or now)
            for name, value in fields.items():
                setattr(row, name, value)
        row.updated_at = now
        if content_changed and "embedding" not in fields:  # the embedder failed, or there is none
            for name, value in records.vector_fields(None, "").items():
                setattr(row, name, value)
        row.save()
        if row.embedding_dimensions:
            vectors.ensure_index(row.embedding_dimensions)
        return row, True

    @staticmethod
    def _gone(row: LongTermMemory, now: datetime) -> bool:
        return LongTermMemory.objects.filter(pk=row.pk).filter(expired_filter(now)).exists()

    def get(self, memory_id: int) -> dict[str, Any]:
        """One memory, or one superseded version of a memory (its ``superseded_by`` says
        which); :class:`MemoryNotFound` when the owner has none with this id."""
        return records.as_dict(self._row(memory_id, versions=True))

    def versions(self, memory_id: int) -> list[dict[str, Any]]:
        """The superseded versions of one memory, newest first (the one replaced last);
        :class:`MemoryNotFound` as ``get`` (a version has none)."""
        row = self._row(memory_id, versions=True)
        return [records.as_dict(version) for version in row.superseded.order_by("-valid_until", "-id")]

    def get_by_key(self, key: str) -> dict[str, Any] | None:
        """The owner's memory under ``key``, or None."""
        row = self._rows().filter(key=records.validate_memory_key(key)).first()
        return records.as_dict(row) if row else None

    def restore_versions(self, memory_id: int, versions: Iterable[dict[str, Any]]) -> int:
        """Add superseded versions to one memory, as :meth:`versions` gives them (the JSON
        Lines import): each checked as a write is (all before any is added), those the
        memory holds already (same content and ``valid_until``) left out; how many were
        added. Their times are kept; their vectors are not (they have none)."""
        row = self._row(memory_id)
        held = set(row.superseded.values_list("content", "valid_until"))
        fresh = []
        for version in versions:
            if not isinstance(version, dict):
                raise InvalidMemory("Invalid version: must be a JSON object.")
            until = records.validate_moment(version.get("valid_until"), name="valid_until")
            if until is None:
                raise InvalidMemory("Invalid valid_until: a superseded version needs one.")
            created = records.validate_moment(version.get("created_at"), name="created_at") or until
            updated = records.validate_moment(version.get("updated_at"), name="updated_at") or created
            fields = _checked(
                version.get("content"),
                type_=version.get("type", row.type),
                session_id=version.get("session_id"),
                metadata=version.get("metadata"),
                source=version.get("source", "import"),
                source_messages=version.get("source_messages"),
                said_at=version.get("said_at"),
                happened_at=version.get("happened_at"),
            )
            if (fields["content"], until) in held:
                continue
            held.add((fields["content"], until))
            fresh.append(
                LongTermMemory(
                    owner=self.owner,
                    key=records.validate_memory_key(version.get("key", row.key)),
                    superseded_by=row,
                    valid_until=until,
                    created_at=created,
                    updated_at=updated,
                    **fields,
                )
            )
        LongTermMemory.objects.bulk_create(fresh)
        return len(fresh)

    def list(
        self,
        *,
        types: Iterable[str] | None = None,
        session_id: str | None = None,
        source: str | None = None,
        limit: int = 50,
        offset: int = 0,
        as_of: datetime | None = None,
    ) -> tuple[int, list[dict[str, Any]]]:
        """``(count, page)`` of the owner's memories, newest update first; with ``as_of``,
        of what was true then (see
        :func:`~persistent_memory.memories.lifecycle.as_of_filter`): superseded versions too."""
        limit = validate_int(limit, name="limit", minimum=1)
        offset = validate_int(offset, name="offset", minimum=0)
        rows = self._filtered(types=types, session_id=session_id, source=source, as_of=as_of)
        page = rows.order_by("-updated_at", "-id")[offset : offset + min(limit, MAX_LIMIT)]
        return rows.count(), [records.as_dict(row) for row in page]

    def update(self, memory_id: int, **fields: Any) -> dict[str, Any]:
        """Change some fields of one memory (see :data:`UPDATABLE`): a correction, made in
        place (no superseded version is kept; adding under the key records a change)."""
        unknown = sorted(set(fields) - set(UPDATABLE))
        if unknown:
            raise InvalidMemory(f"Invalid fields: {', '.join(unknown)} cannot be changed.")
        checked: dict[str, Any] = {}
        if "content" in fields:
            checked["content"] = records.validate_content(fields["content"])
            checked["tokens"] = _count_tokens(checked["content"])
        if "type" in fields:
            checked["type"] = records.validate_choice(fields["type"], name="type", choices=records.TYPES)
        if "key" in fields:
            checked["key"] = records.validate_memory_key(fields["key"])
        if "session_id" in fields:
            checked["session_id"] = records.validate_memory_session(fields["session_id"])
        if "metadata" in fields:
            checked["metadata"] = records.validate_metadata(fields["metadata"])
        if "expires_at" in fields:
            checked["expires_at"] = records.validate_expires_at(fields["expires_at"])
        if "source" in fields:
            checked["source"] = records.validate_choice(
                fields["source"], name="source", choices=records.SOURCES
            )
        if "source_messages" in fields:
            checked["source_messages"] = records.validate_source_messages(fields["source_messages"])
        if "said_at" in fields:
            checked["said_at"] = records.validate_said_at(fields["said_at"])
        if "happened_at" in fields:
            checked["happened_at"] = records.validate_happened_at(fields["happened_at"])
        later = False
        if "content" in checked and search.embedder() is not None:
            found = _vector_of(checked["content"])  # before the row lock, as in add
            checked.update(found or {})
            later = found is None
        with transaction.atomic():
            row = self._row(memory_id)
            new_key = checked.get("key", row.key)
            taken = LongTermMemory.objects.filter(owner=self.owner, key=new_key).filter(current_filter())
            if new_key != row.key and taken.exists():
                raise MemoryKeyExists(f"Another memory has the key {new_key!r}.")
            if "content" in checked and checked["content"] == row.content:
                for name in records.vector_fields(None, ""):
                    checked.pop(name, None)  # its vector stands
            elif "content" in checked and "embedding" not in checked:
                checked.update(records.vector_fields(None, ""))
            for name, value in checked.items():
                setattr(row, name, value)
            row.updated_at = timezone.now()
            row.save()
            if checked.get("embedding_dimensions"):
                vectors.ensure_index(checked["embedding_dimensions"])
        if later:
            _embed_later(row)
        return records.as_dict(row)

    def delete(self, memory_id: int) -> None:
        """Delete one memory and its superseded versions; :class:`MemoryNotFound` when the
        owner has none with this id (a superseded version is deleted with its memory only)."""
        deleted, _ = self._rows().filter(pk=self._row(memory_id).pk).delete()
        if not deleted:
            raise MemoryNotFound(f"No memory {memory_id}.")

    def delete_all(self) -> int:
        """Delete every memory of the owner, expired ones and superseded versions too; the
        number of rows deleted."""
        deleted, _ = LongTermMemory.objects.filter(owner=self.owner).delete()
        return deleted

    def stats(self) -> dict[str, Any]:
        """Counts and tokens, in all and by type and by source."""
        rows = self._rows()
        by_type = {t: {"count": 0, "tokens": 0} for t in records.TYPES}
        for row in rows.values("type").annotate(count=Count("id"), tokens=Sum("tokens")):
            by_type[row["type"]] = {"count": row["count"], "tokens": row["tokens"] or 0}
        by_source = {s: 0 for s in records.SOURCES}
        for row in rows.values("source").annotate(count=Count("id")):
            by_source[row["source"]] = row["count"]
        return {
            "count": sum(item["count"] for item in by_type.values()),
            "tokens": sum(item["tokens"] for item in by_type.values()),
            "by_type": by_type,
            "by_source": by_source,
        }

    def similar(self, memory_id: int, *, limit: int = 10) -> list[dict[str, Any]]:
        """The owner's memories whose vectors are nearest this memory's, best first, each
        with its ``score`` (cosine similarity); none when the memory has no vector of the
        current model (not embedded yet, no embedder). :class:`MemoryNotFound` as ``get``."""
        limit = min(validate_int(limit, name="limit", minimum=1), MAX_LIMIT)
        row = self._row(memory_id)
        current = search.embedder()
        if current is None or not row.embedding or row.embedding_model != current.model:
            return []
        others = self._rows().exclude(pk=row.pk)
        near = vectors.nearest(others, search.compiled_where(others), row.embedding, current.model, limit)
        by_id = {other.pk: other for other in LongTermMemory.objects.filter(pk__in=[pk for pk, _ in near])}
        return [
            {
                **records.as_dict(by_id[pk]),
                "score": round(score, 6),
                "score_parts": {"semantic": round(score, 6)},
            }
            for pk, score in near
            if pk in by_id and by_id[pk].owner == self.owner
        ]

    def search(
        self,
        query: str,
        *,
        strategy: str = "hybrid",
        types: Iterable[str] | None = None,
        session_id: str | None = None,
        limit: int = 10,
        max_tokens: int | None = None,
        said_after: datetime | None = None,
        said_before: datetime | None = None,
        as_of: datetime | None = None,
        kinds: Iterable[str] | None = None,
        exclude_session_id: str | None = None,
    ) -> list[dict[str, Any]]:
        """The owner's memories, and what was said in their conversations, matching
        ``query``, best first, each with its ``kind`` ("memory" or "message") and ``score``.

        ``kinds``: what to look through (default MEMORY_SEARCH_KINDS; with ``types``,
        memories of those types only). At most ``limit``; with ``max_tokens``, accepted
        in order while their tokens add up within it, but at least one when anything
        matched. A message and a memory that came from it are found once, as the memory
        (at the better place of the two). Found memories count an access.
        ``said_after`` / ``said_before``: only what was said at or after / before that
        moment (a memory's ``said_at``, or ``created_at`` where it is unknown; a
        message's time). A message found carries
        its ``session_id``, ``conversation``, ``role``, ``name`` and ``said_at`` (see
        :mod:`persistent_memory.memories.message_search`); ``exclude_session_id``: not
        the messages of that session (the one a prompt already holds).
        ``as_of``: what was true at that moment (see
        :func:`~persistent_memory.memories.lifecycle.as_of_filter`), superseded versions of
        memories included, and the messages said by then.
        """
        return self.search_results(
            query,
            strategy=strategy,
            types=types,
            session_id=session_id,
            limit=limit,
            max_tokens=max_tokens,
            said_after=said_after,
            said_before=said_before,
            as_of=as_of,
            kinds=kinds,
            exclude_session_id=exclude_session_id,
        ).results

    def search_results(
        self,
        query: str,
        *,
        strategy: str = "hybrid",
        types: Iterable[str] | None = None,
        session_id: str | None = None,
        limit: int = 10,
        max_tokens: int | None = None,
        said_after: datetime | None = None,
        said_before: datetime | None = None,
        as_of: datetime | None = None,
        kinds: Iterable[str] | None = None,
        exclude_session_id: str | None = None,
    ) -> SearchResults:
        """:meth:`search`'s results and the strategy that ranked them: the one asked for,
        or ``"keyword"`` when a semantic or hybrid search had no query vector in time
        (see :func:`persistent_memory.memories.search.rank`)."""
        if not isinstance(query, str):
            raise InvalidMemory("Invalid query: must be a string.")
        if len(query) > memory_settings.MEMORY_MAX_CONTENT_CHARS:
            raise InvalidMemory("Invalid query: longer than MEMORY_MAX_CONTENT_CHARS.")
        strategy = records.validate_choice(strategy, name="strategy", choices=search.STRATEGIES)
        if strategy == "semantic" and search.embedder() is None:
            raise InvalidMemory("Invalid strategy 'semantic': no EMBEDDER is configured.")
        limit = min(validate_int(limit, name="limit", minimum=1), MAX_LIMIT)
        if max_tokens is not None:
            max_tokens = validate_int(max_tokens, name="max_tokens", minimum=0)
        kinds = _kinds(kinds, types)
        after = records.validate_moment(said_after, name="said_after")
        before = records.validate_moment(said_before, name="said_before")
        as_of = records.validate_moment(as_of, name="as_of")
        if exclude_session_id is not None:
            exclude_session_id = records.validate_memory_session(exclude_session_id)
        rows = self._filtered(types=types, session_id=session_id, as_of=as_of)
        rows = rows.filter(_said_between(after, before))
        messages = None
        if search.MESSAGE in kinds:
            messages = message_search.rows(
                self.owner,
                session_id=None if session_id is None else records.validate_memory_session(session_id),
                said_after=after,
                said_before=before,
            )
            if as_of is not None:  # what had been said by then
                messages = messages.filter(created_at__lte=as_of)
            if exclude_session_id is not None:
                messages = messages.exclude(conversation__session__session_id=exclude_session_id)
            message_search.catch_up(self.owner)
        # Both kinds: twice the results, for those a memory and the message it came from share.
        candidates = max(limit, search.CANDIDATES if max_tokens else limit * len(kinds))
        ranked, ranked_by = search.rank(
            rows if search.MEMORY in kinds else None, query, strategy, candidates, messages
        )
        ranked = _distinct(ranked)
        # Every strategy ranks the owner's rows, so the ids are the owner's: they are looked
        # up by id alone (with the owner's filters again, SQLite without table statistics
        # walks every memory of the owner). With a budget, the candidates' tokens first:
        # only what is accepted is read whole.
        accepted = ranked[:limit]
        if max_tokens is not None:
            tokens = _tokens(ranked)
            accepted, used = [], 0
            for hit in ranked:
                if (hit.kind, hit.id) not in tokens:
                    continue
                cost = tokens[hit.kind, hit.id]
                if len(accepted) >= limit or (accepted and used + cost > max_tokens):
                    break
                used += cost
                accepted.append(hit)
        memory_rows = {
            row.pk: row
            for row in LongTermMemory.objects.filter(
                pk__in=[hit.id for hit in accepted if hit.kind == search.MEMORY]
            ).order_by()
            if row.owner == self.owner
        }
        said = message_search.as_dicts([hit.id for hit in accepted if hit.kind == search.MESSAGE])
        found = []
        for hit in accepted:
            if hit.kind == search.MEMORY and hit.id in memory_rows:
                item = {"kind": search.MEMORY, **records.as_dict(memory_rows[hit.id])}
            elif hit.kind == search.MESSAGE and said.get(hit.id, {}).get("owner") == self.owner:
                item = said[hit.id]
            else:
                continue
            found.append({**item, "score": round(hit.score, 6), "score_parts": hit.parts})
        counted = [item for item in found if item["kind"] == search.MEMORY]
        if counted:
            now = timezone.now()
            _count_access([m["id"] for m in counted], now)
            for memory in counted:
                memory["access_count"] += 1
                memory["last_accessed_at"] = now
        return SearchResults(found, ranked_by)


def _kinds(kinds: Iterable[str] | None, types: Iterable[str] | None) -> set[str]:
    """What a search looks through: ``kinds``, else memories alone when ``types`` narrows
    them, else MEMORY_SEARCH_KINDS."""
    if kinds is None:
        kinds = [search.MEMORY] if types is not None else memory_settings.MEMORY_SEARCH_KINDS
    elif isinstance(kinds, str):
        kinds = [kinds]
    elif not isinstance(kinds, Iterable):
        raise InvalidMemory("Invalid kinds: must be a list of memory, message.")
    chosen = {records.validate_choice(kind, name="kind", choices=search.KINDS) for kind in kinds}
    if not chosen:
        raise InvalidMemory("Invalid kinds: name at least one of memory, message.")
    return chosen


def _distinct(hits: list[search.Hit]) -> list[search.Hit]:
    """``hits`` where a memory and a message it came from (its ``source_messages`` names
    the message's id) are both found: the memory alone, at the better place of the two
    (the same thing said twice; the memory says it as a fact)."""
    from persistent_memory.models import MemoryMessage

    ids = {kind: [hit.id for hit in hits if hit.kind == kind] for kind in search.KINDS}
    if not ids[search.MEMORY] or not ids[search.MESSAGE]:
        return hits
    memories = {hit.id: hit for hit in hits if hit.kind == search.MEMORY}
    made_of: dict[str, int] = {}  # message id -> the first memory found that came from it
    for pk, sources in LongTermMemory.objects.filter(pk__in=ids[search.MEMORY]).values_list(
        "id", "source_messages"
    ):
        for message_id in sources or ():
            made_of.setdefault(message_id, pk)
    said = dict(MemoryMessage.objects.filter(pk__in=ids[search.MESSAGE]).values_list("id", "message_id"))
    kept: list[search.Hit] = []
    placed: set[int] = set()
    for hit in hits:
        memory = hit.id if hit.kind == search.MEMORY else made_of.get(said.get(hit.id, ""))
        if memory is None:
            kept.append(hit)  # a message no memory found came from
        elif memory not in placed:
            placed.add(memory)
            kept.append(memories[memory])
    return kept


def _tokens(hits: list[search.Hit]) -> dict[tuple[str, int], int]:
    """The tokens of each hit, by (kind, id)."""
    from persistent_memory.models import MemoryMessage

    tokens: dict[tuple[str, int], int] = {}
    for kind, model in ((search.MEMORY, LongTermMemory), (search.MESSAGE, MemoryMessage)):
        ids = [hit.id for hit in hits if hit.kind == kind]
        if ids:
            found = model.objects.filter(pk__in=ids).order_by().values_list("id", "tokens")
            tokens.update(((kind, pk), count) for pk, count in found)
    return tokens


def _vector_of(content: str) -> dict[str, Any] | None:
    """The content's vector fields; ``{}`` when the embedder's vector was refused (the
    memory is written without one: asking again gives the same), None when none came
    within the request's bound (written without one, then embedded in the background:
    see :func:`_embed_later`)."""
    current = search.embedder()
    found = embedders.request_vectors([content]) if current is not None else None
    if not found or current is None:
        return None
    vector = embedders.checked(found, current.model)[0]
    return records.vector_fields(vector, current.model) if vector else {}


def _embed_later(row: LongTermMemory) -> None:
    """Queue ``row`` for the background embedding worker (its write got no vector in
    time) unless it has a vector of the current model meanwhile (a merge kept one)."""
    current = search.embedder()
    if current is not None and (row.embedding is None or row.embedding_model != current.model):
        embedding_worker.embed_later(row.pk)


def _count_access(pks: list[int], now: datetime) -> None:
    """One more access for each memory of ``pks``. The counts are bookkeeping: on
    PostgreSQL their commit does not wait for the write-ahead log's flush (synchronous_commit
    off for this transaction alone), which was most of what a search that found something
    cost (0.5 to 7 ms, bench/memories_bench.py). A database crash can lose the last
    counts, never a memory. Inside a caller's transaction the setting would be theirs
    too, so there the update just joins it."""
    rows = LongTermMemory.objects.filter(pk__in=pks)
    connection = connections[router.db_for_write(LongTermMemory)]
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        rows.update(access_count=F("access_count") + 1, last_accessed_at=now)
        return
    with transaction.atomic(using=connection.alias):
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL synchronous_commit TO OFF")
        rows.update(access_count=F("access_count") + 1, last_accessed_at=now)
