"""What only the Redis backend does: the node's key layout, TTL alignment, one round
trip per operation, and a clear error when Redis is away."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
import redis

from persistent_memory.backends.redis import RedisBackend
from persistent_memory.conf import MemorySettings
from persistent_memory.exceptions import BackendUnavailable
from persistent_memory.pipeline import MemoryFilter
from persistent_memory.store import MemoryStore
from tests.conftest import CountingConnection, _free_port, pttls
from tests.timing import LIVE_TTL, wait_past


@pytest.fixture
def rstore(redis_client, redis_url):
    store = MemoryStore(
        RedisBackend(client=redis.Redis.from_url(redis_url), max_history=100, auto_summarize=True)
    )
    yield store
    store.close()


def test_key_layout_byte_for_byte(rstore, redis_client):
    rstore.create_session("s1")
    rstore.put("s1", "topic", {"name": "cats"})
    rstore.increment("s1", "count", 2)
    keys = {k.decode() for k in redis_client.keys("*")}
    assert keys == {
        "rr:memory:__sessions__",
        "rr:memory:~sessions",  # the listing's indexes, beside the node's layout
        "rr:memory:~names",
        "rr:memory:s1:__meta__",
        "rr:memory:s1:__keys__",
        "rr:memory:s1:__history__",
        "rr:memory:s1:topic",
        "rr:memory:s1:count",
    }
    assert redis_client.smembers("rr:memory:__sessions__") == {b"s1"}
    assert redis_client.smembers("rr:memory:s1:__keys__") == {b"topic", b"count"}
    assert json.loads(redis_client.get("rr:memory:s1:topic")) == {"name": "cats"}
    assert redis_client.get("rr:memory:s1:count") == b"2"  # a Redis integer, readable by GET
    meta = redis_client.hgetall("rr:memory:s1:__meta__")
    assert meta[b"ttl_seconds"] == b"None"
    assert float(meta[b"created_at"]) == pytest.approx(time.time(), abs=5)
    history = [json.loads(raw) for raw in redis_client.lrange("rr:memory:s1:__history__", 0, -1)]
    assert [(e["op"], e["key"]) for e in history] == [("put", "topic"), ("increment", "count")]


def test_reads_data_written_by_the_original_node(rstore, redis_client):
    # What the node writes: meta with str(time.time()) and the string "None".
    pipe = redis_client.pipeline()
    pipe.sadd("rr:memory:__sessions__", "legacy")
    pipe.hset("rr:memory:legacy:__meta__", mapping={"created_at": "1700000000.5", "ttl_seconds": "3600"})
    pipe.set("rr:memory:legacy:last_answer", json.dumps("hello"))
    pipe.set("rr:memory:legacy:answer_count", json.dumps(3))
    pipe.sadd("rr:memory:legacy:__keys__", "last_answer", "answer_count")
    pipe.rpush(
        "rr:memory:legacy:__history__", json.dumps({"op": "put", "key": "last_answer", "timestamp": 1.0})
    )
    pipe.execute()
    info = rstore.session_info("legacy")
    assert info["created_at"] == 1700000000.5 and info["ttl_seconds"] == 3600
    assert info["key_count"] == 2 and info["history_length"] == 1
    assert rstore.get_all("legacy") == {"answer_count": 3, "last_answer": "hello"}
    assert rstore.record_answer("legacy", "again").answer_count == 4


def test_custom_key_prefix(redis_client, redis_url):
    store = MemoryStore(
        RedisBackend(
            client=redis.Redis.from_url(redis_url), key_prefix="app:mem", max_history=10, auto_summarize=True
        )
    )
    store.create_session("s1")
    store.put("s1", "k", 1)
    assert {k.decode() for k in redis_client.keys("*")} == {
        "app:mem:__sessions__",
        "app:mem:~sessions",
        "app:mem:~names",
        "app:mem:s1:__meta__",
        "app:mem:s1:__keys__",
        "app:mem:s1:__history__",
        "app:mem:s1:k",
    }
    assert store.list_sessions() == ["s1"]


def test_ttl_aligned_across_every_key(rstore, redis_client):
    rstore.create_session("s1", ttl_seconds=60)
    rstore.put("s1", "first", 1)
    time.sleep(0.3)
    rstore.put("s1", "second", 2)
    rstore.increment("s1", "counter")
    rstore.record_answer("s1", "answer")
    keys = [k for k in redis_client.keys("rr:memory:s1:*")]
    # meta, key set, history, five values, and the answer's conversation: its meta,
    # messages, links, thread, its tail, seq order and the session's set of conversation names.
    assert len(keys) == 15
    ttls = pttls(redis_client, keys)
    assert min(ttls) > 0
    assert max(ttls) - min(ttls) <= 50
    assert max(ttls) <= 60_000 - 250  # later keys inherited what was left, not a fresh minute


def test_no_ttl_means_no_expiry_on_any_key(rstore, redis_client):
    rstore.create_session("s1")
    rstore.put("s1", "k", 1)
    assert all(redis_client.pttl(k) == -1 for k in redis_client.keys("rr:memory:s1:*"))


def test_summarize_keeps_history_ttl(rstore, redis_client):
    rstore.create_session("s1", ttl_seconds=60)
    for i in range(5):
        rstore.put("s1", "k", i)
    assert rstore.summarize("s1", max_entries=2)
    assert 0 < redis_client.pttl("rr:memory:s1:__history__") <= redis_client.pttl("rr:memory:s1:__meta__") + 5


def test_expired_session_leftovers_are_removed(rstore, redis_client):
    expiring = rstore.create_session("s1", ttl_seconds=LIVE_TTL)
    rstore.put("s1", "k", 1)
    # A leftover with no TTL, as a crash mid-way in the original node could leave.
    redis_client.set("rr:memory:s1:orphan", "1")
    redis_client.sadd("rr:memory:s1:__keys__", "orphan")
    redis_client.persist("rr:memory:s1:__keys__")
    wait_past(expiring["expires_at"])
    rstore.create_session("s1")
    assert rstore.get_all("s1") == {}
    assert not redis_client.exists("rr:memory:s1:orphan")


def test_every_operation_is_one_round_trip(counting_client):
    store = MemoryStore(RedisBackend(client=counting_client, max_history=4, auto_summarize=True))
    lanes = MemoryFilter(store)
    store.ping()  # loads nothing; the first EVALSHA below loads the script once
    store.create_session("warm")
    store.create_session("s1", ttl_seconds=60)
    for i in range(10):
        store.put("s1", f"k{i}", i)
    operations = {
        "create_session": lambda: store.create_session("s2"),
        "resume_session": lambda: store.resume_session("s1"),
        "session_info": lambda: store.session_info("s1"),
        "list_sessions": store.list_sessions,
        "list_session_infos": store.list_session_infos,
        "put (with auto-summarize)": lambda: store.put("s1", "k", {"v": 1}),
        "get": lambda: store.get("s1", "k"),
        "get_all (11 keys)": lambda: store.get_all("s1"),
        "list_keys": lambda: store.list_keys("s1"),
        "increment": lambda: store.increment("s1", "n", 2),
        "clear key": lambda: store.clear("s1", "k0"),
        "get_history": lambda: store.get_history("s1", 0),
        "summarize": lambda: store.summarize("s1", 2),
        "enrich lane": lambda: lanes.enrich({"text": "q", "metadata": {"session_id": "s3"}}),
        "store lane": lambda: lanes.store({"text": "a", "metadata": {"session_id": "s3"}}),
        "enrich lane with run_id": lambda: MemoryFilter(store).enrich(
            {"text": "q", "metadata": {"session_id": "s4"}}, run_id="r1"
        ),
        "store lane through run_id": lambda: MemoryFilter(store).store(
            {"text": "a", "metadata": {}}, run_id="r1"
        ),
        "clear all": lambda: store.clear("s1"),
        "delete_session": lambda: store.delete_session("s2"),
        "ping": store.ping,
    }
    trips = {}
    for name, call in operations.items():
        CountingConnection.sends = 0
        call()
        trips[name] = CountingConnection.sends
    assert trips == dict.fromkeys(operations, 1)


def test_redis_down_raises_backend_unavailable():
    port = _free_port()  # nothing listens there
    url = f"redis://:s3cret-pw@127.0.0.1:{port}/0"
    store = MemoryStore.from_settings(MemorySettings({"BACKEND": "redis", "REDIS_URL": url}))
    calls = (
        store.ping,
        store.list_sessions,
        lambda: store.create_session("s1"),
        lambda: store.put("s1", "k", 1),
        lambda: store.enrich("s1"),
    )
    for call in calls:
        with pytest.raises(BackendUnavailable) as info:
            call()
        assert f"127.0.0.1:{port}" in str(info.value)
        assert "s3cret-pw" not in str(info.value)
        assert info.value.__cause__ is None and info.value.__suppress_context__
    # Given up at once, never retried: a server that hangs up on every connection is
    # connected to once per call (counted, rather than timed, on any machine).
    listener = socket.create_server(("127.0.0.1", 0))
    accepted = []

    def hang_up() -> None:
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:  # closed: the test is over
                return
            accepted.append(connection)
            connection.close()

    threading.Thread(target=hang_up, daemon=True).start()
    try:
        url = f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
        hung_up = MemoryStore.from_settings(MemorySettings({"BACKEND": "redis", "REDIS_URL": url}))
        for count, call in enumerate(
            (hung_up.ping, hung_up.list_sessions, lambda: hung_up.put("s1", "k", 1)), 1
        ):
            with pytest.raises(BackendUnavailable):
                call()
            assert len(accepted) == count
    finally:
        listener.close()


def test_redis_restart_recovers_without_new_store(redis_server, redis_url):
    if redis_server is None:
        pytest.skip("REDIS_URL given: the suite does not restart a server it does not own")
    store = MemoryStore.from_settings(MemorySettings({"BACKEND": "redis", "REDIS_URL": redis_url}))
    store.create_session("before")
    redis_server.stop()
    try:
        with pytest.raises(BackendUnavailable):
            store.put("before", "k", 1)
    finally:
        redis_server.start()
    # Server data is gone (no persistence) but the same store works again at once,
    # including loading the script into the fresh server.
    store.create_session("after")
    store.put("after", "k", 1)
    assert store.get("after", "k") == 1
    store.close()


def test_a_flushed_script_cache_is_reloaded_and_the_write_runs_once(rstore, redis_client):
    rstore.create_session("s1")
    assert rstore.increment("s1", "n") == 1
    redis_client.script_flush()
    assert rstore.increment("s1", "n") == 2  # NOSCRIPT: loaded, then sent again, run once
    assert [e["op"] for e in rstore.get_history("s1", 0)] == ["increment", "increment"]


def test_describe_hides_password():
    backend = RedisBackend(
        client=redis.Redis.from_url("redis://:hunter2@127.0.0.1:6390/3"), max_history=10, auto_summarize=True
    )
    assert backend.describe() == "redis://127.0.0.1:6390/3"


def test_run_binding_key_cannot_collide_with_a_session(rstore, redis_client):
    rstore.enrich("s1", run_id="run-1")
    assert redis_client.get("rr:memory:~run:run-1") == b"s1"
    assert 3_590_000 < redis_client.pttl("rr:memory:~run:run-1") <= 3_600_000
    # '~' is outside the session id alphabet, so no session's keys can take this name.
    assert rstore.list_sessions() == ["s1"]


def test_create_with_a_ttl_shorter_than_the_script(rstore):
    # The meta may expire before the script's next command: create must not read it back.
    for i in range(300):
        info = rstore.create_session(f"blink{i}", ttl_seconds=0.001)
        assert info["expires_at"] == pytest.approx(info["created_at"] + 0.001, abs=0.05)
        assert (info["key_count"], info["history_length"]) == (0, 0)


def test_sessions_with_more_keys_than_lua_unpack_takes(rstore, redis_client):
    # Lua's unpack() stops at about 8,000 items: the script works in chunks.
    count = 9000
    pipe = redis_client.pipeline(transaction=False)
    pipe.sadd("rr:memory:__sessions__", "big")
    pipe.hset("rr:memory:big:__meta__", mapping={"created_at": "1.0", "ttl_seconds": "None"})
    pipe.mset({f"rr:memory:big:k{i}": str(i) for i in range(count)})
    pipe.sadd("rr:memory:big:__keys__", *[f"k{i}" for i in range(count)])
    pipe.execute()
    values = rstore.get_all("big")
    assert len(values) == count and values["k8999"] == 8999
    assert len(rstore.enrich("big")) == count
    snapshot = rstore.backend.snapshots(["big"])["big"]
    snapshot["info"]["session_id"] = "copy"
    snapshot["info"]["expires_at"] = time.time() + 60
    rstore.backend.restore_session(snapshot, replace=False)
    assert len(rstore.get_all("copy")) == count
    ttls = {redis_client.pttl(f"rr:memory:copy:k{i}") for i in (0, 4500, 8999)}
    assert all(0 < ttl <= 60_000 for ttl in ttls)


def test_many_sessions_are_listed_in_batches(rstore, redis_client, monkeypatch):
    from persistent_memory.backends.redis import listing

    monkeypatch.setattr(listing, "ONE_STEP_LIST_LIMIT", 3)
    for i in range(10):
        rstore.create_session(f"s{i}", ttl_seconds=0.1 if i < 2 else None)
    time.sleep(0.2)
    assert rstore.list_sessions() == [f"s{i}" for i in range(2, 10)]
    infos = rstore.list_session_infos("s")
    assert sorted(info["session_id"] for info in infos) == [f"s{i}" for i in range(2, 10)]
    assert infos[0]["created_at"] >= infos[-1]["created_at"]  # newest first
    assert redis_client.smembers("rr:memory:__sessions__") == {f"s{i}".encode() for i in range(2, 10)}


def test_a_write_whose_reply_is_lost_is_not_run_twice(redis_client, redis_url):
    # A proxy that passes the command to Redis and drops the connection instead of the reply.
    import socket
    import threading

    target = ("127.0.0.1", int(redis_url.rsplit(":", 1)[1].split("/")[0]))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    drop = threading.Event()

    def serve() -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(target)

            def pump(src, dst, is_reply, pair):
                try:
                    while data := src.recv(65536):
                        if is_reply and drop.is_set():
                            drop.clear()  # one reply lost; a reconnect would work
                            for sock in pair:
                                sock.shutdown(socket.SHUT_RDWR)  # the client sees the connection drop
                                sock.close()
                            return
                        dst.sendall(data)
                except OSError:
                    pass

            pair = (client, upstream)
            threading.Thread(target=pump, args=(client, upstream, False, pair), daemon=True).start()
            threading.Thread(target=pump, args=(upstream, client, True, pair), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    from persistent_memory.conf import MemorySettings

    url = f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
    store = MemoryStore.from_settings(
        MemorySettings({"BACKEND": "redis", "REDIS_URL": url, "MIRROR_MODE": "off"})
    )
    try:
        store.create_session("s1")
        drop.set()
        with pytest.raises(BackendUnavailable):
            store.increment("s1", "n")
        assert redis_client.get("rr:memory:s1:n") == b"1"  # it ran once, and only once
        assert redis_client.llen("rr:memory:s1:__history__") == 1
    finally:
        store.close()
        listener.close()


# Run bindings and the listing's indexes ---------------------------------------------


def write_node_session(client, session_id, created_at):
    """A session as the original node writes it: its set, its meta, no index of the app's."""
    pipe = client.pipeline()
    pipe.sadd("rr:memory:__sessions__", session_id)
    pipe.hset(f"rr:memory:{session_id}:__meta__", mapping={"created_at": created_at, "ttl_seconds": "None"})
    pipe.set(f"rr:memory:{session_id}:last_answer", json.dumps("hello"))
    pipe.sadd(f"rr:memory:{session_id}:__keys__", "last_answer")
    pipe.execute()


