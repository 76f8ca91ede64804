"""Conversation stores of Pydantic AI (``pydantic_ai.conversation_store.ConversationStore``)
on this app's conversations.

``PersistentMemoryConversationStore(owner=...)`` keeps each Pydantic AI conversation as
session ``conversation_id`` of that owner, its messages in the session's conversation
``"default"`` (``conversation=`` for another name), so that windows, token counts, rolling
summaries, extraction, the admin's transcript, the sweep, export and forget-an-owner see
it as any conversation::

    store = PersistentMemoryConversationStore(owner=f"user:{request.user.pk}")
    conversation = await store.load(conversation_id) or Conversation(conversation_id=conversation_id)
    result = await agent.run(prompt, conversation=conversation)
    await store.save(result)

How it maps:

- Each entry is a message of the conversation under the entry's id, after its parent: a
  ``ModelResponse`` an ``assistant`` message (its tool calls as ``tool_calls``), a
  ``ModelRequest`` a ``user`` message (a ``system`` one when it holds only system prompts),
  with the text of its parts as content and the exact message, as Pydantic AI serializes
  it, in the ``metadata``. A request that only returns the results of the calls before it
  is ``tool`` messages, one per result, as the Agents SDK's are (the entry's id on the last,
  which keeps the message; ``<id>.<n>`` on the others). So the thread Pydantic AI reads is
  the thread stored, a model sent the window reads real tool calls, and branches it leaves
  are branches of the tree. Messages recorded otherwise (the REST API, the Agents SDK) read
  back as Pydantic AI's parts: tool calls as ``ToolCallPart``, results as ``ToolReturnPart``.
- The record (usage, deferred tool requests, scope, branches, revision) is the session's
  value ``"pydantic_ai"``. A save checks the revision, appends the new entries, moves the
  head and stores the new record in one atomic step (one round trip on Redis): a stale
  revision raises ``ConversationConflict`` and writes nothing.
- ``scope`` is the owner: an owner's store answers only that owner's conversations, each
  with ``scope`` set to the owner (a save naming another scope is refused). The unowned
  store (``owner=None``) keeps the scope a save names, as a label to list by.
- A fork copies the history it keeps into its own session (a session holds its whole
  tree), so that deleting one conversation never takes another's messages: ``delete``
  erases the conversation's messages and record, and its session when nothing else is in it.
- Conversations longer than ``MAX_MESSAGES`` lose their oldest messages as every
  conversation does (with a summarizer, only what its summary covers).

The async methods await Redis on the event loop, without a thread (see
:mod:`persistent_memory.integrations.redis_bridge`), and run inline on the memory backend (a
call there never waits for I/O).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import TypeAdapter
from pydantic_ai.conversation_store import (
    ConversationConflict,
    ConversationEntry,
    ConversationRecord,
    ConversationStore,
)
from pydantic_ai.exceptions import UserError
from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    RetryPromptPart,
    SystemPromptPart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)

from persistent_memory.chat.messages import (
    CHAT_FIELDS,
    DEFAULT_CONVERSATION,
    MESSAGE_ID_PATTERN,
    NAME_PATTERN,
    TOOL_CALL_ID_PATTERN,
)
from persistent_memory.exceptions import (
    KeyNotFound,
    MessageNotFound,
    RevisionConflict,
    SessionNotFound,
)
from persistent_memory.integrations import off_the_loop
from persistent_memory.store import get_store
from persistent_memory.telemetry import instrument

if TYPE_CHECKING:
    from persistent_memory.store import MemoryStore

T = TypeVar("T")
#: The session value that holds a conversation's record, and the metadata field of each
#: message that holds the Pydantic AI message it stores.
KEY = "pydantic_ai"
RECORDS: TypeAdapter[ConversationRecord] = TypeAdapter(ConversationRecord)
#: Entry ids whose conversation a store remembers (for ``read_history``, which is given
#: only an entry id): those of the records it read or wrote lately.
REMEMBERED = 65536


# Entries <-> chat messages -------------------------------------------------------------


def _part_text(part: Any) -> str:
    """What a model reads of a part, as text (empty for parts with none)."""
    if isinstance(part, (SystemPromptPart, TextPart)):
        return part.content
    if isinstance(part, UserPromptPart):
        if isinstance(part.content, str):
            return part.content
        return "\n".join(item for item in part.content if isinstance(item, str))
    if isinstance(part, ToolReturnPart):
        return f"{part.tool_name}: {part.model_response_str()}"
    if isinstance(part, RetryPromptPart):
        return part.model_response()
    if isinstance(part, ToolCallPart):
        return f"{part.tool_name}({part.args_as_json_str()})"
    return ""


#: Metadata of the ``tool`` messages before an entry's last: the entry they belong to (read
#: back as part of it, not as entries of their own); and of that last message, the entry's
#: parent (its stored parent is the part before it).
PART_OF = "pydantic_ai_part_of"
PARENT = "pydantic_ai_parent"


def _call(part: ToolCallPart) -> dict[str, Any]:
    return {
        "id": part.tool_call_id,
        "type": "function",
        "function": {"name": part.tool_name, "arguments": part.args_as_json_str()},
    }


def _valid_calls(calls: list[ToolCallPart]) -> bool:
    ids = [part.tool_call_id for part in calls]
    return len(set(ids)) == len(ids) and all(
        TOOL_CALL_ID_PATTERN.fullmatch(call_id) and part.tool_name
        for call_id, part in zip(ids, calls, strict=True)
    )


def _answers(part: Any) -> str | None:
    """The call a request part returns the result of (None: it is no tool result)."""
    if isinstance(part, ToolReturnPart) or (isinstance(part, RetryPromptPart) and part.tool_name):
        return part.tool_call_id
    return None


def chats_of(entry: ConversationEntry, open_calls: set[str]) -> tuple[list[dict[str, Any]], set[str]]:
    """The chat messages that store ``entry``, after a thread whose ``open_calls`` wait for
    results; and the calls open after them (see the module's docstring)."""
    message = entry.message
    (dumped,) = ModelMessagesTypeAdapter.dump_python([message], mode="json")
    kept = {KEY: dumped}
    text = "\n".join(filter(None, map(_part_text, message.parts)))
    if isinstance(message, ModelResponse):
        calls = [part for part in message.parts if isinstance(part, ToolCallPart)]
        if not calls or not _valid_calls(calls):
            return [{"id": entry.id, "role": "assistant", "content": text, "metadata": kept}], set()
        said = "\n".join(
            filter(None, (_part_text(p) for p in message.parts if not isinstance(p, ToolCallPart)))
        )
        chat = {
            "id": entry.id,
            "role": "assistant",
            "content": said or None,
            "tool_calls": list(map(_call, calls)),
        }
        return [{**chat, "metadata": kept}], {part.tool_call_id for part in calls}
    answered = [_answers(part) for part in message.parts]
    results = len(answered) <= 100 and len(entry.id) <= 120 and bool(answered)
    if results and all(call in open_calls for call in answered) and len(set(answered)) == len(answered):
        chats = []
        for number, part in enumerate(message.parts, start=1):
            last = number == len(message.parts)
            chat = {
                "id": entry.id if last else f"{entry.id}.{number}",
                "role": "tool",
                "tool_call_id": part.tool_call_id,
                "content": part.model_response()
                if isinstance(part, RetryPromptPart)
                else part.model_response_str(),
                "metadata": {**kept, PARENT: entry.parent_id} if last else {PART_OF: entry.id},
            }
            if NAME_PATTERN.fullmatch(part.tool_name):
                chat["name"] = part.tool_name
            chats.append(chat)
        return chats, open_calls - set(answered)
    role = (
        "system"
        if message.parts and all(isinstance(part, SystemPromptPart) for part in message.parts)
        else "user"
    )
    return [{"id": entry.id, "role": role, "content": text, "metadata": kept}], set()


def _kept_message(metadata: Any) -> ModelMessage | None:
    """The Pydantic AI message a stored message's metadata keeps; None when it keeps none,
    or something else under ``pydantic_ai`` (any metadata can be written through the REST
    API): such a message reads as one recorded otherwise."""
    kept = metadata.get(KEY) if isinstance(metadata, dict) else None
    if kept is None:
        return None
    try:
        (message,) = ModelMessagesTypeAdapter.validate_python([kept])
    except ValueError:  # pydantic's ValidationError
        return None
    return message


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(part["text"] for part in content if part.get("type") == "text")
    return content if isinstance(content, str) else ""


def entry_of(stored: dict[str, Any], call_names: dict[str, str] | None = None) -> ConversationEntry:
    """The entry a stored message holds. A message recorded otherwise (the lanes, the REST
    API, the Agents SDK) reads as a user prompt, a response (with its ``tool_calls`` as
    tool call parts) or a tool's result (the tool named from ``call_names``, call id to
    name, when the message names none)."""
    metadata = stored.get("metadata")
    message: ModelMessage | None = _kept_message(metadata)
    parent = stored["parent_id"]
    if message is not None and isinstance(metadata, dict) and PARENT in metadata:
        parent = metadata[PARENT] if isinstance(metadata[PARENT], str) else None
    if message is None:
        text = _text(stored.get("content"))
        if stored["role"] == "assistant":
            parts: list[Any] = [TextPart(text)] if text or not stored.get("tool_calls") else []
            for call in stored.get("tool_calls") or ():
                function = call["function"]
                parts.append(ToolCallPart(function["name"], function["arguments"], tool_call_id=call["id"]))
            message = ModelResponse(parts=parts)
        elif stored["role"] == "system":
            message = ModelRequest(parts=[SystemPromptPart(text)])
        elif stored["role"] == "tool":
            call_id = stored["tool_call_id"]
            name = stored.get("name") or (call_names or {}).get(call_id, "")
            message = ModelRequest(parts=[ToolReturnPart(name, text, tool_call_id=call_id)])
        else:
            message = ModelRequest(parts=[UserPromptPart(text)])
    return ConversationEntry(id=stored["id"], parent_id=parent, message=message)


def entries_of(messages: list[dict[str, Any]]) -> list[ConversationEntry]:
    """The entries of a thread's stored messages, oldest first: the ``tool`` messages of an
    entry before its last (``PART_OF``) are read as part of it."""
    names: dict[str, str] = {}
    entries = []
    for stored in messages:
        for call in stored.get("tool_calls") or ():
            names[call["id"]] = call["function"]["name"]
        metadata = stored.get("metadata")
        if stored["role"] == "tool" and isinstance(metadata, dict) and PART_OF in metadata:
            continue
        entries.append(entry_of(stored, names))
    return entries


# The store ---------------------------------------------------------------------------------


@instrument
class PersistentMemoryConversationStore(ConversationStore):
    """A Pydantic AI ``ConversationStore`` over this app's conversations (see the module's
    docstring). ``owner``: whose conversations (None: the store's own namespace,
    ``get_store()``'s by default); ``store``: another store; ``conversation``: the name of
    the conversation each session keeps the messages in."""

    def __init__(
        self,
        *,
        owner: str | None = None,
        store: MemoryStore | None = None,
        conversation: str = DEFAULT_CONVERSATION,
    ) -> None:
        self.owner = owner
        self.conversation = conversation
        self._store = store
        self._where: OrderedDict[str, str] = OrderedDict()
        # Records found to name a head their session does not hold (written through the
        # REST API): read as no record, so that load answers None instead of failing.
        self._headless: OrderedDict[tuple[str, str | None], None] = OrderedDict()

    @property
    def store(self) -> MemoryStore:
        store = self._store if self._store is not None else get_store()
        return store if self.owner is None else store.for_owner(self.owner)

    def _remember(self, session_id: str, entry_ids: Sequence[str | None]) -> None:
        for entry_id in entry_ids:
            if entry_id is not None:
                self._where[entry_id] = session_id
                self._where.move_to_end(entry_id)
        while len(self._where) > REMEMBERED:
            self._where.popitem(last=False)

    def _record(self, session_id: str, value: Any) -> ConversationRecord | None:
        """The record a session's ``pydantic_ai`` value holds; None when the value is
        anything else (any value can be written under any key through the REST API): such
        a session has no conversation of this store, as one without the value."""
        try:
            record = RECORDS.validate_python(value)
        except ValueError:  # pydantic's ValidationError
            return None
        ids = [record.head_id, *record.branches] if record.head_id is not None else record.branches
        if (
            record.conversation_id != session_id
            or not all(
                isinstance(entry_id, str) and MESSAGE_ID_PATTERN.fullmatch(entry_id) for entry_id in ids
            )
            or (session_id, record.head_id) in self._headless
        ):
            return None
        self._remember(session_id, [record.head_id, *record.branches])
        return record

    # What each method does, synchronously ------------------------------------------

    def get_record(self, conversation_id: str) -> ConversationRecord | None:
        """The conversation's record (None: the store does not have it)."""
        try:
            value = self.store.get(conversation_id, KEY)
        except (SessionNotFound, KeyNotFound):
            return None
        return self._record(conversation_id, value)

    def get_records(self, scope: str | None = None, limit: int | None = None) -> list[ConversationRecord]:
        """The records (of ``scope``), newest ``updated_at`` first, at most ``limit``."""
        store = self.store
        values = store.get_many(store.list_sessions(), KEY)
        read = (self._record(session_id, value) for session_id, value in values.items())
        records = [record for record in read if record is not None]
        if scope is not None:
            records = [record for record in records if record.scope == scope]
        records.sort(key=lambda record: record.updated_at, reverse=True)
        return records[:limit]

    def put_record(
        self,
        record: ConversationRecord,
        new_entries: Sequence[ConversationEntry],
        expected_revision: str | None,
    ) -> None:
        """Store ``record`` and ``new_entries`` if the stored revision is ``expected_revision``."""
        if self.owner is not None:
            if record.scope not in (None, self.owner):
                raise UserError(f"This store keeps owner {self.owner!r}'s conversations only.")
            record = dataclasses.replace(record, scope=self.owner)
        session_id, new_ids = record.conversation_id, {entry.id for entry in new_entries}
        parent = new_entries[0].parent_id if new_entries else None
        for before, entry in zip(new_entries, new_entries[1:], strict=False):
            if entry.parent_id != before.id:
                raise UserError("new_entries must be a chain, each after the one before it.")
        copied = []
        if expected_revision is None:  # a new conversation: a fork's history is elsewhere
            copied = self._kept_elsewhere(record, parent if new_entries else record.head_id, new_ids)
        open_calls = self._open_calls(session_id, parent, copied, new_entries)
        messages: list[dict[str, Any]] = []
        for entry in new_entries:
            chats, open_calls = chats_of(entry, open_calls)
            messages.extend(chats)
        if copied:  # its history first, then what comes after it
            parent = None
            messages = [*copied, *messages]
        try:
            self.store.write_thread(
                session_id,
                key=KEY,
                expected=expected_revision,
                record=RECORDS.dump_python(record, mode="json"),
                messages=messages,
                parent_id=parent,
                head_id=record.head_id,
                conversation=self.conversation,
            )
        except (RevisionConflict, MessageNotFound, SessionNotFound):
            raise ConversationConflict(session_id) from None
        self._remember(session_id, [record.head_id, *record.branches, *new_ids])

    def _open_calls(
        self,
        session_id: str,
        parent: str | None,
        copied: list[dict[str, Any]],
        new_entries: Sequence[ConversationEntry],
    ) -> set[str]:
        """The tool calls of the message the new entries follow, when the first returns
        results (a run resumed with deferred tools' results): read from the store then only."""
        first = new_entries[0].message if new_entries else None
        if not isinstance(first, ModelRequest) or not any(map(_answers, first.parts)) or parent is None:
            return set()
        if copied:
            before = copied[-1]
        else:
            try:
                read = self.store.get_messages(
                    session_id, conversation=self.conversation, leaf=parent, limit=1
                )
            except (SessionNotFound, MessageNotFound):
                return set()  # the write says why
            before = read["messages"][-1] if read["messages"] else {}
        return (
            {call["id"] for call in before.get("tool_calls") or ()}
            if before.get("role") == "assistant"
            else set()
        )

    def _kept_elsewhere(
        self, record: ConversationRecord, last: str | None, new_ids: set[str]
    ) -> list[dict[str, Any]]:
        """The history a fork keeps, to copy: up to ``last``, where the new record's history
        goes on from (empty when there is none or it is new)."""
        source = self._where.get(last) if last is not None and last not in new_ids else None
        if source is None or source == record.conversation_id:
            return []
        try:
            read = self.store.get_messages(source, conversation=self.conversation, leaf=last)
        except (SessionNotFound, MessageNotFound):
            raise ConversationConflict(record.conversation_id) from None  # released meanwhile
        return [
            {field: message[field] for field in ("id", *CHAT_FIELDS, "metadata") if field in message}
            for message in read["messages"]
        ]

    def remove_record(self, conversation_id: str, expected_revision: str) -> None:
        """Delete the conversation if its revision is ``expected_revision``."""
        try:
            self.store.remove_thread(
                conversation_id, key=KEY, expected=expected_revision, conversation=self.conversation
            )
        except (RevisionConflict, SessionNotFound):
            raise ConversationConflict(conversation_id) from None

    def get_history(self, head_id: str | None, limit: int | None = None) -> list[ConversationEntry]:
        """The entries up to ``head_id``, oldest first (the newest ``limit``); ``KeyError``
        when it is not stored (or not in a conversation this store has read)."""
        if head_id is None or limit == 0:
            return []
        session_id = self._where.get(head_id)
        if session_id is None:
            raise KeyError(head_id)
        wanted = limit
        while True:  # an entry of tool results is a message per result: read on until ``limit``
            try:
                read = self.store.get_messages(
                    session_id, conversation=self.conversation, leaf=head_id, limit=wanted
                )
            except (SessionNotFound, MessageNotFound):
                self._headless[(session_id, head_id)] = None
                while len(self._headless) > REMEMBERED:
                    self._headless.popitem(last=False)
                raise KeyError(head_id) from None
            entries = entries_of(read["messages"])
            if limit is None or wanted is None or len(entries) >= limit or len(read["messages"]) < wanted:
                break
            wanted += limit - len(entries)
        entries = entries[-limit:] if limit else entries
        self._remember(session_id, [entry.id for entry in entries])  # where a fork or a branch may start
        return entries

    # Pydantic AI's storage primitives ---------------------------------------------------

    async def _async(self, method: Callable[..., T], *args: Any) -> T:
        return await off_the_loop(self.store, method, *args)

    async def read_record(self, conversation_id: str) -> ConversationRecord | None:
        return await self._async(self.get_record, conversation_id)

    async def read_records(
        self, *, scope: str | None = None, limit: int | None = None
    ) -> Sequence[ConversationRecord]:
        return await self._async(self.get_records, scope, limit)

    async def write_record(
        self,
        record: ConversationRecord,
        *,
        new_entries: Sequence[ConversationEntry] = (),
        expected_revision: str | None,
    ) -> None:
        await self._async(self.put_record, record, new_entries, expected_revision)

    async def delete_record(self, conversation_id: str, *, expected_revision: str) -> None:
        await self._async(self.remove_record, conversation_id, expected_revision)

    async def read_entry(self, entry_id: str) -> ConversationEntry:
        (entry,) = await self._async(self.get_history, entry_id, 1)
        return entry

    async def read_history(self, head_id: str | None, *, limit: int | None = None) -> list[ConversationEntry]:
        return await self._async(self.get_history, head_id, limit)
