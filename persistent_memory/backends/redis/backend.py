"""The Redis backend: one round trip per operation, on one server, Sentinel or a cluster.

Every operation is one FCALL of the function library ``lua/redis.lua`` (with the files it
includes; :mod:`.functions` loads it, and falls back to EVALSHA of the same code on
Redis < 7), which keeps each write atomic with its history entry, TTL alignment and
summarization, and declares its keys (:mod:`.layout` names them). The node layout,
byte for byte the original node's (so either can read the other's data)::

    {prefix}:{session_id}:{key}         value as JSON text (counters: Redis integers)
    {prefix}:{session_id}:__keys__      set of the session's keys
    {prefix}:{session_id}:__history__   list of JSON history entries
    {prefix}:{session_id}:__meta__      hash: created_at, ttl_seconds
    {prefix}:__sessions__               set of session ids

Owned sessions use the same layout with their storage id (``~o:{owner}~{session_id}``,
see :mod:`persistent_memory.owners`) in place of the session id; all owned ids are in
``{prefix}:~owned``. The listing keeps each namespace's ids in two sorted sets, by
creation time and by name: ``{prefix}:~o:{owner}~:sessions`` and ``...:names`` for an
owner, ``{prefix}:~sessions`` and ``{prefix}:~names`` for the unowned namespace. A
session's run references are in ``{prefix}:{session_id}:~runs``.
Idempotency records (:mod:`persistent_memory.idempotency`) are ``{prefix}:~idem:{key}``
and ``{prefix}:~o:{owner}~:idem:{key}``, each expiring after its TTL.

The cluster layout is the same below a bucket's root, ``{prefix}:{<bucket tag>}``, in
place of the prefix (see :mod:`.layout`): what walks every session (listing, the
sweep, the mirror's and the summarizers' queues) reads every bucket.

The backend builds each call of the library and sends it through its transport
(:mod:`.transport`: pools, packets, redirects, batches, errors); the listing
(:mod:`.listing`) and the scans and sweeps (:mod:`.maintenance`) are parts it holds.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

import redis
from redis.cluster import RedisCluster
from redis.exceptions import RedisClusterException

from persistent_memory.backends.base import (
    AnswerRecord,
    BaseBackend,
    IdempotencyRecord,
    RunBinding,
    SessionInfo,
    SessionSnapshot,
    remaining_seconds,
)
from persistent_memory.backends.checkpoints import CheckpointBackend
from persistent_memory.backends.conversations import Answer, ConversationBackend, SummaryBackend
from persistent_memory.backends.parts import delegate
from persistent_memory.backends.redis.checkpoints import RedisCheckpoints, _entries
from persistent_memory.backends.redis.conversations import (
    RedisConversations,
    RedisSummaries,
    message_args,
    restore_blob,
    snapshot_conversations,
)
from persistent_memory.backends.redis.functions import READ_ONLY as _READ_ONLY
from persistent_memory.backends.redis.functions import READS as _READS
from persistent_memory.backends.redis.layout import DIRTY, Layout
from persistent_memory.backends.redis.listing import RedisListing, info_of
from persistent_memory.backends.redis.maintenance import RedisMaintenance, _glob_escape
from persistent_memory.backends.redis.queues import BucketQueues
from persistent_memory.backends.redis.topology import build_client, build_replicas, describe
from persistent_memory.backends.redis.transport import (
    _ON_PRIMARY,
    _REDIRECTS,
    RedisTransport,
    _bridged,
    _RoomCheck,
)
from persistent_memory.backends.redis.ttl import ttl_ms as _ttl_ms
from persistent_memory.backends.redis.ttl import ttl_text as _ttl_text
from persistent_memory.conf import (
    MemorySettings,
    mirror_mode,
    owner_session_cap,
    redis_layout,
    summarize_after_tokens,
)
from persistent_memory.owners import namespace_of
from persistent_memory.telemetry import instrument

logger = logging.getLogger(__name__)

#: What the 'delete' script adds to its reply when keys of the session were not of their type.
_DAMAGED = "~damaged"

#: ARGV 14-16 of a call without an idempotency key (see redis.lua).
_NO_IDEMPOTENCY = ("", "", "0")

#: The values the answer lane writes.
ANSWER_KEYS = ("last_answer", "answer_count")


def _idle_args(info: SessionInfo, remaining: float | None) -> str:
    """The restore op's idle TTL: "{idle ms} {ms left to the fixed deadline}" ('' for none).

    ``remaining``: the time left that the restore sets. A session whose fixed deadline is
    its expiry gets that same time left as its deadline, and one whose idle TTL ends first
    a deadline at least 2 ms later, so that ``expires_by`` reads the same on the copy (the
    deadline from ``created_at`` is off by the create call's latency)."""
    idle = info.get("idle_ttl_seconds")
    if not idle:
        return ""
    if info["ttl_seconds"] is None:
        return _ttl_ms(idle)
    expiry = _ttl_ms(remaining)
    if info["expires_by"] == "ttl":
        return f"{_ttl_ms(idle)} {expiry}"
    left = max(1, round((info["created_at"] + info["ttl_seconds"] - time.time()) * 1000))
    return f"{_ttl_ms(idle)} {max(left, int(expiry) + 2)}"


@instrument
class RedisBackend(ConversationBackend, SummaryBackend, CheckpointBackend, BaseBackend):
    """Sessions in Redis, shared by every process that points at the same server or cluster.

    Sessions and values are the backend's own; it holds its other parts, each made in
    ``__init__`` with the calls it needs: ``conversations``, ``summaries``, ``checkpoints``
    (every method one call of the library, through :meth:`_run`), ``queues`` (the bucket
    queues), ``listing`` (the listing of sessions) and ``maintenance`` (scans, sweeps,
    forgetting a namespace). The contract's methods that a part serves are delegated to it
    by name below. What carries a call to Redis and its reply back (pools, packets,
    redirects, batches, errors) is its ``transport``.
    """

    name = "redis"

    conversations: RedisConversations
    summaries: RedisSummaries
    checkpoints: RedisCheckpoints
    queues: BucketQueues
    listing: RedisListing
    maintenance: RedisMaintenance
    transport: RedisTransport

    # Sessions listed, served by ``listing``.
    list_sessions = delegate("listing", RedisListing.list_sessions)
    list_session_infos = delegate("listing", RedisListing.list_session_infos)
    list_session_page = delegate("listing", RedisListing.list_session_page)

    # Maintenance in batches, served by ``maintenance``.
    scan_sessions = delegate("maintenance", RedisMaintenance.scan_sessions)
    forget_namespace = delegate("maintenance", RedisMaintenance.forget_namespace)
    sweep = delegate("maintenance", RedisMaintenance.sweep)

    # ConversationBackend, served by ``conversations``.
    add_messages = delegate("conversations", RedisConversations.add_messages)
    get_messages = delegate("conversations", RedisConversations.get_messages)
    get_context = delegate("conversations", RedisConversations.get_context)
    list_conversations = delegate("conversations", RedisConversations.list_conversations)
    set_head = delegate("conversations", RedisConversations.set_head)
    clear_messages = delegate("conversations", RedisConversations.clear_messages)
    pop_message = delegate("conversations", RedisConversations.pop_message)
    write_thread = delegate("conversations", RedisConversations.write_thread)
    enrich_recording = delegate("conversations", RedisConversations.enrich_recording)

    # SummaryBackend, served by ``summaries``.
    pop_unsummarized = delegate("summaries", RedisSummaries.pop_unsummarized)
    mark_unsummarized = delegate("summaries", RedisSummaries.mark_unsummarized)
    unsummarized_count = delegate("summaries", RedisSummaries.unsummarized_count)
    summary_source = delegate("summaries", RedisSummaries.summary_source)
    commit_summary = delegate("summaries", RedisSummaries.commit_summary)
    summarizer_health = delegate("summaries", RedisSummaries.summarizer_health)
    set_summarizer_health = delegate("summaries", RedisSummaries.set_summarizer_health)

    # CheckpointBackend, served by ``checkpoints``.
    put_checkpoint = delegate("checkpoints", RedisCheckpoints.put_checkpoint)
    put_checkpoint_writes = delegate("checkpoints", RedisCheckpoints.put_checkpoint_writes)
    get_checkpoint = delegate("checkpoints", RedisCheckpoints.get_checkpoint)
    list_checkpoints = delegate("checkpoints", RedisCheckpoints.list_checkpoints)
    checkpoint_chain = delegate("checkpoints", RedisCheckpoints.checkpoint_chain)
    prune_checkpoints = delegate("checkpoints", RedisCheckpoints.prune_checkpoints)
    delete_checkpoint_runs = delegate("checkpoints", RedisCheckpoints.delete_checkpoint_runs)
    checkpoint_entries = delegate("checkpoints", RedisCheckpoints.checkpoint_entries)
    load_checkpoint_entries = delegate("checkpoints", RedisCheckpoints.load_checkpoint_entries)

    def __init__(
        self,
        *,
        client: redis.Redis | RedisCluster,
        key_prefix: str = "rr:memory",
        owns_client: bool = True,
        layout: str = "node",
        wait_replicas: int = 0,
        wait_timeout_ms: int = 1000,
        replicas: redis.Redis | None = None,
        **options: Any,
    ) -> None:
        super().__init__(**options)
        self.client = client
        self.replicas = replicas
        self.owns_client = owns_client
        self.key_prefix = key_prefix
        self.layout = Layout(key_prefix, cluster=layout == "cluster")
        self.on_cluster = isinstance(client, RedisCluster)
        self.transport = transport = RedisTransport(
            client, replicas=replicas, wait_replicas=wait_replicas, wait_timeout_ms=wait_timeout_ms
        )
        # ARGV 5-13 of every call (see redis.lua); 14-16 are the idempotency key's.
        self._policy = (
            str(self.max_history),
            "1" if self.auto_summarize else "0",
            "1" if self.track_dirty else "0",
            str(self.max_sessions_per_owner or 0),
            str(self.max_session_bytes or 0),
            str(self.max_messages),
            _ttl_ms(self.idle_ttl_seconds),
            "1" if self.refresh_on_read else "0",
            str(self.summarize_after_tokens or 0),
        )
        self._loops: Any = None  # redis_bridge.LoopClients, made by the first async call
        self.queues = BucketQueues(
            layout=self.layout,
            client=client,
            batch=transport.batch,
            checked=transport.checked,
            errors=transport.errors,
        )
        self.conversations = RedisConversations(run=self._run, run_pointer=self._run_pointer)
        self.summaries = RedisSummaries(
            run=self._run, queues=self.queues, batch=transport.batch, checked=transport.checked
        )
        self.checkpoints = RedisCheckpoints(run=self._run)
        self.maintenance = RedisMaintenance(
            layout=self.layout, client=client, transport=transport, run=self._run
        )
        self.listing = RedisListing(
            layout=self.layout,
            transport=transport,
            run=self._run,
            command=self._command,
            each_root=self._each_root,
            scan_sessions=self.maintenance.scan_sessions,
            infos=self.infos,
        )

    @classmethod
    def from_settings(cls, conf: MemorySettings) -> RedisBackend:
        return cls(
            client=build_client(conf),
            key_prefix=conf.KEY_PREFIX,
            layout=redis_layout(conf),
            wait_replicas=conf.REDIS_WAIT_REPLICAS,
            wait_timeout_ms=conf.REDIS_WAIT_TIMEOUT_MS,
            replicas=build_replicas(conf),
            max_history=conf.MAX_HISTORY,
            auto_summarize=conf.AUTO_SUMMARIZE,
            track_dirty=mirror_mode(conf) != "off",
            owns_client=not conf.REDIS_CACHE_ALIAS,
            max_sessions_per_owner=owner_session_cap(conf),
            max_session_bytes=conf.MAX_SESSION_BYTES,
            max_messages=conf.MAX_MESSAGES,
            idle_ttl_seconds=conf.SESSION_IDLE_TTL_SECONDS or None,
            refresh_on_read=conf.IDLE_TTL_REFRESH_ON_READ,
            summarize_after_tokens=summarize_after_tokens(conf),
        )

    def describe(self) -> str:
        """The server (or the cluster's primaries, or Sentinel's current master) in use,
        with no credentials."""
        return describe(self.client)

    def _command(
        self,
        op: str,
        session_id: str,
        args: tuple[Any, ...],
        idempotency: IdempotencyRecord | None = None,
        bound: bool = False,
        elsewhere: int | None = None,
        **names: Any,
    ) -> tuple[Any, ...]:
        """The FCALL of ``op``, its keys declared (``names``: see :meth:`Layout.keys`) and
        its ARGV as redis.lua reads them."""
        keys = self.layout.keys(session_id, idempotency=idempotency.ref if idempotency else None, **names)
        once = _NO_IDEMPOTENCY
        if idempotency is not None:
            once = ("1", idempotency.fingerprint, _ttl_ms(idempotency.ttl_seconds))
        policy = self._policy
        if self.layout.cluster and self.max_sessions_per_owner:
            cap = f"{self.max_sessions_per_owner}" + ("?" if elsewhere is None else f"+{elsewhere}")
            policy = (*policy[:3], cap, *policy[4:])
        argv = (op, "bound" if bound else "", session_id, repr(time.time()), *policy, *once, *args)
        head = self.transport.library.head(op, read_only=not self.refresh_on_read)
        return (*head, str(len(keys)), *keys, *argv)

    def _run(self, op: str, session_id: str, *args: Any, **options: Any) -> Any:
        """:meth:`_call`; in the cluster layout, a call that would create a session of an owner
        under a cap is sent again with the owner's sessions in the other buckets counted. The
        count is not reserved: creations in different buckets at the same moment can pass the
        cap together (by at most their number)."""
        try:
            return self._call(op, session_id, *args, **options)
        except _RoomCheck:
            return self._call(op, session_id, *args, elsewhere=self._owner_elsewhere(session_id), **options)

    def _owner_elsewhere(self, session_id: str) -> int:
        """The live sessions of ``session_id``'s owner in every bucket but its own."""
        namespace = namespace_of(session_id)
        own = self.layout.root_of(session_id)
        counts = self._each_root("owner_count", namespace=namespace)
        return sum(n for root, n in zip(self.layout.roots(), counts, strict=True) if root != own)

    def _call(
        self,
        op: str,
        session_id: str,
        *args: Any,
        idempotency: IdempotencyRecord | None = None,
        bound: bool = False,
        elsewhere: int | None = None,
        aside: tuple[Any, ...] | None = None,
        **names: Any,
    ) -> Any:
        """One FCALL of the library, its keys declared, on the primary of their slot.

        Sent on a pooled connection directly rather than through ``Redis.fcall``:
        the client's command wrapper (retries, which are off, and instrumentation)
        costs more on this hot path than the rest of the store's Python code. With
        REDIS_WAIT_REPLICAS, a write's ``WAIT`` goes in the same packet. A command
        ``aside`` (another slot's) is sent before the script's reply is read: both
        replies come back in one round trip.
        """
        bridge = _bridged()
        if bridge is not None:
            return self._call_bridged(
                bridge, op, session_id, args, idempotency, bound, elsewhere, aside, names
            )
        command = self._command(op, session_id, args, idempotency, bound, elsewhere, **names)
        transport = self.transport
        if transport.replica_reads and command[0] == "FCALL_RO":
            reply = transport.replica_read(command)
            if reply is not _ON_PRIMARY:
                return reply
        wait = 0 if op in _READS else transport.wait_replicas
        side = None
        try:
            pool = transport.pool(command[3])
            connection = pool.get_connection()
            try:
                if aside is not None:
                    side = transport.send(aside, wait)
                return transport.exchange(connection, command, wait)
            except redis.ResponseError:
                raise  # whole replies were read: the connection is fine
            except BaseException:
                connection.disconnect()  # a reply may be left half read
                raise
            finally:
                pool.release(connection)
                if side is not None:
                    transport.receive(aside, *side)
        except _REDIRECTS as redirect:
            return transport.redirected(command, wait, redirect)
        except (redis.RedisError, RedisClusterException) as exc:
            with transport.errors():
                raise exc

    def _call_bridged(
        self,
        bridge: Any,
        op: str,
        session_id: str,
        args: tuple[Any, ...],
        idempotency: IdempotencyRecord | None,
        bound: bool,
        elsewhere: int | None,
        aside: tuple[Any, ...] | None,
        names: dict[str, Any],
    ) -> Any:
        """:meth:`_call` for an async caller (see :mod:`persistent_memory.integrations.redis_bridge`):
        the script call is awaited on the caller's event loop; what the bridge does not send
        itself runs in a worker thread."""
        if self._loops is None:
            self._loops = bridge.LoopClients(self.client)
        made, client = self._loops.ready()
        if not made:
            client = bridge.await_only(self._loops.get())
        wait = 0 if op in _READS else self.transport.wait_replicas
        replica = self.transport.replica_reads and op in _READ_ONLY and not self.refresh_on_read
        if client is None or aside is not None or (wait and self.on_cluster) or replica:
            options = {"idempotency": idempotency, "bound": bound, "elsewhere": elsewhere, "aside": aside}
            return bridge.blocking(lambda: self._call(op, session_id, *args, **options, **names))
        command = self._command(op, session_id, args, idempotency, bound, elsewhere, **names)
        try:
            return bridge.await_only(bridge.exchange(self.transport, client, command, wait))
        except (redis.RedisError, RedisClusterException) as exc:
            with self.transport.errors():
                raise exc from None

    def _each_root(self, op: str, *args: Any, namespace: str = "") -> list[Any]:
        """``op`` (on no one session) in every bucket of the layout; their replies, errors raised."""
        roots = self.layout.roots()
        if len(roots) == 1:
            return [self._run(op, "", *args, root=roots[0], namespace=namespace)]
        replies = self.transport.run_many(
            [self._command(op, "", args, root=root, namespace=namespace) for root in roots]
        )
        for reply in replies:
            if isinstance(reply, redis.ResponseError):
                raise self.transport.error(reply)
        return replies

    @staticmethod
    def _pairs(flat: list[bytes]) -> dict[str, str]:
        return {flat[i].decode(): flat[i + 1].decode() for i in range(0, len(flat), 2)}

    # Sessions ---------------------------------------------------------------

    def create_session(
        self,
        session_id: str,
        ttl_seconds: float | None,
        *,
        idle_ttl_seconds: float | None = None,
        idempotency: IdempotencyRecord | None = None,
    ) -> SessionInfo:
        reply = self._run(
            "create",
            session_id,
            _ttl_text(ttl_seconds),
            _ttl_ms(ttl_seconds),
            _ttl_ms(idle_ttl_seconds),
            idempotency=idempotency,
        )
        return info_of(session_id, reply)

    def resume_session(self, session_id: str) -> SessionInfo:
        return info_of(session_id, self._run("info", session_id))

    session_info = resume_session

    def delete_session(self, session_id: str, *, idempotency: IdempotencyRecord | None = None) -> list[str]:
        cleared = sorted(item.decode() for item in self._run("delete", session_id, idempotency=idempotency))
        if _DAMAGED in cleared:
            # Keys of the session that were written over by hand named others, which only a
            # scan of its keys finds now (a rare repair, not a request's usual path).
            cleared.remove(_DAMAGED)
            root = self.layout.root_of(session_id)
            removed = self.maintenance.unlink_matching([f"{_glob_escape(f'{root}:{session_id}:')}*"])
            logger.warning(
                "Deleted session %r, whose keys were not of their type (%d more keys).", session_id, removed
            )
        return cleared

    # Values -----------------------------------------------------------------

    def put(
        self, session_id: str, key: str, value_json: str, *, idempotency: IdempotencyRecord | None = None
    ) -> None:
        self._run("put", session_id, key, value_json, idempotency=idempotency, key=key)

    def get(self, session_id: str, key: str) -> str:
        return self._run("get", session_id, key, key=key).decode()

    def get_all(self, session_id: str) -> str:
        return self._run("get_all", session_id).decode()

    def get_many(self, session_ids: list[str], key: str) -> dict[str, str]:
        # Plain GETs: a value key expires and goes with its session.
        gets = [("GET", self.layout.value_key(sid, key)) for sid in session_ids]
        values = self.transport.checked(self.transport.batch(gets))
        return {
            sid: value.decode() for sid, value in zip(session_ids, values, strict=True) if value is not None
        }

    def list_keys(self, session_id: str) -> list[str]:
        return sorted(item.decode() for item in self._run("keys", session_id))

    def increment(
        self, session_id: str, key: str, amount: int, *, idempotency: IdempotencyRecord | None = None
    ) -> int:
        return int(self._run("increment", session_id, key, str(amount), idempotency=idempotency, key=key))

    def clear(
        self, session_id: str, key: str | None, *, idempotency: IdempotencyRecord | None = None
    ) -> list[str]:
        reply = self._run("clear", session_id, key or "", idempotency=idempotency, key=key)
        return [item.decode() for item in reply]

    # History ----------------------------------------------------------------

    def get_history(self, session_id: str, limit: int) -> list[dict[str, Any]]:
        return [json.loads(raw) for raw in self._run("history", session_id, str(limit))]

    def summarize(
        self, session_id: str, max_entries: int, *, idempotency: IdempotencyRecord | None = None
    ) -> int:
        return self._run("summarize", session_id, str(max_entries), idempotency=idempotency)

    # Lanes ------------------------------------------------------------------

    def enrich(
        self,
        session_id: str,
        ttl_seconds: float | None,
        run: RunBinding | None = None,
        *,
        idempotency: IdempotencyRecord | None = None,
    ) -> str:
        run_args = (run.run_id, _ttl_ms(run.ttl_seconds)) if run else ("", "0")
        reply = self._run(
            "enrich",
            session_id,
            _ttl_text(ttl_seconds),
            _ttl_ms(ttl_seconds),
            *run_args,
            "",  # no question to record (enrich_recording)
            idempotency=idempotency,
            run=run.run_id if run else None,
            aside=self._run_pointer(session_id, run),
        )
        return reply.decode()

    def _run_pointer(self, session_id: str, run: RunBinding | None) -> tuple[Any, ...] | None:
        """The cluster layout's pointer from a run to its session (see :mod:`.layout`),
        set beside the script that binds the run in the session's bucket. The binding there
        is what counts: a pointer whose session failed to bind, or was deleted, leads nowhere
        (and the sweep removes it). Its value ends with when it was set, so that the sweep
        deletes only the pointer it checked, never one set again meanwhile."""
        if run and self.layout.cluster:
            value = f"{session_id} {time.time_ns()}"
            return ("SET", self.layout.run_pointer(run.run_id), value, "PX", _ttl_ms(run.ttl_seconds))
        return None

    def record_answer(
        self,
        session_id: str | None,
        answer_json: str,
        ttl_seconds: float | None,
        run_id: str | None = None,
        message: Answer | None = None,
        *,
        idempotency: IdempotencyRecord | None = None,
    ) -> AnswerRecord | None:
        recorded = ()
        if message is not None:
            recorded = (message.conversation, message.parent_id or "", *message_args([message.message]))
        bound = not session_id and bool(run_id) and self.layout.cluster
        if bound:
            # The one operation of two round trips: the run's pointer names its session.
            with self.transport.errors():
                pointer = self.client.get(self.layout.run_pointer(run_id))
            if pointer is None:
                return None
            session_id = pointer.decode().split(" ", 1)[0]
        conversation = message.conversation if message is not None and session_id else None
        # The two values an answer writes (unknown in the node layout without a session: the
        # script names them from the run's binding there).
        written = [self.layout.value_key(session_id, key) for key in ANSWER_KEYS] if session_id else []
        reply = self._run(
            "answer",
            session_id or "",
            _ttl_text(ttl_seconds),
            _ttl_ms(ttl_seconds),
            answer_json,
            run_id or "",
            *recorded,
            idempotency=idempotency,
            bound=bound,
            run=run_id,
            conversation=conversation,
            extra=written,
        )
        return AnswerRecord(reply[0].decode(), reply[1]) if reply else None

    # Whole sessions, for the mirror, export and import -----------------------

    def snapshots(
        self, session_ids: list[str], *, checkpoints: bool = False
    ) -> dict[str, SessionSnapshot | None]:
        replies = self._pipelined("snapshot", session_ids, "1" if checkpoints else "")
        result: dict[str, SessionSnapshot | None] = {}
        for session_id in session_ids:
            reply = replies.get(session_id)
            if not reply:  # 0 from the script: not live
                result[session_id] = None
                continue
            info, values, history, conversations, *entries = reply
            result[session_id] = {
                "info": info_of(session_id, info),
                "values": self._pairs(values),
                "history": [json.loads(raw) for raw in history],
                "conversations": snapshot_conversations(conversations),
            }
            if entries and entries[0]:
                result[session_id]["checkpoints"] = _entries(entries[0])
        return result

    def restore_session(self, snapshot: SessionSnapshot, *, replace: bool) -> None:
        # An idle TTL comes back with its fixed deadline, as time left (clocks may differ).
        info = snapshot["info"]
        remaining = remaining_seconds(info)
        values = snapshot["values"]
        conversations = snapshot.get("conversations") or {}
        sid = info["session_id"]
        declared = [self.layout.value_key(sid, key) for key in values]
        for name in conversations:
            declared.extend(self.layout.conversation_keys(sid, name))
        checkpoints = snapshot.get("checkpoints") or {}
        self._run(
            "restore",
            info["session_id"],
            "1" if replace else "0",
            repr(info["created_at"]),
            _ttl_text(info["ttl_seconds"]),
            _ttl_ms(remaining),
            restore_blob(conversations),
            _idle_args(info, remaining),
            json.dumps(checkpoints) if checkpoints else "",
            str(len(values)),
            *[part for key, value_json in values.items() for part in (key, value_json)],
            *[json.dumps(entry) for entry in snapshot["history"]],
            extra=declared,
        )

    # Maintenance in batches (the scans and the sweep are ``maintenance``'s) ----------

    def existing(self, session_ids: list[str]) -> set[str]:
        found = self.transport.checked(
            self.transport.batch([("EXISTS", self.layout.session_keys(sid)[0]) for sid in session_ids])
        )
        return {sid for sid, exists in zip(session_ids, found, strict=True) if exists}

    def _pipelined(self, op: str, session_ids: list[str], *args: Any) -> dict[str, Any]:
        """Run ``op`` for each session in one round trip per primary; sessions gone meanwhile
        are left out."""
        replies = self.transport.run_many([self._command(op, session_id, args) for session_id in session_ids])
        result: dict[str, Any] = {}
        for session_id, reply in zip(session_ids, replies, strict=True):
            if isinstance(reply, redis.ResponseError):
                if str(reply).startswith(("PM_NOT_FOUND", "PM_EXPIRED")):
                    continue
                raise self.transport.error(reply)
            result[session_id] = reply
        return result

    def infos(self, session_ids: list[str]) -> dict[str, SessionInfo]:
        return {sid: info_of(sid, reply) for sid, reply in self._pipelined("info", session_ids).items()}

    def summarize_many(self, session_ids: list[str], max_entries: int) -> dict[str, int]:
        return self._pipelined("summarize", session_ids, str(max_entries))

    # The bucket queues: the mirror's dirty set, the summarizers' marks ----------------

    def pop_dirty(self, count: int) -> list[str]:
        return [item.decode() for item in self.queues.pop(DIRTY, count)]

    def dirty_count(self) -> int:
        return self.queues.count(DIRTY)

    def mark_dirty(self, session_ids: list[str]) -> None:
        self.queues.add(DIRTY, [(sid, sid) for sid in session_ids])

    # Health -----------------------------------------------------------------

    def ping(self) -> None:
        with self.transport.errors():
            self.client.ping()

    def close(self) -> None:
        # A connection borrowed from a django-redis cache belongs to that cache.
        if self.replicas is not None:
            self.replicas.close()
        if self.owns_client:
            self.client.close()
            if not self.on_cluster:
                self.client.connection_pool.disconnect()
