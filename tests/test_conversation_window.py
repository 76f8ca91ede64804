"""Property tests of the window (Hypothesis), on both backends: random conversations with
tool calls, branches and head moves, read with random budgets, checked against the
window's rules and against a reference model written here; and the window's cost,
bounded by the window rather than by the conversation."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from persistent_memory.backends.memory import tree as memory_tree
from persistent_memory.backends.redis.functions import CALL_STATS
from persistent_memory.chat.messages import chat_message
from persistent_memory.exceptions import MessageNotFound, OrphanToolResult
from persistent_memory.store import MemoryStore
from tests.chat import assistant, result, system, tool_call, user

EXAMPLES = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
UNLIMITED = 10**9
#: Texts of varied token costs (emoji and CJK cost more tokens than their length suggests).
TEXT = st.text(alphabet="ab xyz.!\n😀中文", max_size=40)

_sessions = itertools.count()


# Building random conversations ---------------------------------------------------------------


@dataclass
class Conversation:
    """What the test appended (by id), and the head it expects: the reference tree."""

    parents: dict[str, str | None] = field(default_factory=dict)
    head: str | None = None
    counter: itertools.count = field(default_factory=itertools.count)
    trimming: bool = False

    def new_id(self) -> str:
        return f"m{next(self.counter)}"

    def thread(self, leaf: str | None = None) -> list[str]:
        ids: list[str] = []
        message_id = self.head if leaf is None else leaf
        while message_id is not None:
            ids.append(message_id)
            message_id = self.parents[message_id]
        return ids[::-1]


def open_calls(thread: list[dict[str, Any]]) -> list[str]:
    """Calls of the thread's last call group still waiting for results."""
    answered = set()
    for message in reversed(thread):
        if message["role"] == "tool":
            answered.add(message["tool_call_id"])
            continue
        calls = [call["id"] for call in message.get("tool_calls") or ()]
        return [call for call in calls if call not in answered]
    return []


def append(
    store: MemoryStore, sid: str, model: Conversation, batch: list[dict[str, Any]], parent: str | None = None
) -> None:
    try:
        added = store.add_messages(sid, batch, parent_id=parent)
    except MessageNotFound:
        assert model.trimming  # the parent was trimmed
        return
    except OrphanToolResult:
        # Trimming removed the call these results answer (it keeps only the head: see
        # test_trimming_keeps_the_call_the_head_waits_for in the contract tests).
        assert model.trimming and batch[0]["role"] == "tool"
        return
    previous = parent if parent is not None else model.head
    for message in added["messages"]:
        model.parents[message["id"]] = previous
        previous = message["id"]
    model.head = previous
    assert added["head"] == model.head


def message(model: Conversation, data: st.DataObject, role: str) -> dict[str, Any]:
    message_id = model.new_id()
    text = f"{message_id} {data.draw(TEXT)}"  # unique, so the window's messages can be named
    return {"user": user, "assistant": assistant, "system": system}[role](text, id=message_id)


def call_group(model: Conversation, data: st.DataObject) -> list[dict[str, Any]]:
    """An assistant message calling 1-3 tools, then some or all of the results, in any order."""
    message_id = model.new_id()
    calls = [f"call-{message_id}-{i}" for i in range(data.draw(st.integers(1, 3)))]
    content = data.draw(st.none() | TEXT.map(lambda text: f"{message_id} {text}"))
    answered = data.draw(
        st.permutations(calls).flatmap(
            lambda order: st.integers(0, len(order)).map(lambda count: order[:count])
        )
    )
    group = [assistant(content, id=message_id, tool_calls=[tool_call(call) for call in calls])]
    return group + [result(call, f"{call} {data.draw(TEXT)}", id=model.new_id()) for call in answered]


def build(store: MemoryStore, sid: str, model: Conversation, data: st.DataObject) -> None:
    """A random valid sequence of appends, branches and head moves."""
    steps = data.draw(st.integers(1, 30), label="steps")
    kinds = ["user", "user", "assistant", "call", "call", "results", "branch", "set_head", "system"]
    for _ in range(steps):
        kind = data.draw(st.sampled_from(kinds))
        if kind in ("user", "assistant", "system"):
            append(store, sid, model, [message(model, data, kind)])
        elif kind == "call":
            group = call_group(model, data)
            if data.draw(st.booleans()):
                append(store, sid, model, group)
            else:  # the results in their own appends
                for part in [group[:1], *([m] for m in group[1:])]:
                    append(store, sid, model, part)
        elif kind == "results":
            waiting = open_calls(store.get_messages(sid)["messages"]) if model.head else []
            if waiting:
                answered = data.draw(st.lists(st.sampled_from(waiting), min_size=1, unique=True))
                append(store, sid, model, [result(call, call, id=model.new_id()) for call in answered])
        elif model.parents:
            target = data.draw(st.sampled_from(sorted(model.parents)))
            if kind == "branch":
                role = data.draw(st.sampled_from(["user", "assistant", "call"]))
                batch = call_group(model, data) if role == "call" else [message(model, data, role)]
                append(store, sid, model, batch, parent=target)
            else:
                try:
                    assert store.set_head(sid, target) == target
                    model.head = target
                except MessageNotFound:
                    assert model.trimming
    if data.draw(st.booleans(), label="ends with a call"):
        append(store, sid, model, call_group(model, data))


