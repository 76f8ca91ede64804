"""Sessions of the OpenAI Agents SDK (``agents.memory.Session``) on this app's conversations.

``PersistentMemorySession(session_id)`` keeps an agent's history in conversation
``"default"`` of session ``session_id`` (``owner=`` for an owner's session, ``conversation=``
for another of its conversations), so that windows, token counts, rolling summaries,
extraction, the admin's transcript, the sweep, export and forget-an-owner see it as any
conversation::

    agent = Agent(name="Assistant", instructions="Reply briefly.")
    session = PersistentMemorySession("chat-42", owner=f"user:{request.user.pk}")
    result = await Runner.run(agent, "Hello", session=session)

How items are stored (every item reads back equal):

- An item with a chat-completions equivalent is a chat message: a message item (``user``,
  ``assistant``, ``system``; ``developer`` as ``system``), a run of ``function_call`` items
  (one assistant message with their ``tool_calls``, as a model answers parallel calls),
  and a ``function_call_output`` (a ``tool`` message). What the chat form leaves out (ids,
  statuses, part types, annotations) is kept in the message's ``metadata``; an item
  that is a chat message as it stands (``{"role": "user", "content": "Hi"}``, as
  ``Runner`` sends a user's input) needs none, and is stored as that message alone.
- Any other item (reasoning, web search, computer and MCP calls, compaction, ...) is kept
  verbatim in the metadata of the message next to it in the same write (or of an empty
  assistant message, when a write holds nothing else).
- A message the app recorded otherwise (the lanes, the REST API) reads as the items the
  SDK would have sent for it.

``get_items`` reads only the messages' chat fields and metadata (not their ids, token
counts or times). ``get_items``, ``add_items`` and ``clear_session`` are one round trip on Redis;
``pop_item`` two (it reads the newest message, then takes it off with a compare-and-set
on the head, retried if another writer moved it). The async methods await Redis on the
event loop, without a thread (see :mod:`persistent_memory.integrations.redis_bridge`), and
run inline on the memory backend (a call there never waits for I/O).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from agents.memory.session_settings import SessionSettings, resolve_session_limit

from persistent_memory.chat.messages import DEFAULT_CONVERSATION, is_chat_message
from persistent_memory.exceptions import HeadMoved, MessageNotFound, OrphanToolResult, SessionNotFound
from persistent_memory.integrations import off_the_loop
from persistent_memory.store import get_store
from persistent_memory.telemetry import instrument
from persistent_memory.validation import validate_session_id

if TYPE_CHECKING:
    from agents.items import TResponseInputItem

    from persistent_memory.store import MemoryStore

T = TypeVar("T")
#: The metadata field that holds how to rebuild a message's items: a list of entries,
#: one per item in order: ``{"m": ...}`` the message item, ``{"c": ...}`` a function call
#: (its ``tool_calls`` entry, in order), ``{"o": ...}`` a call's output, ``{"v": item}``
#: an item kept verbatim. The first three hold the item with the fields the chat
#: message carries set to None (a message's list content: each part without its text).
KEY = "openai_agents"
ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
TEXT_PARTS = ("input_text", "output_text")


# Items -> chat messages ---------------------------------------------------------------


def _message(item: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """A message item as a chat message, and its entry."""
    content = item.get("content")
    if item.get("type", "message") != "message" or item.get("role") not in ROLES:
        return None
    chat: dict[str, Any] = {"role": ROLES[item["role"]], "content": content}
    rest = {**item, "content": None}
    if isinstance(content, list):
        parts, shapes = [], []
        for part in content:
            text = part.get("text") if isinstance(part, dict) and part.get("type") in TEXT_PARTS else None
            if isinstance(text, str):
                parts.append({"type": "text", "text": text})
                shapes.append({key: value for key, value in part.items() if key != "text"})
            else:
                parts.append(part)
                shapes.append(None)
        chat["content"], rest["content"] = parts, shapes
    return chat, {"m": rest}


def _call(item: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A function call as a ``tool_calls`` entry, and its entry."""
    call = {
        "id": item.get("call_id"),
        "type": "function",
        "function": {"name": item.get("name"), "arguments": item.get("arguments")},
    }
    return call, {"c": {**item, "call_id": None, "name": None, "arguments": None}}


