"""The admin's read-only view of a graph thread's checkpoints (LangGraph's checkpointer,
:mod:`persistent_memory.integrations.langgraph_saver`), read from the store as it holds
them now: the newest :data:`SHOWN` of every namespace, newest first."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.utils.html import format_html, format_html_join

from persistent_memory.checkpoints import THREAD_PREFIXES
from persistent_memory.exceptions import PersistentMemoryError
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
