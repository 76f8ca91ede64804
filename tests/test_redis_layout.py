"""The Redis key layouts pinned to golden values, and the listing indexes kept per namespace.

The layouts are stored data: a changed bucket count, tag or key name leaves what is stored
unreachable (``memory_relayout`` moves data between the two layouts, never between
versions of one), so each is checked against the values it has always had, not against
what the code computes today.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from persistent_memory import get_store
from persistent_memory.backends.redis.layout import BUCKETS, TAGS, Layout, _tag, bucket_of, swept
from tests.conftest import memory_settings_for

PREFIX = "rr:memory"
SID = "~o:user:1~s1"  # session "s1" of owner "user:1"
ROOT = f"{PREFIX}:{{b29.526}}"  # its bucket's root (bucket 29)


def test_the_buckets_and_their_tags_never_change():
    assert BUCKETS == 64
    assert len(TAGS) == 64 and (TAGS[:3], TAGS[-3:]) == (
        ("b0.56", "b1.371", "b2.193"),
        ("b61.41", "b62.1", "b63.323"),
    )
    assert hashlib.sha256(",".join(TAGS).encode()).hexdigest() == (
        "296db7aae61046324cb5327aebb95a927d48138e11af7c9612e3e7ee3fd5f94c"
    )
    # Why these: bucket b's tag hashes within 16 slots of the middle of slots [256 b, 256 b + 256).
    for bucket, tag in enumerate(TAGS):
        assert abs(key_slot(tag.encode()) - (256 * bucket + 128)) <= 16
    # And the rule still picks them (TAGS is computed once, at import).
    assert tuple(_tag(bucket) for bucket in range(BUCKETS)) == TAGS


def test_a_session_keeps_its_bucket():
    ids = ["s1", SID, "", "session-42", "~o:tenant:acme~thread-7"]
    assert [bucket_of(sid) for sid in ids] == [48, 29, 0, 57, 50]
    cluster = Layout(PREFIX, cluster=True)
    assert [cluster.root_of(sid) for sid in ids[:2]] == [f"{PREFIX}:{{b48.24}}", ROOT]
    assert Layout(PREFIX, cluster=False).root_of(SID) == PREFIX


def test_the_node_layouts_key_names():
    node = Layout(PREFIX, cluster=False)
    assert (node.name, node.roots()) == ("node", [PREFIX])
    own = [f"{PREFIX}:s1:{name}" for name in ("__meta__", "__keys__", "__history__", "~runs", "~convs")]
    shared = [f"{PREFIX}:{name}" for name in ("~sessions", "~names", "__sessions__", "~owned", "~dirty")]
    shared += [f"{PREFIX}:~summarize", f"{PREFIX}:~summarizer"]
    varying = [f"{PREFIX}:~idem:k", f"{PREFIX}:~run:r1", f"{PREFIX}:s1:n"]
    checkpoints = [f"{PREFIX}:s1:~cp", f"{PREFIX}:s1:~cpi"]
    conversation = [
        f"{PREFIX}:s1:~c:default{suffix}" for suffix in ("", ":m", ":l", ":t", ":s", ":k", ":o", ":y", ":x")
    ]
    keys = node.keys("s1", idempotency="~idem:k", run="~run:r1", key="n", conversation="default")
    assert keys == own + shared + varying + [f"{PREFIX}:~search"] + checkpoints + conversation
    # Without them, the node's set stands in (a script may only name keys it declares).
    stand_in = [f"{PREFIX}:__sessions__"] * 3
    assert node.keys("s1") == own + shared + stand_in + [f"{PREFIX}:~search"] + checkpoints
    assert node.index_keys(PREFIX, ["s1", "~o:a~s2", "~o:a~s3"]) == [
        f"{PREFIX}:s1:__meta__",
        f"{PREFIX}:~sessions",
        f"{PREFIX}:~names",
        f"{PREFIX}:~o:a~s2:__meta__",
        f"{PREFIX}:~o:a~:sessions",
        f"{PREFIX}:~o:a~:names",
        f"{PREFIX}:~o:a~s3:__meta__",
    ]
    assert node.run_pointer("~run:r1") == f"{PREFIX}:~run:r1"


def test_the_cluster_layouts_key_names():
    cluster = Layout(PREFIX, cluster=True)
    assert cluster.name == "cluster"
    assert cluster.roots() == [f"{PREFIX}:{{{tag}}}" for tag in TAGS]
    keys = cluster.keys(
        SID, idempotency="~o:user:1~:idem:k", run="~o:user:1~:run:r1", key="n", conversation="c"
    )
    names = [key.removeprefix(f"{ROOT}:") for key in keys]
    assert all(key.startswith(f"{ROOT}:") for key in keys)
    assert names == [
        *(f"{SID}:{name}" for name in ("__meta__", "__keys__", "__history__", "~runs", "~convs")),
        "~o:user:1~:sessions",
        "~o:user:1~:names",
        "__sessions__",
        "~owned",
        "~dirty",
        "~summarize",
        "~summarizer",
        "~o:user:1~:idem:k",
        "~o:user:1~:run:r1",
        f"{SID}:n",
        "~search",
        f"{SID}:~cp",
        f"{SID}:~cpi",
        *(f"{SID}:~c:c{suffix}" for suffix in ("", ":m", ":l", ":t", ":s", ":k", ":o", ":y", ":x")),
    ]
    assert cluster.conversation_keys(SID, "c") == keys[18:]
    assert cluster.value_key(SID, "n") == keys[14]
    # A call on a bucket (no session): its listing of a namespace, the node's set elsewhere,
    # and room for a conversation's keys before the extra keys.
    root = cluster.roots()[5]
    keys = cluster.keys("", root=root, namespace="~o:user:1~", extra=["x"])
    assert keys == [f"{root}:__sessions__"] * 5 + [
        f"{root}:~o:user:1~:sessions",
        f"{root}:~o:user:1~:names",
        *(f"{root}:{name}" for name in ("__sessions__", "~owned", "~dirty", "~summarize", "~summarizer")),
        *[f"{root}:__sessions__"] * 3,
        f"{root}:~search",
        *[f"{root}:__sessions__"] * 11,
        "x",
    ]
    assert cluster.keys("")[5] == f"{PREFIX}:{{{TAGS[0]}}}:~sessions"
    assert cluster.run_pointer("~o:user:1~:run:r1") == f"{PREFIX}:~o:user:1~:run:r1"
    assert cluster.slot(keys[0]) == key_slot(TAGS[5].encode())


@pytest.mark.parametrize(
    ("rest", "kind"),
    [
        ("~run:r-1", ("b", None)),
        ("~o:user:a~:run:r1", ("b", None)),
        ("~idem:k", ("", None)),
        ("~o:user:a~:idem:k", ("", None)),
        ("s1:~c:default:m", ("k", "s1")),
        ("~o:user:a~s1:~c:x", ("k", "~o:user:a~s1")),
        ("s1:__meta__", ("k", "s1")),
        ("s1:a.b-c_d", ("k", "s1")),
        ("~o:a~s1:~cpi", ("k", "~o:a~s1")),
        ("s1:~runs", ("i", "s1")),
        ("~o:a~s1:~runs", ("i", "~o:a~s1")),
        ("__sessions__", ("", None)),
        ("~sessions", ("", None)),
        ("~o:user:a~:sessions", ("", None)),
        ("s1:__sessions__", ("", None)),
        ("other:prefix:s1:k", ("", None)),  # another deployment's, its prefix starting with ours
        ("s 1:k", ("", None)),
        ("s1:a b", ("", None)),
    ],
)
def test_what_the_sweep_makes_of_a_key(rest, kind):
    assert swept(rest) == kind


@pytest.mark.parametrize("layout", ["node", "cluster"])
def test_each_owner_has_a_listing_of_its_own(
    layout, settings: Any, redis_client: redis.Redis, redis_url: str
):
    """Two owners' sessions (same ids, in one bucket and in others) are listed apart, in
    their namespace's own index."""
    settings.PERSISTENT_MEMORY = memory_settings_for("redis", redis_url, REDIS_LAYOUT=layout)
    store = get_store()
    owners = {"user:a": ["s1", "s2", "shared"], "user:b": ["shared", "s3"], "": ["shared", "s4"]}
    for owner, ids in owners.items():
        for session_id in ids:
            store.for_owner(owner).create_session(session_id)
    for owner, ids in owners.items():
        assert sorted(store.for_owner(owner).list_sessions()) == sorted(ids)
    # The index itself: one sorted set per namespace and bucket, naming only its own ids.
    layout_of = store.backend.layout
    listed: dict[str, set[bytes]] = {}
    for key in redis_client.scan_iter(match="*sessions"):
        if not key.endswith(b":__sessions__"):
            listed.setdefault(key.decode(), set()).update(redis_client.zrange(key, 0, -1))
    expected: dict[str, set[bytes]] = {}
    for owner, ids in owners.items():
        for session_id in ids:
            sid = f"~o:{owner}~{session_id}" if owner else session_id
            listing = layout_of.keys(sid)[5]
            assert listing.endswith(f":~o:{owner}~:sessions" if owner else ":~sessions")
            expected.setdefault(listing, set()).add(sid.encode())
    assert listed == expected
