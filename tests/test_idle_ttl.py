"""Idle expiry: sessions that live while they are used (SESSION_IDLE_TTL_SECONDS), on both backends."""

from __future__ import annotations

import time

import pytest

from persistent_memory.exceptions import SessionNotFound
from persistent_memory.operations.maintenance import sweep
from persistent_memory.pipeline import MemoryFilter
from tests.conftest import CountingConnection, pttls
from tests.timing import wait_past

IDLE = 0.6


def live(store, session_id: str) -> bool:
    try:
        store.session_info(session_id)
    except SessionNotFound:
        return False
    return True


class Stalled(Exception):
    """The machine paused the test past the session's expiry between two calls: the
    scenario proves nothing then, and runs again."""


def touch(call, alive_until: float) -> float:
    """``call()`` on a session that lives at least until ``alive_until`` (an epoch: the
    previous write's start plus the idle TTL, or the fixed deadline); when it started.
    Gone while the call ended before then is a failure; gone after it, a stall."""
    started = time.time()
    try:
        call()
    except SessionNotFound:
        if time.time() < alive_until:
            raise AssertionError("the session ended before its expiry") from None
        raise Stalled from None
    return started


def again_if_stalled(scenario, attempts: int = 5) -> None:
    """``scenario(session_id)``, run again under a new id while the machine stalls it."""
    for attempt in range(attempts):
        try:
            return scenario(f"chat-{attempt}")
        except Stalled:
            continue
    pytest.fail(f"the machine stalled every one of {attempts} attempts past the idle TTL")


def test_writes_keep_a_session_alive_past_its_idle_ttl_then_it_goes(configure):
    store = configure(SESSION_IDLE_TTL_SECONDS=IDLE)

    def scenario(chat: str) -> None:
        started = time.time()
        info = store.create_session(chat)
        assert info["idle_ttl_seconds"] == IDLE and info["expires_by"] == "idle"
        last = started
        for n in range(6):  # 1.5 s of writes, each well within the idle TTL of the last
            time.sleep(0.25)
            last = touch(lambda n=n: store.put(chat, "turn", n), last + IDLE)
        written = time.time()
        assert written - started > 2 * IDLE
        assert store.get(chat, "turn") == 5
        expires_at = store.session_info(chat)["expires_at"]
        assert last + IDLE - 0.01 <= expires_at <= written + IDLE + 0.01  # the last write's, not a read's
        wait_past(expires_at)
        assert not live(store, chat)

    again_if_stalled(scenario)


@pytest.mark.parametrize("refresh", [False, True])
def test_reads_refresh_only_with_the_setting(configure, refresh):
    store = configure(SESSION_IDLE_TTL_SECONDS=IDLE, IDLE_TTL_REFRESH_ON_READ=refresh)

    def scenario(chat: str) -> None:
        created_at = store.create_session(chat)["created_at"]
        store.put(chat, "k", 1)
        last = time.time()
        store.add_messages(chat, [{"role": "user", "content": "hi"}])
        expires_at = store.session_info(chat)["expires_at"]  # the last write's
        reads = [
            lambda: store.get(chat, "k"),
            lambda: store.get_all(chat),
            lambda: store.enrich(chat),
            lambda: store.get_messages(chat),
            lambda: store.get_context(chat),
        ]
        if not refresh:  # the reads leave the expiry where the last write put it
            for read in reads:
                time.sleep(0.2)
                if time.time() >= expires_at:
                    break
                try:
                    read()
                except SessionNotFound:
                    break
            wait_past(expires_at)
            try:
                again = store.session_info(chat)
            except SessionNotFound:
                return
            if again["created_at"] != created_at:
                raise Stalled  # enrich met it just expired, and created it anew
            raise AssertionError("a read refreshed the idle TTL")
        for n in range(6):  # each read refreshes: it lives on past the writes' idle TTL
            time.sleep(0.2)
            last = touch(reads[n % len(reads)], last + IDLE)
        touch(lambda: store.session_info(chat), last + IDLE)

    again_if_stalled(scenario)


def session_keys(redis_client, storage_id: str) -> list[bytes]:
    return list(redis_client.scan_iter(match=f"rr:memory:{storage_id}:*"))


