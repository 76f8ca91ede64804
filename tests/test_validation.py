"""Invalid ids and keys are refused before anything reaches a backend."""

from __future__ import annotations

import pytest

from persistent_memory.backends.redis import RedisBackend
from persistent_memory.exceptions import InvalidKey, InvalidSessionId
from persistent_memory.store import MemoryStore
from tests.conftest import CountingConnection

BAD_IDS = [
    "",
    "a" * 129,
    "abc\n",
    "a\x00b",
    "a:b",
    "a/b",
    "a b",
    "a*",
    "a{b}",
    "café",
    "ａｂｃ",  # full-width letters
    "a.b",  # dots are for keys only
    "__sessions__",
    "__meta__",
    None,
    123,
    b"abc",
    ["abc"],
]
BAD_KEYS = [
    "",
    "k" * 257,
    "key\n",
    "k\x00",
    "k:1",
    "k/1",
    "k 1",
    "k*",
    "{k}",
    "ключ",
    "__keys__",
    "__history__",
    "__meta__",
    None,
    1,
    b"k",
]


def test_longest_valid_names(store):
    session_id, key = "s" * 128, "k" * 256
    store.create_session(session_id)
    store.put(session_id, key, 1)
    store.put(session_id, "a.b-c_D9", 2)
    assert store.get_all(session_id) == {key: 1, "a.b-c_D9": 2}


@pytest.mark.parametrize("session_id", BAD_IDS, ids=repr)
def test_bad_session_ids(store, session_id):
    calls = [
        lambda: store.create_session(session_id),
        lambda: store.resume_session(session_id),
        lambda: store.session_info(session_id),
        lambda: store.delete_session(session_id),
        lambda: store.put(session_id, "k", 1),
        lambda: store.get(session_id, "k"),
        lambda: store.get_all(session_id),
        lambda: store.list_keys(session_id),
        lambda: store.increment(session_id, "k"),
        lambda: store.clear(session_id),
        lambda: store.get_history(session_id),
        lambda: store.summarize(session_id),
        lambda: store.enrich(session_id),
        lambda: store.record_answer(session_id, "text"),
    ]
    for call in calls:
        with pytest.raises(InvalidSessionId):
            call()
    assert store.list_sessions() == []


@pytest.mark.parametrize("key", BAD_KEYS, ids=repr)
def test_bad_keys(store, key):
    store.create_session("s1")
    for call in (
        lambda: store.put("s1", key, 1),
        lambda: store.get("s1", key),
        lambda: store.increment("s1", key),
        *([] if key is None else [lambda: store.clear("s1", key)]),  # clear(None) means all keys
    ):
        with pytest.raises(InvalidKey):
            call()
    assert store.list_keys("s1") == []
    assert store.get_history("s1", 0) == []


def test_invalid_input_never_reaches_redis(counting_client):
    store = MemoryStore(RedisBackend(client=counting_client, max_history=100, auto_summarize=True))
    for session_id in BAD_IDS:
        with pytest.raises(InvalidSessionId):
            store.put(session_id, "k", 1)
    for key in BAD_KEYS:
        with pytest.raises(InvalidKey):
            store.put("s1", key, 1)
    assert CountingConnection.sends == 0