def page_ids(page):
    total, infos = page
    return total, [info["session_id"] for info in infos]


def test_deleting_a_session_drops_its_run_bindings_and_run_index(rstore, redis_client):
    rstore.enrich("s1", run_id="run-a")
    rstore.enrich("s1", run_id="run-b")
    rstore.enrich("s2", run_id="run-c")
    runs = redis_client.zrange("rr:memory:s1:~runs", 0, -1)
    assert sorted(runs) == [b"~run:run-a", b"~run:run-b"]
    rstore.delete_session("s1")
    for pattern in ("*run-a*", "*run-b*", "rr:memory:s1:*"):
        assert list(redis_client.scan_iter(pattern)) == [], pattern
    assert redis_client.get("rr:memory:~run:run-c") == b"s2"  # another session's stays


def test_a_run_binding_and_the_run_index_expire_with_their_session(rstore, redis_client):
    rstore.create_session("s1", ttl_seconds=60)
    rstore.enrich("s1", run_id="r1")  # bound for an hour, to a session that has a minute
    meta = redis_client.pttl("rr:memory:s1:__meta__")
    for key in ("rr:memory:~run:r1", "rr:memory:s1:~runs"):
        assert 0 < redis_client.pttl(key) <= meta + 5, key
    rstore.enrich("s2", run_id="r2")  # a session that never expires: the binding's own TTL
    assert 3_590_000 < redis_client.pttl("rr:memory:~run:r2") <= 3_600_000
    assert redis_client.pttl("rr:memory:s2:~runs") == -1


