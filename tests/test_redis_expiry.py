"""On Redis every key of a session expires at its meta's moment, whatever the writes.

A write aligns only the keys it may have created (or SET, which drops an expiry): the
others keep the session's. Random sequences of every kind of write, on sessions with a
fixed TTL, an idle TTL and both, check after each step that no key was missed: none
without an expiry, none apart from the meta.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from persistent_memory.backends.redis import RedisBackend
from persistent_memory.conversations.summarizing import summarize_conversation
from persistent_memory.pipeline import MemoryFilter
from persistent_memory.store import MemoryStore
from tests.chat import assistant, calling, result, system, user
from tests.test_summaries import Recorder, options

PREFIX = "rr:memory"
counter = itertools.count()


def expiries(client: redis.Redis, sid: str) -> dict[str, int]:
    """PEXPIRETIME of every key of session ``sid`` (-1: none), read in one MULTI."""
    keys = sorted(key.decode() for key in client.scan_iter(match=f"{PREFIX}:{sid}:*", count=1000))
    with client.pipeline(transaction=True) as pipe:
        for key in keys:
            pipe.execute_command("PEXPIRETIME", key)
        return dict(zip(keys, pipe.execute(), strict=True))


def assert_aligned(client: redis.Redis, sid: str, step: str) -> None:
    keys = expiries(client, sid)
    meta = keys.pop(f"{PREFIX}:{sid}:__meta__")
    assert meta > 0, step
    # The run index takes the meta's remaining time (PEXPIRE): a millisecond may pass.
    apart = {
        key: at
        for key, at in keys.items()
        if not (at > 0 and abs(at - meta) <= (5 if key.endswith("~runs") else 0))
    }
    assert not apart, (step, meta, apart)


def writes(store: MemoryStore, sid: str) -> dict[str, Callable[[], Any]]:
    lanes = MemoryFilter(store)
    step = itertools.count()

    def branch_and_back() -> None:
        """A branch off the thread's first message, then the head back to the old
        thread, which is rebuilt (its keys deleted and written again)."""
        thread = store.get_messages(sid)["messages"]
        if len(thread) >= 2:
            store.add_messages(sid, [assistant(f"again {next(step)}")], parent_id=thread[0]["id"])
            store.set_head(sid, thread[-1]["id"])

    def summarize() -> None:
        store.add_messages(sid, [user("Where?"), assistant("In Paris.")])
        assert summarize_conversation(store, sid, "default", Recorder(), options(min_tokens=0, keep_tokens=0))

    return {
        "put": lambda: store.put(sid, f"k{next(step) % 3}", {"n": 1}),
        "increment": lambda: store.increment(sid, f"n{next(step) % 3}"),
        "clear a key": lambda: store.clear(sid, f"k{next(step) % 3}"),
        "clear all": lambda: store.clear(sid),
        "store lane": lambda: lanes.store({"text": "In Paris.", "metadata": {"session_id": sid}}),
        "enrich lane": lambda: lanes.enrich({"text": "Where?", "metadata": {"session_id": sid}}),
        "append": lambda: store.add_messages(sid, [user(f"q {next(step)}"), assistant("a")]),
        "append a system message": lambda: store.add_messages(sid, [system("rules")]),
        "append a tool call": lambda: store.add_messages(sid, [calling("c1"), result("c1")]),
        "append to another conversation": lambda: store.add_messages(sid, [user("x")], conversation="other"),
        "branch and back": branch_and_back,
        "clear the conversation": lambda: store.clear_messages(sid),
        "summarize the conversation": summarize,
        "summarize the history": lambda: store.summarize(sid, 2),
    }


@pytest.mark.parametrize("max_history", [1, 4])  # 1: each fold deletes the history list
@pytest.mark.parametrize(
    "ttl", [{"ttl_seconds": 600}, {"idle_ttl_seconds": 300}, {"ttl_seconds": 600, "idle_ttl_seconds": 300}]
)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_key_keeps_the_sessions_expiry(redis_client, ttl, max_history, data) -> None:
    store = MemoryStore(
        RedisBackend(
            client=redis_client,
            owns_client=False,
            max_history=max_history,
            auto_summarize=True,
            max_messages=6,
            summarize_after_tokens=40,
        )
    )
    sid = f"x{next(counter)}"
    store.create_session(sid, **ttl)
    operations = writes(store, sid)
    for name in data.draw(st.lists(st.sampled_from(sorted(operations)), min_size=1, max_size=12)):
        operations[name]()
        assert_aligned(redis_client, sid, name)
