"""The admin's read-only view of a graph thread (LangGraph's checkpointer,
:mod:`persistent_memory.integrations.langgraph_saver`), read from the store as it holds
it now: the conversation in its latest checkpoint (its message channel, as the
conversations' transcripts show theirs) and the newest :data:`SHOWN` checkpoints of
every namespace, newest first."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.template.loader import render_to_string
from django.utils.html import format_html, format_html_join

from persistent_memory.checkpoints import THREAD_PREFIXES
from persistent_memory.exceptions import PersistentMemoryError
from persistent_memory.mirror_conversations import content_text
from persistent_memory.models import MemoryMessage
from persistent_memory.store import get_store
from persistent_memory.transcript import Transcript, fold_calls

if TYPE_CHECKING:
    from persistent_memory.models import MemorySession

SHOWN = 50
#: The channel LangGraph's ``MessagesState`` and ``add_messages`` keep the chat in; any
#: other channel holding chat messages is shown when a graph has none of this name.
MESSAGES_CHANNEL = "messages"


def is_thread(row: MemorySession) -> bool:
    return row.session_id.startswith(THREAD_PREFIXES)


def checkpoints_html(row: MemorySession) -> str:
    """A table of the session's checkpoints; a line saying why there is none."""
    store = get_store().for_owner(row.owner)
    try:
        stored = store.list_checkpoints(row.session_id, limit=SHOWN)
    except PersistentMemoryError as exc:
        return f"Not read: {exc}"
    if not stored:
        return "None saved."
    try:
        from persistent_memory.integrations.langgraph_saver import PersistentMemorySaver
    except ImportError:
        return f"{len(stored)} or more; install the langgraph extra to read them."
    saver = PersistentMemorySaver(store=store)
    rows = []
    for item in stored:
        checkpoint = saver.checkpoint_tuple(None, item, row.session_id)
        metadata = checkpoint.metadata
        parent = (
            checkpoint.parent_config["configurable"]["checkpoint_id"] if checkpoint.parent_config else "—"
        )
        rows.append(
            (
                item.checkpoint_id,
                item.ns or "(root)",
                metadata.get("step", "—"),
                metadata.get("source", "—"),
                parent,
                ", ".join(sorted(checkpoint.checkpoint["channel_values"])) or "—",
                len(checkpoint.pending_writes or ()),
            )
        )
    body = format_html_join(
        "",
        "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td>"
        "<td>{}</td><td>{}</td></tr>",
        rows,
    )
    return format_html(
        '<table class="pm-checkpoints"><thead><tr><th>checkpoint</th><th>namespace</th><th>step</th>'
        "<th>source</th><th>parent</th><th>channels</th><th>pending writes</th></tr></thead>"
        "<tbody>{}</tbody></table>",
        body,
    )


def _chat_channel(values: dict[str, Any]) -> str | None:
    """The channel holding the thread's chat: ``messages`` first, else the first (by
    name) whose value is a non-empty list of LangChain messages."""
    from langchain_core.messages import BaseMessage

    def is_chat(value: Any) -> bool:
        return (
            isinstance(value, list) and bool(value) and all(isinstance(item, BaseMessage) for item in value)
        )

    names = [MESSAGES_CHANNEL, *sorted(name for name in values if name != MESSAGES_CHANNEL)]
    return next((name for name in names if is_chat(values.get(name))), None)


def _rows(messages: list[Any]) -> list[MemoryMessage]:
    """LangChain messages as unsaved message rows, in the OpenAI chat format the
    conversations keep (tool calls as ``tool_calls``, results as ``tool`` messages)."""
    from langchain_core.messages import convert_to_openai_messages

    rows = []
    for seq, (message, chat) in enumerate(
        zip(messages, convert_to_openai_messages(messages), strict=True), 1
    ):
        rows.append(
            MemoryMessage(
                message_id=message.id or f"#{seq}",
                seq=seq,
                role=chat["role"] if chat["role"] != "developer" else "system",
                content_text=content_text(chat.get("content")),
                name=chat.get("name") or "",
                tool_call_id=chat.get("tool_call_id") or "",
                tool_calls=chat.get("tool_calls"),
            )
        )
    return rows


def messages_html(row: MemorySession) -> str:
    """The chat of the thread's latest root checkpoint as a transcript; a line saying why
    there is none."""
    store = get_store().for_owner(row.owner)
    try:
        latest = store.list_checkpoints(row.session_id, "", limit=1)
    except PersistentMemoryError as exc:
        return f"Not read: {exc}"
    if not latest:
        return "No checkpoint saved."
    try:
        from persistent_memory.integrations.langgraph_saver import PersistentMemorySaver
    except ImportError:
        return "Install the langgraph extra to read them."
    values = (
        PersistentMemorySaver(store=store)
        .checkpoint_tuple(None, latest[0], row.session_id)
        .checkpoint["channel_values"]
    )
    channel = _chat_channel(values)
    if channel is None:
        return "The latest checkpoint holds no chat messages (no channel of LangChain messages)."
    rows = _rows(values[channel])
    context = {"channel": channel, "checkpoint_id": latest[0].checkpoint_id, "count": len(rows)}
    return render_to_string(
        "admin/persistent_memory/graph_messages.html",
        {**context, "transcript": Transcript(None, None, fold_calls(rows), [])},
    )
