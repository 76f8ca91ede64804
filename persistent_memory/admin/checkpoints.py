"""The admin's read-only view of a graph thread (LangGraph's checkpointer,
:mod:`persistent_memory.integrations.langgraph_saver`), read from the store as it holds
it now: the conversation in its latest checkpoint (its message channel, as the
conversations' transcripts show theirs) and the newest :data:`SHOWN` checkpoints of
every namespace, newest first."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.template.loader import render_to_string
from django.utils.html import format_html, format_html_join

from persistent_memory.admin.transcript import Transcript, fold_calls
from persistent_memory.checkpoints import THREAD_PREFIXES
from persistent_memory.exceptions import PersistentMemoryError
from persistent_memory.mirror.conversations import content_text
from persistent_memory.models import MemoryMessage
from persistent_memory.store import get_store

if TYPE_CHECKING:
    from persistent_memory.models import MemorySession

SHOWN = 50


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


def _rows(messages: list[dict[str, Any]]) -> list[MemoryMessage]:
    """Chat messages (see ``chat_messages``) as unsaved message rows, for the transcript."""
    return [
        MemoryMessage(
            message_id=message["id"],
            seq=seq,
            role=message["role"],
            content_text=content_text(message.get("content")),
            name=message.get("name") or "",
            tool_call_id=message.get("tool_call_id") or "",
            tool_calls=message.get("tool_calls"),
        )
        for seq, message in enumerate(messages, 1)
    ]


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
        from persistent_memory.integrations.langgraph_saver import PersistentMemorySaver, chat_messages
    except ImportError:
        return "Install the langgraph extra to read them."
    checkpoint = PersistentMemorySaver(store=store).checkpoint_tuple(None, latest[0], row.session_id)
    found = chat_messages(checkpoint.checkpoint["channel_values"])
    if found is None:
        return "The latest checkpoint holds no chat messages (no channel of LangChain messages)."
    channel, messages = found
    rows = _rows(messages)
    context = {"channel": channel, "checkpoint_id": latest[0].checkpoint_id, "count": len(rows)}
    return render_to_string(
        "admin/persistent_memory/graph_messages.html",
        {**context, "transcript": Transcript(None, None, fold_calls(rows), [])},
    )
