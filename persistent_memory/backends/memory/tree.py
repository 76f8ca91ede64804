"""One conversation held in process memory: the memory backend's message tree.

Each message keeps its stored text and its link (parent, seq, tokens, role, tool calls).
``thread`` is the current thread, root to head, so appending to the head and reading
the newest messages cost O(1) per message; a branch cuts the thread back to its
parent (found from the end, where regenerated answers branch) before appending.

Rolling summaries are kept by anchor, one per branch that has one: each stands for the
thread from the root to its anchor, and a window uses the one whose anchor is deepest
on the current thread (``anchor``, kept as the thread moves, with ``covered``, the tokens
of the stored messages it covers, so an append need not count them again).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

from persistent_memory.backends.conversations import Summary, text_digest
from persistent_memory.chat.messages import (
    PreparedMessage,
    chat_message,
    link_of,
    stored_link,
    stored_text,
)
from persistent_memory.chat.window import Link, Window, select
from persistent_memory.exceptions import MessageConflict, MessageNotFound, OrphanToolResult


@dataclass
class StoredMessage:
    """A message as stored, and its link."""

    id: str
    text: str
    link: str
    parent: str | None
    seq: int
    tokens: int
    role: str
    calls: tuple[str, ...]
    answers: str | None
    fingerprint: str
    #: Its chat fields, parsed from ``text`` when first read (messages never change).
    chat: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.window = Link(self.id, self.tokens, self.role, self.calls, self.answers)

    def chat_copy(self) -> dict[str, Any]:
        """A fresh copy of the chat fields (lists and objects copied, strings shared)."""
        chat = self.chat
        if chat is None:
            chat = self.chat = chat_message(json.loads(self.text))
        if len(chat) == 2 and isinstance(chat.get("content"), str):  # role and text: nothing nested
            return chat.copy()
        return {key: copy.deepcopy(v) if isinstance(v, list | dict) else v for key, v in chat.items()}

    @classmethod
    def build(cls, message_id: str, text: str, link: str) -> StoredMessage:
        data = json.loads(link)
        return cls(
            message_id,
            text,
            link,
            data["p"],
            data["s"],
            data["t"],
            data["r"],
            tuple(data["c"]),
            data["a"],
            data["f"],
        )

    @classmethod
    def new(cls, prepared: PreparedMessage, parent_id: str | None, seq: int) -> StoredMessage:
        """``prepared`` as stored under ``parent_id`` with ``seq``."""
        return cls(
            prepared.id,
            stored_text(prepared.id, parent_id, seq, prepared.body),
            stored_link(parent_id, seq, prepared.link),
            parent_id,
            seq,
            prepared.tokens,
            prepared.role,
            prepared.calls,
            prepared.answers,
            prepared.fingerprint,
        )


@dataclass
class Tree:
    """A conversation's messages, head and current thread."""

    messages: dict[str, StoredMessage] = field(default_factory=dict)
    thread: list[str] = field(default_factory=list)
    #: The pinned system messages: those of the current thread, in order.
    system: list[str] = field(default_factory=list)
    #: Ids of messages with at least one child (the others are leaves: branch ends).
    parents: set[str] = field(default_factory=set)
    head: str | None = None
    seq: int = 0
    tokens: int = 0
    trimmed: int = 0
    #: Bytes of the stored texts (they count toward MAX_SESSION_BYTES).
    size: int = 0
    #: Rolling summaries by anchor (see persistent_memory.conversations.summaries); their
    #: ``covered_tokens`` are counted when read (:meth:`covered_tokens`), since a trim
    #: on one branch can take messages that several of them cover.
    summaries: dict[str, Summary] = field(default_factory=dict)
    #: The anchor of the summary that applies to the current thread (the deepest one on
    #: it; None: none) and the tokens of the stored messages it covers.
    anchor: str | None = None
    covered: int = 0
    #: The XOR of the text digests of the messages up to seq ``digested`` (the snapshot's
    #: ``digest``): kept as messages go, and the newer ones folded in when next asked, so
    #: an append pays nothing for it and a mirror sync only for the messages since the last.
    digest: int = 0
    digested: int = 0

    # Reading ------------------------------------------------------------------

    def require(self, message_id: str) -> StoredMessage:
        try:
            return self.messages[message_id]
        except KeyError:
            raise MessageNotFound(f"The conversation has no message {message_id!r}.") from None

    def open_calls(self, message_id: str | None) -> set[str]:
        """Tool calls still waiting for results on the thread ending at ``message_id``."""
        answered: set[str] = set()
        message = self.messages.get(message_id) if message_id else None
        while message is not None and message.role == "tool":
            answered.add(message.answers or "")
            message = self.messages.get(message.parent) if message.parent else None
        if message is None or not message.calls:
            return set()
        return set(message.calls) - answered

    def path(self, leaf: str, limit: int) -> list[str]:
        """Ids from the root (or the newest ``limit``) to ``leaf``, oldest first. A thread whose
        start was trimmed starts with the system messages the trim kept (see :meth:`trim`)."""
        ids: list[str] = []
        message: StoredMessage | None = self.require(leaf)
        first = message
        while message is not None and (not limit or len(ids) < limit):
            ids.append(message.id)
            first = message
            message = self.messages.get(message.parent) if message.parent else None
        ids.reverse()
        if message is None and first.parent is not None:  # walked to a trimmed parent
            pinned = self._pinned_before(first)
            ids[:0] = pinned[len(pinned) - (limit - len(ids)) :] if limit else pinned
        return ids

    def _pinned_before(self, first: StoredMessage) -> list[str]:
        """The system messages a trim kept before ``first``, a message whose parent it
        removed: older system messages with nothing but system messages above them (a side
        branch's own system message has the branch's other messages above it)."""
        return [
            message.id
            for message in self.messages.values()  # in seq order
            if message.seq < first.seq and message.role == "system" and self._only_system_above(message)
        ]

    def read(self, leaf: str | None, limit: int) -> list[str]:
        """Stored texts of the thread ending at ``leaf`` (None: the head), oldest first."""
        if leaf is not None:
            return [self.messages[message_id].text for message_id in self.path(leaf, limit)]
        ids = self.thread[-limit:] if limit else self.thread
        return [self.messages[message_id].text for message_id in ids]

    def window(self, max_tokens: int | None, max_messages: int | None, *, after: int | None = None) -> Window:
        """The window; with ``after`` (a thread position: the summary's anchor), of the
        messages after it only, whose walk ends there without leaving anything out."""
        newest = reversed(self.thread if after is None else self.thread[after + 1 :])
        return select(
            [self.messages[message_id].window for message_id in self.system],
            (self.messages[message_id].window for message_id in newest),
            max_tokens=max_tokens,
            max_messages=max_messages,
            starts_at_root=after is not None or self._starts_at_root(),
        )

    def position(self, message_id: str | None) -> int | None:
        """Where a message is on the current thread (None: not on it), searched from the end."""
        if message_id is None:
            return None
        for position in range(len(self.thread) - 1, -1, -1):
            if self.thread[position] == message_id:
                return position
        return None

    def anchor_position(self) -> int | None:
        """Where the anchor of the summary that applies to the current thread is on it
        (None: no summary's anchor is on this thread)."""
        return self.position(self.anchor)

    @property
    def summary(self) -> Summary | None:
        """The summary that applies to the current thread, with its covered tokens."""
        if self.anchor is None:
            return None
        return self.summaries[self.anchor]._replace(covered_tokens=self.covered)

    def covered_tokens(self, anchor: str) -> int:
        """Tokens of the stored messages the summary anchored at ``anchor`` covers."""
        return sum(self.messages[message_id].tokens for message_id in self.path(anchor, 0))

    def find_anchor(self) -> None:
        """Choose the summary that applies to the current thread again (it moved past or off
        the one that did, or lost it to a trim): the deepest anchor on it."""
        self.anchor, self.covered = None, 0
        if not self.summaries:
            return
        positions = {message_id: position for position, message_id in enumerate(self.thread)}
        on_thread = [positions[anchor] for anchor in self.summaries if anchor in positions]
        if on_thread:
            deepest = max(on_thread)
            self.anchor = self.thread[deepest]
            self.covered = sum(self.messages[message_id].tokens for message_id in self.thread[: deepest + 1])

    def put_summary(self, summary: Summary, position: int) -> None:
        """Store ``summary``, anchored at thread ``position``, as the one of the current
        thread: the summaries anchored on it before (all before ``position``) are the
        ones it continues, and go; those of other branches stay."""
        on_thread = set(self.thread[:position])
        self.summaries = {anchor: held for anchor, held in self.summaries.items() if anchor not in on_thread}
        self.summaries[summary.anchor] = summary
        self.anchor = summary.anchor
        self.covered = sum(self.messages[message_id].tokens for message_id in self.thread[: position + 1])

    def _starts_at_root(self) -> bool:
        """Whether the thread lost no message to trimming: its first message after the pinned
        system ones still has its parent (or had none)."""
        for message_id in self.thread:
            message = self.messages[message_id]
            if message.role != "system":
                return message.parent is None or message.parent in self.messages
        return True

    def branch_count(self) -> int:
        return len(self.messages) - len(self.parents)

    # Writing ------------------------------------------------------------------

    def plan(
        self, parent_id: str | None, batch: list[PreparedMessage], *, root: bool = False
    ) -> list[tuple[StoredMessage, bool]]:
        """Check an append after ``parent_id`` (None: the head; with ``root``, none: a new
        root) without changing anything: each message as it would be stored, and whether it
        is new (False: it repeats a stored one). Raises what the append would."""
        if parent_id is not None:
            self.require(parent_id)
        previous = None if root else self.head if parent_id is None else parent_id
        open_calls = self.open_calls(previous)
        seq = self.seq
        plan: list[tuple[StoredMessage, bool]] = []
        for index, prepared in enumerate(batch):
            stored = self.messages.get(prepared.id)
            if stored is not None:
                if stored.fingerprint != prepared.fingerprint:
                    raise MessageConflict(
                        f"messages[{index}]: message {prepared.id!r} is already stored with other content."
                    )
                open_calls = self.open_calls(stored.id)
                plan.append((stored, False))
                previous = stored.id
                continue
            if prepared.role == "tool":
                if prepared.answers not in open_calls:
                    raise OrphanToolResult(
                        f"messages[{index}]: tool_call_id {prepared.answers!r} answers no call open on "
                        "this thread (a tool result must follow the assistant message that called it)."
                    )
                open_calls.discard(prepared.answers or "")
            else:
                open_calls = set(prepared.calls)
            seq += 1
            message = StoredMessage.new(prepared, previous, seq)
            plan.append((message, True))
            previous = message.id
        return plan

    def commit(self, plan: list[tuple[StoredMessage, bool]]) -> None:
        """Store the new messages of a :meth:`plan`; the last new one becomes the head."""
        for message, new in plan:
            if not new:
                continue
            self.add(message)
            self.seq = message.seq
            if message.parent is not None:
                self.parents.add(message.parent)
            self._move_thread(message.parent)
            self.thread.append(message.id)
            if message.role == "system":
                self.system.append(message.id)
            self.head = message.id

    def add(self, message: StoredMessage) -> None:
        """Hold ``message`` (no thread change)."""
        self.messages[message.id] = message
        self.tokens += message.tokens
        self.size += len(message.text)

    def set_head(self, message_id: str) -> None:
        self.require(message_id)
        self._move_thread(message_id)
        self.head = message_id

    def clear_head(self) -> None:
        """No head: the next append starts a new root."""
        self._move_thread(None)
        self.head = None

    def drop(self, message: StoredMessage) -> None:
        """Remove a message off the current thread (``pop_message``): unless another branch
        goes on from it; a summary anchored there goes with it."""
        if message.id in self.parents:
            return
        self._remove(message)
        if message.parent is not None and not any(
            other.parent == message.parent for other in self.messages.values()
        ):
            self.parents.discard(message.parent)
        if self.summaries.pop(message.id, None) is not None:
            self.find_anchor()

    def _move_thread(self, parent_id: str | None) -> None:
        """Make the thread end at ``parent_id`` (None: empty)."""
        if parent_id is None:
            self.thread, self.system = [], []
            self.find_anchor()
            return
        if self.thread and self.thread[-1] == parent_id:
            return
        for position in range(len(self.thread) - 1, -1, -1):
            if self.thread[position] == parent_id:
                del self.thread[position + 1 :]
                seq = self.messages[parent_id].seq  # seqs grow along a thread
                self.system = [m for m in self.system if self.messages[m].seq <= seq]
                if self.anchor is not None and self.messages[self.anchor].seq > seq:
                    self.find_anchor()  # cut back before the summary's anchor
                return
        self.thread = self.path(parent_id, 0)
        self.system = [m for m in self.thread if self.messages[m].role == "system"]
        self.find_anchor()

    def _only_system_above(self, message: StoredMessage) -> bool:
        parent = self.messages.get(message.parent) if message.parent else None
        while parent is not None:
            if parent.role != "system":
                return False
            parent = self.messages.get(parent.parent) if parent.parent else None
        return True

    def trim(self, max_messages: int, *, covered_only: bool = False) -> int:
        """Remove the oldest messages (by seq, on any branch) beyond ``max_messages``, then
        tool results left without their call; never the head nor the current thread's
        pinned system messages. With ``covered_only`` (a summarizer is configured) only
        messages the current thread's summary covers go, its anchor excepted: nothing is
        forgotten that is not summarized. A summary whose anchor goes goes with it (with
        ``covered_only`` the current thread's covers all it did). Returns how many went."""
        excess = len(self.messages) - max_messages
        if excess <= 0:
            return 0
        kept = {*self.system, self.head}
        candidates: Any = self.messages.values()  # in seq order
        if covered_only:
            anchor = self.anchor_position()
            if anchor is None:
                return 0
            kept.add(self.thread[anchor])
            candidates = [self.messages[message_id] for message_id in self.thread[:anchor]]
        gone: dict[str, StoredMessage] = {}
        for message in candidates:
            if message.id in kept:
                continue
            if len(gone) >= excess and not (message.role == "tool" and self._call_gone(message, gone)):
                break
            gone[message.id] = message
        for message in gone.values():
            self._remove(message)
        if any(message_id in gone for message_id in self.thread):
            self.thread = [message_id for message_id in self.thread if message_id not in gone]
        if self.summaries:
            self.summaries = {anchor: held for anchor, held in self.summaries.items() if anchor not in gone}
            if covered_only:
                self.covered -= sum(message.tokens for message in gone.values())
            else:  # what went may be anywhere: count again
                self.find_anchor()
        self.trimmed += len(gone)
        return len(gone)

    def _call_gone(self, message: StoredMessage, gone: dict[str, StoredMessage]) -> bool:
        """Whether a tool message's parent (its call, or a result before it) is removed."""
        return message.parent is None or message.parent in gone or message.parent not in self.messages

    def _remove(self, message: StoredMessage) -> None:
        del self.messages[message.id]
        self.parents.discard(message.id)
        self.tokens -= message.tokens
        self.size -= len(message.text)
        if message.seq <= self.digested:
            self.digest ^= text_digest(message.text)

    def texts_digest(self) -> int:
        """The XOR of every held message's :func:`text_digest` (see ``digest``)."""
        for message in reversed(self.messages.values()):  # in seq order: the newest last
            if message.seq <= self.digested:
                break
            self.digest ^= text_digest(message.text)
        self.digested = self.seq
        return self.digest

    @classmethod
    def restore(cls, snapshot: dict[str, Any]) -> Tree:
        """A tree from :meth:`snapshot`'s dict."""
        messages = []
        for text in snapshot["messages"]:
            stored = json.loads(text)
            messages.append(StoredMessage.build(stored["id"], text, link_of(stored)))
        tree = cls.assemble(messages, head=snapshot["head"], seq=snapshot["seq"], trimmed=snapshot["trimmed"])
        tree.summaries = {
            summary["anchor"]: Summary(**summary)
            for summary in snapshot.get("summaries") or ()
            if summary["anchor"] in tree.messages  # (an import checks it; a snapshot holds it)
        }
        tree.find_anchor()
        return tree

    @classmethod
    def assemble(cls, messages: list[StoredMessage], *, head: str | None, seq: int, trimmed: int) -> Tree:
        """A tree of these messages with this head, as :meth:`restore` builds it (the
        mirror builds one to count branches as the store does)."""
        tree = cls(seq=seq, trimmed=trimmed)
        for message in sorted(messages, key=lambda message: message.seq):  # the dict stays in seq order
            tree.add(message)
        tree.parents = {message.parent for message in messages if message.parent in tree.messages}
        if head is not None:
            tree.set_head(head)
            # Every message of the current thread but its head had a child there (the pinned
            # system messages a trim kept too): they count as parents, as they did live.
            tree.parents.update(tree.thread[:-1])
        return tree

    def snapshot(self) -> dict[str, Any]:
        return {
            "head": self.head,
            "seq": self.seq,
            "trimmed": self.trimmed,
            "messages": [message.text for message in self.messages.values()],  # in seq order
            "summaries": [
                summary._replace(covered_tokens=self.covered_tokens(anchor))._asdict()
                for anchor, summary in sorted(self.summaries.items(), key=lambda item: item[1].anchor_seq)
            ],
            "digest": f"{self.texts_digest():032x}",
            "message_count": len(self.messages),
            "tokens": self.tokens,
            "branch_count": self.branch_count(),
        }