def test_the_run_index_holds_only_live_bindings(redis_client, redis_url):
    store = MemoryStore(
        RedisBackend(client=redis.Redis.from_url(redis_url), max_history=100, auto_summarize=True),
        run_binding_ttl_seconds=0.1,
    )
    for i in range(5):
        store.enrich("s1", run_id=f"old-{i}")
    time.sleep(0.15)
    store.enrich("s1", run_id="new")
    assert redis_client.zrange("rr:memory:s1:~runs", 0, -1) == [b"~run:new"]
    store.close()


def test_the_node_sessions_are_in_the_operator_listing(rstore, redis_client):
    write_node_session(redis_client, "node-old", "1700000000.5")
    rstore.create_session("app-1")
    write_node_session(redis_client, "node-new", repr(time.time() + 1))
    assert page_ids(rstore.list_session_page()) == (3, ["node-new", "app-1", "node-old"])
    assert page_ids(rstore.list_session_page("node-", offset=1)) == (2, ["node-old"])
    assert redis_client.zscore("rr:memory:~sessions", "node-old") == 1700000000.5  # indexed now
    assert rstore.get_all("node-old") == {"last_answer": "hello"}
    # The node deletes one (its keys and its set's member): it leaves the listing.
    redis_client.delete("rr:memory:node-new:__meta__", "rr:memory:node-new:__keys__")
    redis_client.srem("rr:memory:__sessions__", "node-new")
    assert page_ids(rstore.list_session_page()) == (2, ["app-1", "node-old"])
    assert redis_client.zrange("rr:memory:~sessions", 0, -1) == [b"node-old", b"app-1"]
    assert redis_client.smembers("rr:memory:__sessions__") == {b"node-old", b"app-1"}


