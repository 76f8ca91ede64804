"""What is traced: each class's operations, by the class's name (data only: no import of
the classes, nor of OpenTelemetry).

A memory operation is named after the GenAI semantic conventions for memory
(``gen_ai.operation.name``: ``create_memory``, ``update_memory``, ``upsert_memory``,
``delete_memory``, ``search_memory``, ``create_memory_store``, ``delete_memory_store``) and
its store (``gen_ai.memory.store.id``) is the kind of memory it reads or writes, one of
:data:`STORES`: a name of few values, so spans and metrics group by it; the session is
``gen_ai.conversation.id``.
"""

from __future__ import annotations

from typing import NamedTuple

#: The memory stores of the app: a session's values and history, its conversations, its
#: LangGraph checkpoints, and the owner's long-term memories.
STORES = ("sessions", "conversations", "checkpoints", "memories")


class Operation(NamedTuple):
    """One traced method: its GenAI operation, its store, and where its arguments are."""

    #: ``gen_ai.operation.name``.
    name: str
    #: ``gen_ai.memory.store.id`` (one of :data:`STORES`).
    store: str
    #: The argument holding the session id (``gen_ai.conversation.id``), if any.
    session: str | None = "session_id"
    #: The argument naming the record touched (``gen_ai.memory.record.id``), if any.
    record: str | None = None
    #: The argument holding what is written (``gen_ai.memory.records``, with content capture on).
    content: str | None = None
    #: The argument holding a query's text (``gen_ai.memory.query.text``, with content capture on).
    query: str | None = None
    #: Whether the result holds the records read (counted, and captured with content capture on).
    returns_records: bool = False


class Task(NamedTuple):
    """A background worker's unit of work: counted, timed, its failures and lag measured.
    How is :mod:`.otel`'s business, by ``task``."""

    task: str


class RoundTrip(NamedTuple):
    """A backend method that makes one Redis round trip (``batch``: one per primary, sent
    together): a ``db.system`` ``redis`` client span."""

    batch: bool = False


_S, _C, _K, _M = STORES

SEARCH, CREATE, UPDATE, UPSERT, DELETE = (
    "search_memory",
    "create_memory",
    "update_memory",
    "upsert_memory",
    "delete_memory",
)

#: The store service (its sessions, values, lanes, conversations and checkpoints).
_STORE: dict[str, Operation] = {
    "create_session": Operation("create_memory_store", _S),
    "resume_session": Operation(SEARCH, _S),
    "session_info": Operation(SEARCH, _S),
    "list_session_infos": Operation(SEARCH, _S, session=None, returns_records=True),
    "session_page": Operation(SEARCH, _S, session=None),
    "delete_session": Operation("delete_memory_store", _S),
    "put": Operation(UPSERT, _S, record="key", content="value"),
    "get": Operation(SEARCH, _S, record="key", returns_records=True),
    "get_all": Operation(SEARCH, _S, returns_records=True),
    "get_many": Operation(SEARCH, _S, session=None, record="key", returns_records=True),
    "list_keys": Operation(SEARCH, _S, returns_records=True),
    "increment": Operation(UPDATE, _S, record="key"),
    "clear": Operation(DELETE, _S, record="key"),
    "get_history": Operation(SEARCH, _S, returns_records=True),
    "fold_history": Operation(UPDATE, _S),
    "enrich": Operation(SEARCH, _S, returns_records=True),
    # The question is recorded too, but what the lane is for is the context it reads.
    "enrich_recording": Operation(SEARCH, _S, query="text", returns_records=True),
    "record_answer": Operation(CREATE, _C, content="text"),
    "add_messages": Operation(CREATE, _C, record="conversation", content="messages"),
    "get_messages": Operation(SEARCH, _C, record="conversation", returns_records=True),
    "get_context": Operation(SEARCH, _C, record="conversation", returns_records=True),
    "list_conversations": Operation(SEARCH, _C, returns_records=True),
    "set_head": Operation(UPDATE, _C, record="conversation"),
    "clear_messages": Operation(DELETE, _C, record="conversation"),
    "pop_message": Operation(DELETE, _C, record="conversation", returns_records=True),
    "write_thread": Operation(UPSERT, _C, record="conversation"),
    "remove_thread": Operation(DELETE, _C, record="conversation"),
    "put_checkpoint": Operation(CREATE, _K),
    "put_checkpoint_writes": Operation(CREATE, _K),
    "get_checkpoint": Operation(SEARCH, _K),
    "list_checkpoints": Operation(SEARCH, _K),
    "delete_checkpoints": Operation(DELETE, _K),
    "prune_checkpoints": Operation(DELETE, _K),
    "delete_checkpoint_runs": Operation(DELETE, _K),
}

