"""The Redis backend's conversations (the contract in :mod:`.conversations`).

Held by :class:`~persistent_memory.backends.redis.RedisBackend` as ``conversations`` and
``summaries``: each method is one FCALL of the backend's library, whose conversation part
is ``conversations.lua`` (the key layout is described there).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from persistent_memory.backends.conversations import (
    Appended,
    ConversationInfo,
    ConversationSnapshot,
    Enriched,
    Popped,
    Question,
    RecordWrite,
    Summary,
    SummarySource,
    WindowTexts,
)
from persistent_memory.backends.memory.tree import Tree
from persistent_memory.backends.redis.layout import SUMMARIZE, SUMMARIZER
from persistent_memory.backends.redis.queues import BucketQueues
from persistent_memory.backends.redis.ttl import ttl_ms as _ttl_ms
from persistent_memory.backends.redis.ttl import ttl_text as _ttl_text
from persistent_memory.chat.messages import PreparedMessage

if TYPE_CHECKING:
    from persistent_memory.backends.base import IdempotencyRecord, RunBinding


def _limit(value: int | None) -> str:
    return "" if value is None else str(value)


def message_args(messages: list[PreparedMessage]) -> list[str]:
    """The (id, body, link) triples the script reads."""
    return [part for message in messages for part in (message.id, message.body, message.link)]


#: A record of a conversation's form (conversations.lua): running totals of tokens, of
#: bytes (where each text ends in the form's texts) and of messages that are not plain.
_RECORD = struct.Struct(">III")


def stored_texts(reply: list[Any]) -> list[bytes]:
    """The texts a read answers (windows.lua, ``add_texts``): a list of texts, then, when
    they came from the thread's form, more texts back to back and their records, whose
    byte totals say where each one ends."""
    texts = list(reply[0])
    if len(reply) > 1 and reply[2]:
        joined, ends = reply[1], [end for _, end, _ in _RECORD.iter_unpack(reply[2])]
        start = ends[-1] - len(joined)
        texts.extend(
            joined[begin - start : end - start] for begin, end in zip([start, *ends], ends, strict=False)
        )
    return texts


def window_texts(reply: list[Any]) -> WindowTexts:
    """A window from the script's reply: tokens, truncated (1/0), the summary (None: none),
    its tokens, the summarizers' state (None unless rolling), then the texts."""
    tokens, truncated, summary, summary_tokens, state = reply[:5]
    return WindowTexts(
        stored_texts(reply[5:]),  # bytes: the store parses them in one call (see conversations.store)
        tokens,
        truncated == 1,
        None,
        summary.decode() if summary else None,
        summary_tokens,
        state.decode() if state else None,
    )


def _summary(fields: list[Any]) -> Summary | None:
    if not fields or not fields[0]:
        return None
    text, anchor, anchor_seq, tokens, covered = fields[:5]
    return Summary(text.decode(), anchor.decode(), anchor_seq, tokens, covered)


def snapshot_conversations(flat: list[Any]) -> dict[str, ConversationSnapshot]:
    """Conversations from the snapshot op's flat reply (messages put in seq order)."""
    conversations: dict[str, ConversationSnapshot] = {}
    for i in range(0, len(flat), 6):
        name, head, seq, trimmed, texts, summaries = flat[i : i + 6]
        decoded = sorted((json.loads(text)["seq"], text.decode()) for text in texts)
        held = sorted(filter(None, map(_summary, summaries)), key=lambda summary: summary.anchor_seq)
        conversations[name.decode()] = {
            "head": head.decode() or None,
            "seq": seq,
            "trimmed": trimmed,
            "messages": [text for _, text in decoded],
            "summaries": [summary._asdict() for summary in held],
        }
    return conversations


