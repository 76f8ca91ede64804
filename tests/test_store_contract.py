"""The store's contract, held against both backends (the `store` fixture is parametrized)."""

from __future__ import annotations

import time

import pytest

from persistent_memory.exceptions import (
    InvalidValue,
    KeyNotFound,
    NotANumber,
    SessionExists,
    SessionExpired,
    SessionNotFound,
)
from persistent_memory.history import operation_count

INFO_FIELDS = {
    "session_id",
    "owner",
    "created_at",
    "expires_at",
    "ttl_seconds",
    "key_count",
    "history_length",
}


class TestSessions:
    def test_create_returns_info(self, store):
        before = time.time()
        info = store.create_session("s1")
        assert set(info) == INFO_FIELDS
        assert info["session_id"] == "s1"
        assert before - 1 <= info["created_at"] <= time.time() + 1
        assert info["expires_at"] is None and info["ttl_seconds"] is None
        assert info["key_count"] == 0 and info["history_length"] == 0

    def test_resume_and_info_agree(self, store):
        created = store.create_session("s1", ttl_seconds=120)
        store.put("s1", "a", 1)
        resumed = store.resume_session("s1")
        assert resumed == store.session_info("s1")
        assert resumed["created_at"] == pytest.approx(created["created_at"])
        assert resumed["ttl_seconds"] == 120
        assert resumed["expires_at"] == pytest.approx(created["created_at"] + 120)
        assert resumed["key_count"] == 1 and resumed["history_length"] == 1

    def test_fractional_ttl_is_kept(self, store):
        assert store.create_session("s1", ttl_seconds=90.5)["ttl_seconds"] == 90.5
        assert store.session_info("s1")["ttl_seconds"] == 90.5

    def test_create_twice_raises(self, store):
        store.create_session("s1")
        with pytest.raises(SessionExists):
            store.create_session("s1")

    def test_unknown_session(self, store):
        for call in (
            lambda: store.resume_session("nope"),
            lambda: store.session_info("nope"),
            lambda: store.delete_session("nope"),
            lambda: store.put("nope", "k", 1),
            lambda: store.get("nope", "k"),
            lambda: store.get_all("nope"),
            lambda: store.list_keys("nope"),
            lambda: store.increment("nope", "k"),
            lambda: store.clear("nope"),
            lambda: store.get_history("nope"),
            lambda: store.summarize("nope"),
        ):
            with pytest.raises(SessionNotFound):
                call()
        assert store.list_sessions() == []

    def test_list_sessions_sorted(self, store):
        for session_id in ("b", "a", "c-1", "A_2"):
            store.create_session(session_id)
        assert store.list_sessions() == ["A_2", "a", "b", "c-1"]

    def test_delete_returns_sorted_keys_and_removes_everything(self, store):
        store.create_session("s1")
        store.put("s1", "zeta", 1)
        store.put("s1", "alpha", 2)
        assert store.delete_session("s1") == ["alpha", "zeta"]
        assert store.list_sessions() == []
        with pytest.raises(SessionNotFound):
            store.get("s1", "alpha")
        # The id is free again and the new session starts empty.
        store.create_session("s1")
        assert store.get_all("s1") == {}
        assert store.get_history("s1") == []

    def test_default_ttl_from_settings(self, configure):
        store = configure(SESSION_TTL_HOURS=2)
        info = store.create_session("s1")
        assert info["ttl_seconds"] == 7200
        assert store.create_session("s2", ttl_seconds=0)["ttl_seconds"] is None