def test_one_evalsha_per_page(counting_client):
    store = MemoryStore(RedisBackend(client=counting_client, max_history=100, auto_summarize=True))
    alice = store.for_owner("user:1")
    for i in range(30):
        store.create_session(f"s{i}", ttl_seconds=0.1 if i % 3 == 0 else None)
        alice.create_session(f"a{i}")
    time.sleep(0.15)  # some gone: the page cleans them in the same step
    calls = {
        "first page": lambda: store.list_session_page(limit=5),
        "a page further on": lambda: store.list_session_page(offset=12, limit=5),
        "a search": lambda: store.list_session_page("s1", limit=3),
        "an owner's page": lambda: alice.list_session_page(offset=20, limit=5),
        "an owner's search": lambda: alice.list_session_page("a2"),
    }
    for name, call in calls.items():
        CountingConnection.sends = 0
        call()
        assert CountingConnection.sends == 1, name
    assert len(store.list_session_page(limit=100)[1]) == 20  # every gone one met, and dropped
    assert store.list_session_page(limit=0) == (20, [])


def test_a_page_removes_the_gone_sessions_it_meets(rstore, redis_client):
    for i in range(6):
        rstore.create_session(f"s{i}", ttl_seconds=0.1 if i < 4 else None)
    time.sleep(0.15)
    assert redis_client.zcard("rr:memory:~sessions") == 6
    # (a page reads one more than its limit: whether another follows)
    assert page_ids(rstore.list_session_page(limit=1)) == (6, ["s5"])  # none met yet
    assert page_ids(rstore.list_session_page(offset=1, limit=2)) == (2, ["s4"])  # met all four
    for key in ("rr:memory:~sessions", "rr:memory:~names"):
        assert redis_client.zrange(key, 0, -1) == [b"s4", b"s5"]
    assert redis_client.smembers("rr:memory:__sessions__") == {b"s4", b"s5"}
    assert redis_client.keys("rr:memory:~search*") == []  # the search's own set is never left