#: The long-term memories' service (one owner's memories).
_MEMORIES: dict[str, Operation] = {
    "add": Operation(CREATE, _M, session=None, content="content"),
    "upsert": Operation(UPSERT, _M, session=None, record="key", content="content"),
    "get": Operation(SEARCH, _M, session=None, record="memory_id", returns_records=True),
    "get_by_key": Operation(SEARCH, _M, session=None, record="key", returns_records=True),
    "versions": Operation(SEARCH, _M, session=None, record="memory_id", returns_records=True),
    "list": Operation(SEARCH, _M, session=None, returns_records=True),
    "similar": Operation(SEARCH, _M, session=None, record="memory_id", returns_records=True),
    "search_results": Operation(SEARCH, _M, session=None, query="query"),
    "update": Operation(UPDATE, _M, session=None, record="memory_id"),
    "restore_versions": Operation(UPDATE, _M, session=None, record="memory_id"),
    "delete": Operation(DELETE, _M, session=None, record="memory_id"),
    "delete_all": Operation(DELETE, _M, session=None),
}

#: What is traced, by class name. The integrations' spans are the framework's call; the
#: store's spans under them say what it did.
OPERATIONS: dict[str, dict[str, Operation | Task | RoundTrip]] = {
    "MemoryStore": dict(_STORE),
    "MemoryService": dict(_MEMORIES),
    # LangGraph's store: a batch of gets, searches, puts and deletes.
    "PersistentMemoryStore": {
        "batch": Operation("batch_memory", _M, session=None),
        "abatch": Operation("batch_memory", _M, session=None),
    },
    # LangGraph's checkpointer (its async methods run these).
    "PersistentMemorySaver": {
        "get_tuple": Operation(SEARCH, _K, session=None),
        "put": Operation(CREATE, _K, session=None),
        "put_writes": Operation(CREATE, _K, session=None),
        "delete_thread": Operation(DELETE, _K, session="thread_id"),
        "delete_for_runs": Operation(DELETE, _K, session=None),
        "copy_thread": Operation(CREATE, _K, session="target_thread_id"),
        "prune": Operation(DELETE, _K, session=None),
    },
    # The OpenAI Agents SDK's session protocol.
    "PersistentMemorySession": {
        "get_items": Operation(SEARCH, _C, session=None, returns_records=True),
        "add_items": Operation(CREATE, _C, session=None, content="items"),
        "pop_item": Operation(DELETE, _C, session=None, returns_records=True),
        "clear_session": Operation(DELETE, _C, session=None),
    },
    # Pydantic AI's conversation store protocol.
    "PersistentMemoryConversationStore": {
        "read_record": Operation(SEARCH, _C, session=None, record="conversation_id"),
        "read_records": Operation(SEARCH, _C, session=None, returns_records=True),
        "write_record": Operation(UPSERT, _C, session=None, content="new_entries"),
        "delete_record": Operation(DELETE, _C, session=None, record="conversation_id"),
        "read_entry": Operation(SEARCH, _C, session=None, record="entry_id"),
        "read_history": Operation(SEARCH, _C, session=None, returns_records=True),
    },
    # The background work.
    "ExtractionWorker": {"extract": Task("extraction")},
    "EmbeddingWorker": {"_embed": Task("embedding")},
    "SummarizerWorker": {"run_once": Task("summary")},
    "Mirror": {"sync_dirty": Task("mirror")},
    # Where the store calls Redis.
    "RedisBackend": {"_call": RoundTrip()},
    "RedisTransport": {"run_many": RoundTrip(batch=True)},
}
