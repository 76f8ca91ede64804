"""Conversation stores of Pydantic AI (``pydantic_ai.conversation_store.ConversationStore``)
on this app's conversations.

``PersistentMemoryConversationStore(owner=...)`` keeps each Pydantic AI conversation as
session ``conversation_id`` of that owner, its messages in the session's conversation
``"default"`` (``conversation=`` for another name), so that windows, token counts, rolling
summaries, extraction, the admin's transcript, the sweep, export and forget-an-owner see
it as any conversation::

    store = PersistentMemoryConversationStore(owner=str(request.user.pk))
    conversation = await store.load(conversation_id) or Conversation(conversation_id=conversation_id)
    result = await agent.run(prompt, conversation=conversation)
    await store.save(result)

How it maps:

- Each entry is a message of the conversation under the entry's id, after its parent: a
  ``ModelResponse`` an ``assistant`` message, a ``ModelRequest`` a ``user`` message (a
  ``system`` one when it holds only system prompts), with the text of its parts as content
  and the exact message, as Pydantic AI serializes it, in the ``metadata``. So the thread
  Pydantic AI reads is the thread stored; branches it leaves are branches of the tree.
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

from persistent_memory.conversations.messages import CHAT_FIELDS, DEFAULT_CONVERSATION, MESSAGE_ID_PATTERN
from persistent_memory.exceptions import (
    KeyNotFound,
    MessageNotFound,
    RevisionConflict,
    SessionNotFound,
)
from persistent_memory.integrations import off_the_loop
from persistent_memory.store import get_store

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


def chat_of(entry: ConversationEntry) -> dict[str, Any]:
    """The chat message that stores ``entry`` (see the module's docstring)."""
    message = entry.message
    if isinstance(message, ModelResponse):
        role = "assistant"
    elif all(isinstance(part, SystemPromptPart) for part in message.parts) and message.parts:
        role = "system"
    else:
        role = "user"
    text = "\n".join(filter(None, map(_part_text, message.parts)))
    (dumped,) = ModelMessagesTypeAdapter.dump_python([message], mode="json")
    return {"id": entry.id, "role": role, "content": text, "metadata": {KEY: dumped}}


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


def entry_of(stored: dict[str, Any]) -> ConversationEntry:
    """The entry a stored message holds; a message recorded otherwise (the lanes, the REST
    API) reads as a user prompt or a text response."""
    message: ModelMessage | None = _kept_message(stored.get("metadata"))
    if message is None:
        content = stored.get("content")
        text = content if isinstance(content, str) else ""
        if isinstance(content, list):
            text = "\n".join(part["text"] for part in content if part.get("type") == "text")
        if stored["role"] == "assistant":
            message = ModelResponse(parts=[TextPart(text)])
        elif stored["role"] == "system":
            message = ModelRequest(parts=[SystemPromptPart(text)])
        else:
            message = ModelRequest(parts=[UserPromptPart(text)])
    return ConversationEntry(id=stored["id"], parent_id=stored["parent_id"], message=message)


# The store ---------------------------------------------------------------------------------


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
        messages = [chat_of(entry) for entry in new_entries]
        for before, entry in zip(new_entries, new_entries[1:], strict=False):
            if entry.parent_id != before.id:
                raise UserError("new_entries must be a chain, each after the one before it.")
        copied = []
        if expected_revision is None:  # a new conversation: a fork's history is elsewhere
            copied = self._kept_elsewhere(record, parent if new_entries else record.head_id, new_ids)
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
        try:
            read = self.store.get_messages(
                session_id, conversation=self.conversation, leaf=head_id, limit=limit
            )
        except (SessionNotFound, MessageNotFound):
            self._headless[(session_id, head_id)] = None
            while len(self._headless) > REMEMBERED:
                self._headless.popitem(last=False)
            raise KeyError(head_id) from None
        entries = [entry_of(message) for message in read["messages"]]
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
