"""LangGraph's ``BaseStore`` over long-term memories (persistent_memory.integrations.langgraph).

The first part re-expresses what LangGraph's own store tests check of a store without a
vector index (libs/checkpoint/tests/test_store.py and the SQLite and Postgres stores'
tests): batches, get/put/delete, search by namespace prefix with filters and pages,
list_namespaces, namespace validation, TTL and the async methods. The second part checks
this app's own promises: owner isolation, items that are memories, search by the text of
the indexed fields, size limits and keys of any shape. Every test runs on SQLite and, with
DATABASE_URL set, on PostgreSQL (the store filters on JSON in ``metadata``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from datetime import datetime, timedelta
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.db import connection
from django.utils import timezone
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from langgraph.store.base import (
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    MatchCondition,
    PutOp,
    SearchItem,
    SearchOp,
)
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from persistent_memory.exceptions import InvalidMemory
from persistent_memory.integrations.langgraph import PersistentMemoryStore, memory_key
from persistent_memory.memories import memories_for
from persistent_memory.models import LongTermMemory
from persistent_memory.operations.forget import forget_owner
from persistent_memory.store import get_store
from tests.conftest import memory_settings_for
from tests.storable_json import JSON

pytestmark = pytest.mark.django_db

OWNER = "user:1"


@pytest.fixture
def lg() -> PersistentMemoryStore:
    """The LangGraph store of user:1 (not ``store``: conftest's is the session store)."""
    return PersistentMemoryStore.for_owner(OWNER)


@pytest.fixture
def sweepable(settings: Any) -> None:
    """The memory backend with the mirror off, for memory_sweep and forget_owner."""
    settings.PERSISTENT_MEMORY = memory_settings_for("memory")


def row(namespace: tuple[str, ...], key: str, owner: str = OWNER) -> LongTermMemory:
    """The memory that holds an item, expired or not (not its superseded versions)."""
    return LongTermMemory.objects.get(owner=owner, key=memory_key(namespace, key), superseded_by__isnull=True)


def expire(namespace: tuple[str, ...], key: str, owner: str = OWNER) -> None:
    """Move an item's expiry into the past without deleting it (not swept yet)."""
    LongTermMemory.objects.filter(owner=owner, key=memory_key(namespace, key)).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )


def keys(items: list[SearchItem]) -> list[str]:
    return [item.key for item in items]


def namespaces_of(items: list[SearchItem]) -> set[tuple[str, ...]]:
    return {item.namespace for item in items}


def sweep_command() -> dict[str, Any]:
    out = StringIO()
    call_command("memory_sweep", "--json", stdout=out, stderr=StringIO())
    return json.loads(out.getvalue())


# --- LangGraph's store behaviours ---------------------------------------------------------


def test_batch_runs_mixed_operations_and_answers_in_order(lg: PersistentMemoryStore) -> None:
    lg.put(("test", "foo"), "key1", {"data": "value1"})
    lg.put(("test", "bar"), "key2", {"data": "value2"})
    results = lg.batch(
        [
            GetOp(("test", "foo"), "key1"),
            PutOp(("test", "bar"), "key2", {"data": "value2"}),
            SearchOp(("test",), filter={"data": "value1"}),
            ListNamespacesOp(),
            GetOp(("test",), "key3"),
        ]
    )
    assert len(results) == 5
    first = results[0]
    assert isinstance(first, Item) and (first.namespace, first.key, first.value) == (
        ("test", "foo"),
        "key1",
        {"data": "value1"},
    )
    assert results[1] is None  # a put answers None
    assert [(item.key, item.value) for item in results[2]] == [("key1", {"data": "value1"})]
    assert results[3] == [("test", "bar"), ("test", "foo")]
    assert results[4] is None  # no such item

    reordered = lg.batch(
        [
            SearchOp(("test",), limit=5),
            GetOp(("test", "bar"), "key2"),
            ListNamespacesOp(limit=5),
            PutOp(("test",), "key3", {"data": "value3"}),
            GetOp(("test", "foo"), "key1"),
        ]
    )
    assert sorted(keys(reordered[0])) == ["key1", "key2"]
    assert reordered[1].value == {"data": "value2"}
    assert reordered[2] == [("test", "bar"), ("test", "foo")]
    assert reordered[3] is None
    assert reordered[4].value == {"data": "value1"}
    assert lg.get(("test",), "key3").value == {"data": "value3"}

    # Puts of a batch, a None value deleting.
    assert lg.batch(
        [PutOp(("b",), "k1", {"n": 1}), PutOp(("b",), "k2", {"n": 2}), PutOp(("b",), "k1", None)]
    ) == [None, None, None]
    assert lg.get(("b",), "k1") is None and lg.get(("b",), "k2").value == {"n": 2}


def test_get_put_delete_and_an_update_keeps_created_at(lg: PersistentMemoryStore) -> None:
    namespace = ("test", "documents")
    value = {"title": "Test Document", "content": "Hello, World!"}
    assert lg.put(namespace, "doc1", value) is None
    item = lg.get(namespace, "doc1")
    assert isinstance(item, Item)
    assert (item.namespace, item.key, item.value) == (namespace, "doc1", value)
    assert isinstance(item.created_at, datetime) and timezone.is_aware(item.created_at)
    assert item.updated_at == item.created_at

    lg.put(namespace, "doc1", {"title": "Updated Document", "content": "Hello, Updated!"})
    updated = lg.get(namespace, "doc1")
    assert updated.value == {"title": "Updated Document", "content": "Hello, Updated!"}
    assert updated.created_at == item.created_at
    assert updated.updated_at > item.updated_at
    # The same value put again is an update too, as in LangGraph's stores.
    lg.put(namespace, "doc1", {"title": "Updated Document", "content": "Hello, Updated!"})
    again = lg.get(namespace, "doc1")
    assert again.updated_at > updated.updated_at and again.created_at == item.created_at

    assert lg.get(("test", "other_documents"), "doc1") is None
    assert lg.get(("test",), "doc1") is None  # a namespace's prefix is another namespace
    lg.delete(namespace, "doc1")
    assert lg.get(namespace, "doc1") is None
    lg.delete(namespace, "doc1")  # deleting what is not there is no error
    assert not LongTermMemory.objects.exists()

    # What comes back is what was put: nested values, lists, numbers, booleans, null.
    rich = {"a": {"b": [1, 2.5, {"c": None}]}, "ok": True, "name": "ünï", "n": 0}
    lg.put(namespace, "rich", rich)
    assert lg.get(namespace, "rich").value == rich
    assert lg.get(namespace, "rich").dict()["namespace"] == list(namespace)