def test_every_key_of_a_session_gets_the_same_expiry(redis_store, redis_client, settings):
    settings.PERSISTENT_MEMORY = {**settings.PERSISTENT_MEMORY, "SESSION_IDLE_TTL_SECONDS": 30}
    from persistent_memory import get_store

    store = get_store()
    lanes = MemoryFilter(store)
    lanes.enrich({"text": "Where is Paris?", "metadata": {"session_id": "chat"}}, run_id="run-1")
    lanes.store({"text": "In France."}, run_id="run-1")
    store.put("chat", "topic", "geography")
    store.add_messages("chat", [{"role": "system", "content": "Be brief."}], conversation="other")
    names = {key.decode().removeprefix("rr:memory:chat:") for key in session_keys(redis_client, "chat")}
    # Values, the node's own keys, the run index and both conversations' keys.
    assert {"__meta__", "__keys__", "__history__", "topic", "last_answer", "~runs", "~convs"} <= names
    assert {"~c:default", "~c:default:m", "~c:other:s"} <= names
    for _ in range(3):
        time.sleep(1.2)  # past the refresh step (1% of the idle TTL, at most a second)
        store.increment("chat", "count")
        ttls = pttls(redis_client, session_keys(redis_client, "chat"))
        assert min(ttls) > 29_000
        assert max(ttls) - min(ttls) <= 50


def test_a_fixed_ttl_still_ends_a_busy_session(configure):
    store = configure()

    def scenario(chat: str) -> None:
        last = time.time()
        info = store.create_session(chat, ttl_seconds=1.2, idle_ttl_seconds=0.5)
        assert info["expires_by"] == "idle" and info["ttl_seconds"] == 1.2
        deadline = info["created_at"] + 1.2
        for n in range(4):
            time.sleep(0.2)
            last = touch(lambda n=n: store.put(chat, "n", n), min(last + 0.5, deadline))
        # 0.8 s in or later: 0.5 s more of idle would pass the deadline.
        info = {}
        touch(lambda: info.update(store.session_info(chat)), min(last + 0.5, deadline))
        assert info["expires_by"] == "ttl"
        assert info["expires_at"] == pytest.approx(info["created_at"] + 1.2, abs=0.1)
        wait_past(info["expires_at"])
        with pytest.raises(SessionNotFound):
            store.put(chat, "n", 9)

    again_if_stalled(scenario)


def test_idle_ttl_per_session_and_none_at_all(configure):
    store = configure(SESSION_IDLE_TTL_SECONDS=IDLE)
    assert store.create_session("no-idle", idle_ttl_seconds=0)["idle_ttl_seconds"] is None
    assert store.create_session("own", idle_ttl_seconds=5)["idle_ttl_seconds"] == 5
    time.sleep(IDLE + 0.2)
    assert live(store, "no-idle") and live(store, "own")


def test_whole_seconds_are_answered_as_integers_on_every_backend(configure):
    """A setting written 604800.0 (as the demo's environment gives it) answers 604800 on
    both backends, as Redis, which keeps milliseconds as integers, always did."""
    store = configure(SESSION_IDLE_TTL_SECONDS=604800.0, SESSION_TTL_HOURS=2.0)
    info = store.create_session("chat")
    assert (info["idle_ttl_seconds"], info["ttl_seconds"]) == (604800, 7200)
    assert type(info["idle_ttl_seconds"]) is int and type(info["ttl_seconds"]) is int
    assert type(store.session_info("chat")["idle_ttl_seconds"]) is int
    assert store.create_session("half", idle_ttl_seconds=1.5)["idle_ttl_seconds"] == 1.5


def test_the_sweep_removes_idle_sessions(configure):
    store = configure(SESSION_IDLE_TTL_SECONDS=0.3)
    store.create_session("idle")
    store.create_session("busy", idle_ttl_seconds=60)
    time.sleep(0.5)
    # On Redis the keys expire by themselves; the sweep drops the id from the indexes.
    assert sweep(store=store).expired_sessions == 1
    assert store.list_sessions() == ["busy"]


def test_a_restored_session_keeps_its_idle_ttl(configure):
    store = configure()
    store.create_session("chat", ttl_seconds=3600, idle_ttl_seconds=120)
    store.put("chat", "k", 1)
    snapshot = store.backend.snapshots(["chat"])["chat"]
    store.delete_session("chat")
    store.backend.restore_session(snapshot, replace=False)
    info = store.session_info("chat")
    assert info["idle_ttl_seconds"] == 120 and info["expires_by"] == "idle"
    assert info["expires_at"] == pytest.approx(time.time() + 120, abs=2)


def test_a_node_session_without_an_idle_ttl_keeps_its_expiry(redis_store, redis_client, settings):
    settings.PERSISTENT_MEMORY = {**settings.PERSISTENT_MEMORY, "SESSION_IDLE_TTL_SECONDS": 30}
    from persistent_memory import get_store

    store = get_store()
    # As the original node writes a session: no idle TTL in its meta.
    meta = {"created_at": str(time.time()), "ttl_seconds": "600"}
    redis_client.hset("rr:memory:node-1:__meta__", mapping=meta)
    redis_client.expire("rr:memory:node-1:__meta__", 600)
    redis_client.sadd("rr:memory:__sessions__", "node-1")
    before = redis_client.pttl("rr:memory:node-1:__meta__")
    store.put("node-1", "k", 1)
    assert store.session_info("node-1")["idle_ttl_seconds"] is None
    assert redis_client.pttl("rr:memory:node-1:__meta__") <= before