# The reference window -----------------------------------------------------------------------


def reference_window(
    thread: list[dict[str, Any]], max_tokens: int, max_messages: int, *, starts_at_root: bool
) -> tuple[list[str], int, bool]:
    """The window rule, written from the issue's words: pinned system messages while they
    fit; then, newest first, whole turn groups (the newest may wait for results) while they
    fit; groups that can never be whole are left out; results without their call are left
    out and make the window truncated."""
    tokens_left, messages_left = max_tokens, max_messages
    pinned: list[str] = []
    for message in thread:
        if message["role"] != "system":
            continue
        if message["tokens"] > tokens_left or messages_left < 1:
            return pinned, max_tokens - tokens_left, True
        pinned.append(message["id"])
        tokens_left -= message["tokens"]
        messages_left -= 1
    # Turn groups, oldest first: [members], calls, and whether it is tool results alone.
    groups: list[tuple[list[dict[str, Any]], set[str], bool]] = []
    for message in (m for m in thread if m["role"] != "system"):
        if message["role"] == "tool":
            if groups and groups[-1][1] and not groups[-1][2]:
                groups[-1][0].append(message)
            else:
                groups.append(([message], set(), True))
        else:
            groups.append(([message], {call["id"] for call in message.get("tool_calls") or ()}, False))
    chosen: list[list[dict[str, Any]]] = []
    truncated = not starts_at_root
    for members, calls, orphans in reversed(groups):
        if orphans:
            truncated = True
            continue
        answered = {member.get("tool_call_id") for member in members[1:]}
        if not calls <= answered and chosen:
            continue  # never whole: the chat went on without some results
        cost = sum(member["tokens"] for member in members)
        if cost > tokens_left or len(members) > messages_left:
            truncated = True
            break
        chosen.append(members)
        tokens_left -= cost
        messages_left -= len(members)
    ids = pinned + [member["id"] for members in reversed(chosen) for member in members]
    return ids, max_tokens - tokens_left, truncated


# Checking windows ----------------------------------------------------------------------------


def calls_of(message: dict[str, Any]) -> set[str]:
    return {call["id"] for call in message.get("tool_calls") or ()}


def chat_key(message: dict[str, Any]) -> str:
    return json.dumps(chat_message(message), sort_keys=True)


def starts_at_root(store: MemoryStore, sid: str, thread: list[dict[str, Any]]) -> bool:
    """Whether nothing of the thread was trimmed: its first message after the pinned system
    ones has no parent, or a parent still stored."""
    first = next((m for m in thread if m["role"] != "system"), None)
    if first is None or first["parent_id"] is None:
        return True
    try:
        store.get_messages(sid, leaf=first["parent_id"], limit=1)
    except MessageNotFound:
        return False
    return True


def check_window(store: MemoryStore, sid: str, thread: list[dict[str, Any]], budgets: Any) -> None:
    by_key = {chat_key(message): message for message in thread}
    assert len(by_key) == len(thread)  # every message is told apart by its chat fields
    position = {message["id"]: index for index, message in enumerate(thread)}
    root = starts_at_root(store, sid, thread)
    for max_tokens, max_messages in budgets:
        window = store.get_context(sid, max_tokens=max_tokens, max_messages=max_messages)
        for sent in window["messages"]:
            assert json.dumps(sent, sort_keys=True) in by_key, ("not on the current thread", sent)
        members = [by_key[json.dumps(sent, sort_keys=True)] for sent in window["messages"]]
        ids = [member["id"] for member in members]
        # Budgets: tokens are the members' own, within both limits.
        assert window["tokens"] == sum(member["tokens"] for member in members)
        assert window["tokens"] <= max_tokens
        assert len(members) <= max_messages
        # Order: system messages first, then the rest in thread order, each once.
        systems = [m["id"] for m in members if m["role"] == "system"]
        assert ids[: len(systems)] == systems
        assert systems == sorted(systems, key=position.get)
        rest = ids[len(systems) :]
        assert rest == sorted(rest, key=position.get) and len(set(ids)) == len(ids)
        # Tool results always follow their call; calls have all their results, but the newest.
        calls_seen: dict[str, str] = {}
        for member in members:
            if member["role"] == "tool":
                assert member["tool_call_id"] in calls_seen, ("orphan tool message", member)
            for call in member.get("tool_calls") or ():
                calls_seen[call["id"]] = member["id"]
        answered = {m["tool_call_id"] for m in members if m["role"] == "tool"}
        for index, member in enumerate(members):
            calls = {call["id"] for call in member.get("tool_calls") or ()}
            if calls - answered:
                assert all(later["role"] == "tool" for later in members[index + 1 :]), (
                    "a call without its results before the newest group",
                    member,
                )
        event(f"window truncated: {window['truncated']}")
        event(f"window waits for tool results: {bool(members) and bool(calls_of(members[-1]) - answered)}")
        event(f"window has tool results: {bool(answered)}")
        expected = reference_window(thread, max_tokens, max_messages, starts_at_root=root)
        assert (ids, window["tokens"], window["truncated"]) == expected