class TestValues:
    def test_put_get_roundtrip_of_json_values(self, store):
        store.create_session("s1")
        values = {
            "text": "héllo ✓",
            "int": 42,
            "big": 2**70,
            "float": 1.5,
            "none": None,
            "bool": True,
            "list": [1, "two", [3]],
            "obj": {"nested": {"deep": [None, False]}},
        }
        for key, value in values.items():
            store.put("s1", key, value)
        for key, value in values.items():
            assert store.get("s1", key) == value
        assert store.get_all("s1") == values
        assert store.list_keys("s1") == sorted(values)

    def test_tuple_comes_back_as_list(self, store):
        store.create_session("s1")
        store.put("s1", "t", (1, 2))
        assert store.get("s1", "t") == [1, 2]

    def test_overwrite(self, store):
        store.create_session("s1")
        store.put("s1", "k", 1)
        store.put("s1", "k", "two")
        assert store.get("s1", "k") == "two"
        assert store.list_keys("s1") == ["k"]

    def test_get_missing_key(self, store):
        store.create_session("s1")
        with pytest.raises(KeyNotFound):
            store.get("s1", "absent")

    def test_deep_copy_isolation(self, store):
        store.create_session("s1")
        value = {"items": [1, 2], "inner": {"a": 1}}
        store.put("s1", "k", value)
        value["items"].append(3)
        value["inner"]["a"] = 99
        got = store.get("s1", "k")
        assert got == {"items": [1, 2], "inner": {"a": 1}}
        got["items"].clear()
        store.get_all("s1")["k"]["inner"]["a"] = 5
        assert store.get("s1", "k") == {"items": [1, 2], "inner": {"a": 1}}

    @pytest.mark.parametrize(
        "value",
        [
            {1, 2},
            b"bytes",
            float("nan"),
            float("inf"),
            -float("inf"),
            object(),
            {"k": {1: "int key"}},
            [{"x": {2}}],
        ],
        ids=["set", "bytes", "nan", "inf", "-inf", "object", "int-key", "nested-set"],
    )
    def test_invalid_values_store_nothing(self, store, value):
        store.create_session("s1")
        store.put("s1", "k", "before")
        with pytest.raises(InvalidValue):
            store.put("s1", "k", value)
        assert store.get("s1", "k") == "before"
        assert len(store.get_history("s1", limit=0)) == 1

    def test_circular_value(self, store):
        store.create_session("s1")
        loop: list = []
        loop.append(loop)
        with pytest.raises(InvalidValue):
            store.put("s1", "k", loop)
        assert store.list_keys("s1") == []

    def test_max_value_bytes(self, configure):
        store = configure(MAX_VALUE_BYTES=100)
        store.create_session("s1")
        store.put("s1", "fits", "x" * 98)  # 100 bytes of JSON with the quotes
        with pytest.raises(InvalidValue, match="over the limit"):
            store.put("s1", "big", "x" * 99)
        with pytest.raises(InvalidValue):
            store.record_answer("s1", "y" * 200)
        assert store.list_keys("s1") == ["fits"]
        assert store.get_all("s1") == {"fits": "x" * 98}


class TestIncrement:
    def test_missing_key_starts_at_zero(self, store):
        store.create_session("s1")
        assert store.increment("s1", "n") == 1
        assert store.increment("s1", "n", 10) == 11
        assert store.increment("s1", "n", -20) == -9
        assert store.get("s1", "n") == -9
        assert isinstance(store.get("s1", "n"), int)

    def test_increments_a_put_integer(self, store):
        store.create_session("s1")
        store.put("s1", "n", 41)
        assert store.increment("s1", "n") == 42
        assert store.get_all("s1") == {"n": 42}

    @pytest.mark.parametrize("start", [2**53, 2**63 - 2, -(2**63) + 1])
    def test_answers_exactly_at_64_bits(self, store, start):
        # Above 2**53 a double cannot hold every integer: the answer must not go through one.
        store.create_session("s1")
        store.put("s1", "n", start)
        assert store.increment("s1", "n") == start + 1
        assert store.increment("s1", "n", -1) == start

    @pytest.mark.parametrize("value", ["5", 1.5, True, [1], {"n": 1}, None, 2**63])
    def test_not_a_number_changes_nothing(self, store, value):
        store.create_session("s1")
        store.put("s1", "v", value)
        with pytest.raises(NotANumber):
            store.increment("s1", "v")
        assert store.get("s1", "v") == value
        assert [e["op"] for e in store.get_history("s1", 0)] == ["put"]

    def test_overflow_is_not_a_number(self, store):
        store.create_session("s1")
        store.put("s1", "n", 2**63 - 1)
        with pytest.raises(NotANumber):
            store.increment("s1", "n")
        assert store.get("s1", "n") == 2**63 - 1

    @pytest.mark.parametrize("amount", [1.0, "1", True, None, 2**64])
    def test_bad_amount(self, store, amount):
        store.create_session("s1")
        with pytest.raises(InvalidValue):
            store.increment("s1", "n", amount)
        assert store.list_keys("s1") == []