def restore_blob(conversations: dict[str, ConversationSnapshot]) -> str:
    """The restore op's JSON text of conversations: each with the thread, pinned system
    messages and parents derived here, as the memory backend's tree derives them."""
    if not conversations:
        return ""
    items = []
    for name, snapshot in conversations.items():
        tree = Tree.restore(dict(snapshot))
        items.append(
            {
                "name": name,
                "head": tree.head,
                "seq": tree.seq,
                "trimmed": tree.trimmed,
                "tokens": tree.tokens,
                "bytes": tree.size,
                "thread": tree.thread,
                "system": [[tree.messages[m].seq, m] for m in tree.system],
                "parents": sorted(tree.parents),
                "messages": [[m.id, m.text, m.link, m.seq] for m in tree.messages.values()],
                "summaries": [
                    {key: summary[key] for key in ("text", "anchor", "anchor_seq", "tokens")}
                    for summary in snapshot.get("summaries") or ()
                ],
            }
        )
    return json.dumps(items)


class RedisConversations:
    """Conversations in Redis, one script call per operation (the contract:
    :class:`~persistent_memory.backends.conversations.ConversationBackend`).

    ``run`` calls the backend's library (``run(op, session_id, *args, **keys)``);
    ``run_pointer`` gives the command that binds a run to a session, sent beside an enrich.
    """

    def __init__(
        self,
        *,
        run: Callable[..., Any],
        run_pointer: Callable[[str, RunBinding | None], tuple[Any, ...] | None],
    ) -> None:
        self._run = run
        self._run_pointer = run_pointer

    def add_messages(
        self,
        session_id: str,
        conversation: str,
        parent_id: str | None,
        messages: list[PreparedMessage],
        ttl_seconds: float | None,
        *,
        idempotency: IdempotencyRecord | None = None,
    ) -> Appended:
        reply = self._run(
            "messages",
            session_id,
            conversation,
            parent_id or "",
            _ttl_text(ttl_seconds),
            _ttl_ms(ttl_seconds),
            *message_args(messages),
            idempotency=idempotency,
            conversation=conversation,
        )
        return Appended(reply[0].decode(), [text.decode() for text in reply[1:]])

    def get_messages(
        self, session_id: str, conversation: str, leaf: str | None, limit: int
    ) -> tuple[str | None, list[bytes]]:
        reply = self._run(
            "read_messages",
            session_id,
            conversation,
            leaf or "",
            str(limit),
            conversation=conversation,
        )
        return reply[0].decode() or None, stored_texts(reply[1:])  # bytes: parsed in one call by the store

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
        flags = ("1" if rolling else "0", "1" if reserve_summary else "0")
        reply = self._run(
            "context",
            session_id,
            conversation,
            _limit(max_tokens),
            _limit(max_messages),
            *flags,
            conversation=conversation,
        )
        return window_texts(reply)

    def list_conversations(self, session_id: str) -> list[ConversationInfo]:
        flat = self._run("conversations", session_id)
        return [
            {
                "conversation": flat[i].decode(),
                "head": flat[i + 1].decode() or None,
                "message_count": flat[i + 2],
                "tokens": flat[i + 3],
                "branch_count": flat[i + 4],
                "trimmed": flat[i + 5],
            }
            for i in range(0, len(flat), 6)
        ]

    def set_head(
        self,
        session_id: str,
        conversation: str,
        message_id: str,
        *,
        idempotency: IdempotencyRecord | None = None,
    ) -> str:
        reply = self._run(
            "head", session_id, conversation, message_id, idempotency=idempotency, conversation=conversation
        )
        return reply.decode()

    def clear_messages(
        self,
        session_id: str,
        conversation: str,
        *,
        idempotency: IdempotencyRecord | None = None,
    ) -> int:
        return self._run(
            "clear_messages", session_id, conversation, idempotency=idempotency, conversation=conversation
        )

    def pop_message(
        self,
        session_id: str,
        conversation: str,
        head_id: str,
        messages: list[PreparedMessage],
        *,
        idempotency: IdempotencyRecord | None = None,
    ) -> Popped:
        reply = self._run(
            "pop",
            session_id,
            conversation,
            head_id,
            *message_args(messages),
            idempotency=idempotency,
            conversation=conversation,
        )
        return Popped(reply[0].decode(), reply[1].decode() or None, [text.decode() for text in reply[2:]])

    def write_thread(
        self,
        session_id: str,
        conversation: str,
        write: RecordWrite,
        messages: list[PreparedMessage],
        ttl_seconds: float | None,
    ) -> list[str]:
        reply = self._run(
            "thread",
            session_id,
            conversation,
            write.key,
            write.expected or "",
            write.value or "",
            write.parent or "",
            write.head or "",
            _ttl_text(ttl_seconds),
            _ttl_ms(ttl_seconds),
            *message_args(messages),
            conversation=conversation,
            key=write.key,
        )
        return [text.decode() for text in reply]

    def enrich_recording(
        self,
        session_id: str,
        ttl_seconds: float | None,
        run: RunBinding | None,
        question: Question,
        *,
        idempotency: IdempotencyRecord | None = None,
    ) -> Enriched:
        run_args = (run.run_id, _ttl_ms(run.ttl_seconds)) if run else ("", "0")
        reply = self._run(
            "enrich",
            session_id,
            _ttl_text(ttl_seconds),
            _ttl_ms(ttl_seconds),
            *run_args,
            question.conversation,
            _limit(question.max_tokens),
            _limit(question.max_messages),
            *message_args([question.message]),
            "1" if question.rolling else "0",
            "1" if question.reserve_summary else "0",
            idempotency=idempotency,
            run=run.run_id if run else None,
            conversation=question.conversation,
            aside=self._run_pointer(session_id, run),
        )
        return Enriched(reply[0].decode(), window_texts(reply[2:]), reply[1].decode())


