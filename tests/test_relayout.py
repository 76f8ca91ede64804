"""memory_relayout: every session copied from the node layout to the cluster layout on one
server, and from there into a real Redis Cluster, reads the same (values, history,
conversations with branches and a rolling summary, TTLs as the same absolute expiry);
a second run writes nothing, an interrupted run finishes when started again, a dry run
writes nothing, and the node layout's keys are left byte for byte as they were."""

from __future__ import annotations

import io
import re
import time
from typing import Any

import pytest
import redis
from django.core.management import call_command
from django.core.management.base import CommandError
from redis.crc import key_slot

from persistent_memory import get_store
from persistent_memory.backends.conversations import Summary
from persistent_memory.backends.redis import RedisBackend
from persistent_memory.conf import MemorySettings
from persistent_memory.operations.relayout import relayout, relayout_backends
from persistent_memory.owners import storage_id
from persistent_memory.store import MemoryStore
from tests.conftest import memory_settings_for
from tests.redis_topologies import poll
from tests.test_conversations_mirror import chat

PREFIX = "rr:memory"
#: Bulk sessions, so that a run with BATCH takes several batches.
BULK = 12
BATCH = "4"
#: Live sessions populate() leaves, and the one it leaves expired.
LIVE = BULK + 6
#: Two absolute expiries are the same within this (the copy sets the time left when it
#: runs); far below the 6600 s an expiry reset to the full TTL would be off by.
TOLERANCE = 60.0
#: The aged session's fixed TTL and the time it has left.
AGED_TTL, AGED_LEFT = 7200, 600


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("memory_relayout", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def counts(output: str) -> tuple[int, int, int]:
    """(copied, up to date, expired) from the final line."""
    match = re.search(
        r"(?:Copied|would copy) (\d+) sessions, skipped (\d+) up to date, (\d+) expired", output
    )
    assert match, output
    return int(match[1]), int(match[2]), int(match[3])


def backend(url: str, layout: str, topology: str = "single") -> RedisBackend:
    conf = {**memory_settings_for("redis", url), "REDIS_LAYOUT": layout, "REDIS_TOPOLOGY": topology}
    return RedisBackend.from_settings(MemorySettings(conf))


def every_session(backend: RedisBackend) -> dict[str, Any]:
    """Every live session's snapshot, by storage id."""
    ids: list[str] = []
    cursor = 0
    while True:
        cursor, batch = backend.scan_sessions(cursor, 100)
        ids.extend(batch)
        if cursor == 0:
            break
    return {sid: snap for sid, snap in backend.snapshots(sorted(set(ids))).items() if snap is not None}


def assert_same_sessions(source: dict[str, Any], target: dict[str, Any]) -> None:
    assert sorted(target) == sorted(source)
    for sid, snap in source.items():
        copy = target[sid]
        assert copy["values"] == snap["values"], sid
        assert copy["history"] == snap["history"], sid
        assert copy.get("conversations") == snap.get("conversations"), sid
        info, copied = snap["info"], copy["info"]
        for name in ("created_at", "ttl_seconds", "idle_ttl_seconds", "key_count", "history_length"):
            assert copied[name] == info[name], (sid, name)
        if info["expires_at"] is None:
            assert copied["expires_at"] is None, sid
        else:
            assert abs(copied["expires_at"] - info["expires_at"]) < TOLERANCE, sid


def populate(store: MemoryStore) -> None:
    """Values, counters, history, conversations with branches and a summary, owned and unowned
    sessions, fixed, idle and aged TTLs, and one session expired (its id still in the set)."""
    store.create_session("plain", ttl_seconds=0)
    store.put("plain", "text", "héllo")
    store.put("plain", "nested", {"a": [1, 2.5, None, True], "b": {"c": "d"}})
    store.increment("plain", "counter", 5)
    store.increment("plain", "counter", -2)
    chat(store, "plain")
    chat(store, "plain", "second")
    store.set_head("plain", "a2", conversation="second")
    owned = store.for_owner("user:1")
    owned.create_session("owned", ttl_seconds=3600)
    owned.put("owned", "k", [1, 2, 3])
    chat(owned, "owned")
    sid = storage_id("user:1", "owned")
    assert store.backend.commit_summary(
        sid, "default", None, Summary("The weather in Paris.", "t1", 4, 12, 30)
    )
    store.create_session("idle", ttl_seconds=7200, idle_ttl_seconds=900)
    store.put("idle", "k", 1)
    store.create_session("idle-only", ttl_seconds=0, idle_ttl_seconds=1200)
    store.for_owner("user:2").create_session("empty", ttl_seconds=0)
    # A session with a fixed TTL that has run for a while: only restore can write that.
    aged = store.backend.snapshots(["plain"])["plain"]
    assert aged is not None
    aged["info"] = {
        **aged["info"],
        "session_id": "aged",
        "ttl_seconds": AGED_TTL,
        "expires_at": time.time() + AGED_LEFT,
    }
    store.backend.restore_session(aged, replace=False)
    for number in range(BULK):
        store.create_session(f"bulk-{number}", ttl_seconds=0)
        store.put(f"bulk-{number}", "n", number)
    store.create_session("gone", ttl_seconds=0.05)
    poll(lambda: "gone" not in store.backend.existing(["gone"]) or None, "the session to expire")


def dump(client: redis.Redis | redis.cluster.RedisCluster) -> dict[bytes, tuple[bytes, bool]]:
    """Every key's DUMP and whether it expires."""
    keys = sorted(client.scan_iter(count=1000))
    return {key: (client.dump(key), client.pttl(key) > 0) for key in keys}


@pytest.fixture
def single(settings: Any, redis_client: redis.Redis, redis_url: str) -> MemoryStore:
    """The process store on one server in the node layout, populated."""
    settings.PERSISTENT_MEMORY = memory_settings_for("redis", redis_url)
    store = get_store()
    assert store.backend.layout.name == "node"
    populate(store)
    return store


def test_to_the_cluster_layout_on_the_same_server(single, redis_client, redis_url, settings):
    node = backend(redis_url, "node")
    before = every_session(node)
    assert len(before) == LIVE
    assert before["aged"]["info"]["ttl_seconds"] == AGED_TTL
    assert before[storage_id("user:1", "owned")]["conversations"]["default"]["summaries"]
    node_keys = dump(redis_client)

    output = run("--to", "cluster", "--batch-size", BATCH, "-v", "2")
    assert counts(output) == (LIVE, 0, 1)
    assert len(re.findall(r"batch \d+:", output)) >= (LIVE + 1) // int(BATCH)

    cluster = backend(redis_url, "cluster")
    after = every_session(cluster)
    assert_same_sessions(before, after)
    # The aged session keeps its absolute expiry, not a fresh TTL.
    assert abs(after["aged"]["info"]["expires_at"] - (time.time() + AGED_LEFT)) < TOLERANCE
    # The node layout is as it was, byte for byte (RocketRide reads it).
    everything = dump(redis_client)
    assert {key: everything[key] for key in node_keys} == node_keys
    assert all(key.startswith(f"{PREFIX}:{{b".encode()) for key in everything.keys() - node_keys.keys())

    # Idempotent: a second run writes nothing.
    assert counts(run("--to", "cluster", "--batch-size", BATCH)) == (0, LIVE, 1)
    assert dump(redis_client) == everything

    # The application in the cluster layout reads what it read in the node layout.
    answers = {
        "plain": single.get_all("plain"),
        "history": single.get_history("plain", 0),
        "messages": single.get_messages("plain", conversation="second"),
    }
    settings.PERSISTENT_MEMORY = {**settings.PERSISTENT_MEMORY, "REDIS_LAYOUT": "cluster"}
    moved = get_store()
    assert moved.backend.layout.name == "cluster"
    assert {
        "plain": moved.get_all("plain"),
        "history": moved.get_history("plain", 0),
        "messages": moved.get_messages("plain", conversation="second"),
    } == answers
    assert sorted(moved.list_sessions()) == sorted(sid for sid in before if not sid.startswith("~o:"))


def test_a_dry_run_writes_nothing(single, redis_client):
    keys = dump(redis_client)
    size = redis_client.dbsize()
    assert counts(run("--to", "cluster", "--dry-run")) == (LIVE, 0, 1)
    assert redis_client.dbsize() == size
    assert dump(redis_client) == keys


def test_a_changed_session_is_copied_again(single, redis_url):
    run("--to", "cluster")
    single.put("plain", "text", "changed")
    single.add_messages("idle", [{"id": "x", "role": "user", "content": "hi"}])
    assert counts(run("--to", "cluster")) == (2, LIVE - 2, 1)
    assert_same_sessions(
        every_session(backend(redis_url, "node")), every_session(backend(redis_url, "cluster"))
    )


def test_an_interrupted_run_finishes_when_started_again(single, redis_url):
    source, target = relayout_backends(to="cluster")

    def interrupt(report: Any) -> None:
        raise KeyboardInterrupt  # as Ctrl-C after the first batch

    first = relayout(source, target, batch_size=int(BATCH), progress=interrupt)
    assert first.interrupted and first.batches == 1
    assert 0 < first.copied < LIVE
    assert len(every_session(target)) == first.copied  # whole sessions only
    output = run("--to", "cluster", "--batch-size", BATCH)
    assert counts(output) == (LIVE - first.copied, first.copied, 1)
    assert_same_sessions(every_session(source), every_session(target))
    source.close()
    target.close()


def test_ctrl_c_ends_the_command_with_what_to_do(single, redis_url, monkeypatch):
    from persistent_memory.management.commands.memory_relayout import Command

    def interrupt(self: Any, report: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(Command, "_batch_done", interrupt)
    out = io.StringIO()
    with pytest.raises(CommandError, match="run the command again"):
        call_command("memory_relayout", "--to", "cluster", "--batch-size", BATCH, stdout=out)
    copied, _, _ = counts(out.getvalue())
    assert 0 < copied == len(every_session(backend(redis_url, "cluster"))) < LIVE
    monkeypatch.undo()
    assert counts(run("--to", "cluster"))[:2] == (LIVE - copied, copied)


def test_into_a_real_cluster(single, redis_url, redis_cluster, redis_cluster_client, settings):
    run("--to", "cluster")
    # Configured in the cluster layout now; its sessions go into the real cluster.
    settings.PERSISTENT_MEMORY = {**settings.PERSISTENT_MEMORY, "REDIS_LAYOUT": "cluster"}
    source = every_session(backend(redis_url, "cluster"))
    into = ("--to", "cluster", "--target-url", redis_cluster.url, "--target-topology", "cluster")
    assert counts(run(*into, "--batch-size", BATCH)) == (LIVE, 0, 0)
    on_cluster = backend(redis_cluster.url, "cluster", "cluster")
    assert_same_sessions(source, every_session(on_cluster))
    keys = dump(redis_cluster_client)
    # Spread over the primaries, as the buckets are.
    owners = redis_cluster.slot_owners(redis_cluster.alive()[0])
    assert len({owners[key_slot(key)] for key in keys}) == len(redis_cluster.primaries())

    assert counts(run(*into)) == (0, LIVE, 0)
    assert dump(redis_cluster_client) == keys
    on_cluster.close()


def test_delete_source_removes_each_copied_session(single, redis_client, redis_url):
    before = every_session(backend(redis_url, "node"))
    output = run("--to", "cluster", "--delete-source")
    assert counts(output) == (LIVE, 0, 1) and f"deleted {LIVE} from the source" in output
    assert every_session(backend(redis_url, "node")) == {}
    assert_same_sessions(before, every_session(backend(redis_url, "cluster")))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--to", "node", "--from", "node"), "same server"),
        (("--to", "node", "--target-url", "redis://127.0.0.1:1/0", "--target-topology", "cluster"), "only"),
        (("--to", "cluster", "--dry-run", "--delete-source"), "deletes nothing"),
    ],
)
def test_refused(single, args, message):
    with pytest.raises(CommandError, match=message):
        run(*args)


