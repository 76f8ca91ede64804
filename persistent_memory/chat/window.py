"""The window: which messages of a thread to send to a model now.

The memory backend runs this; redis.lua's ``window`` runs the same rule. A window is
the thread's pinned ``system`` messages (oldest first, while they fit), then the
newest whole *turn groups* that fit both budgets, oldest first. A turn group is a
user message; an assistant message without tool calls; or an assistant message with
tool calls and the tool messages answering them. So a window never holds a tool
result without its call, nor a call without all its results, except the newest group
while its tools are still running. Groups that can never be whole (a call whose
results never came before the chat went on, results whose call was trimmed) are left
out. The walk reads the thread from its newest message and stops at the first group
that does not fit, so its cost is bounded by the window, not by the thread.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

#: Roles whose message without tool calls is a turn group of its own.
PLAIN_ROLES = frozenset(("user", "assistant"))


class Link(NamedTuple):
    """What a window needs to know of a message (its stored link)."""

    id: str
    tokens: int
    role: str
    calls: tuple[str, ...]
    answers: str | None


class Window(NamedTuple):
    """Ids of the messages to send, in order, their tokens, and whether older ones were left out."""

    ids: list[str]
    tokens: int
    truncated: bool


def select(
    system: list[Link],
    newest_first: Iterable[Link],
    *,
    max_tokens: int | None,
    max_messages: int | None,
    starts_at_root: bool,
) -> Window:
    """The window over a thread given its pinned ``system`` messages (oldest first) and its
    messages from the newest (system ones are skipped there). ``starts_at_root``: the
    thread's first stored message has no parent (none was trimmed before it)."""
    token_room = max_tokens if max_tokens is not None else float("inf")
    message_room = max_messages if max_messages is not None else float("inf")
    pinned: list[str] = []
    used = 0
    truncated = False
    for link in system:
        if link.tokens > token_room or message_room < 1:
            truncated = True
            break
        pinned.append(link.id)
        used += link.tokens
        token_room -= link.tokens
        message_room -= 1
    groups: list[list[Link]] = []  # newest first
    results: list[Link] = []  # tool messages met (newest first), waiting for their call
    full = truncated
    for link in newest_first:
        if full:
            break
        if not results and not link.calls and link.role in PLAIN_ROLES:
            # A plain message with no tool results waiting (most are): a group of its own.
            if link.tokens > token_room or message_room < 1:
                truncated = full = True
                break
            used += link.tokens
            token_room -= link.tokens
            message_room -= 1
            groups.append([link])
            continue
        if link.role == "system":
            continue
        if link.role == "tool":
            results.append(link)
            continue
        group = [link]
        if link.calls:
            answered = {result.answers for result in results}
            group.extend(reversed(results))
            if not answered.issuperset(link.calls) and groups:
                results = []
                continue  # never whole: the chat went on without some results
        elif results:
            truncated = True  # results whose call is gone (trimmed): left out
        results = []
        tokens = sum(member.tokens for member in group)
        if tokens > token_room or len(group) > message_room:
            truncated = full = True
            break
        used += tokens
        token_room -= tokens
        message_room -= len(group)
        groups.append(group)
    else:
        if results or not starts_at_root:
            truncated = True
    ids = pinned + [member.id for group in reversed(groups) for member in group]
    return Window(ids, used, truncated)