def test_search_scopes_by_whole_namespace_labels(lg: PersistentMemoryStore) -> None:
    for namespace in [
        ("foo",),
        ("foo", "child"),
        ("foo", "child", "deep"),
        ("foobar",),
        ("foobar", "baz"),
        ("foo2",),
    ]:
        lg.put(namespace, "k", {"v": 1})
    assert namespaces_of(lg.search(("foo",), limit=100)) == {
        ("foo",),
        ("foo", "child"),
        ("foo", "child", "deep"),
    }
    assert namespaces_of(lg.search(("foobar",), limit=100)) == {("foobar",), ("foobar", "baz")}
    assert namespaces_of(lg.search(("foo", "child"), limit=100)) == {
        ("foo", "child"),
        ("foo", "child", "deep"),
    }
    assert namespaces_of(lg.search(("foo2",), limit=100)) == {("foo2",)}
    assert lg.search(("fo",)) == []
    assert lg.search(("foo", "child", "deep", "deeper")) == []
    assert len(lg.search((), limit=100)) == 6  # the empty prefix is every namespace


def test_search_takes_labels_literally(lg: PersistentMemoryStore) -> None:
    """``_`` and ``%`` are labels, not LIKE wildcards; case matters; a newline is a character."""
    for namespace in [
        ("user_1",),
        ("user_1", "child"),
        ("userX1",),
        ("a%b",),
        ("axxb",),
        ("Tenant",),
        ("tenant", "a_%"),
    ]:
        lg.put(namespace, "k", {"v": 1})
    assert namespaces_of(lg.search(("user_1",))) == {("user_1",), ("user_1", "child")}
    assert namespaces_of(lg.search(("a%b",))) == {("a%b",)}
    assert namespaces_of(lg.search(("tenant",))) == {("tenant", "a_%")}
    assert namespaces_of(lg.search(("tenant", "a_%"))) == {("tenant", "a_%")}
    assert lg.search(("tenant", "ab")) == []
    lg.put(("users", "alice\n"), "k", {"v": 2})
    lg.put(("users", "alice"), "k", {"v": 1})
    assert [item.value for item in lg.search(("users", "alice"))] == [{"v": 1}]


def test_search_without_query_is_newest_update_first_without_score(lg: PersistentMemoryStore) -> None:
    for key in ("a", "b", "c"):
        lg.put(("docs",), key, {"text": key})
    lg.put(("docs",), "a", {"text": "a again"})
    found = lg.search(("docs",))
    assert keys(found) == ["a", "c", "b"]
    assert all(isinstance(item, SearchItem) and item.score is None for item in found)
    assert lg.search(("docs",), query="") == found  # an empty query is no query
    assert lg.search(("docs",), query=None) == found


FILTER_DOCS = [
    (
        "doc1",
        {"text": "red apple", "color": "red", "score": 4.5, "tags": ["fruit"], "meta": {"by": "ann", "n": 1}},
    ),
    (
        "doc2",
        {"text": "red car", "color": "red", "score": 3.0, "tags": ["car"], "meta": {"by": "bob", "n": 2}},
    ),
    (
        "doc3",
        {
            "text": "green apple",
            "color": "green",
            "score": 4.0,
            "tags": ["fruit"],
            "meta": {"by": "ann", "n": 3},
        },
    ),
    (
        "doc4",
        {"text": "blue car", "color": "blue", "score": 3.5, "tags": ["car", "blue"], "when": "2024-03-01"},
    ),
]


@pytest.fixture
def filter_docs(lg: PersistentMemoryStore) -> PersistentMemoryStore:
    for key, value in FILTER_DOCS:
        lg.put(("test",), key, value)
    lg.put(("other",), "doc5", {"color": "red", "score": 9})  # outside the searched prefix
    return lg


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        ({"color": "red"}, ["doc1", "doc2"]),
        ({"color": "purple"}, []),
        ({"color": {"$eq": "green"}}, ["doc3"]),
        ({"color": {"$ne": "red"}}, ["doc3", "doc4"]),
        ({"score": {"$gt": 3.5}}, ["doc1", "doc3"]),
        ({"score": {"$gte": 3.5}}, ["doc1", "doc3", "doc4"]),
        ({"score": {"$lt": 3.5}}, ["doc2"]),
        ({"score": {"$lte": 3.5}}, ["doc2", "doc4"]),
        ({"score": {"$gt": 3.2, "$lt": 4.2}}, ["doc3", "doc4"]),  # operators of a field: all of them
        ({"score": {"$gte": 4.0}, "color": "green"}, ["doc3"]),  # fields: all of them
        ({"score": 3}, ["doc2"]),  # 3 and 3.0 are the same number
        ({"tags": ["fruit"]}, ["doc1", "doc3"]),  # a list: equal item by item
        ({"tags": ["blue", "car"]}, []),
        ({"meta": {"by": "ann"}}, ["doc1", "doc3"]),  # an object: matched key by key
        ({"meta": {"n": {"$gte": 2}}}, ["doc2", "doc3"]),
        ({"when": {"$ne": "2024-03-01"}}, ["doc1", "doc2", "doc3"]),  # missing is not equal
        ({"missing": "x"}, []),
        ({"color": {"$gt": 3}}, []),  # a text is not more than a number
        ({"when": {"$gt": "2024-01-01"}}, ["doc4"]),  # texts compare as texts
        ({"when": {"$lt": "2024-01-01"}}, []),
    ],
)
def test_search_filters(
    filter_docs: PersistentMemoryStore, condition: dict[str, Any], expected: list[str]
) -> None:
    assert sorted(keys(filter_docs.search(("test",), filter=condition))) == expected


def test_search_filters_with_a_query_and_an_unknown_operator(filter_docs: PersistentMemoryStore) -> None:
    assert keys(filter_docs.search(("test",), query="apple", filter={"color": "red"})) == ["doc1"]
    assert sorted(keys(filter_docs.search(("test",), query="car", filter={"score": {"$gt": 3.2}}))) == [
        "doc4"
    ]
    with pytest.raises(ValueError, match=r"\$regex"):
        filter_docs.search(("test",), filter={"color": {"$regex": "r.*"}})


