"""The mirror's conversations: rows from a session snapshot's ``conversations``, and that
part of a snapshot back from the rows (for the memory backend's restore).

A message never changes once stored, so a sync inserts the messages a conversation
gained since the last one and deletes those it lost (trimmed beyond ``MAX_MESSAGES``)
instead of writing them all again. Each conversation row keeps a digest of the set of
its messages' texts: when the snapshot's messages up to the row's ``seq`` hash to it,
the rows hold exactly those, and only the newer messages are written (the common case:
a chat that grows). Otherwise (a trim, a conversation cleared and written again, a
session replaced by an import) the rows are compared by message id and text digest.
A snapshot that carries its own digest and counts (the memory backend's) is read only
from its end, back to the row's ``seq``: a sync of a growing chat then costs what it
gained, not its length.

Each message row keeps the store's JSON text whole (``stored``), so a restore gives the
store back the same bytes; its other columns are copies for the admin to read and
search, where U+0000 (which PostgreSQL's text and jsonb columns refuse) shows as its
escape.

Called by :class:`persistent_memory.mirror.Mirror` inside its transaction.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from datetime import datetime
from functools import cached_property, reduce
from operator import xor
from typing import Any

from django.db.models import Prefetch, QuerySet

from persistent_memory.backends.base import SessionSnapshot
from persistent_memory.backends.conversations import ConversationSnapshot, text_digest
from persistent_memory.backends.memory.tree import StoredMessage, Tree
from persistent_memory.mirror.rows import _datetime, _insert
from persistent_memory.mirror.signals import messages_mirrored
from persistent_memory.models import MemoryConversation, MemoryMessage

#: The columns a sync writes, in the order :func:`_message_row` gives them.
MESSAGE_COLUMNS = (
    "conversation",
    "message_id",
    "parent_id",
    "seq",
    "role",
    "content_text",
    "name",
    "tool_call_id",
    "tool_calls",
    "metadata",
    "tokens",
    "tokenizer",
    "created_at",
    "stored",
    "digest",
)
CONVERSATION_FIELDS = (
    "head",
    "seq",
    "message_count",
    "tokens",
    "branch_count",
    "trimmed",
    "summary",
    "digest",
)
NUL_ESCAPE = "\\u0000"


def _hex(digest: int) -> str:
    return f"{digest:032x}"


def _set_digest(digests: list[int]) -> str:
    """Of a set of messages: the same whatever their order (XOR of their digests)."""
    return _hex(reduce(xor, digests, 0))


@dataclass
class _Parsed:
    """One snapshot conversation, its messages parsed when first needed, in seq order."""

    snapshot: ConversationSnapshot

    @cached_property
    def messages(self) -> list[tuple[dict[str, Any], str, int]]:
        """Each message decoded, with its text and digest."""
        pairs = sorted(((json.loads(t), t) for t in self.snapshot["messages"]), key=lambda p: p[0]["seq"])
        return [(message, text, text_digest(text)) for message, text in pairs]

    @cached_property
    def digest(self) -> str:
        """Of the set of its messages' texts (the snapshot's own when it carries one)."""
        if "digest" in self.snapshot:
            return self.snapshot["digest"]
        return _set_digest([digest for *_, digest in self.messages])

    def after(self, seq: int, digest: str) -> list[tuple[dict[str, Any], str, int]] | None:
        """Its messages newer than ``seq`` when the others are exactly those whose set
        ``digest`` is (the rows' then), else None."""
        if "digest" not in self.snapshot:
            split = bisect.bisect_right([message["seq"] for message, *_ in self.messages], seq)
            older = [d for *_, d in self.messages[:split]]
            return self.messages[split:] if _set_digest(older) == digest else None
        newer = []
        for text in reversed(self.snapshot["messages"]):  # in seq order: read from the end
            message = json.loads(text)
            if message["seq"] <= seq:
                break
            newer.append((message, text, text_digest(text)))
        newer.reverse()
        older = reduce(xor, (d for *_, d in newer), int(self.digest, 16))
        return newer if _hex(older) == digest else None

    @property
    def summary(self) -> str:
        """The summaries as its row holds them (JSON text of the list; empty: none)."""
        summaries = self.snapshot.get("summaries")
        return json.dumps(summaries) if summaries else ""

    @property
    def state(self) -> tuple[int, str, str, int, str]:
        """What its row holds that can change: seq, digest, head, trimmed count and summary."""
        snapshot = self.snapshot
        return (snapshot["seq"], self.digest, snapshot["head"] or "", snapshot["trimmed"], self.summary)

    def _counts(self) -> tuple[int, int, int]:
        """Messages, tokens and branches, as ``list_conversations`` says."""
        snapshot = self.snapshot
        if "branch_count" in snapshot:
            return snapshot["message_count"], snapshot["tokens"], snapshot["branch_count"]
        # Counted by the memory backend's own tree, so the row says what list_conversations does.
        shape = [
            StoredMessage(
                m["id"], text, "", m["parent_id"], m["seq"], m.get("tokens", 0), m["role"], (), None, ""
            )
            for m, text, _ in self.messages
        ]
        tree = Tree.assemble(shape, head=snapshot["head"], seq=snapshot["seq"], trimmed=snapshot["trimmed"])
        return len(tree.messages), tree.tokens, tree.branch_count()

    def row(self, session_pk: int, name: str) -> MemoryConversation:
        snapshot = self.snapshot
        message_count, tokens, branch_count = self._counts()
        return MemoryConversation(
            session_id=session_pk,
            name=name,
            head=snapshot["head"] or "",
            seq=snapshot["seq"],
            message_count=message_count,
            tokens=tokens,
            branch_count=branch_count,
            trimmed=snapshot["trimmed"],
            summary=self.summary,
            digest=self.digest,
        )


def _visible(value: Any) -> Any:
    """``value`` with U+0000 in its strings (and keys) as its escape, for the display columns."""
    if isinstance(value, str):
        return value.replace("\x00", NUL_ESCAPE)
    if isinstance(value, dict):
        return {_visible(key): _visible(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_visible(item) for item in value]
    return value


def content_text(content: Any) -> str:
    """A message's content as plain text: a string as it is, the texts of content parts
    one per line (other parts as ``[type]``), nothing for null."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    lines = []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "text":
            lines.append(str(part.get("text", "")))
        else:
            lines.append(f"[{part.get('type', 'part') if isinstance(part, dict) else 'part'}]")
    return "\n".join(lines)


def _message_row(conversation_pk: int, message: dict[str, Any], text: str, digest: int, now: datetime):
    return (
        conversation_pk,
        message["id"],
        message.get("parent_id") or "",
        message["seq"],
        message["role"],
        _visible(content_text(message.get("content"))),
        message.get("name") or "",
        message.get("tool_call_id") or "",
        _visible(message.get("tool_calls")),
        _visible(message.get("metadata")),
        message.get("tokens", 0),
        str(message.get("tokenizer", ""))[:200],
        _datetime(message.get("created_at"), now),
        text,
        _hex(digest),
    )


def write_conversations(pks: dict[str, int], snapshots: dict[str, SessionSnapshot], now: datetime) -> None:
    """Make the conversation and message rows of these live sessions (``pks``: storage id
    -> session row pk) equal to their snapshots; the caller holds the transaction."""
    existing = {
        (session_pk, name): (pk, seq, digest, head, trimmed, summary)
        for pk, session_pk, name, seq, digest, head, trimmed, summary in MemoryConversation.objects.filter(
            session_id__in=pks.values()
        ).values_list("pk", "session_id", "name", "seq", "digest", "head", "trimmed", "summary")
    }
    wanted = {
        (pks[sid], name): _Parsed(conversation)
        for sid, snapshot in snapshots.items()
        for name, conversation in (snapshot.get("conversations") or {}).items()
    }
    if not existing and not wanted:
        return  # sessions without conversations: one query
    # Cleared conversations go, with their messages.
    MemoryConversation.objects.filter(
        pk__in=[row[0] for key, row in existing.items() if key not in wanted]
    ).delete()
    # Those of a synced session that did not change since are left as they are.
    wanted = {key: parsed for key, parsed in wanted.items() if existing.get(key, ())[1:] != parsed.state}
    MemoryConversation.objects.bulk_create(
        [parsed.row(session_pk, name) for (session_pk, name), parsed in wanted.items()],
        update_conflicts=True,
        unique_fields=["session", "name"],
        update_fields=CONVERSATION_FIELDS,
    )
    conversation_pks = {
        (session_pk, name): pk
        for pk, session_pk, name in MemoryConversation.objects.filter(
            session_id__in=pks.values()
        ).values_list("pk", "session_id", "name")
    }
    new: list[tuple[Any, ...]] = []
    compared: dict[int, _Parsed] = {}
    for key, parsed in wanted.items():
        pk = conversation_pks[key]
        gained = parsed.after(*existing[key][1:3]) if key in existing else parsed.messages
        if gained is None:
            compared[pk] = parsed  # not only grown since: compare message by message
            continue
        new.extend(_message_row(pk, message, text, digest, now) for message, text, digest in gained)
    if compared:
        new.extend(_differences(compared, now))
    _insert(MemoryMessage, MESSAGE_COLUMNS, new)
    if new:
        messages_mirrored.send(write_conversations, messages=[(row[0], row[1]) for row in new])


def _differences(compared: dict[int, _Parsed], now: datetime) -> list[tuple[Any, ...]]:
    """Delete the rows of these conversations that the snapshots no longer hold; return
    rows for the messages they hold that the rows do not."""
    held: dict[int, dict[tuple[str, str], int]] = {pk: {} for pk in compared}
    for row_pk, conversation_pk, message_id, digest in MemoryMessage.objects.filter(
        conversation_id__in=compared
    ).values_list("pk", "conversation_id", "message_id", "digest"):
        held[conversation_pk][message_id, digest] = row_pk
    wanted = {pk: {(m["id"], _hex(d)) for m, _, d in parsed.messages} for pk, parsed in compared.items()}
    stale = [row_pk for pk, rows in held.items() for key, row_pk in rows.items() if key not in wanted[pk]]
    for start in range(0, len(stale), 500):  # within any database's limit of parameters
        MemoryMessage.objects.filter(pk__in=stale[start : start + 500]).delete()
    return [
        _message_row(pk, message, text, digest, now)
        for pk, parsed in compared.items()
        for message, text, digest in parsed.messages
        if (message["id"], _hex(digest)) not in held[pk]
    ]


# Restoring ------------------------------------------------------------------------


def with_conversations(sessions: QuerySet) -> QuerySet:
    """``sessions`` with their conversations and messages fetched for :func:`snapshot_conversations`."""
    messages = MemoryMessage.objects.only("conversation_id", "seq", "stored").order_by("seq")
    return sessions.prefetch_related(Prefetch("conversations__messages", queryset=messages))


def row_summaries(text: str) -> list[dict[str, Any]]:
    """A row's summaries (a row written before they were kept per branch holds one)."""
    summaries = json.loads(text) if text else []
    return [summaries] if isinstance(summaries, dict) else summaries


def snapshot_conversations(session: Any) -> dict[str, ConversationSnapshot]:
    """A mirrored session's conversations as its snapshot holds them (texts as stored)."""
    return {
        conversation.name: {
            "head": conversation.head or None,
            "seq": conversation.seq,
            "trimmed": conversation.trimmed,
            "messages": [message.stored for message in conversation.messages.all()],
            "summaries": row_summaries(conversation.summary),
        }
        for conversation in session.conversations.all()
    }