class RedisSummaries:
    """Rolling summaries in each conversation's ``:y`` hash (by anchor); marked conversations in
    each bucket's ``~summarize`` set ("{storage id} {conversation}"), the summarizers' health in
    ``~summarizer`` (``state``, and the whole record as JSON), a copy in every bucket so that a
    window's one script call reads it beside the conversation (the contract:
    :class:`~persistent_memory.backends.conversations.SummaryBackend`).

    ``run`` calls the backend's library; ``queues`` are the backend's bucket queues (the
    marked conversations are one); ``batch`` pipelines plain commands to their keys'
    primaries, ``checked`` raises the first error of its replies as the store's.
    """

    def __init__(
        self,
        *,
        run: Callable[..., Any],
        queues: BucketQueues,
        batch: Callable[[list[tuple[Any, ...]]], list[Any]],
        checked: Callable[[list[Any]], list[Any]],
    ) -> None:
        self._run = run
        self._queues = queues
        self._batch = batch
        self._checked = checked

    def pop_unsummarized(self, count: int) -> list[tuple[str, str]]:
        items = self._queues.pop(SUMMARIZE, count)
        return [tuple(item.decode().split(" ", 1)) for item in items]  # type: ignore[misc]

    def mark_unsummarized(self, items: list[tuple[str, str]]) -> None:
        self._queues.add(SUMMARIZE, [(sid, f"{sid} {name}") for sid, name in items])

    def unsummarized_count(self) -> int:
        return self._queues.count(SUMMARIZE)

    def summary_source(self, session_id: str, conversation: str) -> SummarySource:
        reply = self._run("summary_source", session_id, conversation, conversation=conversation)
        return SummarySource(_summary(reply[:5]), [text.decode() for text in reply[5]])

    def commit_summary(
        self, session_id: str, conversation: str, expected_anchor: str | None, summary: Summary
    ) -> bool:
        reply = self._run(
            "commit_summary",
            session_id,
            conversation,
            expected_anchor or "",
            summary.text,
            summary.anchor,
            str(summary.anchor_seq),
            str(summary.tokens),
            str(summary.covered_tokens),
            conversation=conversation,
        )
        return reply == 1

    def summarizer_health(self) -> dict[str, Any]:
        record = self._checked(self._batch([("HGET", self._queues.keys(SUMMARIZER)[0], "record")]))[0]
        return json.loads(record) if record else {}

    def set_summarizer_health(self, health: dict[str, Any]) -> None:
        mapping = {"state": health.get("state", "healthy"), "record": json.dumps(health)}
        fields = [part for pair in mapping.items() for part in pair]
        self._checked(self._batch([("HSET", key, *fields) for key in self._queues.keys(SUMMARIZER)]))