def test_search_limit_and_offset(lg: PersistentMemoryStore) -> None:
    for i in range(5):
        lg.put(("test",), f"doc{i}", {"text": f"test document number {i}"})
    assert keys(lg.search(("test",), limit=2)) == ["doc4", "doc3"]
    assert keys(lg.search(("test",), limit=2, offset=2)) == ["doc2", "doc1"]
    assert keys(lg.search(("test",), offset=4)) == ["doc0"]
    assert lg.search(("test",), offset=5) == []
    assert len(lg.search(("test",))) == 5
    # With a query: pages of the ranking, none shared.
    first, second = (
        lg.search(("test",), query="document", limit=2),
        lg.search(("test",), query="document", limit=2, offset=2),
    )
    assert len(first) == len(second) == 2 and not set(keys(first)) & set(keys(second))
    assert len(lg.search(("test",), query="document", limit=10)) == 5
    # A filter applies before the page.
    assert keys(lg.search(("test",), filter={"text": {"$ne": "test document number 4"}}, limit=1)) == ["doc3"]


def test_search_query_edge_cases(lg: PersistentMemoryStore) -> None:
    lg.put(("test",), "doc1", {"text": "test document"})
    assert len(lg.search(("test",), query="test " * 100)) == 1
    assert len(lg.search(("test",), query="test!@#$%^&*()")) == 1
    assert len(lg.search(("test",), query="これは日本語です")) == 0
    lg.put(("test",), "doc2", {"text": "这是中文 Это русский"})
    assert keys(lg.search(("test",), query="русский")) == ["doc2"]


LISTED = [
    ("a", "b", "c"),
    ("a", "b", "d", "e"),
    ("a", "b", "d", "i"),
    ("a", "b", "f"),
    ("a", "c", "f"),
    ("b", "a", "f"),
    ("users", "123"),
    ("users", "456", "settings"),
    ("admin", "users", "789"),
]


def test_list_namespaces(lg: PersistentMemoryStore) -> None:
    assert lg.list_namespaces() == []
    for i, namespace in enumerate(LISTED):
        lg.put(namespace, f"id_{i}", {"data": f"value_{i:02d}"})
    lg.put(("a", "b", "c"), "second", {"data": "same namespace, listed once"})
    assert lg.list_namespaces() == sorted(LISTED)
    assert lg.list_namespaces(prefix=("a", "b")) == [
        ("a", "b", "c"),
        ("a", "b", "d", "e"),
        ("a", "b", "d", "i"),
        ("a", "b", "f"),
    ]
    assert lg.list_namespaces(suffix=("f",)) == [("a", "b", "f"), ("a", "c", "f"), ("b", "a", "f")]
    assert lg.list_namespaces(prefix=("a",), suffix=("f",)) == [("a", "b", "f"), ("a", "c", "f")]
    assert lg.list_namespaces(prefix=("a", "b"), max_depth=3) == [
        ("a", "b", "c"),
        ("a", "b", "d"),
        ("a", "b", "f"),
    ]
    assert lg.list_namespaces(max_depth=1) == [("a",), ("admin",), ("b",), ("users",)]
    assert lg.list_namespaces(prefix=("a", "b"), limit=2) == [("a", "b", "c"), ("a", "b", "d", "e")]
    assert lg.list_namespaces(prefix=("a", "b"), offset=2) == [("a", "b", "d", "i"), ("a", "b", "f")]
    assert lg.list_namespaces(prefix=("a", "*", "f")) == [("a", "b", "f"), ("a", "c", "f")]
    assert lg.list_namespaces(suffix=("*", "f")) == [("a", "b", "f"), ("a", "c", "f"), ("b", "a", "f")]
    assert lg.list_namespaces(prefix=("users", "*")) == [("users", "123"), ("users", "456", "settings")]
    assert lg.list_namespaces(prefix=("*", "users"), suffix=("*", "settings")) == []
    assert lg.list_namespaces(prefix=("nonexistent",)) == []
    assert lg.list_namespaces(prefix=("users", "123")) == [("users", "123")]
    assert lg.list_namespaces(prefix=["users"]) == [
        ("users", "123"),
        ("users", "456", "settings"),
    ]  # a list too


def test_list_namespaces_pages_and_whole_labels(lg: PersistentMemoryStore) -> None:
    for i in range(20):
        lg.put(("namespace", f"sub_{i:02d}"), f"id_{i:02d}", {"data": i})
    assert lg.list_namespaces(prefix=("namespace",), limit=5) == [
        ("namespace", f"sub_{i:02d}") for i in range(5)
    ]
    assert lg.list_namespaces(prefix=("namespace",), limit=5, offset=15) == [
        ("namespace", f"sub_{i:02d}") for i in range(15, 20)
    ]
    for namespace in [
        ("foo",),
        ("foo", "child"),
        ("foobar",),
        ("uid", "users", "alice"),
        ("uid", "users", "malice"),
        ("uid", "a", "b", "alice"),
        ("users", "alice\n"),
    ]:
        lg.put(namespace, "k", {"v": 1})
    assert lg.list_namespaces(prefix=("foo",)) == [("foo",), ("foo", "child")]
    assert lg.list_namespaces(suffix=("alice",)) == [("uid", "a", "b", "alice"), ("uid", "users", "alice")]
    assert lg.list_namespaces(prefix=("uid", "*", "alice")) == [("uid", "users", "alice")]


BAD_LABELS = [("foo.bar",), ("foo", ""), (123,), ("a\x00b",)]


@pytest.mark.parametrize("namespace", [(), *BAD_LABELS, ("langgraph", "foo")])
def test_put_refuses_invalid_namespaces(lg: PersistentMemoryStore, namespace: tuple[Any, ...]) -> None:
    with pytest.raises(InvalidNamespaceError):
        lg.put(namespace, "key", {"foo": "bar"})
    with pytest.raises(InvalidNamespaceError):
        asyncio.run(lg.aput(namespace, "key", {"foo": "bar"}))
    assert not LongTermMemory.objects.exists()


@pytest.mark.parametrize("namespace", BAD_LABELS)
def test_reads_refuse_invalid_labels(lg: PersistentMemoryStore, namespace: tuple[Any, ...]) -> None:
    for call in (
        lambda: lg.get(namespace, "key"),
        lambda: lg.delete(namespace, "key"),
        lambda: lg.search(namespace),
        lambda: lg.list_namespaces(prefix=namespace),
        lambda: lg.list_namespaces(suffix=namespace),
    ):
        with pytest.raises(InvalidNamespaceError):
            call()


