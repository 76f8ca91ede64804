"""The session listing on Redis: what a page reads (bounded, however deep), and a session
whose keys were written over by hand (skipped by the listing, deletable)."""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from persistent_memory.backends.redis_layout import BUCKETS
from persistent_memory.owners import storage_id
from persistent_memory.store import MemoryStore
from tests.conftest import topology_settings

API = "/api/memory/"


@pytest.fixture(params=["redis", "redis-cluster-layout"])
def layout_store(request: pytest.FixtureRequest, settings: Any) -> MemoryStore:
    """The process store on one Redis server, in the node or the cluster key layout."""
    from persistent_memory import get_store

    settings.PERSISTENT_MEMORY = {
        "BACKEND": "redis",
        "MIRROR_MODE": "off",
        **topology_settings(request.param, request),
    }
    return get_store()


#: A session's own keys, in Layout.session_keys' order.
DAMAGED = ("meta", "key set", "history", "runs", "conversations")
USER_PK = 4343
OWNER = f"user:{USER_PK}"


def session_keys(store: MemoryStore, owner: str, session_id: str) -> tuple[str, ...]:
    """The session's own keys: meta, key set, history, ..."""
    return store.backend.layout.session_keys(storage_id(owner, session_id))


@pytest.fixture
def api(db: Any) -> APIClient:
    """The API as the user whose sessions are ``OWNER``'s."""
    user = get_user_model().objects.create_user("lister", password="pw-for-tests", pk=USER_PK)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


class TestDamagedSession:
    """A session whose keys are not of their type (written over by hand)."""

    @pytest.mark.parametrize("damaged", ["meta", "key set", "history"])
    def test_the_listing_skips_it_and_logs_it(self, layout_store, redis_client, damaged, caplog):
        alice = layout_store.for_owner("user:1")
        for i in range(4):
            alice.create_session(f"s{i}")
            alice.put(f"s{i}", "k", i)
        key = session_keys(layout_store, "user:1", "s2")[DAMAGED.index(damaged)]
        redis_client.delete(key)
        redis_client.set(key, "written over")
        with caplog.at_level(logging.WARNING, "persistent_memory.backends.redis"):
            total, infos = alice.list_session_page(limit=10)
        assert [info["session_id"] for info in infos] == ["s3", "s1", "s0"]
        assert total == 3
        assert "skipped 1 session" in caplog.text
        assert [i["session_id"] for i in alice.session_page(limit=2).sessions] == ["s3", "s1"]

    @pytest.mark.parametrize("damaged", ["meta", "key set", "history", "runs", "conversations"])
    def test_the_api_deletes_it(self, layout_store, redis_client, api, damaged):
        store = layout_store.for_owner(OWNER)
        for i in range(3):
            store.create_session(f"s{i}")
            store.put(f"s{i}", "k", i)
        store.add_messages("s1", [{"role": "user", "content": "hi"}])
        key = session_keys(layout_store, OWNER, "s1")[DAMAGED.index(damaged)]
        redis_client.delete(key)
        redis_client.set(key, "written over")
        response = api.delete(API + "sessions/s1/")
        assert response.status_code == 200, response.content
        assert response.json()["session_id"] == "s1"
        storage = storage_id(OWNER, "s1").encode()
        assert [key for key in redis_client.keys("*") if storage in key] == []
        assert api.get(API + "sessions/s1/").status_code == 404
        body = api.get(API + "sessions/").json()
        assert (body["count"], [s["session_id"] for s in body["results"]]) == (2, ["s2", "s0"])

    def test_the_api_lists_around_it(self, layout_store, redis_client, api):
        store = layout_store.for_owner(OWNER)
        for i in range(3):
            store.create_session(f"s{i}")
        meta = session_keys(layout_store, OWNER, "s1")[0]
        redis_client.delete(meta)
        redis_client.set(meta, "written over")
        body = api.get(API + "sessions/").json()
        assert (body["count"], [s["session_id"] for s in body["results"]]) == (2, ["s2", "s0"])


