"""How PersistentMemorySaver stores a channel's list (integrations/langgraph_values.py): a
delta only of a list that extends the channel's last one, a whole list again on a fixed
schedule, cold reads that rebuild exactly what was put, warm reads that decode only what is
new, and the process cache's accounting. Fast on purpose (the mutation check re-runs it per
mutant): checkpoints put directly or by a one-node graph, on the memory backend and one Redis."""

from __future__ import annotations

from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, RemoveMessage
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

from persistent_memory.backends.checkpoints import DELTA_SEP, SEP
from persistent_memory.integrations import langgraph_values
from persistent_memory.integrations.langgraph_saver import PersistentMemorySaver, thread_session
from persistent_memory.integrations.langgraph_values import LATEST, Latest, _Cache


class CountingSerde(JsonPlusSerializer):
    """LangGraph's serializer, noting the length of each list it decodes."""

    def __init__(self) -> None:
        super().__init__()
        self.lists: list[int] = []

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        value = super().loads_typed(data)
        if type(value) is list:
            self.lists.append(len(value))
        return value


@pytest.fixture(autouse=True)
def cold_process() -> None:
    """Each test starts as a process that has seen no thread."""
    LATEST.forget(())


def key(thread: str, channel: str = "messages") -> tuple[str, ...]:
    return ("alice", thread_session(thread), "", channel)