@pytest.mark.parametrize(
    "op",
    [
        PutOp(("foo.bar",), "key", {"v": 1}),
        PutOp(("foo", ""), "key", {"v": 1}),
        GetOp(("foo.bar",), "key"),
        SearchOp(("a", "")),
        ListNamespacesOp(match_conditions=(MatchCondition("prefix", ("a.b",)),)),
    ],
)
def test_batch_refuses_invalid_labels_before_running_anything(lg: PersistentMemoryStore, op: Any) -> None:
    """Ops given to batch directly skip BaseStore's checks: the store checks their labels
    (as LangGraph's SQLite and Postgres stores do), all of them before running any."""
    with pytest.raises(InvalidNamespaceError):
        lg.batch([PutOp(("ok",), "first", {"v": 1}), op])
    assert not LongTermMemory.objects.exists()


def test_langgraph_is_a_label_anywhere_and_a_root_through_batch(lg: PersistentMemoryStore) -> None:
    doc = {"foo": "bar"}
    lg.put(("foo", "langgraph", "foo"), "bar", doc)
    assert lg.get(("foo", "langgraph", "foo"), "bar").value == doc
    assert lg.search(("foo", "langgraph", "foo"))[0].value == doc
    lg.delete(("foo", "langgraph", "foo"), "bar")
    assert lg.get(("foo", "langgraph", "foo"), "bar") is None
    # As in LangGraph: the "langgraph" root is refused by put, not by batch (LangGraph's own use).
    lg.batch([PutOp(("langgraph", "foo"), "bar", doc)])
    assert lg.get(("langgraph", "foo"), "bar").value == doc
    assert lg.search(("langgraph", "foo"))[0].value == doc
    lg.delete(("langgraph", "foo"), "bar")
    assert lg.get(("langgraph", "foo"), "bar") is None


# --- TTL ----------------------------------------------------------------------------------


def test_put_with_ttl_sets_an_expiry(lg: PersistentMemoryStore) -> None:
    before = timezone.now()
    lg.put(("ttl",), "short", {"v": 1}, ttl=5)
    lg.put(("ttl",), "forever", {"v": 2})
    expires_at = row(("ttl",), "short").expires_at
    assert before + timedelta(minutes=5) <= expires_at <= timezone.now() + timedelta(minutes=5)
    assert row(("ttl",), "forever").expires_at is None
    lg.put(("ttl",), "short", {"v": 1})  # put again without a TTL: no expiry any more
    assert row(("ttl",), "short").expires_at is None


def test_store_ttl_config_default_and_refresh_on_read() -> None:
    store = PersistentMemoryStore.for_owner(OWNER, ttl={"default_ttl": 60, "refresh_on_read": False})
    store.put(("ttl",), "default", {"v": 1})
    store.put(("ttl",), "none", {"v": 1}, ttl=None)  # an explicit None overrides the default
    store.put(("ttl",), "own", {"v": 1}, ttl=1)
    now = timezone.now()
    assert now + timedelta(minutes=59) < row(("ttl",), "default").expires_at <= now + timedelta(minutes=60)
    assert row(("ttl",), "none").expires_at is None
    assert row(("ttl",), "own").expires_at <= now + timedelta(minutes=1)
    # refresh_on_read False: reads leave the expiry unless they ask.
    LongTermMemory.objects.filter(owner=OWNER).update(expires_at=now + timedelta(seconds=30))
    store.get(("ttl",), "own")
    store.search(("ttl",))
    assert row(("ttl",), "own").expires_at == now + timedelta(seconds=30)
    store.get(("ttl",), "own", refresh_ttl=True)
    assert row(("ttl",), "own").expires_at > now + timedelta(seconds=55)


def test_reads_refresh_the_ttl(lg: PersistentMemoryStore) -> None:
    lg.put(("ttl",), "item", {"foo": "bar"}, ttl=10)
    lg.put(("ttl",), "plain", {"foo": "baz"})
    soon = timezone.now() + timedelta(seconds=30)

    def set_expiry() -> None:
        LongTermMemory.objects.filter(key=memory_key(("ttl",), "item")).update(expires_at=soon)

    set_expiry()
    assert lg.get(("ttl",), "item", refresh_ttl=False) is not None
    assert row(("ttl",), "item").expires_at == soon
    assert lg.get(("ttl",), "item") is not None  # refresh_ttl defaults to True
    assert row(("ttl",), "item").expires_at > timezone.now() + timedelta(minutes=9)

    set_expiry()
    assert len(lg.search(("ttl",), refresh_ttl=False)) == 2
    assert row(("ttl",), "item").expires_at == soon
    assert keys(lg.search(("ttl",), query="bar")) == ["item"]
    assert row(("ttl",), "item").expires_at > timezone.now() + timedelta(minutes=9)
    # Only what a search returns is refreshed, and an item without a TTL keeps none.
    set_expiry()
    assert keys(lg.search(("ttl",), query="baz")) == ["plain"]
    assert row(("ttl",), "item").expires_at == soon
    assert row(("ttl",), "plain").expires_at is None
    # A read refreshes; it does not count as an update.
    assert lg.get(("ttl",), "item").updated_at == row(("ttl",), "item").updated_at


def test_an_expired_item_is_gone_and_memory_sweep_deletes_it(
    lg: PersistentMemoryStore, sweepable: None
) -> None:
    lg.put(("ttl", "gone"), "item", {"data": "gone"}, ttl=1)
    lg.put(("ttl", "kept"), "item", {"data": "kept"}, ttl=None)
    lg.put(("ttl", "kept"), "other", {"data": "gone too"}, ttl=1)
    expire(("ttl", "gone"), "item")
    expire(("ttl", "kept"), "other")
    # Expired but not swept: no read returns it, and a refresh does not bring it back.
    assert lg.get(("ttl", "gone"), "item", refresh_ttl=True) is None
    assert lg.search(("ttl",), refresh_ttl=True, limit=100) == lg.search(("ttl", "kept"))
    assert keys(lg.search(("ttl",), limit=1)) == ["item"]  # filtered before the page
    assert lg.search(("ttl",), query="gone") == []
    assert lg.list_namespaces(prefix=("ttl",)) == [("ttl", "kept")]
    assert row(("ttl", "gone"), "item").expires_at < timezone.now()
    assert memories_for(OWNER).list()[0] == 1

    assert sweep_command()["memories_deleted"] == 2
    assert list(LongTermMemory.objects.values_list("key", flat=True)) == [memory_key(("ttl", "kept"), "item")]