def budgets_for(data: st.DataObject, thread: list[dict[str, Any]]) -> list[tuple[int, int]]:
    total = sum(message["tokens"] for message in thread)
    tokens = st.integers(1, total + 10) | st.just(UNLIMITED)
    counts = st.integers(1, len(thread) + 2) | st.just(UNLIMITED)
    return data.draw(st.lists(st.tuples(tokens, counts), min_size=1, max_size=4), label="budgets")


@EXAMPLES
@given(data=st.data())
def test_random_conversations_have_valid_windows(configure, data):
    store = configure(MAX_MESSAGES=10_000)
    sid = f"w{next(_sessions)}"
    model = Conversation()
    build(store, sid, model, data)
    if model.head is None:
        return
    thread = store.get_messages(sid)["messages"]
    assert [message["id"] for message in thread] == model.thread()  # the current thread, and only it
    for leaf in data.draw(st.lists(st.sampled_from(sorted(model.parents)), max_size=3)):
        assert [m["id"] for m in store.get_messages(sid, leaf=leaf)["messages"]] == model.thread(leaf)
    (info,) = store.list_conversations(sid)
    assert (info["message_count"], info["trimmed"]) == (len(model.parents), 0)
    assert info["branch_count"] == len(set(model.parents) - set(model.parents.values()))
    event(f"branches: {min(info['branch_count'], 3)}")
    check_window(store, sid, thread, budgets_for(data, thread))


@EXAMPLES
@given(data=st.data())
def test_random_trimmed_conversations_have_valid_windows(configure, data):
    store = configure(MAX_MESSAGES=12)
    sid = f"t{next(_sessions)}"
    model = Conversation(trimming=True)
    build(store, sid, model, data)
    if model.head is None:
        return
    read = store.get_messages(sid)
    thread = read["messages"]
    assert read["head"] == model.head == thread[-1]["id"]
    (info,) = store.list_conversations(sid)
    assert info["message_count"] + info["trimmed"] == len(model.parents)
    # Trimming leaves no result without its call but at the start of a thread it cut (see
    # test_trimming_leaves_no_tool_result_of_another_branch_without_its_call), and there the
    # window knows it: the thread does not start at its root.
    chat = [message for message in thread if message["role"] != "system"]
    leading = next((i for i, message in enumerate(chat) if message["role"] != "tool"), len(chat))
    if leading:
        assert not starts_at_root(store, sid, thread)
    for index, message in enumerate(chat[leading:], start=leading):
        if message["role"] == "tool":
            assert any(message["tool_call_id"] in calls_of(m) for m in chat[:index]), message
    check_window(store, sid, thread, budgets_for(data, thread))


# The reference model against hand-made cases --------------------------------------------------


def stored(message_id: str, role: str, tokens: int, **fields: Any) -> dict[str, Any]:
    return {"id": message_id, "role": role, "tokens": tokens, "parent_id": None, **fields}


def test_the_reference_model_on_known_cases():
    call = {"tool_calls": [tool_call("c1"), tool_call("c2")]}
    thread = [
        stored("s", "system", 5),
        stored("u1", "user", 3),
        stored("a1", "assistant", 4, **call),
        stored("t1", "tool", 2, tool_call_id="c1"),
        stored("t2", "tool", 2, tool_call_id="c2"),
        stored("a2", "assistant", 3),
        stored("u2", "user", 3),
        stored("a3", "assistant", 4, **call),
        stored("t3", "tool", 2, tool_call_id="c1"),
    ]
    assert reference_window(thread, 100, 100, starts_at_root=True) == (
        ["s", "u1", "a1", "t1", "t2", "a2", "u2", "a3", "t3"],
        28,
        False,
    )
    assert reference_window(thread, 100, 5, starts_at_root=True) == (["s", "a2", "u2", "a3", "t3"], 17, True)
    assert reference_window(thread, 17 + 7, 100, starts_at_root=True) == (
        ["s", "a2", "u2", "a3", "t3"],
        17,
        True,
    )
    assert reference_window(thread, 100, 100, starts_at_root=False)[2] is True
    assert reference_window(thread, 4, 100, starts_at_root=True) == ([], 0, True)
    unanswered = [*thread[:-1], stored("u3", "user", 3)]  # a3's results never came
    assert reference_window(unanswered, 100, 100, starts_at_root=True)[0][-2:] == ["u2", "u3"]
    orphans = [stored("t0", "tool", 2, tool_call_id="gone"), *thread[1:3]]
    assert reference_window(orphans, 100, 100, starts_at_root=False) == (["u1", "a1"], 7, True)


