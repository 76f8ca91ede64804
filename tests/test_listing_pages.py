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

from persistent_memory.backends.redis.layout import BUCKETS, bucket_of
from persistent_memory.backends.redis.listing import _page_of, _position
from persistent_memory.owners import storage_id
from persistent_memory.store import MAX_PAGE_OFFSET, MemoryStore
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
    user = get_user_model().objects.create_user("lister", pk=USER_PK)
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


@pytest.fixture(params=["memory", "redis", "redis-cluster-layout", "redis-cluster"])
def any_store(request: pytest.FixtureRequest, settings: Any) -> MemoryStore:
    """The process store on memory, on one Redis server in either layout, or on a real cluster."""
    from persistent_memory import get_store

    topology = {"BACKEND": "memory"} if request.param == "memory" else {"BACKEND": "redis"}
    if request.param != "memory":
        topology.update(topology_settings(request.param, request))
    room = {"MAX_SESSIONS": 10_000, "MAX_SESSIONS_PER_OWNER": 10_000}
    settings.PERSISTENT_MEMORY = {"MIRROR_MODE": "off", **room, **topology}
    return get_store()


def read_by_cursor(store: MemoryStore, prefix: str, limit: int) -> list[str]:
    """Every session id of the listing (searched for ``prefix``), page after page by cursor."""
    ids: list[str] = []
    cursor = None
    while True:
        page = store.session_page(prefix, cursor=cursor, limit=limit)
        ids += [info["session_id"] for info in page.sessions]
        if page.next_cursor is None:
            return ids
        cursor = page.next_cursor


def page_ids(page: Any) -> list[str]:
    return [info["session_id"] for info in page.sessions]


def commands_run(redis_client: Any, call: Any) -> Counter:
    """How many times each command ran while ``call`` ran (MONITOR shows those of scripts)."""
    seen: Counter = Counter()
    with redis_client.monitor() as monitor:
        call()
        redis_client.echo("listing-commands-done")
        for event in monitor.listen():
            if "listing-commands-done" in event["command"]:
                return seen
            seen[event["command"].split()[0].upper()] += 1
    raise AssertionError("MONITOR ended early")


class TestOffsets:
    """An offset counts places in the listing's index, as the node layout's rank range does.
    In the cluster layout the places skipped are read as rank ranges of every bucket (a
    search: each bucket's walk of its time index, or its matches ordered by time), merged,
    and a bucket whose part may reach the page is read on: the pages are the listing's own."""

    def test_offset_pages_are_the_listing_read_by_cursor(self, any_store: MemoryStore) -> None:
        alice, bob = any_store.for_owner("user:1"), any_store.for_owner("user:2")
        for i in range(1200):  # ~19 of alice's a bucket in the cluster layout
            alice.create_session(f"{'ab'[i % 2]}-{i:04d}")
            if i % 4 == 0:
                bob.create_session(f"a-{i:04d}")
        # every id, half of them, 50 (a few a bucket: each walks its index) and 5 (each
        # orders its matches)
        for prefix, matches in (("", 1200), ("a-", 600), ("b-01", 50), ("a-000", 5)):
            everything = read_by_cursor(alice, prefix, 37)
            assert len(everything) == matches and len(set(everything)) == matches
            assert all(session_id.startswith(prefix) for session_id in everything)
            offsets = {0, 1, 4, 63, 64, 65, 333, matches - 9, matches - 1, matches, MAX_PAGE_OFFSET}
            for offset in sorted(offset for offset in offsets if 0 <= offset <= MAX_PAGE_OFFSET):
                total, infos = alice.list_session_page(prefix, offset=offset, limit=9)
                assert [info["session_id"] for info in infos] == everything[offset : offset + 9], offset
                assert total == matches
            # an offset from a cursor's position
            cursor = alice.session_page(prefix, limit=3).next_cursor
            assert page_ids(alice.session_page(prefix, cursor=cursor, offset=2, limit=9)) == everything[5:14]
        assert len(read_by_cursor(bob, "a-", 50)) == 300  # the other owner's, untouched

    @pytest.mark.parametrize("layout", ["redis", "redis-cluster-layout"])
    def test_a_damaged_session_keeps_its_place(self, layout, request, settings, redis_client) -> None:
        from persistent_memory import get_store

        settings.PERSISTENT_MEMORY = {
            "BACKEND": "redis",
            "MIRROR_MODE": "off",
            **topology_settings(layout, request),
        }
        store = get_store()
        alice, bob = store.for_owner("user:1"), store.for_owner("user:2")
        for i in range(300):
            alice.create_session(f"s-{i:03d}")
            bob.create_session(f"s-{i:03d}")
        index = [f"s-{i:03d}" for i in reversed(range(300))]  # newest first
        damaged = ["s-250", "s-100"]  # places 49 and 199
        for session_id in damaged:
            meta = session_keys(store, "user:1", session_id)[0]
            redis_client.delete(meta)
            redis_client.set(meta, "written over")
        everything = read_by_cursor(alice, "", 20)
        assert everything == [sid for sid in index if sid not in damaged]
        for offset in (0, 30, 48, 49, 50, 51, 150, 198, 199, 200, 290):
            total, infos = alice.list_session_page(offset=offset, limit=10)
            expected = [sid for sid in index[offset:] if sid not in damaged][:10]
            assert [info["session_id"] for info in infos] == expected, offset
            assert 298 <= total <= 300  # those the page met are left out of the count
        assert alice.list_session_page(limit=300)[0] == 298  # met them all
        assert read_by_cursor(bob, "", 100) == index

    def test_a_bucket_walks_its_index_or_orders_its_matches(self, layout_store, redis_client) -> None:
        """In the cluster layout a wide search walks each bucket's time index; a narrow one
        orders each bucket's few matches by time (the node layout: its one index)."""
        alice = layout_store.for_owner("user:1")
        for i in range(1500):
            alice.create_session(f"s{i:04d}")
        wide = commands_run(redis_client, lambda: alice.session_page("s1", limit=10))
        narrow = commands_run(redis_client, lambda: alice.session_page("s000", limit=10))
        if layout_store.backend.layout.cluster:
            assert wide["ZREVRANGE"] >= 32 and wide["ZRANGEBYLEX"] == 0, wide
            assert narrow["ZRANGEBYLEX"] >= 5, narrow
        assert [i["session_id"] for i in alice.session_page("s000", limit=10).sessions] == [
            f"s{i:04d}" for i in range(9, -1, -1)
        ]