def test_refused_on_the_memory_backend(settings):
    settings.PERSISTENT_MEMORY = memory_settings_for("memory")
    with pytest.raises(CommandError, match="not redis"):
        run("--to", "cluster")


def test_expires_by_survives_a_relayout_both_ways(settings, redis_client, redis_url):
    """Fixed-TTL sessions (the deadline first) stay ``expires_by: "ttl"`` and idle ones
    ``"idle"``, node -> cluster -> node, when the application's clock (``created_at``) is a
    few milliseconds off the server's (its fixed deadline): the copy's deadline came from
    ``created_at``, a millisecond past its expiry made a fixed-TTL session read "idle"."""
    settings.PERSISTENT_MEMORY = memory_settings_for("redis", redis_url)
    store = get_store()
    kinds = {
        "fixed": {"ttl_seconds": 600, "idle_ttl_seconds": 3600},  # the deadline first: "ttl"
        "idle": {"ttl_seconds": 7200, "idle_ttl_seconds": 900},  # the idle TTL first: "idle"
        "idle-only": {"ttl_seconds": 0, "idle_ttl_seconds": 900},
        "plain": {"ttl_seconds": 600},
    }
    for skew in (-0.005, 0.005):
        for name, ttls in kinds.items():
            sid = f"{name}-{'ahead' if skew > 0 else 'behind'}"
            store.create_session(sid, **ttls)
            meta = f"{PREFIX}:{sid}:__meta__"
            created_at = float(redis_client.hget(meta, "created_at"))
            redis_client.hset(meta, "created_at", repr(created_at + skew))
    expected = {
        sid: snap["info"]["expires_by"] for sid, snap in every_session(backend(redis_url, "node")).items()
    }
    assert sorted(set(expected.values())) == ["idle", "ttl"]
    assert expected["fixed-ahead"] == "ttl" and expected["idle-behind"] == "idle"

    run("--to", "cluster", "--delete-source")
    moved = every_session(backend(redis_url, "cluster"))
    assert {sid: snap["info"]["expires_by"] for sid, snap in moved.items()} == expected
    run("--to", "node", "--delete-source")
    back = every_session(backend(redis_url, "node"))
    assert {sid: snap["info"]["expires_by"] for sid, snap in back.items()} == expected
    # A copy reads back equal to its source, expires_by included: a second run skips it.
    assert counts(run("--to", "cluster")) == (len(expected), 0, 0)
    assert counts(run("--to", "cluster")) == (0, len(expected), 0)
