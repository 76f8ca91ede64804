"""The memory backend's rolling summaries (the contract in :mod:`.conversations`).

Held by :class:`~persistent_memory.backends.memory.MemoryBackend` as ``summaries``, which gives it
its session table (:class:`~.sessions.SessionTable`), with its lock,
journal and mirror marks; marked conversations are a set of (storage id, conversation).
"""

from __future__ import annotations

import copy
import time
from typing import TYPE_CHECKING, Any

from persistent_memory.backends.conversations import Summary, SummarySource

if TYPE_CHECKING:
    from persistent_memory.backends.memory.conversations import MemoryConversations
    from persistent_memory.backends.memory.sessions import SessionTable


class MemorySummaries:
    """Summaries kept on each conversation's tree (by anchor: one per branch that has one)."""

    def __init__(self, table: SessionTable, conversations: MemoryConversations) -> None:
        self._table = table
        self._conversations = conversations  # a summary settles a conversation as a write does

    def pop_unsummarized(self, count: int) -> list[tuple[str, str]]:
        with self._table._lock:
            return [
                self._table._unsummarized.pop() for _ in range(min(count, len(self._table._unsummarized)))
            ]

    def mark_unsummarized(self, items: list[tuple[str, str]]) -> None:
        with self._table._lock:
            self._table._unsummarized.update(items)

    def unsummarized_count(self) -> int:
        return len(self._table._unsummarized)

    def summary_source(self, session_id: str, conversation: str) -> SummarySource:
        with self._table._lock:
            tree = self._table._live(session_id, time.time()).conversations.get(conversation)
            if tree is None:
                return SummarySource(None, [])
            anchor = tree.anchor_position()
            after = tree.thread if anchor is None else tree.thread[anchor + 1 :]
            return SummarySource(tree.summary, [tree.messages[message_id].text for message_id in after])

    def commit_summary(
        self, session_id: str, conversation: str, expected_anchor: str | None, summary: Summary
    ) -> bool:
        with self._table._lock:
            return self._summary_op(time.time(), session_id, conversation, expected_anchor, summary._asdict())

    def _summary_op(
        self,
        now: float,
        session_id: str,
        conversation: str,
        expected_anchor: str | None,
        summary: dict[str, Any],
    ) -> bool:
        if not self._table._is_live(session_id, now):
            return False
        session = self._table._sessions[session_id]
        tree = session.conversations.get(conversation)
        if tree is None:
            return False
        # The anchor read is still the current thread's (summary_source answers none for a
        # thread without one), and the new one is still on that thread, after it.
        position, current = tree.position(summary["anchor"]), tree.anchor_position()
        if position is None or tree.anchor != expected_anchor:
            return False
        if current is not None and position <= current:
            return False
        self._table._log("summary", session_id, now, conversation, expected_anchor, summary)
        # What it covers is counted by the tree: a trim between the read and this commit changed it.
        tree.put_summary(Summary(**summary), position)
        self._conversations._settle(
            session_id, session, conversation, tree, now, touch=False
        )  # not the session's use
        return True

    def summarizer_health(self) -> dict[str, Any]:
        return copy.deepcopy(self._table._health)

    def set_summarizer_health(self, health: dict[str, Any]) -> None:
        self._table._health = copy.deepcopy(health)