class TestClear:
    def test_clear_one_key(self, store):
        store.create_session("s1")
        store.put("s1", "a", 1)
        store.put("s1", "b", 2)
        assert store.clear("s1", "a") == ["a"]
        assert store.clear("s1", "a") == []
        assert store.get_all("s1") == {"b": 2}

    def test_clear_all(self, store):
        store.create_session("s1")
        store.put("s1", "b", 1)
        store.increment("s1", "a")
        assert store.clear("s1") == ["a", "b"]
        assert store.get_all("s1") == {}
        assert store.list_keys("s1") == []
        assert store.clear("s1") == []
        assert store.session_info("s1")["key_count"] == 0


class TestHistory:
    def test_every_write_is_recorded_without_values(self, store):
        store.create_session("s1")
        store.put("s1", "a", "secret value")
        store.increment("s1", "n", 3)
        store.clear("s1", "a")
        store.clear("s1")
        entries = store.get_history("s1", limit=0)
        assert [(e["op"], e["key"]) for e in entries] == [
            ("put", "a"),
            ("increment", "n"),
            ("clear", "a"),
            ("clear", None),
        ]
        assert entries[-1]["cleared"] == ["n"]
        assert all(isinstance(e["timestamp"], float) for e in entries)
        assert "secret value" not in repr(entries)
        timestamps = [e["timestamp"] for e in entries]
        assert timestamps == sorted(timestamps)

    def test_reads_are_not_recorded(self, store):
        store.create_session("s1")
        store.put("s1", "a", 1)
        store.get("s1", "a")
        store.get_all("s1")
        store.list_keys("s1")
        assert len(store.get_history("s1", 0)) == 1

    def test_limit(self, configure):
        store = configure(AUTO_SUMMARIZE=False)
        store.create_session("s1")
        for i in range(60):
            store.put("s1", f"k{i}", i)
        assert len(store.get_history("s1")) == 50
        newest = store.get_history("s1", limit=3)
        assert [e["key"] for e in newest] == ["k57", "k58", "k59"]
        assert len(store.get_history("s1", limit=0)) == 60
        with pytest.raises(InvalidValue):
            store.get_history("s1", limit=-1)

    def test_history_copies_are_isolated(self, store):
        store.create_session("s1")
        store.put("s1", "a", 1)
        store.get_history("s1")[0]["op"] = "changed"
        assert store.get_history("s1")[0]["op"] == "put"