def test_putting_an_expired_item_again_starts_a_new_one(lg: PersistentMemoryStore) -> None:
    lg.put(("ttl",), "item", {"v": 1}, ttl=1)
    first = lg.get(("ttl",), "item")
    expire(("ttl",), "item")
    lg.put(("ttl",), "item", {"v": 2}, ttl=1)
    again = lg.get(("ttl",), "item")
    assert again.value == {"v": 2} and again.created_at > first.created_at


# --- Async --------------------------------------------------------------------------------


async def together(*calls: Awaitable[Any]) -> list[Any]:
    """The calls at once on PostgreSQL; one by one on SQLite, whose in-memory test database
    (shared cache) fails a write that meets another thread's lock instead of waiting for it
    as a database file does."""
    if connection.vendor == "sqlite":
        return [await call for call in calls]
    return list(await asyncio.gather(*calls))


@pytest.mark.django_db(transaction=True)
def test_async_methods(lg: PersistentMemoryStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """The async twins run in worker threads, on their own connections: committed data.
    With Django's default CONN_MAX_AGE (0, not the demo's 60) each thread closes its
    connection after a batch, so none is left open on the test database."""
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", 0)

    async def scenario() -> None:
        await lg.aput(("docs", "a"), "one", {"text": "red apple", "n": 1}, ttl=5)
        await together(
            lg.aput(("docs", "a"), "two", {"text": "green pear", "n": 2}),
            lg.aput(("docs", "b"), "three", {"text": "blue car", "n": 3}),
        )
        one, missing = await together(lg.aget(("docs", "a"), "one"), lg.aget(("docs", "a"), "zero"))
        assert one.value == {"text": "red apple", "n": 1} and missing is None
        assert sorted(keys(await lg.asearch(("docs",), filter={"n": {"$gte": 2}}))) == ["three", "two"]
        assert keys(await lg.asearch(("docs",), query="pear")) == ["two"]
        assert await lg.alist_namespaces(prefix=("docs",)) == [("docs", "a"), ("docs", "b")]
        assert await lg.alist_namespaces(max_depth=1) == [("docs",)]
        results = await lg.abatch(
            [GetOp(("docs", "b"), "three"), PutOp(("docs", "b"), "four", {"n": 4}), SearchOp(("docs", "b"))]
        )
        assert results[0].key == "three" and results[1] is None
        # LangGraph promises no order of a batch's puts and reads (its SQL stores run the
        # puts last); this store runs them in order.
        assert keys(results[2]) in (["three"], ["four", "three"])
        await lg.adelete(("docs", "a"), "one")
        assert await lg.aget(("docs", "a"), "one") is None
        with pytest.raises(InvalidNamespaceError):
            await lg.aput(("langgraph",), "k", {"v": 1})
        with pytest.raises(InvalidNamespaceError):
            await lg.asearch(("a.b",))

    asyncio.run(scenario())
    assert sorted(LongTermMemory.objects.values_list("key", flat=True)) == sorted(
        memory_key(namespace, key)
        for namespace, key in [(("docs", "a"), "two"), (("docs", "b"), "three"), (("docs", "b"), "four")]
    )


# --- This app's guarantees ------------------------------------------------------------------


def test_a_store_needs_an_owner() -> None:
    with pytest.raises(PermissionError):
        PersistentMemoryStore()
    assert PersistentMemoryStore(owner="user:3").owner == "user:3"
    assert PersistentMemoryStore.for_owner("").owner == ""  # the unowned namespace is an owner too


def test_owners_never_see_each_others_items(lg: PersistentMemoryStore) -> None:
    other = PersistentMemoryStore.for_owner("user:2")
    lg.put(("prefs",), "theme", {"text": "dark mode secret"}, ttl=5)
    lg.put(("prefs", "deep"), "font", {"text": "serif"})
    expires_at = row(("prefs",), "theme").expires_at

    assert other.get(("prefs",), "theme") is None
    assert other.search(()) == [] and other.search(("prefs",)) == []
    assert other.search(("prefs",), query="dark mode secret") == []
    assert other.search((), filter={"text": "serif"}) == []
    assert other.list_namespaces() == []
    other.delete(("prefs",), "theme")
    assert other.batch([GetOp(("prefs",), "theme"), PutOp(("prefs", "deep"), "font", None)]) == [None, None]
    assert lg.get(("prefs", "deep"), "font").value == {"text": "serif"}

    # The same namespace and key: the other owner's own item, and neither touches the other.
    other.put(("prefs",), "theme", {"text": "light"})
    assert lg.get(("prefs",), "theme", refresh_ttl=False).value == {"text": "dark mode secret"}
    assert other.get(("prefs",), "theme").value == {"text": "light"}
    assert row(("prefs",), "theme").expires_at == expires_at
    other.delete(("prefs",), "theme")
    assert lg.get(("prefs",), "theme").value == {"text": "dark mode secret"}
    assert other.list_namespaces() == []
    assert LongTermMemory.objects.filter(owner=OWNER).count() == 2


def test_items_are_memories_of_the_owner(lg: PersistentMemoryStore) -> None:
    lg.put(("user", "episodic", "trips"), "rome", {"text": "Went to Rome in May", "rating": 5})
    lg.put(("prefs",), "theme", {"text": "Prefers dark mode"})
    lg.put(("procedural", "factual"), "first-type-wins", {"text": "how"})
    count, memories = memories_for(OWNER).list()
    assert count == 3
    by_key = {memory["key"]: memory for memory in memories}
    rome = by_key[memory_key(("user", "episodic", "trips"), "rome")]
    assert rome["key"] == "lg.user.episodic.trips.rome"
    assert rome["type"] == "episodic"  # the namespace's first label that is a type
    assert rome["content"] == "Went to Rome in May 5"  # the text of the value's fields
    assert rome["metadata"] == {
        "langgraph": {"namespace": ["user", "episodic", "trips"], "key": "rome", "ttl": None},
        "value": {"text": "Went to Rome in May", "rating": 5},
    }
    assert by_key[memory_key(("prefs",), "theme")]["type"] == "semantic"  # no type label
    assert by_key[memory_key(("procedural", "factual"), "first-type-wins")]["type"] == "procedural"
    found = memories_for(OWNER).search("Rome")
    assert [memory["key"] for memory in found] == [rome["key"]]
    assert memories_for("user:2").list()[0] == 0
    # A memory written by other means is no item, even under an item's key.
    memories_for(OWNER).add("Written through the API", key="lg.notes.k")
    assert lg.get(("notes",), "k") is None
    assert lg.search(("notes",)) == [] and ("notes",) not in lg.list_namespaces()


def test_forgetting_the_owner_deletes_its_items(lg: PersistentMemoryStore, sweepable: None) -> None:
    other = PersistentMemoryStore.for_owner("user:2")
    lg.put(("prefs",), "theme", {"text": "dark"})
    lg.put(("notes",), "n1", {"text": "note"}, ttl=1)
    expire(("notes",), "n1")  # expired ones too
    other.put(("prefs",), "theme", {"text": "light"})
    counts = forget_owner(OWNER, store=get_store())
    assert counts["memories"] == 2
    assert lg.get(("prefs",), "theme") is None and lg.list_namespaces() == []
    assert not LongTermMemory.objects.filter(owner=OWNER).exists()
    assert other.get(("prefs",), "theme").value == {"text": "light"}


def test_a_query_finds_items_by_their_indexed_fields(lg: PersistentMemoryStore) -> None:
    ns = ("docs",)
    lg.put(ns, "all", {"title": "Quarterly report", "body": {"summary": "revenue grew", "tags": ["finance"]}})
    lg.put(ns, "short", {"title": "Holiday plans", "body": "snorkeling in Crete"}, index=["title"])
    lg.put(ns, "hidden", {"title": "Secret recipe", "body": "cardamom"}, index=False)
    lg.put(
        ns,
        "paths",
        {"items": [{"name": "espresso"}, {"name": "ristretto"}], "log": ["draft", "final"]},
        index=["items[*].name", "log[-1]"],
    )
    lg.put(ns, "first", {"items": [{"name": "zucchini"}, {"name": "yam"}]}, index=["items[0].name"])
    lg.put(ns, "nothing", {"title": "Alpaca wool"}, index=[])

    def found(query: str) -> list[str]:
        return keys(lg.search(ns, query=query))

    assert found("revenue") == ["all"]  # every field by default, nested ones too
    assert found("finance") == ["all"]
    assert found("quarterly") == ["all"]
    assert found("holiday") == ["short"]
    assert found("snorkeling") == []  # not an indexed field
    assert found("cardamom") == [] and found("secret") == []  # index=False: not by its value
    assert found("ristretto") == ["paths"] and found("espresso") == ["paths"]  # [*]: every item
    assert found("final") == ["paths"] and found("draft") == []  # [-1]: the last
    assert found("zucchini") == ["first"] and found("yam") == []
    assert found("alpaca") == []  # an empty index: nothing
    assert found("name") == [] and found("title") == []  # field names are not text
    assert found("hidden") == ["hidden"]  # the words of the key and labels are (index=False too)
    assert lg.get(ns, "hidden").value == {"title": "Secret recipe", "body": "cardamom"}

    # The store's index_fields is the default for a put without index=.
    titled = PersistentMemoryStore.for_owner("user:titles", index_fields=["title"])
    titled.put(ns, "t", {"title": "Volcano", "body": "lava"})
    titled.put(ns, "b", {"title": "Glacier", "body": "volcano nearby"}, index=["body"])
    assert keys(titled.search(ns, query="volcano")) in (["t", "b"], ["b", "t"])
    assert keys(titled.search(ns, query="lava")) == []
    # An update re-indexes.
    lg.put(ns, "short", {"title": "Work plans", "body": "snorkeling"}, index=["title"])
    assert found("holiday") == [] and found("work") == ["short"]


def test_a_value_too_large_raises_and_writes_nothing(lg: PersistentMemoryStore, settings: Any) -> None:
    settings.PERSISTENT_MEMORY = {"MEMORY_MAX_METADATA_BYTES": 2048}
    with pytest.raises(InvalidMemory, match="metadata"):
        lg.put(("big",), "k", {"text": "x" * 3000})
    assert not LongTermMemory.objects.exists() and lg.get(("big",), "k") is None
    lg.put(("big",), "k", {"text": "small"})
    with pytest.raises(InvalidMemory):
        lg.put(("big",), "k", {"text": "y" * 3000})
    assert lg.get(("big",), "k").value == {"text": "small"}  # the item before the put, whole
    # A batch is one transaction: its later op failing leaves none of its puts.
    with pytest.raises(InvalidMemory):
        lg.batch([PutOp(("big",), "first", {"text": "fine"}), PutOp(("big",), "k", {"text": "z" * 3000})])
    assert lg.get(("big",), "first") is None and lg.get(("big",), "k").value == {"text": "small"}
    with pytest.raises(InvalidMemory):
        lg.put(("big",), "nul", {"text": "a\x00b"})  # what the database cannot hold either
    # Content is cut to MEMORY_MAX_CONTENT_CHARS; the value is kept whole.
    settings.PERSISTENT_MEMORY = {"MEMORY_MAX_CONTENT_CHARS": 50}
    long_text = " ".join(["word"] * 30) + " needle"
    lg.put(("big",), "long", {"text": long_text})
    assert lg.get(("big",), "long").value == {"text": long_text}
    assert len(row(("big",), "long").content) <= 50


@pytest.mark.parametrize(
    ("namespace", "key"),
    [
        (("docs",), "a b"),
        (("docs",), "ключ-🔑"),
        (("docs",), "k" * 1000),
        (("docs",), "a.b"),
        (("docs",), "lg.docs.x"),
        (("docs",), "1"),
        (("ünïcode", "with space", "a_%"), "plain"),
        (tuple(f"label{i}" for i in range(40)), "deep"),
    ],
    ids=["space", "unicode", "long", "dot", "lookalike", "digits", "odd-labels", "deep-namespace"],
)
def test_keys_and_labels_of_any_shape_round_trip(
    lg: PersistentMemoryStore, namespace: tuple[str, ...], key: str
) -> None:
    value = {"text": "findable words", "key": key}
    lg.put(namespace, key, value)
    lg.put(namespace, "neighbour", {"text": "other"})
    item = lg.get(namespace, key)
    assert (item.namespace, item.key, item.value) == (namespace, key, value)
    assert [(found.namespace, found.key) for found in lg.search(namespace[:1], query="findable")] == [
        (namespace, key)
    ]
    assert namespace in lg.list_namespaces()
    memory = row(namespace, key)
    assert len(memory.key) <= 256
    lg.put(namespace, key, {"text": "changed"})
    assert lg.get(namespace, key).value == {"text": "changed"}
    # Updated in place (the same memory); its old value kept as a superseded version.
    assert memory.pk == row(namespace, key).pk
    assert LongTermMemory.objects.filter(owner=OWNER, superseded_by__isnull=True).count() == 2
    assert LongTermMemory.objects.get(superseded_by=memory.pk).metadata["value"] == value
    lg.delete(namespace, key)
    assert not LongTermMemory.objects.filter(superseded_by=memory.pk).exists()  # with its item
    assert lg.get(namespace, key) is None and lg.get(namespace, "neighbour") is not None


def test_similar_keys_are_distinct_items(lg: PersistentMemoryStore) -> None:
    pairs = [
        (("a", "b"), "c"),
        (("a",), "b"),
        (("a", "b", "c"), "d"),
        (("a",), "b.c"),
        (("a", "b"), "c d"),
        (("a b",), "c"),
    ]
    for i, (namespace, key) in enumerate(pairs):
        lg.put(namespace, key, {"i": i})
    assert [lg.get(namespace, key).value for namespace, key in pairs] == [{"i": i} for i in range(len(pairs))]
    assert len({memory_key(namespace, key) for namespace, key in pairs}) == len(pairs)


# --- What an owner wrote by other means (the REST API) ------------------------------------

#: Marks close to an item's: the fields right and one of them wrong, and anything at all.
MARKS = st.one_of(
    JSON,
    st.fixed_dictionaries(
        {"namespace": st.just(["notes"]) | JSON, "key": st.just("k") | JSON, "ttl": st.none() | JSON}
    ),
)


def test_memories_written_through_the_rest_api_are_passed_over(lg: PersistentMemoryStore) -> None:
    """A memory an owner wrote through the REST API with a ``langgraph`` field of its own
    (a number, an empty object, null, a mark of another key or of a bad TTL) is no item:
    search, list_namespaces and get pass it over instead of raising."""
    user = get_user_model().objects.create_user("rest-writer", password="pw-for-tests")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    owner = PersistentMemoryStore.for_owner(f"user:{user.pk}")
    owner.put(("notes",), "kept", {"text": "an item"})
    good = {"namespace": ["notes"], "key": "k", "ttl": None}
    written = [
        ({"langgraph": 1}, None),
        ({"langgraph": {}}, None),
        ({"langgraph": None}, "lg.notes.k"),
        ({"langgraph": "notes"}, "lg.notes.k"),
        ({"langgraph": {**good, "namespace": [1, 2]}}, None),
        ({"langgraph": {**good, "namespace": []}}, None),
        ({"langgraph": good, "value": 7}, "lg.notes.k"),
        ({"langgraph": {**good, "ttl": "soon"}}, "lg.notes.k"),
        ({"langgraph": {**good, "ttl": 1e300}}, "lg.notes.k"),
        ({"langgraph": good}, "not-the-item-key"),
    ]
    for metadata, key in written:
        body = {"content": f"written through the API {metadata}", "metadata": metadata}
        answer = client.post(
            "/api/memory/memories/", {**body, **({"key": key} if key else {})}, format="json"
        )
        assert answer.status_code in (200, 201), answer.content
        assert [item.key for item in owner.search(())] == ["kept"], metadata
        assert [item.key for item in owner.search(("notes",), query="written API")] == []
        assert [item.key for item in owner.search((), filter={"text": "an item"})] == ["kept"]
        assert owner.list_namespaces() == [("notes",)]
        assert owner.get(("notes",), "k") is None
        assert owner.get(("notes",), "kept").value == {"text": "an item"}
    # A page of items is the same page whatever lies between them.
    assert [item.key for item in owner.search((), limit=1, offset=0)] == ["kept"]
    assert owner.search((), limit=1, offset=1) == []


@hypothesis_settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(mark=MARKS, value=JSON, keyed=st.booleans())
def test_any_metadata_leaves_every_read_working(
    lg: PersistentMemoryStore, mark: Any, value: Any, keyed: bool
) -> None:
    """Whatever JSON a memory's ``langgraph`` and ``value`` fields hold, every read of the
    store answers (a mark that is exactly an item's reads as that item)."""
    LongTermMemory.objects.filter(owner=OWNER).delete()
    memories_for(OWNER).add(
        "any metadata", key="lg.notes.k" if keyed else None, metadata={"langgraph": mark, "value": value}
    )
    found = lg.search(())
    assert lg.search((), query="any metadata") == found
    assert lg.search(("notes",), filter={"text": "any"}) == []
    namespaces = lg.list_namespaces()
    item = lg.get(("notes",), "k")
    assert [i.key for i in found] == ([item.key] if item else [])
    assert namespaces == ([("notes",)] if item else [])
    assert lg.batch([ListNamespacesOp(match_conditions=(MatchCondition("prefix", ("notes",)),))]) == [
        namespaces
    ]


# --- What was said: the read-only ("conversations", session, conversation) namespaces ----------


@pytest.fixture
def said(db: Any, configure: Any) -> PersistentMemoryStore:
    """user:1's LangGraph store over conversations written through the session store (on
    each backend, mirrored when a read syncs), beside another owner's saying the same words
    and a memory item of user:1 saying them too."""
    store = configure(MIRROR_MODE="deferred")
    mine = store.for_owner(OWNER)
    mine.add_messages(
        "trip",
        [
            {"id": "q1", "role": "user", "name": "Ada", "content": "We fly to Lisbon on Friday."},
            {"id": "a1", "role": "assistant", "content": "Lisbon in spring: pack a light jacket."},
        ],
    )
    mine.add_messages(
        "trip", [{"id": "p1", "role": "user", "content": "Book the Lisbon dinner."}], conversation="planning"
    )
    mine.add_messages("work", [{"id": "w1", "role": "user", "content": "The quarterly report is due."}])
    # A "." in a conversation's name: no LangGraph label can hold it, so no item is made of it.
    mine.add_messages(
        "trip", [{"id": "d1", "role": "user", "content": "Lisbon, v2."}], conversation="plan.v2"
    )
    store.for_owner("user:2").add_messages(
        "theirs", [{"id": "x1", "role": "user", "content": "Lisbon again."}]
    )
    lg = PersistentMemoryStore.for_owner(OWNER)
    lg.put(("notes",), "n1", {"text": "Lisbon hotel: Alfama"})
    return lg


def said_keys(items: list[SearchItem]) -> list[tuple[tuple[str, ...], str]]:
    return [(item.namespace, item.key) for item in items]


def test_conversations_are_searched_ranked_and_scoped(said: PersistentMemoryStore) -> None:
    found = said.search(("conversations",), query="Lisbon dinner")
    assert said_keys(found)[0] == (("conversations", "trip", "planning"), "p1")  # both words
    assert sorted(said_keys(found)[1:]) == [
        (("conversations", "trip", "default"), "a1"),
        (("conversations", "trip", "default"), "q1"),
    ]  # never the memory item, never user:2's message
    assert found[0].score == 1.0 and all(0 < item.score <= found[0].score for item in found)
    assert found[0].value["content"] == "Book the Lisbon dinner."
    q1 = next(item for item in found if item.key == "q1")
    assert {k: v for k, v in q1.value.items() if k != "said_at"} == {
        "role": "user",
        "name": "Ada",
        "content": "We fly to Lisbon on Friday.",
    }
    assert datetime.fromisoformat(q1.value["said_at"]) == q1.created_at == q1.updated_at
    json.dumps(q1.value)  # a value is JSON, as every item's is

    # Narrowed by session, then by conversation; a deeper prefix holds nothing.
    assert sorted(said_keys(said.search(("conversations", "trip", "planning"), query="Lisbon"))) == [
        (("conversations", "trip", "planning"), "p1")
    ]
    assert said.search(("conversations", "work"), query="Lisbon") == []
    assert said.search(("conversations", "theirs"), query="Lisbon") == []  # user:2's session id
    assert said.search(("conversations", "trip", "default", "q1")) == []
    # LangGraph's filter on the value, and pages.
    assert sorted(keys(said.search(("conversations",), query="Lisbon", filter={"role": "user"}))) == [
        "p1",
        "q1",
    ]
    assert keys(said.search(("conversations",), query="Lisbon", limit=1, offset=1)) == keys(found)[1:2]
    # Without a query: newest first, without score.
    newest = said.search(("conversations", "trip", "default"))
    assert keys(newest) == ["a1", "q1"] and {item.score for item in newest} == {None}
    assert len(said.search(("conversations",))) == 4
    # Memories are searched as before, without messages.
    assert said_keys(said.search((), query="Lisbon")) == [(("notes",), "n1")]
    assert said_keys(said.search(())) == [(("notes",), "n1")]


def test_conversations_get_and_list_namespaces(said: PersistentMemoryStore) -> None:
    item = said.get(("conversations", "trip", "default"), "a1")
    assert isinstance(item, Item) and (item.namespace, item.key) == (
        ("conversations", "trip", "default"),
        "a1",
    )
    assert item.value["role"] == "assistant" and item.value["content"].startswith("Lisbon in spring")
    assert said.get(("conversations", "trip", "planning"), "a1") is None  # another conversation's
    assert said.get(("conversations", "trip"), "a1") is None
    assert said.get(("conversations", "theirs", "default"), "x1") is None  # user:2's
    assert (
        PersistentMemoryStore.for_owner("user:2").get(("conversations", "theirs", "default"), "x1").key
        == "x1"
    )

    assert said.list_namespaces() == [
        ("conversations", "trip", "default"),
        ("conversations", "trip", "planning"),
        ("conversations", "work", "default"),
        ("notes",),
    ]
    assert said.list_namespaces(prefix=("conversations", "trip")) == [
        ("conversations", "trip", "default"),
        ("conversations", "trip", "planning"),
    ]
    assert said.list_namespaces(max_depth=1) == [("conversations",), ("notes",)]
    assert said.list_namespaces(suffix=("planning",)) == [("conversations", "trip", "planning")]

    # A deleted session's messages are gone from every read.
    get_store().for_owner(OWNER).delete_session("work")
    assert said.search(("conversations", "work")) == []
    assert ("conversations", "work", "default") not in said.list_namespaces()


def test_conversations_are_read_only(said: PersistentMemoryStore) -> None:
    namespace = ("conversations", "trip", "default")
    with pytest.raises(InvalidNamespaceError, match="read-only"):
        said.put(namespace, "q1", {"content": "rewritten"})
    with pytest.raises(InvalidNamespaceError, match="read-only"):
        said.delete(namespace, "q1")
    with pytest.raises(InvalidNamespaceError, match="read-only"):
        said.put(("conversations",), "new", {"content": "a memory here"})
    # A batch holding a refused put runs nothing, its other puts included.
    with pytest.raises(InvalidNamespaceError):
        said.batch([PutOp(("notes",), "n2", {"text": "kept?"}), PutOp(namespace, "q1", None)])
    assert said.get(("notes",), "n2") is None
    assert said.get(namespace, "q1").value["content"] == "We fly to Lisbon on Friday."
    assert LongTermMemory.objects.filter(owner=OWNER).count() == 1

    with pytest.raises(InvalidNamespaceError, match="read-only"):
        asyncio.run(said.aput(namespace, "q1", {"content": "rewritten"}))


def test_conversations_can_be_left_out(said: PersistentMemoryStore) -> None:
    """``conversations=None``: the label is an ordinary namespace of memory items."""
    plain = PersistentMemoryStore.for_owner(OWNER, conversations=None)
    assert plain.search(("conversations",), query="Lisbon") == []
    plain.put(("conversations",), "mine", {"text": "an item"})
    assert plain.get(("conversations",), "mine").value == {"text": "an item"}
    assert plain.list_namespaces() == [("conversations",), ("notes",)]
    # The store with the root reserved reaches neither that item nor its namespace.
    assert said.get(("conversations",), "mine") is None
    assert ("conversations",) not in said.list_namespaces()
    assert said_keys(said.search(())) == [(("notes",), "n1")]
    # Another name for the root.
    renamed = PersistentMemoryStore.for_owner(OWNER, conversations="said")
    assert keys(renamed.search(("said", "work"), query="report")) == ["w1"]
    assert renamed.get(("conversations",), "mine").value == {"text": "an item"}
    with pytest.raises(InvalidNamespaceError):
        PersistentMemoryStore.for_owner(OWNER, conversations="a.b")
