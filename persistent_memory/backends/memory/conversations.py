"""The memory backend's conversations (the contract in :mod:`.conversations`).

Held by :class:`~persistent_memory.backends.memory.MemoryBackend` as ``conversations``, which gives it
its session table (:class:`~.sessions.SessionTable`): each write takes the
backend's lock, checks everything, journals itself, then changes the session and marks
it for the mirror, as the backend's other writes do. Journal records carry each
message as ``[id, body, link]`` (what :class:`PreparedMessage` is built from).
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any, cast

from persistent_memory.backends.conversations import (
    Appended,
    ConversationInfo,
    Enriched,
    Popped,
    Question,
    RecordWrite,
    WindowTexts,
)
from persistent_memory.backends.memory.tree import StoredMessage, Tree
from persistent_memory.chat.messages import PreparedMessage
from persistent_memory.exceptions import (
    HeadMoved,
    MessageConflict,
    MessageNotFound,
    PersistentMemoryError,
    RevisionConflict,
)

if TYPE_CHECKING:
    from persistent_memory.backends.memory.sessions import Session, SessionTable

Plan = list[tuple[StoredMessage, bool]]


def journaled(message: PreparedMessage) -> list[str]:
    return [message.id, message.body, message.link]


def prepared(item: list[str]) -> PreparedMessage:
    """A journaled message, as the append takes it."""
    message_id, body, link = item
    data = json.loads(link)
    return PreparedMessage(
        message_id, data["r"], body, link, data["t"], tuple(data["c"]), data["a"], data["f"]
    )


def _revision(value_json: str) -> Any:
    """The ``"revision"`` of a record held as a session value (None: not a record)."""
    try:
        value = json.loads(value_json)
    except ValueError:
        return None
    return value.get("revision") if isinstance(value, dict) else None


class MemoryConversations:
    """Conversations held in each session's ``conversations`` dict."""

    def __init__(self, table: SessionTable) -> None:
        self._table = table

    # Helpers, called with the lock held ------------------------------------------

    def _check_room(self, session: Session | None, plan: Plan, values: int = 0) -> None:
        """QuotaExceeded when the new messages (and ``values`` more bytes of values) would
        take the session over MAX_SESSION_BYTES."""
        if self._table.max_session_bytes is not None:
            size = (session.size if session is not None else 0) + values
            self._table._within_cap(size + sum(len(message.text) for message, new in plan if new))

    def _commit(
        self,
        session_id: str,
        session: Session,
        conversation: str,
        tree: Tree,
        plan: Plan,
        now: float,
    ) -> Appended:
        """Store a checked plan, trim, and record what was trimmed."""
        tree.commit(plan)
        session.conversations[conversation] = tree
        self._settle(
            session_id,
            session,
            conversation,
            tree,
            now,
            plan_bytes=sum(len(message.text) for message, new in plan if new),
        )
        return Appended(tree.head or "", [message.text for message, _ in plan])

    def _settle(
        self,
        session_id: str,
        session: Session,
        conversation: str,
        tree: Tree,
        now: float,
        *,
        plan_bytes: int = 0,
        touch: bool = True,
    ) -> None:
        """After a conversation grew or got a summary: trim it (only what its summary covers,
        with a summarizer), record what was trimmed, mark it for a summarizer when its
        pending tokens pass the threshold (unmark it otherwise), touch and mark the session."""
        size = tree.size - plan_bytes
        removed = tree.trim(
            self._table.max_messages, covered_only=self._table.summarize_after_tokens is not None
        )
        session.size += tree.size - size
        if touch:
            self._table._touch(session, now)
        if removed:
            self._table._record(
                session_id, session, now, "trim_messages", None, conversation=conversation, removed=removed
            )
        if self._table.summarize_after_tokens is not None:
            if tree.tokens - tree.covered > self._table.summarize_after_tokens:
                self._table._unsummarized.add((session_id, conversation))
            else:
                self._table._unsummarized.discard((session_id, conversation))
        self._table._mark(session_id)

    def _window(
        self,
        tree: Tree | None,
        max_tokens: int | None,
        max_messages: int | None,
        rolling: bool = False,
        reserve_summary: bool = True,
    ) -> WindowTexts:
        state = self._table._health.get("state", "healthy") if rolling else None
        if tree is None or not tree.messages:
            return WindowTexts([], 0, False, [], summary_state=state)
        anchor = tree.anchor_position() if rolling else None
        if anchor is None:
            window = tree.window(max_tokens, max_messages)
            summary, summary_tokens = None, 0
        else:
            held = tree.summaries[tree.thread[anchor]]
            summary, summary_tokens = held.text, held.tokens
            budget = max_tokens
            if budget is not None and reserve_summary:
                budget = max(0, budget - summary_tokens)
            window = tree.window(budget, max_messages, after=anchor)
        messages = [tree.messages[message_id] for message_id in window.ids]
        texts = [message.text for message in messages]
        chats = [message.chat_copy() for message in messages]
        return WindowTexts(texts, window.tokens, window.truncated, chats, summary, summary_tokens, state)

    def _tree(self, session_id: str, conversation: str, now: float, *, read: bool = False) -> Tree | None:
        session = self._table._read(session_id, now) if read else self._table._live(session_id, now)
        return session.conversations.get(conversation)

    # Writes ----------------------------------------------------------------------------

    def add_messages(
        self,
        session_id: str,
        conversation: str,
        parent_id: str | None,
        messages: list[PreparedMessage],
        ttl_seconds: float | None,
    ) -> Appended:
        with self._table._lock:
            return self._messages_op(time.time(), session_id, conversation, parent_id, messages, ttl_seconds)

    def _messages_op(
        self,
        now: float,
        session_id: str,
        conversation: str,
        parent_id: str | None,
        items: list[PreparedMessage] | list[list[str]],
        ttl_seconds: float | None,
    ) -> Appended:
        """``items``: prepared messages, or as the journal holds them (when replayed)."""
        batch = [item if isinstance(item, PreparedMessage) else prepared(item) for item in items]
        session = self._table._sessions[session_id] if self._table._is_live(session_id, now) else None
        tree = (session.conversations.get(conversation) if session else None) or Tree()
        plan = tree.plan(parent_id, batch)
        self._check_room(session, plan)
        if session is None:
            self._table._admit(session_id, now)
        if self._table.journal is not None:
            journal_items = [journaled(message) for message in batch]
            self._table._log("messages", session_id, now, conversation, parent_id, journal_items, ttl_seconds)
        if session is None:
            session = self._table._create(session_id, ttl_seconds, now)
        return self._commit(session_id, session, conversation, tree, plan, now)

    def set_head(self, session_id: str, conversation: str, message_id: str) -> str:
        with self._table._lock:
            return self._head_op(time.time(), session_id, conversation, message_id)

    def _head_op(self, now: float, session_id: str, conversation: str, message_id: str) -> str:
        session = self._table._live(session_id, now)
        tree = session.conversations.get(conversation)
        if tree is None or message_id not in tree.messages:
            raise MessageNotFound(f"Conversation {conversation!r} has no message {message_id!r}.")
        self._table._log("head", session_id, now, conversation, message_id)
        tree.set_head(message_id)
        self._table._touch(session, now)
        self._table._mark(session_id)
        return message_id

    def clear_messages(self, session_id: str, conversation: str) -> int:
        with self._table._lock:
            return self._clear_messages_op(time.time(), session_id, conversation)

    def _clear_messages_op(self, now: float, session_id: str, conversation: str) -> int:
        session = self._table._live(session_id, now)
        tree = session.conversations.get(conversation)
        if tree is None:
            return 0
        self._table._log("clear_messages", session_id, now, conversation)
        del session.conversations[conversation]
        session.size -= tree.size
        removed = len(tree.messages)
        self._table._record(
            session_id, session, now, "clear_messages", None, conversation=conversation, removed=removed
        )
        return removed

    def pop_message(
        self,
        session_id: str,
        conversation: str,
        head_id: str,
        messages: list[PreparedMessage],
    ) -> Popped:
        with self._table._lock:
            return self._pop_op(time.time(), session_id, conversation, head_id, messages)

    def _pop_op(
        self,
        now: float,
        session_id: str,
        conversation: str,
        head_id: str,
        items: list[PreparedMessage] | list[list[str]],
    ) -> Popped:
        batch = [item if isinstance(item, PreparedMessage) else prepared(item) for item in items]
        session = self._table._live(session_id, now)
        tree = session.conversations.get(conversation)
        if tree is None or tree.head is None:
            raise MessageNotFound(f"Conversation {conversation!r} has no messages.")
        if tree.head != head_id:
            raise HeadMoved(f"The head of conversation {conversation!r} is no longer {head_id!r}.")
        removed = tree.messages[head_id]
        # The replacement is checked as an append after the parent: the head moves there
        # first, and back if a check fails (nothing else changed yet).
        if removed.parent in tree.messages:
            tree.set_head(removed.parent)
        else:  # a root, or its parent was trimmed
            tree.clear_head()
        try:
            if any(message.id == head_id for message in batch):
                raise MessageConflict(f"The replacement reuses the id {head_id!r} of the message it takes.")
            plan = tree.plan(None, batch) if batch else []
            self._check_room(session, plan)
        except PersistentMemoryError:
            tree.set_head(head_id)
            raise
        self._table._log(
            "pop", session_id, now, conversation, head_id, [journaled(message) for message in batch]
        )
        size = tree.size
        tree.drop(removed)
        session.size += tree.size - size
        if not tree.messages:  # as a clear leaves it (its keys go, on Redis)
            del session.conversations[conversation]
        self._table._record(
            session_id, session, now, "pop_message", None, conversation=conversation, removed=head_id
        )
        texts = self._commit(session_id, session, conversation, tree, plan, now).messages if plan else []
        return Popped(removed.text, tree.head, texts)

    def write_thread(
        self,
        session_id: str,
        conversation: str,
        write: RecordWrite,
        messages: list[PreparedMessage],
        ttl_seconds: float | None,
    ) -> list[str]:
        with self._table._lock:
            return self._thread_op(time.time(), session_id, conversation, write, messages, ttl_seconds)

    def _thread_op(
        self,
        now: float,
        session_id: str,
        conversation: str,
        write: RecordWrite | list[Any],
        items: list[PreparedMessage] | list[list[str]],
        ttl_seconds: float | None,
    ) -> list[str]:
        write = RecordWrite(*write)
        batch = [item if isinstance(item, PreparedMessage) else prepared(item) for item in items]
        session = self._table._sessions[session_id] if self._table._is_live(session_id, now) else None
        stored = session.values.get(write.key) if session else None
        tree = session.conversations.get(conversation) if session else None
        if write.expected is None:
            matches = stored is None and tree is None
        else:
            matches = stored is not None and _revision(stored) == write.expected
        if not matches:
            raise RevisionConflict(f"The record of conversation {conversation!r} has another revision.")
        if write.value is None:  # a record was there: the session is live
            return self._unrecord(now, session_id, cast("Session", session), conversation, write)
        tree = tree or Tree()
        head_before = tree.head
        # Checked as an append after the parent: the head moves there first, and back if
        # a check fails (nothing else changed yet).
        if write.parent is None:
            tree.clear_head()
        elif write.parent in tree.messages:
            tree.set_head(write.parent)
        try:
            plan = tree.plan(write.parent, batch, root=write.parent is None)
            planned = {message.id for message, _ in plan}
            if write.head is not None and write.head not in tree.messages and write.head not in planned:
                raise MessageNotFound(f"Conversation {conversation!r} has no message {write.head!r}.")
            grown = len(write.key) + len(write.value) - (len(write.key) + len(stored) if stored else 0)
            self._check_room(session, plan, values=grown)
        except PersistentMemoryError:
            if head_before is None:
                tree.clear_head()
            else:
                tree.set_head(head_before)
            raise
        if session is None:
            self._table._admit(session_id, now)
        if self._table.journal is not None:
            journal_items = [journaled(message) for message in batch]
            self._table._log("thread", session_id, now, conversation, list(write), journal_items, ttl_seconds)
        if session is None:
            session = self._table._create(session_id, ttl_seconds, now)
        texts = [message.text for message, _ in plan]
        if plan:
            self._commit(session_id, session, conversation, tree, plan, now)
        if write.head is None:
            tree.clear_head()
        elif write.head in tree.messages:  # not trimmed by the append
            tree.set_head(write.head)
        if tree.messages:
            session.conversations[conversation] = tree
        self._table._write(session, {write.key: write.value})
        self._table._record(session_id, session, now, "put", write.key)
        return texts

    def _unrecord(
        self,
        now: float,
        session_id: str,
        session: Session,
        conversation: str,
        write: RecordWrite,
    ) -> list[str]:
        """Remove a record and its conversation, and the session when nothing is left in it."""
        self._table._log("thread", session_id, now, conversation, list(write), [], None)
        tree = session.conversations.pop(conversation, None)
        if tree is not None:
            session.size -= tree.size
        self._table._remove_value(session, write.key)
        checkpoints = session.checkpoints.entries if session.checkpoints else None
        if not (session.values or session.conversations or checkpoints):
            self._table._drop(session_id)
        else:
            self._table._record(session_id, session, now, "clear", write.key)
            if tree is not None:
                self._table._record(
                    session_id,
                    session,
                    now,
                    "clear_messages",
                    None,
                    conversation=conversation,
                    removed=len(tree.messages),
                )
        self._table._mark(session_id)
        return []

    # Reads -----------------------------------------------------------------------------

    def get_messages(
        self, session_id: str, conversation: str, leaf: str | None, limit: int
    ) -> tuple[str | None, list[str]]:
        with self._table._lock:
            tree = self._tree(session_id, conversation, time.time(), read=True)
            if tree is None:
                if leaf is not None:
                    raise MessageNotFound(f"Conversation {conversation!r} has no message {leaf!r}.")
                return None, []
            return tree.head, tree.read(leaf, limit)

    def get_context(
        self,
        session_id: str,
        conversation: str,
        max_tokens: int | None,
        max_messages: int | None,
        *,
        rolling: bool = False,
        reserve_summary: bool = True,
    ) -> WindowTexts:
        with self._table._lock:
            tree = self._tree(session_id, conversation, time.time(), read=True)
            return self._window(tree, max_tokens, max_messages, rolling, reserve_summary)

    def list_conversations(self, session_id: str) -> list[ConversationInfo]:
        with self._table._lock:
            session = self._table._live(session_id, time.time())
            return [
                {
                    "conversation": name,
                    "head": tree.head,
                    "message_count": len(tree.messages),
                    "tokens": tree.tokens,
                    "branch_count": tree.branch_count(),
                    "trimmed": tree.trimmed,
                }
                for name, tree in session.conversations.items()
            ]

    # The lanes ---------------------------------------------------------------------------

    def enrich_recording(
        self, session_id: str, ttl_seconds: float | None, run: Any, question: Question
    ) -> Enriched:
        with self._table._lock:
            run_args = (run.run_id, run.ttl_seconds) if run else (None, None)
            asked = [
                question.conversation,
                journaled(question.message),
                question.max_tokens,
                question.max_messages,
                question.rolling,
                question.reserve_summary,
            ]
            return self._table._enrich_op(time.time(), session_id, ttl_seconds, *run_args, asked)

    def _answer_plan(self, session: Session, answered: list[Any], run_id: str | None) -> tuple[Tree, Plan]:
        """Where the store lane's answer goes: after its run's question, else after the
        parent given, else after the head."""
        conversation, item, parent_id = answered
        tree = session.conversations.get(conversation) or Tree()
        asked = session.questions.get(run_id or "")
        if asked is not None and asked[0] == conversation and asked[1] in tree.messages:
            parent_id = asked[1]
        elif parent_id not in tree.messages:
            parent_id = None
        return tree, tree.plan(parent_id, [prepared(item)])
