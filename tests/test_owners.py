"""Owners in the store, on both backends: namespaces, run ids, quotas, and the Redis keys."""

from __future__ import annotations

import re
import time

import pytest
from django.core.checks import run_checks
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from persistent_memory.exceptions import (
    CapacityExceeded,
    InvalidOwner,
    KeyNotFound,
    QuotaExceeded,
    SessionExists,
    SessionNotFound,
)
from persistent_memory.owners import split_storage_id, storage_id, validate_owner
from tests.conftest import TOPOLOGIES

from .conftest import CountingConnection, pttls

OWNER_CHARS = "abcXYZ019_.:/@+=-"


class TestNamespaces:
    def test_same_id_two_owners_and_unowned_are_separate(self, store):
        alice, bob = store.for_owner("user:1"), store.for_owner("user:2")
        alice.create_session("chat-1", ttl_seconds=100)
        bob.create_session("chat-1")
        store.create_session("chat-1", ttl_seconds=50)
        alice.put("chat-1", "k", "alice")
        bob.put("chat-1", "k", "bob")
        bob.increment("chat-1", "n", 5)
        assert alice.get_all("chat-1") == {"k": "alice"}
        assert bob.get_all("chat-1") == {"k": "bob", "n": 5}
        assert store.get_all("chat-1") == {}
        assert alice.session_info("chat-1")["ttl_seconds"] == 100
        assert bob.session_info("chat-1")["ttl_seconds"] is None
        assert store.session_info("chat-1")["ttl_seconds"] == 50
        assert [e["key"] for e in bob.get_history("chat-1")] == ["k", "n"]
        assert alice.delete_session("chat-1") == ["k"]
        assert bob.get("chat-1", "k") == "bob"
        assert store.session_info("chat-1")["owner"] == ""

    def test_another_owners_session_looks_like_none(self, store):
        store.for_owner("user:1").create_session("mine")
        other = store.for_owner("user:2")
        calls = {
            "info": lambda sid: other.session_info(sid),
            "get": lambda sid: other.get(sid, "k"),
            "get_all": lambda sid: other.get_all(sid),
            "put": lambda sid: other.put(sid, "k", 1),
            "increment": lambda sid: other.increment(sid, "n"),
            "clear": lambda sid: other.clear(sid),
            "history": lambda sid: other.get_history(sid),
            "summarize": lambda sid: other.summarize(sid),
            "delete": lambda sid: other.delete_session(sid),
        }
        for name, call in calls.items():
            with pytest.raises(SessionNotFound) as theirs:
                call("mine")
            with pytest.raises(SessionNotFound) as nobodys:
                call("nope")
            # The same exception and message (the id aside), no storage id or owner in it.
            assert type(theirs.value) is type(nobodys.value), name
            assert str(theirs.value) == str(nobodys.value).replace("'nope'", "'mine'"), name
            assert "~" not in str(theirs.value) and "user:1" not in str(theirs.value)
        assert other.list_sessions() == []
        with pytest.raises(SessionExists):
            store.for_owner("user:1").create_session("mine")
        other.create_session("mine")  # its own, beside user:1's

    def test_listing_is_per_owner_and_the_operator_sees_all(self, store):
        store.for_owner("user:1").create_session("a1")
        store.for_owner("user:1").create_session("b1")
        store.for_owner("user:2").create_session("a2")
        store.create_session("node")
        assert store.for_owner("user:1").list_sessions() == ["a1", "b1"]
        assert [i["session_id"] for i in store.for_owner("user:1").list_session_infos("a")] == ["a1"]
        assert store.for_owner("user:2").list_sessions() == ["a2"]
        assert store.list_sessions() == ["node"]
        everyone = store.list_session_infos(all_owners=True)
        assert sorted((i["owner"], i["session_id"]) for i in everyone) == [
            ("", "node"),
            ("user:1", "a1"),
            ("user:1", "b1"),
            ("user:2", "a2"),
        ]

    def test_run_ids_are_per_owner(self, store):
        alice, bob = store.for_owner("user:1"), store.for_owner("user:2")
        alice.enrich("s1", run_id="run-1")
        assert bob.record_answer(None, "not yours", run_id="run-1") is None
        assert store.record_answer(None, "not the node's either", run_id="run-1") is None
        record = alice.record_answer(None, "yes", run_id="run-1")
        assert record.session_id == "s1" and record.answer_count == 1
        assert alice.get("s1", "last_answer") == "yes"
        assert bob.list_sessions() == [] and store.list_sessions() == []
        bob.enrich("s1", run_id="run-1")  # the same run id, bob's own binding
        assert bob.record_answer(None, "bob", run_id="run-1").answer_count == 1
        assert alice.get("s1", "answer_count") == 1

    def test_owner_strings_are_validated(self, store):
        for bad in ("has space", "a~b", "a*", "x" * 201, "{tag}", "new\nline", 42, None):
            with pytest.raises(InvalidOwner):
                store.for_owner(bad)
        assert store.for_owner("tenant:acme.com/user:42@x+y=z_-").owner == "tenant:acme.com/user:42@x+y=z_-"
        assert store.for_owner("").owner == ""

    @given(
        owner=st.text(OWNER_CHARS, min_size=1, max_size=30),
        session_id=st.from_regex(r"[A-Za-z0-9_-]{1,20}", fullmatch=True),
    )
    def test_storage_ids_round_trip(self, owner, session_id):
        sid = storage_id(validate_owner(owner), session_id)
        assert split_storage_id(sid) == (owner, session_id)
        assert split_storage_id(session_id) == ("", session_id)