def _output(item: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A function call's output as a tool message, and its entry (an output that is not a
    string stays in the entry; the message then holds its text parts)."""
    output = item.get("output")
    if isinstance(output, str):
        return {"role": "tool", "tool_call_id": item.get("call_id"), "content": output}, {
            "o": {**item, "call_id": None, "output": None}
        }
    parts = output if isinstance(output, list) else ()
    texts = [part["text"] for part in parts if isinstance(part, dict) and isinstance(part.get("text"), str)]
    message = {"role": "tool", "tool_call_id": item.get("call_id"), "content": "\n".join(texts)}
    return message, {"o": {**item, "call_id": None}}


def messages_of(items: list[dict[str, Any]], *, outputs: bool = True) -> list[dict[str, Any]]:
    """The chat messages that hold ``items`` (see the module's docstring); ``outputs=False``
    keeps function call outputs verbatim (their calls are not open on the thread)."""
    messages: list[dict[str, Any]] = []
    waiting: list[dict[str, Any]] = []  # verbatim items, for the next message
    calls: dict[str, Any] | None = None  # the message of the run of calls going on
    for item in json.loads(json.dumps(items)):  # as stored: JSON, and the caller's copy untouched
        kind = item.get("type", "message") if isinstance(item, dict) else None
        built: tuple[dict[str, Any], dict[str, Any]] | None = None
        if kind == "function_call":
            call, entry = _call(item)
            if calls is not None and call["id"] not in {known["id"] for known in calls["tool_calls"]}:
                trial = {**calls, "tool_calls": [*calls["tool_calls"], call]}
                if is_chat_message(trial):
                    calls["tool_calls"].append(call)
                    calls["metadata"][KEY] += [*waiting, entry]
                    waiting = []
                    continue
            built = {"role": "assistant", "content": None, "tool_calls": [call]}, entry
        elif kind == "function_call_output" and outputs:
            built = _output(item)
        elif kind == "message":
            built = _message(item)
        if built is None or not is_chat_message(built[0]):
            waiting.append({"v": item})
            continue
        message, entry = built
        message["metadata"] = {KEY: [*waiting, entry]}
        waiting = []
        messages.append(message)
        calls = message if kind == "function_call" else None
    if waiting:
        if messages:
            messages[-1]["metadata"][KEY] += waiting
        else:
            messages.append({"role": "assistant", "content": "", "metadata": {KEY: waiting}})
    for message in messages:
        if _plain(message):
            del message["metadata"]  # it reads back as the same item without: see items_of
    return messages


def _plain(message: dict[str, Any]) -> bool:
    """Whether ``message`` holds one item that is the message itself (``{"role": "user",
    "content": "Hi"}``, as the SDK's ``Runner`` sends a user's input), and so needs no
    entries: most messages, stored and read back without metadata to parse."""
    return (
        isinstance(message["content"], str)
        and message["role"] in ("user", "assistant", "system")
        and message["metadata"][KEY] == [{"m": {"role": message["role"], "content": None}}]
    )


# Chat messages -> items ---------------------------------------------------------------


def items_of(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The items a stored message holds, in order."""
    metadata = message.get("metadata")
    if (
        metadata is None
        and len(message) == 2
        and message["role"] != "tool"
        and isinstance(message["content"], str)
    ):
        return [message]  # a plain message (see _plain); what _plain_items would build, sooner
    entries = metadata.get(KEY) if isinstance(metadata, dict) else None
    if not isinstance(entries, list):
        return _plain_items(message)
    # Any metadata can be written through the REST API: entries that do not rebuild this
    # message (not this module's shape, or another message's) are passed over, and the
    # message reads as one recorded without a session.
    try:
        return _kept_items(message, entries)
    except (KeyError, TypeError, ValueError, AttributeError, StopIteration):
        return _plain_items(message)


def _kept_items(message: dict[str, Any], entries: list[Any]) -> list[dict[str, Any]]:
    """The items ``entries`` rebuild from ``message`` (see :data:`KEY`)."""
    if not entries:  # every message this module writes holds an item
        raise ValueError("No entries.")
    calls = iter(message.get("tool_calls") or ())
    items = []
    for entry in entries:
        ((kind, rest),) = entry.items()
        if kind not in ("m", "c", "o", "v") or not isinstance(rest, dict):
            raise ValueError(f"Not an entry: {entry!r}")
        item = dict(rest)
        if kind == "m":
            content = message["content"]
            if rest["content"] is not None:
                content = [
                    {**shape, "text": part["text"]} if shape is not None else part
                    for shape, part in zip(rest["content"], content, strict=True)
                ]
            item["content"] = content
        elif kind == "c":
            call = next(calls)
            function = call["function"]
            item.update(call_id=call["id"], name=function["name"], arguments=function["arguments"])
        elif kind == "o":
            item["call_id"] = message["tool_call_id"]
            if "output" in rest and rest["output"] is None:
                item["output"] = message["content"]
        items.append(item)
    if next(calls, None) is not None:
        raise ValueError("A tool call without its entry.")
    return items


def _plain_items(message: dict[str, Any]) -> list[dict[str, Any]]:
    """The items of a message recorded without a session (the lanes, the REST API)."""
    role, content = message["role"], message.get("content")
    if isinstance(content, list):
        content = [
            {"type": "output_text" if role == "assistant" else "input_text", "text": part["text"]}
            if part.get("type") == "text"
            else part
            for part in content
        ]
    if role == "tool":
        return [{"type": "function_call_output", "call_id": message["tool_call_id"], "output": content}]
    items: list[dict[str, Any]] = []
    if content:
        items.append({"role": role, "content": content})
    for call in message.get("tool_calls") or ():
        function = call["function"]
        items.append(
            {
                "type": "function_call",
                "call_id": call["id"],
                "name": function["name"],
                "arguments": function["arguments"],
            }
        )
    return items or [{"role": role, "content": content or ""}]


def _checked(items: list[dict[str, Any]], messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages``, with any item that would not read back equal kept verbatim instead."""
    expected = json.loads(json.dumps(items))
    if [item for message in messages for item in items_of(message)] == expected:
        return messages
    fixed: list[dict[str, Any]] = []
    for item in expected:
        (message,) = messages_of([item])
        if items_of(message) != [item]:
            message = {"role": "assistant", "content": "", "metadata": {KEY: [{"v": item}]}}
        fixed.append(message)
    return fixed


def _as_chat(items: list[Any], write: Callable[[list[dict[str, Any]]], Any]) -> None:
    """``write`` the messages that hold ``items``; should an output's call not be open on
    the thread (another item came between them), again with the outputs kept verbatim, so
    that the thread stays a valid chat."""
    try:
        write(_checked(items, messages_of(items)))
    except OrphanToolResult:
        write(_checked(items, messages_of(items, outputs=False)))


# The session ----------------------------------------------------------------------------


@instrument
class PersistentMemorySession:
    """An Agents SDK ``Session`` over conversation ``conversation`` of session ``session_id``
    (see the module's docstring). ``owner``: the owner whose session it is (None: the
    store's own namespace, ``get_store()``'s by default); ``store``: another store;
    ``session_settings``: the SDK's settings (``limit``: how many items ``get_items``
    reads by default)."""

    def __init__(
        self,
        session_id: str,
        *,
        owner: str | None = None,
        conversation: str = DEFAULT_CONVERSATION,
        store: MemoryStore | None = None,
        session_settings: SessionSettings | None = None,
    ) -> None:
        self.session_id = validate_session_id(session_id)
        self.conversation = conversation
        self.owner = owner
        self._store = store
        self.session_settings = session_settings
        self._scoped: tuple[MemoryStore, str, MemoryStore] | None = None  # see store

    @property
    def store(self) -> MemoryStore:
        store = self._store if self._store is not None else get_store()
        if self.owner is None:
            return store
        # The owner's store, made once per store (a new one after a settings change), not
        # validated and copied again on every call.
        scoped = self._scoped
        if scoped is None or scoped[0] is not store or scoped[1] != self.owner:
            scoped = self._scoped = (store, self.owner, store.for_owner(self.owner))
        return scoped[2]

    # What each method does, synchronously --------------------------------------------

    def read_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The newest ``limit`` items (None: the settings' limit, else all), oldest first."""
        limit = resolve_session_limit(limit, self.session_settings)
        if limit is not None and limit <= 0:
            return []
        try:
            read = self.store.get_chat_messages(self.session_id, conversation=self.conversation, limit=limit)
        except SessionNotFound:
            return []
        items = [item for message in read for item in items_of(message)]
        return items[-limit:] if limit else items  # type: ignore[return-value]

    def write_items(self, items: list[TResponseInputItem]) -> None:
        """Append ``items`` to the conversation (creating the session if need be)."""
        if items:
            store = self.store
            _as_chat(
                items,
                lambda messages: store.add_messages(
                    self.session_id, messages, conversation=self.conversation
                ),
            )

    def take_item(self) -> TResponseInputItem | None:
        """Remove the newest item and return it (None: there is none)."""
        store = self.store
        while True:
            try:
                read = store.get_messages(self.session_id, conversation=self.conversation, limit=1)
            except SessionNotFound:
                return None
            if not read["messages"]:
                return None
            (newest,) = read["messages"]
            items = items_of(newest)

            def pop(rest: list[dict[str, Any]] | None, head: str = newest["id"]) -> Any:
                return store.pop_message(
                    self.session_id, head, conversation=self.conversation, replacement=rest
                )

            try:
                if len(items) > 1:
                    _as_chat(items[:-1], pop)
                else:
                    pop(None)
            except (HeadMoved, MessageNotFound):
                continue  # another writer went first: read the new head
            return items[-1]  # type: ignore[return-value]

    def clear(self) -> None:
        """Remove every item of the conversation."""
        with contextlib.suppress(SessionNotFound):
            self.store.clear_messages(self.session_id, conversation=self.conversation)

    # The SDK's protocol -------------------------------------------------------------

    async def _async(self, method: Callable[..., T], *args: Any) -> T:
        return await off_the_loop(self.store, method, *args)

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        return await self._async(self.read_items, limit)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        await self._async(self.write_items, items)

    async def pop_item(self) -> TResponseInputItem | None:
        return await self._async(self.take_item)

    async def clear_session(self) -> None:
        await self._async(self.clear)