# The window's cost ---------------------------------------------------------------------------


def long_conversation(store: MemoryStore, sid: str, count: int) -> None:
    store.add_messages(sid, [system("rules")])
    for start in range(1, count, 100):
        batch = []
        for index in range(start, min(start + 100, count)):
            batch.append(user(f"question {index % 100}") if index % 2 else assistant(f"answer {index % 100}"))
        store.add_messages(sid, batch)


def test_the_memory_window_reads_only_around_the_window(configure, backend_name, monkeypatch):
    if backend_name != "memory":
        pytest.skip("counts the memory backend's reads")
    store = configure(MAX_MESSAGES=20_000)
    long_conversation(store, "long", 10_000)
    long_conversation(store, "short", 100)
    reads = []
    select = memory_tree.select

    def counted(system: list[Any], newest_first: Any, **budgets: Any) -> Any:
        def pulled() -> Any:
            for link in newest_first:
                reads.append(link.id)
                yield link

        reads.extend(link.id for link in system)
        return select(system, pulled(), **budgets)

    monkeypatch.setattr(memory_tree, "select", counted)
    counts = {}
    for sid in ("long", "short"):
        reads.clear()
        window = store.get_context(sid, max_messages=20)
        assert len(window["messages"]) == 20 and window["truncated"] is True
        counts[sid] = len(reads)
        reads.clear()
        window = store.get_context(sid, max_tokens=60, max_messages=1000)
        assert 5 < len(window["messages"]) < 20
        counts[sid, "tokens"] = len(reads)
    # The window's messages, the system message and the one that did not fit.
    assert counts["long"] == counts["short"] <= 22
    assert counts["long", "tokens"] == counts["short", "tokens"] <= 22


def thread_reads(redis_client: Any, call: Any) -> list[str]:
    """The commands redis.lua runs during ``call`` on lists (as MONITOR reports them)."""
    seen: list[str] = []
    with redis_client.monitor() as monitor:
        call()
        redis_client.echo("end of the window")
        for event in monitor.listen():
            command = event["command"]
            if command.startswith("ECHO"):
                break
            if command.startswith(("LRANGE", "LINDEX", "LLEN", "LPOS", "GETRANGE")):
                seen.append(command)
    return seen


def test_the_redis_window_reads_only_around_the_window(configure, backend_name, redis_client):
    if backend_name != "redis":
        pytest.skip("watches the commands redis.lua runs")
    store = configure(MAX_MESSAGES=20_000)
    long_conversation(store, "long", 10_000)
    long_conversation(store, "short", 100)
    store.get_context("short", max_messages=20)  # the script is loaded
    calls, spans, ranges = {}, {}, {}
    for sid in ("long", "short"):
        redis_client.config_resetstat()
        window = store.get_context(sid, max_messages=20)
        assert len(window["messages"]) == 20 and window["truncated"] is True
        stats = redis_client.info("commandstats")
        calls[sid] = sum(
            stat["calls"]
            for name, stat in stats.items()
            if name not in (*CALL_STATS, "cmdstat_eval", "cmdstat_config", "cmdstat_info")
        )
        # How many entries of the thread's list the script read.
        span = ranges[sid] = 0
        for command in thread_reads(redis_client, lambda sid=sid: store.get_context(sid, max_messages=20)):
            parts = command.replace('"', "").split()
            ranges[sid] += parts[0] == "GETRANGE"
            if parts[0] == "LRANGE" and parts[1].endswith(":t"):  # the thread's ids (not its tail)
                start, stop = int(parts[2]), int(parts[3])
                assert start >= 0 and stop >= 0, command  # never "to the end" of the thread
                span += stop - start + 1
        spans[sid] = span
    assert calls["long"] == calls["short"], calls
    # The thread's form answers it: no entry of the thread's list read; one GETRANGE of the
    # records the budgets may reach, one of the texts.
    assert spans == {"long": 0, "short": 0} and ranges == {"long": 2, "short": 2}, (spans, ranges)