def test_the_sweep_cleans_the_indexes_and_run_indexes(rstore, redis_client):
    rstore.enrich("live", run_id="r1")
    redis_client.zadd("rr:memory:live:~runs", {"~run:expired": 1})  # a binding long expired
    redis_client.zadd("rr:memory:gone:~runs", {"~run:r9": 9e15})  # the index of a gone session
    redis_client.zadd("rr:memory:~sessions", {"ghost": 1})  # deleted by the node, still listed
    redis_client.zadd("rr:memory:~names", {"ghost": 0})
    write_node_session(redis_client, "node-1", "1700000000.5")  # never listed yet
    counts = rstore.backend.sweep(dry_run=True, batch_size=2)
    assert counts == {"expired_sessions": 1, "leftover_keys": 1, "run_bindings": 0}
    counts = rstore.backend.sweep(dry_run=False, batch_size=2)
    assert counts == {"expired_sessions": 1, "leftover_keys": 1, "run_bindings": 0}
    assert redis_client.zrange("rr:memory:live:~runs", 0, -1) == [b"~run:r1"]
    assert not redis_client.exists("rr:memory:gone:~runs")
    assert redis_client.zrange("rr:memory:~sessions", 0, -1, withscores=True) == [
        (b"node-1", 1700000000.5),
        (b"live", pytest.approx(time.time(), abs=60)),
    ]
    assert redis_client.zrange("rr:memory:~names", 0, -1) == [b"live", b"node-1"]


def test_the_script_is_split_by_concern_each_file_naming_its_keys():
    """Lua files of at most about 500 lines, each opening with the keys it expects."""
    from importlib import resources

    files = list(resources.files("persistent_memory.backends.redis").joinpath("lua").iterdir())
    assert len(files) >= 8
    for path in files:
        text = path.read_text()
        assert len(text.splitlines()) <= 500, path.name
        opening = "\n".join(text.splitlines()[:30])
        assert "KEYS" in opening or "Keys used here" in opening, path.name
