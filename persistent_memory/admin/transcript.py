"""A conversation's thread read from the mirror rows and shaped for reading (the admin's
transcripts): each message with its role, an assistant's tool calls with the results
that answer them folded under them, the other versions of a regenerated message, and
every thread of the conversation (one per branch end).

The rows hold each message's parent, so a thread is walked from any message back to
the first one (or to the oldest one left after trimming); the current thread is the
store's, read with the memory backend's tree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from persistent_memory.backends.memory.tree import StoredMessage, Tree
from persistent_memory.mirror.conversations import row_summaries
from persistent_memory.models import MemoryConversation, MemoryMessage

#: Messages of a thread shown on the session page; the conversation's page shows all.
SESSION_PAGE_MESSAGES = 50
PREVIEW_CHARACTERS = 80


@dataclass
class Call:
    """One tool call of an assistant message, and the tool message answering it."""

    call_id: str
    name: str
    #: As the model wrote them, and indented when they are JSON.
    arguments: str
    pretty_arguments: str
    result: MemoryMessage | None = None


@dataclass
class Version:
    """One version of a message (it and its siblings): the thread to read it in."""

    message: MemoryMessage
    leaf: str
    shown: bool


@dataclass
class Entry:
    """One message of the thread as shown."""

    message: MemoryMessage
    calls: list[Call] = field(default_factory=list)
    #: With more than one: the message was regenerated (or edited); in seq order.
    versions: list[Version] = field(default_factory=list)

    @property
    def version_number(self) -> int:
        return next(i for i, version in enumerate(self.versions, start=1) if version.shown)


@dataclass
class Thread:
    """A thread of the conversation: the messages from the first one to ``leaf``."""

    leaf: str
    length: int
    preview: str
    current: bool
    shown: bool


@dataclass
class Transcript:
    #: None: messages that are no conversation's rows (a graph thread's, see
    #: :mod:`persistent_memory.admin.checkpoints`), shown without links to their rows.
    conversation: MemoryConversation | None
    leaf: str | None
    entries: list[Entry]
    threads: list[Thread]
    #: Older messages of the thread left out (``limit``).
    hidden: int = 0
    #: Messages before the first shown were trimmed from the store.
    trimmed_before: bool = False
    #: The rolling summary of this thread (Summary._asdict(): of the conversation's, the one
    #: whose anchor is deepest on it), and the ids of the shown messages it covers (the
    #: thread up to its anchor).
    summary: dict[str, Any] | None = None
    covered: set[str] = field(default_factory=set)


class UnknownLeaf(LookupError):
    """The conversation has no message of that id (in the mirror)."""


def preview(message: MemoryMessage) -> str:
    text = " ".join(message.content_text.split())
    if not text and message.tool_calls:
        text = ", ".join(f"{call['function']['name']}()" for call in message.tool_calls)
    return text if len(text) <= PREVIEW_CHARACTERS else text[: PREVIEW_CHARACTERS - 1] + "…"


def _pretty_arguments(arguments: str) -> str:
    """A call's arguments indented when they are JSON (they usually are)."""
    try:
        return json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
    except ValueError:
        return arguments


def fold_calls(messages: list[MemoryMessage]) -> list[Entry]:
    """``messages`` as entries, each tool result folded under the call it answers (a
    result whose call is not right before it stays an entry of its own)."""
    entries: list[Entry] = []
    open_calls: dict[str, Call] = {}
    for message in messages:
        if message.role == "tool" and message.tool_call_id in open_calls:
            open_calls.pop(message.tool_call_id).result = message
            continue
        entry = Entry(message)
        if message.role != "tool":
            open_calls = {}
        for call in message.tool_calls or ():
            function = call.get("function") or {}
            arguments = function.get("arguments", "")
            folded = Call(
                call.get("id", ""), function.get("name", ""), arguments, _pretty_arguments(arguments)
            )
            entry.calls.append(folded)
            open_calls[folded.call_id] = folded
        entries.append(entry)
    return entries


def build(
    conversation: MemoryConversation, *, leaf: str | None = None, limit: int | None = None
) -> Transcript:
    """The thread ending at ``leaf`` (None: the head), its newest ``limit`` messages (None:
    all); :class:`UnknownLeaf` when ``leaf`` is not a message of the conversation."""
    rows = list(conversation.messages.defer("stored").order_by("seq"))
    by_id = {row.message_id: row for row in rows}
    children: dict[str, list[MemoryMessage]] = {}
    for row in rows:
        if row.parent_id in by_id:
            children.setdefault(row.parent_id, []).append(row)
    end = leaf or conversation.head or None
    if end is not None and end not in by_id:
        raise UnknownLeaf(end)

    # The newest branch end below each message, and each message's depth (parents have lower seqs).
    newest_leaf: dict[str, str] = {}
    for row in reversed(rows):
        below = children.get(row.message_id)
        newest_leaf[row.message_id] = (
            max((newest_leaf[child.message_id] for child in below), key=lambda m: by_id[m].seq)
            if below
            else row.message_id
        )
    depth: dict[str, int] = {}
    for row in rows:
        depth[row.message_id] = depth.get(row.parent_id, 0) + 1

    # The thread as the store reads it: the current one begins with the system messages
    # a trim kept before it (see backends.memory.tree.Tree), which no parent link reaches.
    shape = [
        StoredMessage(
            row.message_id, "", "", row.parent_id or None, row.seq, row.tokens, row.role, (), None, ""
        )
        for row in rows
    ]
    head = conversation.head if conversation.head in by_id else None
    tree = Tree.assemble(shape, head=head, seq=conversation.seq, trimmed=0)
    ids = [] if end is None else tree.thread if end == tree.head else tree.path(end, 0)
    path = [by_id[message_id] for message_id in ids]
    trimmed_before = any(row.parent_id and row.parent_id not in by_id for row in path)
    start = 0
    if limit is not None and len(path) > limit:
        start = len(path) - limit
        while start > 0 and path[start].role == "tool":  # never a result without its call
            start -= 1
    on_path = {row.message_id for row in path}

    entries = fold_calls(path[start:])
    for entry in entries:
        message = entry.message
        siblings = children.get(message.parent_id, []) if message.parent_id in by_id else []
        if len(siblings) > 1:
            entry.versions = [
                Version(sibling, newest_leaf[sibling.message_id], sibling.message_id in on_path)
                for sibling in siblings
            ]

    ends = [row for row in reversed(rows) if row.message_id not in children]
    if head in by_id and head in children:
        ends.insert(0, by_id[head])  # the head moved back to a message that has answers
    threads = [
        Thread(
            row.message_id, depth[row.message_id], preview(row), row.message_id == head, row.message_id == end
        )
        for row in ends
    ]
    # Of the summaries, the one a window of this thread uses (the others summarize other branches).
    summaries = row_summaries(conversation.summary)
    positions = {row.message_id: position for position, row in enumerate(path)}
    on_thread = [summary for summary in summaries if summary["anchor"] in positions]
    summary = max(on_thread, key=lambda summary: positions[summary["anchor"]], default=None)
    covered: set[str] = set()
    if summary is not None:
        covered = {row.message_id for row in path[: positions[summary["anchor"]] + 1]}
    return Transcript(
        conversation,
        end,
        entries,
        threads,
        hidden=start,
        trimmed_before=trimmed_before,
        summary=summary,
        covered=covered,
    )