def ranges_read(redis_client: Any, call: Any) -> Counter:
    """How many ids each sorted set's ZREVRANGE/ZREVRANGEBYSCORE asked for while ``call``
    ran (MONITOR shows the commands of scripts too)."""
    asked: Counter = Counter()
    with redis_client.monitor() as monitor:
        call()
        redis_client.echo("listing-read-done")
        for event in monitor.listen():
            words = event["command"].split()
            if "listing-read-done" in event["command"]:
                return asked
            name = words[0].upper()
            if name == "ZREVRANGE":
                asked[words[1]] += int(words[3]) - int(words[2]) + 1
            elif name == "ZREVRANGEBYSCORE" and "LIMIT" in words:
                asked[words[1]] += int(words[words.index("LIMIT") + 2])
    raise AssertionError("MONITOR ended early")


class TestBoundedReads:
    """However deep a page, it reads about ``limit`` ids per bucket (not offset + limit)."""

    LIMIT = 5

    @pytest.fixture
    def owner(self, layout_store: MemoryStore) -> MemoryStore:
        owner = layout_store.for_owner("user:1")
        # Spread over 64 buckets, ~23 each in the cluster layout: far more than a page's share.
        for i in range(1500 if layout_store.backend.layout.cluster else 200):
            owner.create_session(f"s{i:04d}")
        return owner

    def test_a_deep_page_by_cursor(self, owner, redis_client):
        cluster = owner.backend.layout.cluster
        deep = owner.session_page(offset=1000 if cluster else 150, limit=self.LIMIT)
        ids = [i["session_id"] for i in deep.sessions]
        found: list = []
        asked = ranges_read(
            redis_client, lambda: found.append(owner.session_page(cursor=deep.next_cursor, limit=self.LIMIT))
        )
        everything = [i["session_id"] for i in owner.session_page(limit=10_000).sessions]
        start = everything.index(ids[-1]) + 1
        assert [i["session_id"] for i in found[0].sessions] == everything[start : start + self.LIMIT]
        assert asked, "the page read nothing"
        # one more than the page (whether another follows), a bucket's share of it, or twice that
        assert max(asked.values()) <= 2 * (self.LIMIT + 1), asked
        if cluster:
            assert len(asked) <= BUCKETS and sum(asked.values()) <= BUCKETS * 4, asked
        else:
            assert sum(asked.values()) == self.LIMIT + 1, asked

    def test_an_offset_reads_about_as_many_ids_as_it_skips(self, owner, redis_client):
        cluster = owner.backend.layout.cluster
        offset = 1000 if cluster else 150
        asked = ranges_read(redis_client, lambda: owner.list_session_page(offset=offset, limit=self.LIMIT))
        if cluster:  # every bucket its share of the ids skipped: 2 x even, and a few more
            assert max(asked.values()) <= 4 * (offset + self.LIMIT + 1) // BUCKETS + 8, asked
            assert sum(asked.values()) <= 3 * (offset + self.LIMIT), asked
        else:  # one index: a range from the offset
            assert sum(asked.values()) == self.LIMIT + 1, asked


def test_the_operators_listing_leaves_out_a_damaged_session(layout_store, redis_client):
    for i in range(3):
        layout_store.create_session(f"s{i}")
    meta = session_keys(layout_store, "", "s1")[0]
    redis_client.delete(meta)
    redis_client.set(meta, "written over")
    assert [info["session_id"] for info in layout_store.list_session_infos()] == ["s2", "s0"]
    layout_store.delete_session("s1")
    assert redis_client.exists(meta) == 0


@pytest.mark.parametrize("backend_name", ["memory", "redis"])
def test_a_cursor_holds_the_callers_own_id_and_fits_the_longest_owner(store, backend_name):
    """The cursor names the session as its owner does (no storage id): with the longest
    owner and session ids the listing's own cursors are still read on, not refused."""
    owner = "o" * 200
    scoped = store.for_owner(owner)
    ids = ["s" * 127 + str(index) for index in range(3)]
    for session_id in ids:
        scoped.create_session(session_id)
    first = scoped.session_page(limit=2)
    assert first.next_cursor is not None and owner not in first.next_cursor
    rest = scoped.session_page(cursor=first.next_cursor, limit=2)
    assert [info["session_id"] for info in first.sessions + rest.sessions] == ids[::-1]