def test_a_bucket_reads_its_part_from_where_it_stopped(settings, request, redis_client) -> None:
    """'bucket_page' (the cluster layout's part of a page): at most ``keep`` sessions, from
    about ``part`` times the bucket's ids per match (a walk of its time index), or from
    its matches ordered by time when it holds far fewer; then on from the position it
    answered, until it says it holds nothing more."""
    from persistent_memory import get_store

    settings.PERSISTENT_MEMORY = {
        "BACKEND": "redis",
        "MIRROR_MODE": "off",
        **topology_settings("redis-cluster-layout", request),
    }
    store = get_store()
    alice, backend = store.for_owner("user:1"), store.backend
    in_bucket = [f"s{i:05d}" for i in range(20_000) if bucket_of(storage_id("user:1", f"s{i:05d}")) == 0]
    others, hits = (
        [sid for sid in in_bucket if sid < "s1"][:108],
        [sid for sid in in_bucket if sid >= "s1"][:12],
    )
    created = []
    for i, session_id in enumerate(others):  # 120 sessions in bucket 0, 12 matching "s1" among them
        created += [session_id] if i % 9 else [hits[i // 9], session_id]
    for session_id in created:
        alice.create_session(session_id)
    matches = [sid for sid in created if sid in hits][::-1]
    namespace = storage_id("user:1", "")
    root = backend.layout.roots()[0]

    def read(part: float, keep: int, after: tuple[float, str] | None) -> tuple[list[str], Any]:
        command = backend._command(
            "bucket_page", "", (namespace + "s1", repr(part), str(keep), *_position(after), ""), root=root
        )
        reply = backend.transport.checked(backend.transport.run_many([command]))[0]
        count, infos = _page_of(reply, ids_only=False, first=5)
        assert count == len(matches)
        found = [info["session_id"][len(namespace) :] for info in infos]
        return found, (float(reply[3]), reply[4].decode()) if reply[4] else None

    for part, keep in ((5.0, 2), (0.2, 2), (1.0, 5)):  # matches ordered; a walk; a walk
        seen, after, rounds = [], None, 0
        while True:
            found, after = read(part, keep, after)
            assert len(found) <= keep
            seen += found
            rounds += 1
            if after is None:
                break
        assert seen == matches, (part, keep)
        assert rounds >= len(matches) // keep
