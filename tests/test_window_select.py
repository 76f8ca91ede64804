"""The window rule itself (chat/window.py's ``select``), fast: hand-made cases at
the budgets' edges, and a few thousand seeded threads checked against the reference model
of tests/test_conversation_window.py (whose Hypothesis tests run it through both backends)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from persistent_memory.chat.window import PLAIN_ROLES, Link, Window, select
from tests.test_conversation_window import reference_window


def links(thread: list[dict[str, Any]]) -> tuple[list[Link], list[Link]]:
    """The pinned system links (oldest first) and every link newest first, as a tree gives them."""
    every = [
        Link(
            m["id"],
            m["tokens"],
            m["role"],
            tuple(call["id"] for call in m.get("tool_calls") or ()),
            m.get("tool_call_id"),
        )
        for m in thread
    ]
    return [link for link in every if link.role == "system"], every[::-1]


def window(
    thread: list[dict[str, Any]], max_tokens: int | None, max_messages: int | None, root: bool
) -> Window:
    system, newest_first = links(thread)
    return select(system, newest_first, max_tokens=max_tokens, max_messages=max_messages, starts_at_root=root)


def msg(
    message_id: str, role: str, tokens: int, calls: tuple[str, ...] = (), answers: str | None = None
) -> dict:
    message: dict[str, Any] = {"id": message_id, "role": role, "tokens": tokens}
    if calls:
        message["tool_calls"] = [{"id": call} for call in calls]
    if answers is not None:
        message["tool_call_id"] = answers
    return message


THREAD = [
    msg("s", "system", 5),
    msg("u1", "user", 3),
    msg("a1", "assistant", 4, calls=("c1", "c2")),
    msg("t1", "tool", 2, answers="c1"),
    msg("t2", "tool", 2, answers="c2"),
    msg("a2", "assistant", 3),
    msg("u2", "user", 3),
    msg("a3", "assistant", 4, calls=("c3",)),
    msg("t3", "tool", 2, answers="c3"),
]


def test_plain_roles():
    assert frozenset(("user", "assistant")) == PLAIN_ROLES


def test_no_budgets_take_the_whole_thread():
    assert window(THREAD, None, None, True) == Window([m["id"] for m in THREAD], 28, False)
    assert window(THREAD, None, None, False) == Window([m["id"] for m in THREAD], 28, True)


@pytest.mark.parametrize(
    ("max_tokens", "max_messages", "expected"),
    [
        (28, None, Window(["s", "u1", "a1", "t1", "t2", "a2", "u2", "a3", "t3"], 28, False)),  # exactly fits
        (27, None, Window(["s", "a1", "t1", "t2", "a2", "u2", "a3", "t3"], 25, True)),  # u1 no longer fits
        (24, None, Window(["s", "a2", "u2", "a3", "t3"], 17, True)),  # nor the call group
        (None, 9, Window(["s", "u1", "a1", "t1", "t2", "a2", "u2", "a3", "t3"], 28, False)),
        (None, 8, Window(["s", "a1", "t1", "t2", "a2", "u2", "a3", "t3"], 25, True)),
        (None, 7, Window(["s", "a2", "u2", "a3", "t3"], 17, True)),
        (None, 5, Window(["s", "a2", "u2", "a3", "t3"], 17, True)),
        (None, 4, Window(["s", "u2", "a3", "t3"], 14, True)),
        (11, None, Window(["s", "a3", "t3"], 11, True)),
        (10, None, Window(["s"], 5, True)),  # the newest group does not fit whole
        (5, None, Window(["s"], 5, True)),
        (4, None, Window([], 0, True)),  # the system message does not fit: nothing does
        (None, 1, Window(["s"], 5, True)),
        (None, 0, Window([], 0, True)),
    ],
)
def test_budgets_at_their_edges(max_tokens, max_messages, expected):
    assert window(THREAD, max_tokens, max_messages, True) == expected


def test_the_newest_group_may_wait_for_its_results_and_older_ones_may_not():
    waiting = [*THREAD[:-1]]  # a3's result has not come yet
    assert window(waiting, None, None, True) == Window([m["id"] for m in waiting], 26, False)
    went_on = [*waiting, msg("u3", "user", 1)]  # the chat went on without it
    assert window(went_on, None, None, True) == Window(
        ["s", "u1", "a1", "t1", "t2", "a2", "u2", "u3"], 23, False
    )
    partial = [*THREAD[:4], msg("u3", "user", 1)]  # a1 got one of its two results only
    assert window(partial, None, None, True) == Window(["s", "u1", "u3"], 9, False)


def test_results_whose_call_is_gone_are_left_out_and_truncate():
    orphans = [msg("t0", "tool", 2, answers="gone"), msg("t9", "tool", 1, answers="gone2"), *THREAD[1:3]]
    assert window(orphans, None, None, True) == Window(["u1", "a1"], 7, True)
    lone = [msg("t0", "tool", 2, answers="gone")]
    assert window(lone, None, None, True) == Window([], 0, True)


def test_system_messages_are_pinned_first_and_skipped_in_the_walk():
    thread = [msg("s1", "system", 1), msg("u1", "user", 2), msg("s2", "system", 3), msg("a1", "assistant", 4)]
    assert window(thread, None, None, True) == Window(["s1", "s2", "u1", "a1"], 10, False)
    assert window(thread, 8, None, True) == Window(["s1", "s2", "a1"], 8, True)
    assert window(thread, 3, None, True) == Window(["s1"], 1, True)
    assert window(thread, None, 2, True) == Window(["s1", "s2"], 4, True)
    assert window(thread, None, 3, True) == Window(["s1", "s2", "a1"], 8, True)


def random_thread(rng: random.Random) -> list[dict[str, Any]]:
    """A thread as a store holds one: results right after their call (any subset, any
    order), pinned system messages anywhere, and, when its start was trimmed, results
    without their call first."""
    thread: list[dict[str, Any]] = []
    counter = iter(range(10_000))

    def new_id() -> str:
        return f"m{next(counter)}"

    for _ in range(rng.randint(0, 2) if rng.random() < 0.2 else 0):
        thread.append(msg(new_id(), "tool", rng.randint(0, 5), answers=f"gone{rng.randint(0, 9)}"))
    for _ in range(rng.randint(0, 12)):
        kind = rng.choice(["user", "user", "assistant", "call", "call", "system"])
        if kind != "call":
            thread.append(msg(new_id(), kind, rng.randint(0, 6)))
            continue
        call_id = new_id()
        calls = tuple(f"{call_id}-{n}" for n in range(rng.randint(1, 3)))
        thread.append(msg(call_id, "assistant", rng.randint(0, 6), calls=calls))
        answered = rng.sample(calls, rng.randint(0, len(calls)))
        thread.extend(msg(new_id(), "tool", rng.randint(0, 4), answers=call) for call in answered)
    return thread


def test_seeded_threads_match_the_reference_model():
    rng = random.Random(46)
    outcomes = set()
    for _ in range(1500):
        thread = random_thread(rng)
        total = sum(m["tokens"] for m in thread)
        root = rng.random() < 0.8
        for max_tokens, max_messages in [
            (None, None),
            (rng.randint(0, total + 2), None),
            (None, rng.randint(0, len(thread) + 1)),
            (rng.randint(0, total + 2), rng.randint(0, len(thread) + 1)),
        ]:
            got = window(thread, max_tokens, max_messages, root)
            expected = reference_window(
                thread,
                10**9 if max_tokens is None else max_tokens,
                10**9 if max_messages is None else max_messages,
                starts_at_root=root,
            )
            assert (got.ids, got.tokens, got.truncated) == expected, (thread, max_tokens, max_messages, root)
            outcomes.add((got.truncated, len(got.ids) == len(thread)))
    assert outcomes == {(False, True), (True, True), (True, False), (False, False)}