def test_one_round_trip_per_operation_with_idle_ttl(redis_url, redis_client, counting_client, settings):
    from persistent_memory.backends.redis import RedisBackend
    from persistent_memory.store import MemoryStore

    backend = RedisBackend(
        client=counting_client,
        owns_client=False,
        max_history=100,
        auto_summarize=True,
        idle_ttl_seconds=30,
        refresh_on_read=True,
    )
    store = MemoryStore(backend)
    store.create_session("warm-up")  # the connection's handshake and the script's first load
    lanes = MemoryFilter(store)
    calls = [
        lambda: store.create_session("chat"),
        lambda: store.put("chat", "k", 1),
        lambda: store.get("chat", "k"),
        lambda: store.get_all("chat"),
        lambda: store.increment("chat", "n"),
        lambda: store.add_messages("chat", [{"role": "user", "content": "hi"}]),
        lambda: store.get_messages("chat"),
        lambda: store.get_context("chat"),
        lambda: lanes.enrich({"text": "Where?", "metadata": {"session_id": "chat"}}, run_id="r"),
        lambda: lanes.store({"text": "Here."}, run_id="r"),
    ]
    for call in calls:
        CountingConnection.sends = 0
        call()
        assert CountingConnection.sends == 1


# The default ---------------------------------------------------------------------------

MONTH = 30 * 24 * 3600


@pytest.mark.parametrize(("extra", "expected"), [({}, MONTH), ({"SESSION_IDLE_TTL_SECONDS": 0}, None)])
def test_the_memory_backend_expires_idle_sessions_after_30_days_by_default(settings, extra, expected):
    """Unset, SESSION_IDLE_TTL_SECONDS is 30 days on the embedded default, for every way a
    session is made (a create, the lanes, a conversation's first message); 0 turns it off."""
    from persistent_memory import get_store

    settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "MIRROR_MODE": "off", **extra}
    store = get_store().for_owner("user:1")
    made = time.time()
    store.create_session("created")
    store.enrich("enriched")
    store.record_answer("answered", "an answer")
    store.add_messages("chat", [{"role": "user", "content": "hi"}])
    for session_id in ("created", "enriched", "answered", "chat"):
        info = store.session_info(session_id)
        assert info["idle_ttl_seconds"] == expected, session_id
        if expected is None:
            assert info["expires_at"] is None
        else:
            assert made + MONTH <= info["expires_at"] <= time.time() + MONTH
    # A session made with its own idle TTL keeps it.
    assert store.create_session("own", idle_ttl_seconds=60)["idle_ttl_seconds"] == 60


def test_redis_keeps_no_idle_expiry_by_default(redis_store):
    """Redis sessions last as before unless SESSION_IDLE_TTL_SECONDS is set: the node's
    sessions have none, and deployments must not start losing sessions with an upgrade."""
    info = redis_store.for_owner("user:1").create_session("chat")
    assert info["idle_ttl_seconds"] is None and info["expires_at"] is None


# The memory backend's: on Redis get_messages leaves the expiry where it was (left to its issue).
@pytest.mark.parametrize("backend_name", ["memory"])
@pytest.mark.parametrize("refresh", [False, True])
def test_each_read_of_messages_or_checkpoints_moves_the_idle_expiry_only_with_the_setting(configure, refresh):
    """One read at a time (the test above lets a refreshing read hide one that does not):
    the expiry moves to the read's time plus the idle TTL, or stays where the write put it."""
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint, generate_metadata

    from persistent_memory.integrations.langgraph_saver import PersistentMemorySaver, thread_session

    store = configure(SESSION_IDLE_TTL_SECONDS=60, IDLE_TTL_REFRESH_ON_READ=refresh)
    store.add_messages("chat", [{"role": "user", "content": "hi"}])
    saver = PersistentMemorySaver(store=store)
    thread = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    saver.put(thread, generate_checkpoint(), generate_metadata(), {})
    reads = {
        "get_messages": ("chat", lambda: store.get_messages("chat")),
        "get_context": ("chat", lambda: store.get_context("chat")),
        "get_tuple": (thread_session("t"), lambda: saver.get_tuple(thread)),
        "list": (thread_session("t"), lambda: list(saver.list(thread))),
    }
    for name, (session_id, read) in reads.items():
        before = store.session_info(session_id)["expires_at"]
        time.sleep(0.05)  # past the clock's resolution (Redis keeps milliseconds)
        read()
        after = store.session_info(session_id)["expires_at"]
        assert (after > before) is refresh, name