class TestQuotas:
    @pytest.fixture(params=TOPOLOGIES)
    def backend_name(self, request: pytest.FixtureRequest) -> str:
        """An owner's cap on every Redis setup: in the cluster layout its sessions are in
        many buckets, and the cap counts them all."""
        return request.param

    def test_the_cap_counts_sessions_in_every_bucket(self, configure):
        alice = configure(MAX_SESSIONS_PER_OWNER=6).for_owner("user:1")
        alice.create_session("s0")
        alice.record_answer("s1", "an answer")  # a lane that creates
        alice.add_messages("s2", [{"role": "user", "content": "hi"}])
        for i in range(3, 6):
            alice.enrich(f"s{i}")
        for call in (
            lambda: alice.create_session("s6"),
            lambda: alice.enrich("s6"),
            lambda: alice.record_answer("s6", "t"),
            lambda: alice.add_messages("s6", [{"role": "user", "content": "hi"}]),
        ):
            with pytest.raises(CapacityExceeded):
                call()
        assert alice.list_sessions() == [f"s{i}" for i in range(6)]
        alice.put("s0", "k", 2)  # its own sessions keep working
        alice.delete_session("s3")
        alice.create_session("s6")
        assert len(alice.list_sessions()) == 6

    def test_sessions_per_owner(self, configure):
        store = configure(MAX_SESSIONS_PER_OWNER=2)
        alice, bob = store.for_owner("user:1"), store.for_owner("user:2")
        alice.create_session("a")
        alice.enrich("b")
        for call in (
            lambda: alice.create_session("c"),
            lambda: alice.enrich("c"),
            lambda: alice.record_answer("c", "t"),
        ):
            with pytest.raises(CapacityExceeded):
                call()
        assert alice.list_sessions() == ["a", "b"]
        bob.create_session("a")
        bob.create_session("b")
        store.create_session("node-1")  # unowned sessions are not an owner's
        alice.delete_session("a")
        alice.create_session("c")
        assert alice.list_sessions() == ["b", "c"]

    def test_expired_sessions_free_their_place(self, configure):
        alice = configure(MAX_SESSIONS_PER_OWNER=1).for_owner("user:1")
        alice.create_session("short", ttl_seconds=0.05)
        time.sleep(0.1)
        alice.create_session("next")
        assert alice.list_sessions() == ["next"]

    def test_memory_backend_lets_an_owner_alone_use_every_place_by_default(self, settings):
        from persistent_memory import get_store

        settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "MAX_SESSIONS": 30, "MIRROR_MODE": "off"}
        alice = get_store().for_owner("user:1")
        for i in range(30):
            alice.create_session(f"s{i}")
        with pytest.raises(CapacityExceeded) as refused:
            alice.create_session("s30")
        assert not isinstance(refused.value, QuotaExceeded) and "MAX_SESSIONS" in str(refused.value)
        # A full process: another owner gets at most a tenth of it (3), not its share (15).
        bob = get_store().for_owner("user:2")
        for i in range(3):
            bob.create_session(f"s{i}")
        with pytest.raises(CapacityExceeded):
            bob.create_session("s3")

    def test_bytes_per_session(self, configure):
        store = configure(MAX_SESSION_BYTES=100)
        alice = store.for_owner("user:1")
        alice.create_session("s")
        alice.put("s", "a", "x" * 40)  # 1 + 42 bytes
        with pytest.raises(CapacityExceeded):
            alice.put("s", "b", "y" * 60)  # 43 + 1 + 62 > 100
        assert alice.get_all("s") == {"a": "x" * 40}
        assert len(alice.get_history("s")) == 1
        alice.put("s", "a", "x" * 90)  # replacing counts the new size only: 1 + 92
        with pytest.raises(CapacityExceeded):
            alice.increment("s", "counter")  # 93 + 7 + 1 > 100: undone
        assert alice.get_all("s") == {"a": "x" * 90}
        with pytest.raises(KeyNotFound):
            alice.get("s", "counter")
        alice.clear("s", "a")
        alice.increment("s", "counter", 7)
        assert alice.get_all("s") == {"counter": 7}
        other = store.for_owner("user:2")
        other.create_session("s")
        other.put("s", "b", "y" * 60)  # another session, its own budget

    def test_an_answer_over_the_byte_cap_writes_nothing(self, configure):
        # Values only: a recorded answer's message counts toward the cap too (tested with conversations).
        alice = configure(MAX_SESSION_BYTES=100, RECORD_CONVERSATION=False).for_owner("user:1")
        with pytest.raises(CapacityExceeded):
            alice.record_answer("new", "z" * 200)
        assert alice.list_sessions() == []  # not even the session
        alice.record_answer("new", "short")
        with pytest.raises(CapacityExceeded):
            alice.record_answer("new", "z" * 80)
        assert alice.get_all("new") == {"answer_count": 1, "last_answer": "short"}
        assert len(alice.get_history("new", 0)) == 2