class TestSummarization:
    def test_auto_summarize_keeps_newest_half(self, configure):
        store = configure(MAX_HISTORY=10)
        store.create_session("s1")
        for i in range(11):
            store.put("s1", f"k{i}", i)
        entries = store.get_history("s1", 0)
        assert len(entries) == 6
        summary = entries[0]
        assert summary["op"] == "summary"
        assert summary["summarized_count"] == 6
        assert summary["op_counts"] == {"put": 6}
        assert summary["keys_touched"] == ["k0", "k1", "k2", "k3", "k4", "k5"]
        assert [e["key"] for e in entries[1:]] == ["k6", "k7", "k8", "k9", "k10"]

    def test_folded_summaries_add_their_counts(self, configure):
        store = configure(MAX_HISTORY=4)
        store.create_session("s1")
        for i in range(50):
            if i % 3 == 0:
                store.increment("s1", "n")
            else:
                store.put("s1", f"k{i % 5}", i)
        entries = store.get_history("s1", 0)
        assert len(entries) <= 4
        summaries = [e for e in entries if e["op"] == "summary"]
        assert len(summaries) == 1
        assert operation_count(entries) == 50
        assert sum(summaries[0]["op_counts"].values()) == summaries[0]["summarized_count"]
        assert "summary" not in summaries[0]["op_counts"]
        assert (
            summaries[0]["op_counts"]["increment"] + sum(1 for e in entries if e["op"] == "increment") == 17
        )

    def test_auto_summarize_off(self, configure):
        store = configure(MAX_HISTORY=3, AUTO_SUMMARIZE=False)
        store.create_session("s1")
        for i in range(10):
            store.put("s1", "k", i)
        assert len(store.get_history("s1", 0)) == 10
        assert store.summarize("s1") is True
        entries = store.get_history("s1", 0)
        assert [e["op"] for e in entries] == ["summary", "put"]
        assert entries[0]["summarized_count"] == 9

    def test_summarize_explicit_limit(self, configure):
        store = configure(AUTO_SUMMARIZE=False)
        store.create_session("s1")
        for i in range(5):
            store.put("s1", "k", i)
        assert store.summarize("s1") is False  # within MAX_HISTORY (100)
        assert store.summarize("s1", max_entries=5) is False
        assert store.summarize("s1", max_entries=4) is True
        assert [e["op"] for e in store.get_history("s1", 0)] == ["summary", "put", "put"]
        with pytest.raises(InvalidValue):
            store.summarize("s1", max_entries=0)

    def test_summary_of_clear_all_and_empty_keys(self, configure):
        store = configure(AUTO_SUMMARIZE=False)
        store.create_session("s1")
        store.clear("s1")
        store.clear("s1")
        store.put("s1", "a", 1)
        assert store.summarize("s1", max_entries=1) is True
        (summary,) = store.get_history("s1", 0)
        assert summary["op_counts"] == {"clear": 2, "put": 1}
        assert summary["keys_touched"] == ["a"]
        store.clear("s1")
        store.clear("s1")
        assert store.summarize("s1", max_entries=2) is True
        entries = store.get_history("s1", 0)
        assert entries[0]["summarized_count"] == 4
        # An empty list stays a list (a naive Lua encoder writes {}).
        store.create_session("s2")
        store.clear("s2")
        store.clear("s2")
        store.summarize("s2", max_entries=1)
        assert store.get_history("s2", 0)[0]["keys_touched"] == []


class TestExpiry:
    def test_sub_second_ttl_expires(self, store):
        store.create_session("s1", ttl_seconds=0.3)
        store.put("s1", "a", 1)
        assert store.get("s1", "a") == 1
        time.sleep(0.45)
        with pytest.raises(SessionExpired):
            store.get("s1", "a")
        # Reported once; afterwards the session is simply gone.
        with pytest.raises(SessionNotFound):
            store.get("s1", "a")
        assert store.list_sessions() == []

    def test_expired_session_can_be_created_again_empty(self, store):
        store.create_session("s1", ttl_seconds=0.2)
        store.put("s1", "a", 1)
        time.sleep(0.3)
        info = store.create_session("s1")
        assert info["key_count"] == 0 and info["history_length"] == 0
        assert store.get_all("s1") == {}

    def test_list_prunes_expired(self, store):
        store.create_session("short", ttl_seconds=0.2)
        store.create_session("long", ttl_seconds=60)
        store.create_session("forever")
        time.sleep(0.3)
        assert store.list_sessions() == ["forever", "long"]

    def test_later_keys_inherit_remaining_ttl(self, store):
        info = store.create_session("s1", ttl_seconds=0.5)
        time.sleep(0.3)
        store.put("s1", "late", 1)  # must not get a fresh 0.5 s
        time.sleep(0.3)
        with pytest.raises(SessionExpired):
            store.get("s1", "late")
        assert info["expires_at"] == pytest.approx(info["created_at"] + 0.5)

    def test_no_ttl_by_default(self, store):
        store.create_session("s1")
        assert store.session_info("s1")["expires_at"] is None

    @pytest.mark.parametrize("ttl", [-1, float("nan"), float("inf"), "60", True, 0.0001])
    def test_bad_ttl(self, store, ttl):
        with pytest.raises(InvalidValue):
            store.create_session("s1", ttl_seconds=ttl)
        assert store.list_sessions() == []


