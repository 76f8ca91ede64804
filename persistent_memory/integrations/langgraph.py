"""LangGraph's long-term memory store (``BaseStore``) over this app's long-term memories,
and its checkpointer, :class:`PersistentMemorySaver` (see
:mod:`persistent_memory.integrations.langgraph_saver`).

``PersistentMemoryStore.for_owner(owner)`` gives a LangGraph agent the owner's memories:
what it puts is a memory of that owner (in the admin, the REST API, the MCP tools, the
enrich lane's injection, export and forget-an-owner), and what it searches is found by
the app's own search (keyword, hybrid, semantic with an ``EMBEDDER``).

How an item maps onto a memory (the extra ``langgraph`` installs LangGraph):

- **Owner**: the store's, fixed when it is made; one owner's store never reads another's.
- **Key**: ``lg.<label>.<label>.<key>`` when every label and the key are made of letters,
  digits, ``-`` and ``_`` (LangGraph forbids ``.`` in labels, so this is unambiguous) and
  it fits in 256 characters; otherwise ``lgh.<digest>`` of the namespace and key.
- **Type**: the first label of the namespace that is a memory type (``factual``,
  ``episodic``, ``procedural``, ``semantic``), else ``semantic``.
- **Content** (what search reads and injection shows): the text of the value's indexed
  fields (``index=[...]`` on put, or the store's ``index_fields``; by default every field),
  cut to ``MEMORY_MAX_CONTENT_CHARS``; with ``index=False`` the item's key.
- **Metadata**: ``{"langgraph": {"namespace": [...], "key": ..., "ttl": minutes},
  "value": {...}}``; the value comes back from it whole.
- **TTL**: ``put(..., ttl=minutes)`` sets the memory's ``expires_at``; reads refresh it
  (``refresh_ttl``, default on); ``memory_sweep`` deletes what expired.

What was said is there too, read-only, under the root label ``conversations`` (the
store's ``conversations``; None turns it off): each of the owner's messages (see
:mod:`persistent_memory.memories.message_search`) is an item of namespace
``("conversations", session_id, conversation)``, its key the message id, its value
``{"role", "name", "content", "said_at"}`` (ISO 8601). ``search`` under that root ranks
messages alone by the same search, ``get`` and ``list_namespaces`` read them, ``put`` and
``delete`` there raise LangGraph's ``InvalidNamespaceError``. Memory items never come
under that root, and messages never come under any other (``search(())`` is memories).
Conversations whose name holds a ``.`` (which LangGraph forbids in labels) are left out.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import math
import operator
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import nullcontext
from datetime import datetime, timedelta
from typing import Any

from django.db import close_old_connections, router, transaction
from django.db.models import QuerySet
from django.utils import timezone
from langgraph.store.base import (
    BaseStore,
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
)
from langgraph.store.base.embed import tokenize_path

from persistent_memory.conf import memory_settings
from persistent_memory.integrations.langgraph_saver import PersistentMemorySaver, thread_session
from persistent_memory.memories import message_search, records, search
from persistent_memory.memories.service import MemoryService, memories_for
from persistent_memory.models import LongTermMemory
from persistent_memory.telemetry import instrument

#: The metadata key that marks a memory as a LangGraph item.
MARK = "langgraph"
_PLAIN = re.compile(r"[A-Za-z0-9_-]+")
#: Candidates ranked for a search with a query, before the filter and the page.
SEARCH_CANDIDATES = 1000
#: The root label of what was said (read-only; see the module's docstring).
CONVERSATIONS = "conversations"
#: The longest TTL a stored item may carry (about 1,900 years): beyond it an expiry
#: would not fit in a date, so a mark carrying one is no item's.
MAX_TTL_MINUTES = 10**9


def memory_key(namespace: tuple[str, ...], key: str) -> str:
    """The memory key of an item (see the module's docstring)."""
    parts = (*namespace, key)
    readable = "lg." + ".".join(parts)
    if all(_PLAIN.fullmatch(part) for part in parts) and len(readable) <= 256:
        return readable
    digest = hashlib.sha256(json.dumps(parts, ensure_ascii=False).encode()).hexdigest()
    return f"lgh.{digest[:48]}"


def memory_type(namespace: tuple[str, ...]) -> str:
    """The memory type of a namespace: its first label that is a type, else semantic."""
    return next((label for label in namespace if label in records.TYPES), "semantic")


def _at_path(value: Any, path: str) -> Iterable[Any]:
    """The values at one of LangGraph's index paths (``$`` the whole value, ``a.b``,
    ``items[0]``, ``items[-1]``, ``items[*].name``, ``*``, ``{title,meta.author}``), in
    order; none when the path leads nowhere. The path is split by LangGraph's own
    tokenizer, so a path means here what it means to LangGraph's stores."""
    if path == "$":
        return [value]
    found = [value]
    for part in tokenize_path(path):
        found = [inner for outer in found for inner in _step(outer, part)]
    return [item for item in found if item is not None]


def _step(value: Any, part: str) -> list[Any]:
    """The values one path part leads to from ``value``."""
    if part.startswith("[") and part.endswith("]"):
        if not isinstance(value, list):
            return []
        if part[1:-1] == "*":
            return list(value)
        try:
            index = int(part[1:-1])
        except ValueError:
            return []
        return [value[index]] if -len(value) <= index < len(value) else []
    if part.startswith("{") and part.endswith("}"):
        if not isinstance(value, dict):
            return []
        return [item for field in part[1:-1].split(",") for item in _at_path(value, field.strip())]
    if part == "*":
        if isinstance(value, dict):
            return list(value.values())
        return list(value) if isinstance(value, list) else []
    return [value[part]] if isinstance(value, dict) and part in value else []


def _texts(value: Any) -> Iterable[str]:
    """The leaves of a JSON value as text, in order (what keyword search should read, not
    the JSON's braces and field names)."""
    if isinstance(value, dict):
        for item in value.values():
            yield from _texts(item)
    elif isinstance(value, list):
        for item in value:
            yield from _texts(item)
    elif value is not None:
        yield value if isinstance(value, str) else json.dumps(value)


def content_of(value: dict[str, Any], key: str, fields: list[str] | None) -> str:
    """The text a memory holds for search: the indexed fields' text, within the limit."""
    if fields is None:
        return key
    texts = [text for path in fields for found in _at_path(value, path) for text in _texts(found)]
    text = records.normalize_content("\n".join(texts)) or key
    return text[: memory_settings.MEMORY_MAX_CONTENT_CHARS]


@instrument
class PersistentMemoryStore(BaseStore):
    """A LangGraph ``BaseStore`` over one owner's long-term memories.

    Make it with :meth:`for_owner`; a store without an owner would be the operator's view
    of every owner's memories, which an agent must not have.
    """

    supports_ttl = True

    def __init__(
        self,
        *,
        owner: str | None = None,
        index_fields: list[str] | None = None,
        ttl: TTLConfig | None = None,
        conversations: str | None = CONVERSATIONS,
    ) -> None:
        if owner is None:
            raise PermissionError(
                "PersistentMemoryStore needs an owner: use PersistentMemoryStore.for_owner(owner) "
                "('' for the unowned namespace)."
            )
        self.memories: MemoryService = memories_for(owner)
        self.owner = self.memories.owner
        self.index_fields = list(index_fields) if index_fields is not None else ["$"]
        self.ttl_config = ttl
        if conversations is not None:
            _check_labels(GetOp((conversations,), ""))
        self.conversations = conversations

    @classmethod
    def for_owner(
        cls,
        owner: str,
        *,
        index_fields: list[str] | None = None,
        ttl: TTLConfig | None = None,
        conversations: str | None = CONVERSATIONS,
    ) -> PersistentMemoryStore:
        """The store of ``owner``'s memories (``index_fields``: the value's fields search
        reads by default; ``ttl``: LangGraph's default TTL and refresh-on-read) and of what
        they said, read-only, under the root label ``conversations`` (None: not there, and
        the label is a memory namespace like any other)."""
        return cls(owner=owner, index_fields=index_fields, ttl=ttl, conversations=conversations)

    # --- LangGraph's two entry points ---------------------------------------------------

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run LangGraph's operations in order; their results, in the same order."""
        ops = list(ops)
        # Ops given to batch directly skip BaseStore's checks: every label is checked
        # before any op runs, as LangGraph's SQLite and Postgres stores do, so a batch
        # holding a label the public methods refuse runs nothing.
        for op in ops:
            _check_labels(op)
            if isinstance(op, PutOp) and self._said(op.namespace):
                raise InvalidNamespaceError(
                    f"The namespace {op.namespace} is read-only: {self.conversations!r} holds what was "
                    "said in the owner's conversations (put and delete are refused there)."
                )
        results: list[Result] = []
        # A batch that writes is one transaction: an op that fails (a value too large)
        # leaves none of the batch's puts behind.
        writes = any(isinstance(op, PutOp) for op in ops)
        with transaction.atomic(using=router.db_for_write(LongTermMemory)) if writes else nullcontext():
            for op in ops:
                if isinstance(op, GetOp):
                    results.append(self._get(op))
                elif isinstance(op, PutOp):
                    results.append(self._put(op))
                elif isinstance(op, SearchOp):
                    results.append(self._search(op))
                elif isinstance(op, ListNamespacesOp):
                    results.append(self._list_namespaces(op))
                else:
                    raise TypeError(f"Unknown operation {type(op).__name__}.")
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """``batch`` in a worker thread: the Django ORM is synchronous. No lock is held
        across calls."""
        return await asyncio.to_thread(self._batch_in_thread, list(ops))

    def _batch_in_thread(self, ops: list[Op]) -> list[Result]:
        # A worker thread gets no request_started/finished signals, which is where Django
        # drops a broken connection or one past CONN_MAX_AGE: done here around each batch,
        # else a connection broken once (a database restart) would fail this thread for
        # good, and one kept by a thread that ended would stay open until collected.
        close_old_connections()
        try:
            return self.batch(ops)
        finally:
            close_old_connections()

    # --- Operations ---------------------------------------------------------------------

    def _items(self) -> QuerySet[LongTermMemory]:
        return self.memories.rows().filter(**{f"metadata__{MARK}__isnull": False})

    def _row(self, namespace: tuple[str, ...], key: str) -> LongTermMemory | None:
        row = self._items().filter(key=memory_key(namespace, key)).first()
        mark = _mark(row) if row is not None else None
        # A memory written under this key by other means is not an item of this namespace.
        if mark is None or tuple(mark["namespace"]) != namespace or mark["key"] != key:
            return None
        return row

    def _said(self, labels: tuple[str, ...]) -> bool:
        """Whether ``labels`` are (under) the read-only root of what was said."""
        return self.conversations is not None and labels[:1] == (self.conversations,)

    def _messages(self, labels: tuple[str, ...]) -> QuerySet[Any] | None:
        """The owner's searchable messages under the namespace (prefix) ``labels`` of the
        conversations root, synced first; None when no message can be under it."""
        if len(labels) > 3:
            return None
        message_search.catch_up(self.owner)
        found = message_search.rows(self.owner, session_id=labels[1] if len(labels) > 1 else None)
        # A conversation name may hold a ".", which LangGraph forbids in a label: such a
        # conversation would be an item no get could address. It is left out.
        found = found.exclude(conversation__name__contains=".")
        return found.filter(conversation__name=labels[2]) if len(labels) > 2 else found

    def _said_item(self, said: dict[str, Any]) -> dict[str, Any]:
        """The item fields of a message (as :func:`message_search.described` gives it)."""
        return {
            "namespace": (self.conversations, said["session_id"], said["conversation"]),
            "key": said["id"],
            "value": {
                "role": said["role"],
                "name": said["name"],
                "content": said["content"],
                "said_at": said["said_at"].isoformat(),
            },
            "created_at": said["said_at"],
            "updated_at": said["said_at"],
        }

    def _get(self, op: GetOp) -> Item | None:
        if self._said(op.namespace):
            found = self._messages(op.namespace) if len(op.namespace) == 3 else None
            if found is None:
                return None
            said = found.filter(message_id=op.key).values(*message_search.FIELDS).first()
            return Item(**self._said_item(message_search.described(said))) if said else None
        row = self._row(op.namespace, op.key)
        if row is None:
            return None
        if op.refresh_ttl:
            self._refresh([row])
        return _item(row)

    def _put(self, op: PutOp) -> None:
        if op.value is None:
            row = self._row(op.namespace, op.key)
            if row is not None:
                self.memories.delete(row.pk)
            return
        if op.ttl is not None and abs(op.ttl) > MAX_TTL_MINUTES:
            raise ValueError(f"ttl must be at most {MAX_TTL_MINUTES} minutes.")
        # index=False: not searchable by its value; a list: those fields (none for []);
        # None: the store's.
        fields = None if op.index is False else self.index_fields if op.index is None else list(op.index)
        value = dict(op.value)
        started = timezone.now()
        memory = self.memories.add(
            content_of(value, op.key, fields),
            type=memory_type(op.namespace),
            key=memory_key(op.namespace, op.key),
            metadata={MARK: {"namespace": list(op.namespace), "key": op.key, "ttl": op.ttl}, "value": value},
            expires_at=_expiry(op.ttl),
        )
        # The service leaves a memory written again unchanged as it was (an extraction run
        # twice); a LangGraph put is an update all the same, as in LangGraph's own stores.
        if memory["updated_at"] < started:
            self._items().filter(pk=memory["id"]).update(updated_at=timezone.now())

    def _search(self, op: SearchOp) -> list[SearchItem]:
        if self._said(op.namespace_prefix):
            return self._search_said(op)
        rows = self._items()
        for position, label in enumerate(op.namespace_prefix):
            rows = rows.filter(**{f"metadata__{MARK}__namespace__{position}": label})
        if not op.namespace_prefix and self.conversations is not None:
            # Memories put under the root before it was reserved: no read reaches them.
            rows = rows.exclude(**{f"metadata__{MARK}__namespace__0": self.conversations})
        if op.query:
            ranked = search.rank(rows, op.query, _strategy(), SEARCH_CANDIDATES).hits
            by_id = {row.pk: row for row in LongTermMemory.objects.filter(pk__in=[hit.id for hit in ranked])}
            scored = [(by_id[hit.id], hit.score) for hit in ranked if hit.id in by_id]
        else:
            newest = _pages(rows.order_by("-updated_at", "-id"), op.offset + op.limit)
            scored = ((row, None) for row in newest)
        kept = (
            (row, score)
            for row, score in scored
            if _mark(row) is not None
            and (not op.filter or _matches(row.metadata.get("value", {}), op.filter))
        )
        page = list(itertools.islice(kept, op.offset, op.offset + op.limit))
        if op.refresh_ttl:
            self._refresh([row for row, _ in page])
        return [SearchItem(**_fields(row), score=score) for row, score in page]

    def _search_said(self, op: SearchOp) -> list[SearchItem]:
        """What was said under the prefix: ranked by the messages' search, or newest first."""
        found = self._messages(op.namespace_prefix)
        if found is None:
            return []
        if op.query:
            ranked = search.rank(None, op.query, _strategy(), SEARCH_CANDIDATES, messages=found).hits
            by_id = message_search.as_dicts([hit.id for hit in ranked])
            scored = ((by_id[hit.id], hit.score) for hit in ranked if hit.id in by_id)
        else:
            newest = _pages(
                found.order_by("-created_at", "-id").values(*message_search.FIELDS), op.offset + op.limit
            )
            scored = ((message_search.described(row), None) for row in newest)
        items = ((self._said_item(said), score) for said, score in scored)
        kept = ((item, score) for item, score in items if not op.filter or _matches(item["value"], op.filter))
        page = itertools.islice(kept, op.offset, op.offset + op.limit)
        return [SearchItem(**item, score=score) for item, score in page]

    def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        found: set[tuple[str, ...]] = set()
        namespaces: Iterable[tuple[str, ...]] = (
            tuple(mark["namespace"])
            for mark in map(_mark, self._items().only("key", "metadata").iterator())
            if mark is not None
        )
        if self.conversations is not None:
            message_search.catch_up(self.owner)
            pairs = message_search.conversations(self.owner)
            said = ((self.conversations, *pair) for pair in pairs if "." not in pair[1])
            namespaces = itertools.chain((n for n in namespaces if not self._said(n)), said)
        for namespace in namespaces:
            if op.match_conditions and not all(_namespace_matches(c, namespace) for c in op.match_conditions):
                continue
            found.add(namespace[: op.max_depth] if op.max_depth is not None else namespace)
        return sorted(found)[op.offset : op.offset + op.limit]

    def _refresh(self, rows: list[LongTermMemory]) -> None:
        """Move the expiry of ``rows`` that have a TTL to now plus their TTL."""
        for row in rows:
            ttl = row.metadata[MARK].get("ttl")
            if ttl:
                row.expires_at = _expiry(ttl)
                self._items().filter(pk=row.pk).update(expires_at=row.expires_at)


def _strategy() -> str:
    """MEMORY_SEARCH_STRATEGY, hybrid in place of semantic without an embedder."""
    strategy = memory_settings.MEMORY_SEARCH_STRATEGY
    return "hybrid" if strategy == "semantic" and search.embedder() is None else strategy


def _mark(row: LongTermMemory) -> dict[str, Any] | None:
    """The ``langgraph`` mark of a memory that is an item, None for any other memory.

    An owner may write any metadata through the REST API, ``{"langgraph": 1}`` included:
    a memory is an item only when its mark is the one ``put`` writes (labels, key, TTL, an
    object as value) and its key is the item's key, so that what else an owner stored is
    passed over, as ``get`` does, instead of failing a search or a listing.
    """
    metadata = row.metadata
    mark = metadata.get(MARK) if isinstance(metadata, dict) else None
    if not isinstance(mark, dict) or not isinstance(metadata.get("value", {}), dict):
        return None
    namespace, key, ttl = mark.get("namespace"), mark.get("key"), mark.get("ttl")
    if not (
        isinstance(namespace, list)
        and namespace
        and all(isinstance(label, str) and label and "." not in label for label in namespace)
        and isinstance(key, str)
        and row.key == memory_key(tuple(namespace), key)
    ):
        return None
    if ttl is not None and (_number(ttl) is None or not math.isfinite(ttl) or abs(ttl) > MAX_TTL_MINUTES):
        return None
    return mark


def _pages(rows: QuerySet[LongTermMemory], size: int) -> Iterator[LongTermMemory]:
    """``rows`` in order, read ``size`` at a time: a page of items costs one query unless
    memories that are no items come between them."""
    size = max(size, 1)
    for start in itertools.count(0, size):
        chunk = list(rows[start : start + size])
        yield from chunk
        if len(chunk) < size:
            return


def _check_labels(op: Op) -> None:
    """LangGraph's rules for the labels an op carries: text, not empty, no ``.`` and no
    U+0000 (the ``langgraph`` root is left to ``put``, as in LangGraph)."""
    if isinstance(op, GetOp | PutOp):
        paths = [op.namespace]
    elif isinstance(op, SearchOp):
        paths = [op.namespace_prefix]
    elif isinstance(op, ListNamespacesOp):
        paths = [condition.path for condition in op.match_conditions or ()]
    else:
        return
    for path in paths:
        for label in path:
            if not isinstance(label, str) or not label or "." in label or "\x00" in label:
                raise InvalidNamespaceError(
                    f"Invalid namespace label {label!r} in {tuple(path)}: labels are non-empty "
                    "strings without '.' or U+0000."
                )


def _expiry(ttl_minutes: float | None) -> datetime | None:
    return timezone.now() + timedelta(minutes=ttl_minutes) if ttl_minutes else None


def _compare(value: Any, wanted: Any, test: Callable[[Any, Any], bool]) -> bool:
    """An ordering test of like with like: numbers as numbers, texts as texts (ISO dates
    order as texts, as in LangGraph's SQLite store); anything else fails the test."""
    if _number(wanted) is not None:
        return _number(value) is not None and test(_number(value), _number(wanted))
    return isinstance(wanted, str) and isinstance(value, str) and test(value, wanted)


_OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    "$eq": lambda value, wanted: value == wanted,
    "$ne": lambda value, wanted: value != wanted,
    "$gt": lambda value, wanted: _compare(value, wanted, operator.gt),
    "$gte": lambda value, wanted: _compare(value, wanted, operator.ge),
    "$lt": lambda value, wanted: _compare(value, wanted, operator.lt),
    "$lte": lambda value, wanted: _compare(value, wanted, operator.le),
}


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _same(value: Any, wanted: Any) -> bool:
    """Whether ``value`` passes the filter ``wanted``: a dict of operators, a dict matched
    key by key, a list matched item by item, or an equal value."""
    if isinstance(wanted, dict):
        if any(name.startswith("$") for name in wanted):
            unknown = set(wanted) - set(_OPERATORS)
            if unknown:
                raise ValueError(f"Unknown filter operator {sorted(unknown)[0]!r}.")
            return all(_OPERATORS[name](value, operand) for name, operand in wanted.items())
        return isinstance(value, dict) and all(_same(value.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, list | tuple):
        return (
            isinstance(value, list)
            and len(value) == len(wanted)
            and all(_same(v, w) for v, w in zip(value, wanted, strict=True))
        )
    return value == wanted


def _matches(value: dict[str, Any], conditions: dict[str, Any]) -> bool:
    """LangGraph's filter on the value's top-level fields."""
    return all(_same(value.get(name), wanted) for name, wanted in conditions.items())


def _namespace_matches(condition: MatchCondition, namespace: tuple[str, ...]) -> bool:
    """A prefix or suffix condition of ``list_namespaces``, ``*`` matching any label."""
    path = tuple(condition.path)
    if len(namespace) < len(path):
        return False
    if condition.match_type == "prefix":
        labels = namespace[: len(path)]
    else:
        labels = namespace[len(namespace) - len(path) :]
    return all(wanted in ("*", label) for wanted, label in zip(path, labels, strict=True))


def _fields(row: LongTermMemory) -> dict[str, Any]:
    mark = row.metadata[MARK]
    return {
        "namespace": tuple(mark["namespace"]),
        "key": mark["key"],
        "value": row.metadata.get("value", {}),
        "created_at": row.created_at,
        "updated_at": row.updated_at,
    }


def _item(row: LongTermMemory) -> Item:
    return Item(**_fields(row))


__all__ = ["PersistentMemorySaver", "PersistentMemoryStore", "memory_key", "memory_type", "thread_session"]