class TestRedisKeys:
    def test_owned_layout_and_ttl(self, redis_store, redis_client):
        alice = redis_store.for_owner("tenant:acme/user:42")
        alice.create_session("chat", ttl_seconds=60)
        alice.put("chat", "topic", "x")
        alice.enrich("chat", run_id="r1")
        base = "rr:memory:~o:tenant:acme/user:42~"
        keys = {key.decode() for key in redis_client.keys("*")}
        assert keys == {
            f"{base}chat:__meta__",
            f"{base}chat:__keys__",
            f"{base}chat:__history__",
            f"{base}chat:topic",
            f"{base}:sessions",
            f"{base}:names",
            f"{base}:run:r1",
            f"{base}chat:~runs",
            "rr:memory:~owned",
        }
        assert redis_client.smembers("rr:memory:~owned") == {
            f"{base}chat".removeprefix("rr:memory:").encode()
        }
        assert not redis_client.exists("rr:memory:__sessions__")  # the node's set holds unowned ids only
        names = ("__meta__", "__keys__", "__history__", "topic", "~runs")
        meta_ttl, *others = pttls(redis_client, [f"{base}chat:{name}" for name in names])
        for ttl in others:
            assert abs(ttl - meta_ttl) < 50

    def test_one_round_trip_per_operation_when_owned(self, settings, counting_client, redis_url):
        from persistent_memory.backends.redis import RedisBackend
        from persistent_memory.store import MemoryStore

        backend = RedisBackend(client=counting_client, max_history=100, auto_summarize=True)
        alice = MemoryStore(backend).for_owner("user:1")
        alice.list_session_infos()  # connects and loads the script
        calls = [
            lambda: alice.create_session("s"),
            lambda: alice.put("s", "k", 1),
            lambda: alice.get("s", "k"),
            lambda: alice.get_all("s"),
            lambda: alice.increment("s", "n"),
            lambda: alice.enrich("s", run_id="r"),
            lambda: alice.record_answer(None, "a", run_id="r"),
            lambda: alice.get_history("s"),
            lambda: alice.list_session_infos(),
            lambda: alice.delete_session("s"),
        ]
        for call in calls:
            CountingConnection.sends = 0
            call()
            assert CountingConnection.sends == 1, call

    def test_sweep_covers_owned_sessions(self, redis_store, redis_client):
        alice = redis_store.for_owner("user:1")
        alice.create_session("gone", ttl_seconds=0.05)
        alice.put("gone", "k", 1)
        alice.enrich("kept", run_id="r-kept")
        alice.enrich("deleted", run_id="r-deleted")
        alice.delete_session("deleted")
        time.sleep(0.1)
        redis_client.set("rr:memory:~o:user:1~gone:k", "1")  # a leftover, as a crash could leave
        counts = redis_store.backend.sweep(dry_run=False, batch_size=10)
        # Deleting dropped the binding of "deleted"; "gone" had none.
        assert counts == {"expired_sessions": 1, "leftover_keys": 1, "run_bindings": 0}
        left = sorted(key.decode() for key in redis_client.keys("rr:memory:~o:user:1~*"))
        assert all("kept" in key or key.endswith(("~:sessions", "~:names")) for key in left), left
        assert redis_client.smembers("rr:memory:~owned") == {b"~o:user:1~kept"}

    def test_node_layout_unchanged_for_unowned(self, redis_store, redis_client):
        redis_store.create_session("s1")
        redis_store.put("s1", "k", 1)
        assert {key.decode() for key in redis_client.keys("*")} == {
            "rr:memory:__sessions__",
            "rr:memory:~sessions",
            "rr:memory:~names",
            "rr:memory:s1:__meta__",
            "rr:memory:s1:__keys__",
            "rr:memory:s1:__history__",
            "rr:memory:s1:k",
        }


