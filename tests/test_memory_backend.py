"""What only the memory backend does: the session cap."""

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
