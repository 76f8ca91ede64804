"""The memory backend's message tree (persistent_memory.backends.memory.tree): what its
snapshot says of a conversation (the digest a mirror sync relies on, the counts), messages
appended and the same ones restored from a snapshot, and a trim around a head that is a
tool call (a case no store call reaches: an append always makes its newest message the head)."""

from __future__ import annotations

import json
from functools import reduce
from operator import xor
from typing import Any

import pytest

from persistent_memory import get_store
from persistent_memory.backends.conversations import text_digest
from persistent_memory.backends.memory.tree import Tree
from persistent_memory.chat.messages import prepare_messages
from persistent_memory.store import MemoryStore
from tests.chat import assistant, calling, result, system, user
from tests.conftest import memory_settings_for


@pytest.fixture
def memory(settings: Any) -> Any:
    """The process store on the memory backend, with extra settings."""

    def apply(**extra: Any) -> MemoryStore:
        settings.PERSISTENT_MEMORY = memory_settings_for("memory", **extra)
        return get_store()

    return apply


def snapshot(store: MemoryStore, session_id: str = "s1") -> dict[str, Any]:
    return store.backend.snapshots([session_id])[session_id]["conversations"]["default"]


def digest_of(texts: list[str]) -> str:
    """The XOR of the texts' digests, as the mirror computes it from the messages."""
    return f"{reduce(xor, map(text_digest, texts), 0):032x}"


def test_the_snapshot_digest_is_of_the_messages_it_holds(memory):
    store = memory(MAX_MESSAGES=4)
    store.add_messages("s1", [system("rules"), user("u1"), assistant("a1")])
    taken = snapshot(store)
    assert taken["digest"] == digest_of(taken["messages"])
    assert snapshot(store)["digest"] == taken["digest"]  # asked again, nothing new
    steps = [
        lambda: store.add_messages("s1", [user("u2"), assistant("a2")]),  # two new, two trimmed
        lambda: store.pop_message("s1", store.get_messages("s1")["head"]),  # the newest goes
        lambda: store.add_messages("s1", [user("u3")]),
        lambda: store.add_messages("s1", [user("u4"), user("u5"), user("u6")]),  # most go
    ]
    for step in steps:
        step()
        taken = snapshot(store)
        assert taken["digest"] == digest_of(taken["messages"])
        assert snapshot(store)["digest"] == taken["digest"]


def test_the_snapshot_counts_as_list_conversations(memory):
    store = memory(MAX_MESSAGES=5)
    q, a = store.add_messages("s1", [user("q"), assistant("a")])["messages"]
    store.add_messages("s1", [assistant("b")], parent_id=q["id"])
    store.add_messages("s1", [user("more")])
    (info,) = store.list_conversations("s1")
    taken = snapshot(store)
    assert info["branch_count"] == 2
    assert (taken["message_count"], taken["tokens"], taken["branch_count"]) == (
        info["message_count"],
        info["tokens"],
        info["branch_count"],
    )


def grow(tree: Tree, parent: str | None, *messages: dict[str, Any]) -> None:
    """Append ``messages`` to ``tree`` after ``parent`` (None: the head)."""
    batch = prepare_messages(
        list(messages), tokenizer="chars", max_batch=100, max_message_bytes=10_000, max_depth=20
    )
    tree.commit(tree.plan(parent, batch))


def held(tree: Tree) -> list[tuple[Any, ...]]:
    """What a tree holds of each message, in seq order."""
    fields = ("id", "text", "link", "parent", "seq", "tokens", "role", "calls", "answers", "fingerprint")
    return [tuple(getattr(message, name) for name in fields) for message in tree.messages.values()]


def test_appended_messages_are_held_as_the_same_ones_restored():
    tree = Tree()
    grow(tree, None, system("rules"), user("q", id="q"), calling("c1", id="c"), result("c1"))
    grow(tree, "q", assistant("other", metadata={"model": "m"}))
    restored = Tree.restore(json.loads(json.dumps(tree.snapshot())))
    assert held(restored) == held(tree)
    assert json.loads(tree.messages["c"].link)["p"] == "q"
    assert (restored.head, restored.thread, restored.parents) == (tree.head, tree.thread, tree.parents)


def test_a_trim_keeps_the_results_of_a_call_that_stays():
    tree = Tree()
    grow(tree, None, user("u0", id="u0"), calling("c1", id="c"), result("c1", id="r"), user("w", id="w"))
    tree.set_head("c")
    assert tree.trim(3) == 1  # u0: the call stays as the head, so its result stays too
    assert list(tree.messages) == ["c", "r", "w"]