OWNERS = st.one_of(st.just(""), st.text(OWNER_CHARS, min_size=1, max_size=12))
NOT_RESERVED = re.compile(r"(?!__.*__$)")  # names like __keys__ are the layout's own
SESSION_IDS = st.text("ab_-0", min_size=1, max_size=6).filter(NOT_RESERVED.match)
KEY_NAMES = st.text("ab.-_", min_size=1, max_size=5).filter(NOT_RESERVED.match)
#: Indexes every namespace shares (not a session's or an owner's).
SHARED = {
    b"rr:memory:__sessions__",
    b"rr:memory:~owned",
    b"rr:memory:~dirty",
    b"rr:memory:~sessions",
    b"rr:memory:~names",
}


@pytest.mark.usefixtures("redis_store")
class TestKeysNeverCollide:
    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(first=st.tuples(OWNERS, SESSION_IDS, KEY_NAMES), second=st.tuples(OWNERS, SESSION_IDS, KEY_NAMES))
    def test_no_key_equals_or_prefixes_another_namespaces(self, redis_store, redis_client, first, second):
        if first[:2] == second[:2] or first[0] == second[0] and first[0]:
            return  # the same session, or the same owner: one namespace
        redis_client.flushdb()
        written = []
        for owner, session_id, key in (first, second):
            before = set(redis_client.keys("*"))
            scoped = redis_store.for_owner(owner)
            scoped.enrich(session_id, run_id="run")
            scoped.put(session_id, key, 1)
            written.append(set(redis_client.keys("*")) - before - SHARED)
        for mine, theirs in (written, written[::-1]):
            for a in mine:
                for b in theirs:
                    assert not b.startswith(a), (a, b)
        assert redis_store.for_owner(first[0]).get(first[1], first[2]) == 1


class TestChecks:
    def ids(self):
        return sorted(
            m.id
            for m in run_checks(include_deployment_checks=True, databases=[])
            if m.id.startswith("persistent_")
        )

    def test_a_cap_that_lets_one_owner_take_every_place(self, settings):
        settings.PERSISTENT_MEMORY = {"MAX_SESSIONS": 10, "MAX_SESSIONS_PER_OWNER": 10}
        assert "persistent_memory.W004" in self.ids()
        settings.PERSISTENT_MEMORY = {"MAX_SESSIONS": 10, "MAX_SESSIONS_PER_OWNER": 5}
        assert "persistent_memory.W004" not in self.ids()

    def test_bad_owner_settings(self, settings):
        settings.PERSISTENT_MEMORY = {"OWNER_RESOLVER": "no.such.thing", "MAX_SESSION_BYTES": 0}
        ids = sorted(m.id for m in run_checks(databases=[]) if m.id.startswith("persistent_"))
        assert ids == ["persistent_memory.E002", "persistent_memory.E009"]
