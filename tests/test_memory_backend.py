"""What only the memory backend does: the session cap, the run ids a session holds."""

from __future__ import annotations

import time

import pytest

from persistent_memory.exceptions import CapacityExceeded


@pytest.fixture
def capped(settings):
    from persistent_memory import get_store

    settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "MAX_SESSIONS": 3, "MIRROR_MODE": "off"}
    return get_store()


def test_cap_on_live_sessions(capped):
    for i in range(3):
        capped.create_session(f"s{i}")
    with pytest.raises(CapacityExceeded):
        capped.create_session("s3")
    with pytest.raises(CapacityExceeded):
        capped.enrich("s3")
    with pytest.raises(CapacityExceeded):
        capped.record_answer("s3", "x")
    assert capped.list_sessions() == ["s0", "s1", "s2"]
    capped.delete_session("s0")
    capped.create_session("s3")


def test_expired_sessions_are_pruned_before_counting(capped):
    for i in range(3):
        capped.create_session(f"old{i}", ttl_seconds=0.1)
    time.sleep(0.15)
    for i in range(3):
        capped.create_session(f"new{i}")
    assert capped.list_sessions() == ["new0", "new1", "new2"]


def test_a_session_holds_only_the_run_ids_still_bound_to_it(settings):
    from persistent_memory import get_store

    settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "MIRROR_MODE": "off"}
    store = get_store()
    for i in range(100):
        store.enrich("s1", run_id=f"r{i}")
        store.enrich("s2", run_id=f"r{i}")  # bound to another session since
    assert len(store.backend._sessions["s1"].runs) < 32  # pruned as it grows: not 100
    store.delete_session("s2")
    assert store.backend._runs == {}  # every binding went with the session it was on
    assert store.record_answer(None, "late", run_id="r5") is None
    assert store.list_sessions() == ["s1"]