def put(saver: PersistentMemorySaver, thread: str, version: int, value: Any, **options: Any) -> dict:
    """Put a checkpoint whose ``messages`` channel (or ``channel``) is ``value`` at
    ``version``, after checkpoint ``parent`` (None: a new thread's first); its config."""
    channel, parent = options.get("channel", "messages"), options.get("parent")
    checkpoint = options.get("checkpoint") or empty_checkpoint()
    checkpoint["channel_values"] = {channel: value}
    checkpoint["channel_versions"] = {channel: version}
    configurable = {"thread_id": thread, "checkpoint_ns": ""}
    if parent:
        configurable["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
    return saver.put({"configurable": configurable}, checkpoint, {"step": version}, {channel: version})


def read(saver: PersistentMemorySaver, config: dict, channel: str = "messages") -> Any:
    return saver.get_tuple(config).checkpoint["channel_values"].get(channel)


def cold_read(config: dict, channel: str = "messages") -> Any:
    """The value as a process that never saw the thread reads it (a saver of its own, and
    nothing of the thread left in the process's cache)."""
    LATEST.forget(())
    assert LATEST.get(key(config["configurable"]["thread_id"], channel)) is None
    return read(PersistentMemorySaver.for_owner("alice"), config, channel)


def kinds(thread: str, channel: str = "messages") -> dict[int, str]:
    """How each version of the channel is stored: "f" (a whole list), "d" (a delta) or
    "plain" (the value whole, with no content id)."""
    entries = PersistentMemorySaver.for_owner("alice").store.checkpoint_entries(thread_session(thread))
    prefix = f"b{SEP}{channel}{SEP}"
    return {
        int(name[len(prefix) :]): text[0] if text[1:2] == DELTA_SEP else "plain"
        for name, text in entries.items()
        if name.startswith(prefix)
    }


# Deltas only of lists that extend the last one ------------------------------------------


class Chat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def chat_graph(saver: PersistentMemorySaver) -> Any:
    def reply(chat: Chat) -> dict[str, Any]:
        return {"messages": [AIMessage(f"reply {len(chat['messages'])}")]}

    graph = StateGraph(Chat)
    graph.add_node("reply", reply)
    graph.add_edge(START, "reply")
    graph.add_edge("reply", END)
    return graph.compile(checkpointer=saver)


def test_a_graph_that_replaces_and_removes_messages_by_id_reads_back_cold(store):
    graph = chat_graph(PersistentMemorySaver.for_owner("alice"))
    config = {"configurable": {"thread_id": "t"}}
    graph.invoke({"messages": [HumanMessage("hello", id="q1")]}, config)
    graph.invoke({"messages": [HumanMessage("what time is it", id="q2")]}, config)
    # The same id: add_messages replaces the first question where it stands (as long a list
    # as before, but not an extension of it); then the second question is removed.
    graph.invoke({"messages": [HumanMessage("hello, edited", id="q1")]}, config)
    warm = graph.invoke({"messages": [RemoveMessage(id="q2")]}, config)["messages"]
    assert [message.content for message in warm] == [
        "hello, edited",
        "reply 1",
        "reply 3",
        "reply 4",
        "reply 4",
    ]
    assert cold_read(graph.get_state(config).config) == warm
    history = [state.values for state in graph.get_state_history(config)]
    LATEST.forget(())
    cold_graph = chat_graph(PersistentMemorySaver.for_owner("alice"))
    assert [state.values for state in cold_graph.get_state_history(config)] == history


def test_only_a_list_that_extends_the_last_one_is_a_delta(store):
    saver = PersistentMemorySaver.for_owner("alice")
    lists = {
        1: ["a", "b"],
        2: ["a2", "b", "c"],  # the first item replaced: longer, but no extension
        3: ["a2", "b", "c", "d"],
        4: ["a2", "b", "c", "D"],  # as long, last item replaced
        5: ["x"],  # shorter
        6: ["x", "y", "z"],
        7: ["x", "y", "z"],  # the same list again
    }
    configs = {}
    parent = None
    for version, value in lists.items():
        parent = configs[version] = put(saver, "t", version, value, parent=parent)
    assert kinds("t") == {1: "f", 2: "f", 3: "d", 4: "f", 5: "f", 6: "d", 7: "d"}
    for version, value in lists.items():
        assert cold_read(configs[version]) == value


def test_a_repeated_put_is_one_store_call_and_reads_back(store, monkeypatch):
    saver = PersistentMemorySaver.for_owner("alice")
    first = put(saver, "t", 1, ["a"])
    checkpoint = empty_checkpoint()
    second = put(saver, "t", 2, ["a", "b"], parent=first, checkpoint=checkpoint)
    calls: list[str] = []
    original = saver.store.put_checkpoint
    monkeypatch.setattr(
        saver.store, "put_checkpoint", lambda *a, **k: calls.append("put") or original(*a, **k)
    )
    # A retry of the same checkpoint: its version of the channel is put again (never as a
    # delta of itself, which the store would refuse and the saver send again whole).
    again = put(saver, "t", 2, ["a", "b"], parent=first, checkpoint=checkpoint)
    assert calls == ["put"]
    assert again == second
    assert cold_read(second) == ["a", "b"]
    third = put(saver, "t", 3, ["a", "b", "c"], parent=second)
    assert cold_read(third) == ["a", "b", "c"]


def test_content_ids_tell_apart_equal_deltas_on_different_lists(store):
    saver = PersistentMemorySaver.for_owner("alice")
    one = put(saver, "t", 1, ["a"])
    two = put(saver, "t", 2, ["a", "x"], parent=one)
    three = put(saver, "t", 3, ["b"], parent=two)
    four = put(saver, "t", 4, ["b", "x"], parent=three)  # the same item added to another list
    assert kinds("t") == {1: "f", 2: "d", 3: "f", 4: "d"}
    assert read(saver, two) == ["a", "x"]
    assert read(saver, four) == ["b", "x"]
    assert read(saver, two) == ["a", "x"]
    # A fork: a second list extends the first one's base (LangGraph's time travel).
    assert read(saver, one) == ["a"]
    fork = put(saver, "t", 5, ["a", "y"], parent=one)
    assert kinds("t")[5] == "d"
    assert read(saver, two) == ["a", "x"]
    assert read(saver, fork) == ["a", "y"]
    assert cold_read(fork) == ["a", "y"]


def test_values_that_are_not_lists_and_channels_that_cannot_take_deltas(store):
    saver = PersistentMemorySaver.for_owner("alice")
    odd = "odd\x1dname"  # a channel name holding the delta form's separator
    config = None
    for version in range(1, 4):
        config = put(saver, "t", version, list(range(version)), channel=odd, parent=config)
    assert kinds("t", odd) == {1: "plain", 2: "plain", 3: "plain"}
    assert cold_read(config, odd) == [0, 1, 2]
    config = put(saver, "t", 4, ("a", "tuple"), parent=config)
    config = put(saver, "t", 5, {"a": ["dict"]}, parent=config)
    assert read(saver, config) == {"a": ["dict"]}
    assert cold_read(config) == {"a": ["dict"]}
    assert LATEST.get(key("t")) is None  # only lists are kept


def test_an_empty_channel_is_stored_as_such(store):
    saver = PersistentMemorySaver.for_owner("alice")
    checkpoint = empty_checkpoint()
    checkpoint["channel_versions"] = {"gone": 1}
    config = saver.put({"configurable": {"thread_id": "t", "checkpoint_ns": ""}}, checkpoint, {}, {"gone": 1})
    entries = saver.store.checkpoint_entries(thread_session("t"))
    assert entries[f"b{SEP}gone{SEP}1"] == "empty:"
    assert "gone" not in saver.get_tuple(config).checkpoint["channel_values"]


def test_a_delta_whose_base_is_gone_is_refused_not_read_short(store):
    saver = PersistentMemorySaver.for_owner("alice")
    second = put(saver, "t", 2, ["a", "b"], parent=put(saver, "t", 1, ["a"]))
    session = thread_session("t")
    stored = saver.store.get_checkpoint(session, "", second["configurable"]["checkpoint_id"])
    saver.store.delete_session(session)  # by another process, between the two reads
    LATEST.forget(())
    with pytest.raises(ValueError, match="lost the base it extends"):
        PersistentMemorySaver.for_owner("alice").checkpoint_tuple("t", stored, session)


# A whole list again on a schedule ------------------------------------------------------


def test_whole_lists_are_written_again_as_the_deltas_grow(store):
    """A whole list once the deltas since the last one hold as many items as it did, and at
    least 64 (SNAPSHOT_ITEMS): put one item at a time, at 1, 65 and 130 items. A process that
    reads the thread cold in between (a whole list, a delta) keeps the same schedule."""
    assert langgraph_values.SNAPSHOT_ITEMS == 64
    saver = PersistentMemorySaver.for_owner("alice")
    config = None
    for version in range(1, 132):
        config = put(saver, "t", version, list(range(version)), parent=config)
        if version in (65, 100):
            assert cold_read(config) == list(range(version))
            saver = PersistentMemorySaver.for_owner("alice")
    assert [version for version, kind in sorted(kinds("t").items()) if kind == "f"] == [1, 65, 130]
    assert cold_read(config) == list(range(131))


# The cache: values read-only, warm reads decode only what is new -------------------------


def test_lists_changed_in_place_after_a_put_or_a_read_are_stored_right(store):
    saver = PersistentMemorySaver.for_owner("alice")
    items = ["a"]
    config = put(saver, "t", 1, items)
    items.append("b")  # a reducer that changes the list it was given
    config = put(saver, "t", 2, items, parent=config)
    assert cold_read(config) == ["a", "b"]
    for version in (3, 4):  # read (from a whole list, then a delta), changed in place, put
        items = read(saver, config)
        items.append(version)
        config = put(saver, "t", version, items, parent=config)
    got = read(saver, config)
    got.append("not stored")
    assert read(saver, config) == ["a", "b", 3, 4]
    assert cold_read(config) == ["a", "b", 3, 4]


def test_warm_reads_decode_only_the_new_items(store):
    serde = CountingSerde()
    saver = PersistentMemorySaver.for_owner("alice", serde=serde)
    configs = [put(saver, "t", 1, list(range(10)))]
    for version in (2, 3):
        configs.append(put(saver, "t", version, list(range(version + 9)), parent=configs[-1]))
    serde.lists.clear()
    assert read(saver, configs[2]) == list(range(12))
    assert serde.lists == []  # the newest list, as put
    assert read(saver, configs[1]) == list(range(11))
    assert serde.lists == [10, 1]  # from its whole list
    serde.lists.clear()
    assert read(saver, configs[2]) == list(range(12))
    assert serde.lists == [1]  # the one item it adds to the list read before
    serde.lists.clear()
    whole = put(saver, "t", 4, ["new"], parent=configs[2])
    assert read(saver, whole) == ["new"]
    assert serde.lists == []
    assert read(saver, configs[0]) == list(range(10))  # a whole list read is kept as well
    assert read(saver, configs[1]) == list(range(11))
    assert serde.lists == [10, 1]
    serde.lists.clear()
    LATEST.forget(())
    assert read(saver, configs[2]) == list(range(12))
    assert serde.lists == [10, 1, 1]  # the chain, oldest first
    serde.lists.clear()
    assert read(saver, whole) == ["new"] and serde.lists == [1]


def cache_with_room(monkeypatch: pytest.MonkeyPatch, items: int) -> _Cache:
    monkeypatch.setattr(langgraph_values, "CACHED_ITEMS", items)
    return _Cache()


def entry(size: int) -> Latest:
    return Latest("ref", "cid", 0, list(range(size)))


def test_the_cache_counts_each_channels_newest_list_once(monkeypatch):
    cache = cache_with_room(monkeypatch, 10)
    cache.put(("o", "s", "", "a"), entry(6))
    cache.put(("o", "s", "", "a"), entry(8))  # replaces the 6 items
    cache.put(("o", "s", "", "b"), entry(2))  # exactly the room
    assert cache.get(("o", "s", "", "a")) == entry(8)
    assert cache.get(("o", "s", "", "b")) == entry(2)
    cache.put(("o", "s", "", "c"), entry(1))  # one over: the least recently used goes
    assert cache.get(("o", "s", "", "a")) is None
    assert cache.get(("o", "s", "", "b")) == entry(2)
    assert cache.get(("o", "s", "", "c")) == entry(1)


def test_the_cache_evicts_the_least_recently_used(monkeypatch):
    cache = cache_with_room(monkeypatch, 10)
    cache.put(("o", "s", "", "a"), entry(4))
    cache.put(("o", "s", "", "b"), entry(4))
    assert cache.get(("o", "s", "", "a")) is not None  # used: b is now the oldest
    cache.put(("o", "s", "", "c"), entry(4))
    assert cache.get(("o", "s", "", "b")) is None
    assert cache.get(("o", "s", "", "a")) == entry(4)
    cache.put(("o", "s", "", "d"), entry(30))  # more than the room: it goes too
    assert [cache.get(("o", "s", "", name)) for name in "acd"] == [None, None, None]


def test_forgetting_a_prefix_forgets_those_keys_and_their_items(monkeypatch):
    cache = cache_with_room(monkeypatch, 10)
    keys = [("o", "s1", "", "a"), ("o", "s1", "x", "b"), ("o", "s2", "", "a"), ("p", "s1", "", "a")]
    for one in keys:
        cache.put(one, entry(2))
    cache.forget(("o", "s1"))
    assert [cache.get(one) is not None for one in keys] == [False, False, True, True]
    # The forgotten items no longer count: room for 6 more without evicting anything.
    cache.put(("q", "s", "", "a"), entry(6))
    assert [cache.get(one) is not None for one in keys[2:]] == [True, True]
    cache.forget(())
    assert [cache.get(one) for one in [*keys, ("q", "s", "", "a")]] == [None] * 5
    cache.put(("q", "s", "", "a"), entry(10))
    assert cache.get(("q", "s", "", "a")) == entry(10)
