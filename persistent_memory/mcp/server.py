"""One owner's MCP server: conversation and memory tools over the service layer.

Every tool is bound to the owner the server was built for (the stdio command's
``--owner``, or the token's owner over HTTP): nothing a caller sends picks another.
The store and the memories service are synchronous (Redis, the ORM), so each call runs
in Django's sync thread; a store exception becomes a tool error whose text starts with
its code (``session_not_found: ...``), never a crashed server. A server-side error (a
backend down or full, the database unreachable, a bug) is told as its code, a plain
message and a request id; its details go to the ``persistent_memory.mcp`` logger under
that id (see :mod:`persistent_memory.errors.reporting`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.core.serializers.json import DjangoJSONEncoder
from django.db import InterfaceError, OperationalError, close_old_connections
from django.utils.dateparse import parse_datetime
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from persistent_memory import get_store
from persistent_memory.errors.reporting import new_request_id, plain_detail
from persistent_memory.exceptions import InvalidMemory, PersistentMemoryError
from persistent_memory.memories.service import MemoryService, memories_for
from persistent_memory.owners import validate_owner
from persistent_memory.store import MemoryStore

T = TypeVar("T")

logger = logging.getLogger("persistent_memory.mcp")

#: Database errors that mean the database cannot be used now (as the API treats them).
DATABASE_UNAVAILABLE = (OperationalError, InterfaceError)

INSTRUCTIONS = (
    "Memory of one owner. Conversations: get_context gives what to send to a model now, "
    "add_messages appends chat messages ({'role', 'content'}) to a session's conversation, "
    "list_conversations names a session's conversations. Long-term memories: search_memories "
    "finds facts by relevance or recency, add_memory stores one (the same key updates it), "
    "delete_memory removes one by id."
)


def _plain(value: Any) -> Any:
    """``value`` with datetimes and other Django-serializable types as JSON strings."""
    return json.loads(json.dumps(value, cls=DjangoJSONEncoder))


def _moment(text: str | None, name: str) -> datetime | None:
    """An ISO 8601 time of a tool's arguments; :class:`InvalidMemory` when it is none."""
    if text is None:
        return None
    try:
        moment = parse_datetime(text)
    except ValueError:
        moment = None
    if moment is None:
        raise InvalidMemory(f"Invalid {name}: must be an ISO 8601 time.")
    return moment


def _in_request(function: Callable[[], T]) -> T:
    # As Django does around a request: a connection that broke or aged out is not reused.
    close_old_connections()
    try:
        return function()
    finally:
        close_old_connections()


def _server_side(code: str, detail: str, error: Exception) -> ToolError:
    """A tool error that tells ``code``, ``detail`` and a request id; ``error`` is logged under it."""
    request_id = new_request_id()
    logger.warning(
        "persistent_memory: MCP tool call answered %s (request %s): %s",
        code,
        request_id,
        error,
        exc_info=None if isinstance(error, (PersistentMemoryError, *DATABASE_UNAVAILABLE)) else error,
    )
    return ToolError(f"{code}: {detail} (request_id: {request_id})")


async def _call(function: Callable[[], T]) -> T:
    """``function`` in Django's sync thread; a store error as a tool error with its code,
    a database that cannot be reached as ``database_unavailable`` (as the API answers)."""
    try:
        return await sync_to_async(_in_request)(function)
    except PersistentMemoryError as error:
        detail = plain_detail(error)
        if detail is not None:  # its message is for the operator
            raise _server_side(error.code, detail, error) from None
        raise ToolError(f"{error.code}: {error}") from error
    except DATABASE_UNAVAILABLE as error:
        raise _server_side(
            "database_unavailable", "The database is unavailable; try again later.", error
        ) from None
    except Exception as error:  # the SDK would tell the caller the exception's text
        raise _server_side("server_error", "A server error occurred.", error) from None


@contextmanager
def _root_logging_kept() -> Iterator[None]:
    """The SDK's server calls ``logging.basicConfig`` (a handler and INFO on the root logger)
    when built: the project's LOGGING decides, so the root logger is put back as it was."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def build_server(owner: str) -> MCPServer:
    """An MCP server whose tools act for ``owner`` alone (``""``: the unowned namespace)."""
    owner = validate_owner(owner)
    with _root_logging_kept():
        server: MCPServer = MCPServer(name="persistent-memory", instructions=INSTRUCTIONS)

    def store() -> MemoryStore:
        # At call time: the process store follows settings changes.
        return get_store().for_owner(owner)

    def memories() -> MemoryService:
        return memories_for(owner)

    @server.tool()
    async def get_context(
        session_id: str, conversation: str = "default", max_tokens: int | None = None
    ) -> dict[str, Any]:
        """What to send to a model now from a session's conversation: its pinned system
        messages and newest turns within ``max_tokens`` (None: the configured budget)."""
        context = await _call(
            lambda: store().get_context(session_id, conversation=conversation, max_tokens=max_tokens)
        )
        return _plain(context)

    @server.tool()
    async def add_messages(
        session_id: str, messages: list[dict[str, Any]], conversation: str = "default"
    ) -> dict[str, Any]:
        """Append chat messages (``{"role": "user"|"assistant"|"system"|"tool", "content": ...}``)
        to a session's conversation, creating the session if needed; the messages as stored."""
        added = await _call(lambda: store().add_messages(session_id, messages, conversation=conversation))
        return _plain(added)

    @server.tool()
    async def list_conversations(session_id: str) -> list[dict[str, Any]]:
        """A session's conversations: name, head, message and token counts."""
        return _plain(await _call(lambda: store().list_conversations(session_id)))

    @server.tool()
    async def search_memories(
        query: str,
        strategy: str = "hybrid",
        limit: int = 10,
        said_after: str | None = None,
        said_before: str | None = None,
        as_of: str | None = None,
        kinds: list[str] | None = None,
    ) -> list[dict[str, Any]]:
        """Long-term memories, and messages of the caller's conversations, relevant to
        ``query``, best first, each with its ``kind`` ("memory" or "message") and score.
        ``strategy``: hybrid, keyword, semantic or recent. ``said_after`` / ``said_before``
        (ISO 8601 times): only what was said at or after / before then. ``kinds``: what to
        look through (default: both). ``as_of`` (an ISO 8601 time):
        what was true then, older versions of changed memories included."""
        found = await _call(
            lambda: memories().search(
                query,
                strategy=strategy,
                limit=limit,
                said_after=_moment(said_after, "said_after"),
                said_before=_moment(said_before, "said_before"),
                as_of=_moment(as_of, "as_of"),
                kinds=kinds,
            )
        )
        return _plain(found)

    @server.tool()
    async def add_memory(
        content: str, type: str = "factual", key: str | None = None, happened_at: str | None = None
    ) -> dict[str, Any]:
        """Store a long-term memory (``type``: factual, episodic, procedural or semantic).
        Writing the same ``key`` again updates it (the old content is kept as an older
        version); without one a key comes from the content. ``happened_at`` (an ISO 8601
        time): when what it describes happened."""
        added = await _call(
            lambda: memories().add(
                content, type=type, key=key, source="mcp", happened_at=_moment(happened_at, "happened_at")
            )
        )
        return _plain(added)

    @server.tool()
    async def delete_memory(memory_id: int) -> dict[str, Any]:
        """Delete one long-term memory by its id."""
        await _call(lambda: memories().delete(memory_id))
        return {"deleted": memory_id}

    return server