class TestLanes:
    def test_enrich_creates_then_reads(self, store):
        assert store.enrich("s1") == {}
        assert store.list_sessions() == ["s1"]
        store.put("s1", "a", {"x": 1})
        assert store.enrich("s1") == {"a": {"x": 1}}

    def test_record_answer(self, store):
        assert store.record_answer("s1", "first").answer_count == 1
        assert store.record_answer("s1", "second").answer_count == 2
        assert store.get_all("s1") == {"answer_count": 2, "last_answer": "second"}
        ops = [(e["op"], e["key"]) for e in store.get_history("s1", 0)]
        assert ops == [("put", "last_answer"), ("increment", "answer_count")] * 2

    def test_record_answer_with_bad_counter_writes_nothing(self, store):
        store.create_session("s1")
        store.put("s1", "answer_count", "many")
        with pytest.raises(NotANumber):
            store.record_answer("s1", "text")
        assert store.get_all("s1") == {"answer_count": "many"}
        assert len(store.get_history("s1", 0)) == 1

    def test_lanes_use_default_ttl(self, configure):
        store = configure(SESSION_TTL_HOURS=0.5)
        store.enrich("s1")
        store.record_answer("s2", "x")
        assert store.session_info("s1")["ttl_seconds"] == 1800
        assert store.session_info("s2")["ttl_seconds"] == 1800


def test_ping(store):
    store.ping()


class TestRunBindings:
    def test_answer_finds_session_through_run(self, store):
        store.enrich("s1", run_id="run-1")
        record = store.record_answer(None, "bound", run_id="run-1")
        assert record == ("s1", 1)
        assert store.get("s1", "last_answer") == "bound"

    def test_unknown_run_writes_nothing(self, store):
        assert store.record_answer(None, "lost", run_id="never-enriched") is None
        assert store.list_sessions() == []

    def test_run_rebinds_to_latest_session(self, store):
        store.enrich("s1", run_id="r")
        store.enrich("s2", run_id="r")
        assert store.record_answer(None, "x", run_id="r").session_id == "s2"
        assert store.list_keys("s1") == []

    def test_binding_expires(self, configure):
        store = configure(RUN_BINDING_TTL_SECONDS=0.2)
        store.enrich("s1", run_id="r")
        time.sleep(0.3)
        assert store.record_answer(None, "late", run_id="r") is None
        assert store.list_keys("s1") == []

    def test_a_deleted_or_expired_session_is_not_recreated_through_its_run_id(self, store):
        store.enrich("gone", run_id="r1")
        store.delete_session("gone")
        assert store.record_answer(None, "late", run_id="r1") is None
        store.create_session("short", ttl_seconds=0.05)
        store.enrich("short", run_id="r2")
        time.sleep(0.1)
        assert store.record_answer(None, "late", run_id="r2") is None
        assert store.list_sessions() == []
        # The binding went with it: a new session under the same id is not reached either.
        store.create_session("gone")
        assert store.record_answer(None, "late", run_id="r1") is None
        assert store.get_all("gone") == {}

    @pytest.mark.parametrize("run_id", ["", "a b", "a:b", "x" * 129, 5])
    def test_invalid_run_id(self, store, run_id):
        from persistent_memory.exceptions import InvalidRunId

        with pytest.raises(InvalidRunId):
            store.enrich("s1", run_id=run_id)
        with pytest.raises(InvalidRunId):
            store.record_answer(None, "x", run_id=run_id)
        assert store.list_sessions() == []

    def test_own_session_wins_over_run(self, store):
        store.enrich("s1", run_id="r")
        assert store.record_answer("s2", "mine", run_id="r").session_id == "s2"
        assert store.list_keys("s1") == []


class TestListInfos:
    def test_newest_first_with_prefix(self, store):
        for session_id in ("chat-1", "chat-2", "other", "chat-3"):
            store.create_session(session_id)
            time.sleep(0.002)
        store.put("chat-2", "k", 1)
        infos = store.list_session_infos()
        assert [i["session_id"] for i in infos] == ["chat-3", "other", "chat-2", "chat-1"]
        chat = store.list_session_infos("chat-")
        assert [i["session_id"] for i in chat] == ["chat-3", "chat-2", "chat-1"]
        assert chat[1] == store.session_info("chat-2")
        assert store.list_session_infos("zzz") == []

    def test_expired_are_left_out(self, store):
        store.create_session("gone", ttl_seconds=0.1)
        store.create_session("kept")
        time.sleep(0.2)
        assert [i["session_id"] for i in store.list_session_infos()] == ["kept"]
