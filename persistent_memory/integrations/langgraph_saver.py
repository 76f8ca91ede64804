"""LangGraph's checkpointer (``BaseCheckpointSaver``) on this app's backends.

``PersistentMemorySaver()`` keeps a graph's checkpoints in the configured backend (Redis in
either layout, or the memory backend with its journal and mirror); ``.for_owner(owner)``
keeps them as that owner's, out of every other owner's reach.

How a thread maps onto the app:

- **Thread**: one session of the owner, ``lgt_<thread_id>`` when the thread id is made of
  letters, digits, ``-`` and ``_`` (at most 124 of them), else ``lgh_<digest>``; a thread
  id is at most :data:`MAX_THREAD_ID` characters (``InvalidThreadId`` past that). Its keys
  expire with it (``ttl=`` seconds, else the app's session TTL and idle TTL), and
  deleting it, ``memory_sweep`` and forgetting the owner take every checkpoint with it.
- **Size**: every byte a thread stores (records, channel values, pending writes) counts
  toward ``MAX_SESSION_BYTES``; a put that would go over raises ``QuotaExceeded`` and
  stores nothing.
- **copy_thread** replaces the target thread whole: its checkpoints are then exactly the
  source's (none when the source has none), as LangGraph's server copies a thread.
- **Channel values** are stored once per version (LangGraph's ``new_versions``): a
  checkpoint whose channel did not change references the value an earlier one stored.
- **Each method is one round trip on Redis**, but ``list`` with a metadata ``filter``
  (a page per 100 checkpoints read), ``list(None)`` and ``delete_for_runs`` (a call per
  thread of the owner) and ``copy_thread`` (two: the threads may be on two servers).
- The async methods run the call in a worker thread on Redis, and inline on the memory
  backend (a call there takes microseconds and never waits for I/O).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    PendingWrite,
    get_checkpoint_id,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from persistent_memory.backends.checkpoints import SEP, StoredCheckpoint
from persistent_memory.checkpoints import THREAD_PREFIXES
from persistent_memory.exceptions import CheckpointBaseMissing, InvalidThreadId
from persistent_memory.integrations.langgraph_values import EMPTY, LATEST, Values
from persistent_memory.store import get_store
from persistent_memory.telemetry import instrument

if TYPE_CHECKING:
    from persistent_memory.store import MemoryStore

T = TypeVar("T")
_PLAIN = re.compile(r"[A-Za-z0-9_-]{1,124}")
#: Checkpoints read per call when ``list`` filters on metadata.
PAGE = 100
#: Longest thread id (characters): every record of a thread holds its id, and LangGraph's
#: are short (a UUID is 36), like the namespaces and checkpoint ids (checkpoints.MAX_NAME).
MAX_THREAD_ID = 512


def thread_session(thread_id: Any) -> str:
    """The session id that holds a thread's checkpoints (``InvalidThreadId`` for a thread
    id over :data:`MAX_THREAD_ID` characters)."""
    text = str(thread_id)
    if len(text) > MAX_THREAD_ID:
        raise InvalidThreadId(f"A thread id is at most {MAX_THREAD_ID} characters, not {len(text)}.")
    if _PLAIN.fullmatch(text):
        return THREAD_PREFIXES[0] + text
    return THREAD_PREFIXES[1] + hashlib.sha256(text.encode()).hexdigest()[:48]


#: The channel LangGraph's ``MessagesState`` and ``add_messages`` keep the chat in; any
#: other channel holding chat messages is read when a graph has none of this name.
MESSAGES_CHANNEL = "messages"


def chat_messages(values: dict[str, Any]) -> tuple[str, list[dict[str, Any]]] | None:
    """The chat in a checkpoint's channel values: the channel (``messages`` first, else the
    first by name whose value is a non-empty list of LangChain messages) and its messages
    in the OpenAI chat format the conversations keep (tool calls as ``tool_calls``,
    results as ``tool`` messages), each with its ``id`` (``#<n>`` when it has none).
    None: no channel holds chat messages."""
    from langchain_core.messages import BaseMessage, convert_to_openai_messages

    def is_chat(value: Any) -> bool:
        return (
            isinstance(value, list) and bool(value) and all(isinstance(item, BaseMessage) for item in value)
        )

    names = [MESSAGES_CHANNEL, *sorted(name for name in values if name != MESSAGES_CHANNEL)]
    channel = next((name for name in names if is_chat(values.get(name))), None)
    if channel is None:
        return None
    chats = convert_to_openai_messages(values[channel])
    return channel, [
        {
            **chat,
            "id": message.id or f"#{number}",
            "role": "system" if chat["role"] == "developer" else chat["role"],
        }
        for number, (message, chat) in enumerate(zip(values[channel], chats, strict=True), 1)
    ]


def _writes_order(item: list[Any]) -> tuple[str, str, int]:
    task_id, idx, _, _, task_path = item
    return task_path, task_id, idx  # LangGraph's own order (writes_sort_key's)


@instrument
class PersistentMemorySaver(BaseCheckpointSaver[int]):
    """A LangGraph checkpointer over ``store`` (None: ``get_store()``, the unowned
    namespace); see the module's docstring."""

    def __init__(
        self,
        *,
        store: MemoryStore | None = None,
        ttl: float | None = None,
        serde: SerializerProtocol | None = None,
    ) -> None:
        super().__init__(serde=serde)
        self._store = store
        self.ttl = ttl
        self._values = Values(self._dump, self._load)

    @classmethod
    def for_owner(cls, owner: str, **options: Any) -> PersistentMemorySaver:
        """A checkpointer whose threads are ``owner``'s ("" is the unowned namespace)."""
        store = options.pop("store", None) or get_store()
        return cls(store=store.for_owner(owner), **options)

    @property
    def store(self) -> MemoryStore:
        return self._store if self._store is not None else get_store()

    # Encoding -------------------------------------------------------------------

    def _dump(self, value: Any) -> str:
        kind, data = self.serde.dumps_typed(value)
        return f"{kind}:{base64.b64encode(data).decode()}"

    def _load(self, text: str) -> Any:
        kind, _, data = text.partition(":")
        return self.serde.loads_typed((kind, base64.b64decode(data)))

    def checkpoint_tuple(self, thread_id: Any, stored: StoredCheckpoint, session: str) -> CheckpointTuple:
        """A stored checkpoint of thread session ``session`` as LangGraph reads it
        (``thread_id`` None: the record's)."""
        record = json.loads(stored.record)
        if thread_id is None:
            thread_id = record["t"]
        checkpoint = self._load(record["c"])
        store, ns = self.store, stored.ns
        values = {}
        for ref, text in stored.blobs.items():
            channel = ref.partition(SEP)[0]
            value, present = self._values.decode(
                (store.owner, session, ns, channel),
                ref,
                text,
                lambda base: store.checkpoint_chain(session, ns, base),
            )
            if present:
                values[channel] = value
        writes: list[PendingWrite] = []
        if stored.writes:
            for task_id, _, channel, value, _ in sorted(json.loads(stored.writes), key=_writes_order):
                writes.append((task_id, channel, self._load(value)))
        parent = record["p"]
        configurable = {"thread_id": thread_id, "checkpoint_ns": stored.ns}
        return CheckpointTuple(
            config={"configurable": {**configurable, "checkpoint_id": stored.checkpoint_id}},
            checkpoint={**checkpoint, "channel_values": values},
            metadata=self._load(record["m"]),
            parent_config={"configurable": {**configurable, "checkpoint_id": parent}} if parent else None,
            pending_writes=writes,
        )

    # The checkpointer -------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        configurable = config["configurable"]
        thread_id = configurable["thread_id"]
        session = thread_session(thread_id)
        stored = self.store.get_checkpoint(
            session, configurable.get("checkpoint_ns", ""), get_checkpoint_id(config)
        )
        return None if stored is None else self.checkpoint_tuple(thread_id, stored, session)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        store = self.store
        if config is None:
            threads = [(None, session) for session in self._thread_sessions()]
            ns, wanted = None, None
        else:
            thread_id = config["configurable"]["thread_id"]
            threads = [(thread_id, thread_session(thread_id))]
            ns, wanted = config["configurable"].get("checkpoint_ns"), get_checkpoint_id(config)
        before_id = get_checkpoint_id(before) if before else None
        left = limit
        for thread_id, session in threads:
            if wanted is not None:
                stored = store.get_checkpoint(session, ns or "", wanted)
                found = [] if stored is None or (before_id and wanted >= before_id) else [stored]
                pages: Iterator[list[StoredCheckpoint]] = iter([found])
            else:
                size = PAGE if filter or left is None else left
                pages = self._pages(session, ns, before_id, size)
            for page in pages:
                for stored in page:
                    item = self.checkpoint_tuple(thread_id, stored, session)
                    if filter and any(item.metadata.get(key) != value for key, value in filter.items()):
                        continue
                    if left is not None and left <= 0:
                        return
                    if left is not None:
                        left -= 1
                    yield item

    def _pages(
        self, session: str, ns: str | None, before: str | None, size: int
    ) -> Iterator[list[StoredCheckpoint]]:
        offset = 0
        while True:
            page = self.store.list_checkpoints(session, ns, before=before, offset=offset, limit=size)
            yield page
            if len(page) < size:
                return
            offset += size

    def _thread_sessions(self) -> list[str]:
        store = self.store
        return [info["session_id"] for prefix in THREAD_PREFIXES for info in store.list_session_infos(prefix)]

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        configurable = config["configurable"]
        thread_id, ns = configurable["thread_id"], configurable.get("checkpoint_ns", "")
        session = thread_session(thread_id)
        saved = checkpoint.copy()
        values = saved.pop("channel_values")  # type: ignore[misc]
        versions = {**saved["channel_versions"], **new_versions}
        meta = get_checkpoint_metadata(config, metadata)
        record = {
            "t": str(thread_id),
            "p": configurable.get("checkpoint_id"),
            "c": self._dump(saved),
            "m": self._dump(meta),
        }
        run_id = meta.get("run_id")
        store = self.store
        for attempt in (1, 2):
            blobs, kept = {}, {}
            for channel, version in new_versions.items():
                ref = f"{channel}{SEP}{version}"
                if channel not in values:
                    blobs[ref] = EMPTY
                    continue
                key = (store.owner, session, ns, channel)
                blobs[ref], kept[key] = self._values.encode(key, ref, values[channel])
            try:
                store.put_checkpoint(
                    session,
                    ns,
                    checkpoint["id"],
                    json.dumps(record),
                    run_id=str(run_id) if run_id else None,
                    refs=[f"{channel}{SEP}{version}" for channel, version in versions.items()],
                    blobs=blobs,
                    ttl_seconds=self.ttl,
                )
                break
            except CheckpointBaseMissing:
                # What this process saw of the thread is gone (deleted, another process's
                # fork): send every value whole.
                LATEST.forget((store.owner, session))
                if attempt == 2:
                    raise
        for key, latest in kept.items():
            if latest is not None:
                LATEST.put(key, latest)
        return {
            "configurable": {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint["id"]}
        }

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        configurable = config["configurable"]
        items = [
            (task_id, WRITES_IDX_MAP.get(channel, idx), channel, self._dump(value), task_path)
            for idx, (channel, value) in enumerate(writes)
        ]
        self.store.put_checkpoint_writes(
            thread_session(configurable["thread_id"]),
            configurable.get("checkpoint_ns", ""),
            configurable["checkpoint_id"],
            items,
            ttl_seconds=self.ttl,
        )

    def delete_thread(self, thread_id: str) -> None:
        store, session = self.store, thread_session(thread_id)
        LATEST.forget((store.owner, session))
        store.delete_checkpoints(session)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        runs = [str(run_id) for run_id in run_ids]
        if runs:
            for session in self._thread_sessions():
                self.store.delete_checkpoint_runs(session, runs)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Make the target thread a copy of the source: its own checkpoints are replaced
        whole, never mixed with the source's (LangGraph's server copies a thread so)."""
        store = self.store
        source, target = thread_session(source_thread_id), thread_session(target_thread_id)
        if source == target:
            return
        entries = store.checkpoint_entries(source)
        for name, text in entries.items():
            if name[0] == "c":  # the records name their thread
                entries[name] = json.dumps({**json.loads(text), "t": str(target_thread_id)})
        LATEST.forget((store.owner, target))  # what this process saw of the target is gone
        if entries:
            store.load_checkpoint_entries(target, entries, ttl_seconds=self.ttl, replace=True)
        else:  # the source has none: neither has the copy
            store.delete_checkpoints(target)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"Unknown prune strategy {strategy!r}: use keep_latest or delete.")
        for thread_id in thread_ids:
            if strategy == "delete":
                self.delete_thread(thread_id)
            else:
                self.store.prune_checkpoints(thread_session(thread_id))

    # Async: inline on the memory backend, a worker thread on Redis -------------------

    async def _async(self, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self.store.backend.name == "memory":
            return method(*args, **kwargs)
        return await asyncio.to_thread(method, *args, **kwargs)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self._async(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        items = await self._async(lambda: list(self.list(config, filter=filter, before=before, limit=limit)))
        for item in items:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await self._async(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await self._async(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await self._async(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self._async(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._async(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self._async(self.prune, thread_ids, strategy=strategy)
