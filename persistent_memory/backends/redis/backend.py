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
"""

from __future__ import annotations

import json
import logging
import math
import re
import sys
import time
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager, suppress
from typing import Any

import hiredis
import redis
from redis.cluster import RedisCluster
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    ReadOnlyError,
    RedisClusterException,
    TryAgainError,
)

from persistent_memory.backends.base import (
    AnswerRecord,
    BaseBackend,
    IdempotencyRecord,
    RunBinding,
    SessionInfo,
    SessionSnapshot,
    remaining_seconds,
    session_info,
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
from persistent_memory.backends.redis.functions import SOURCE, Library, missing, write_needed
from persistent_memory.backends.redis.layout import DIRTY, Layout, swept
from persistent_memory.backends.redis.queues import BucketQueues
from persistent_memory.backends.redis.topology import (
    build_client,
    build_replicas,
    cluster_pool,
    declared_keys,
    describe,
    replica_pool,
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
from persistent_memory.exceptions import (
    BackendUnavailable,
    CapacityExceeded,
    CheckpointBaseMissing,
    HeadMoved,
    IdempotencyKeyReused,
    KeyNotFound,
    MessageConflict,
    MessageNotFound,
    NotANumber,
    OrphanToolResult,
    PersistentMemoryError,
    QuotaExceeded,
    ReplicasBehind,
    RevisionConflict,
    SessionExists,
    SessionExpired,
    SessionNotFound,
)
from persistent_memory.owners import namespace_of
from persistent_memory.telemetry import instrument


def _bridged() -> Any:
    """:mod:`persistent_memory.integrations.redis_bridge` when this call runs in its bridge
    (an async caller's: see there), else None."""
    module = sys.modules.get("persistent_memory.integrations.redis_bridge")
    return module if module is not None and module.current() is not None else None


def _pack(connection: redis.Connection, command: tuple[Any, ...]) -> Any:
    """``command`` in the protocol, by hiredis directly when every argument is text: redis-py's
    packer first looks at each of a call's fifty arguments in Python, which was half the
    packing time (it takes the other types: numbers an operation passes)."""
    try:
        return [hiredis.pack_command(command)]  # a list: send_packed_command sends each item
    except TypeError:
        return connection.pack_command(*command)


def _pack_all(connection: redis.Connection, commands: list[tuple[Any, ...]]) -> Any:
    """:func:`_pack` of a pipeline, as one buffer (one send)."""
    try:
        return [b"".join([hiredis.pack_command(command) for command in commands])]
    except TypeError:
        return connection.pack_commands(commands)


def _execute(connection: redis.Connection, command: tuple[Any, ...]) -> Any:
    """``command``'s reply on ``connection``."""
    connection.send_command(*command)
    return connection.read_response()


logger = logging.getLogger(__name__)

#: Up to this many sessions, listing them is one script; beyond, batches (see redis.lua).
ONE_STEP_LIST_LIMIT = 2000


#: What the 'delete' script adds to its reply when keys of the session were not of their type.
_DAMAGED = "~damaged"


def _position(after: tuple[float, str] | None) -> tuple[str, str]:
    """ARGV of a page's start (see indexes.lua): a creation time as the text Redis parses
    back to the same double (``repr``), and an id; empty for the first page."""
    return ("", "") if after is None else (repr(after[0]), after[1])


def _page_order(info: Any) -> tuple[float, str]:
    """The listing's order, as the time index sorts it (score, then the id's bytes)."""
    return info["created_at"], info["session_id"]


def _scored(reply: list[Any]) -> list[tuple[bytes, Any]]:
    """The (member, score) pairs of a WITHSCORES reply: flat in RESP2, pairs in RESP3 (and
    from the cluster client, which parses it)."""
    if reply and isinstance(reply[0], list | tuple):
        return [(pair[0], pair[1]) for pair in reply]
    return list(zip(reply[::2], reply[1::2], strict=True))


def _log_damaged(count: int) -> None:
    logger.warning("A listing skipped %d session(s) whose Redis keys are not of their type.", count)


class _TooMany(Exception):
    """redis.lua declined to list every session in one step."""


class _RoomCheck(Exception):
    """The cluster layout: a call would create an owned session under a cap, and the owner's
    sessions in the other buckets have not been counted (see ``owner_has_room``)."""


# Reply prefixes of redis.lua's errors.
_SCRIPT_ERRORS: dict[str, type[PersistentMemoryError]] = {
    "PM_NOT_FOUND": SessionNotFound,
    "PM_EXPIRED": SessionExpired,
    "PM_EXISTS": SessionExists,
    "PM_KEY_NOT_FOUND": KeyNotFound,
    "PM_NOT_A_NUMBER": NotANumber,
    "PM_QUOTA": QuotaExceeded,
    "PM_IDEMPOTENCY_REUSED": IdempotencyKeyReused,
    "PM_MESSAGE_NOT_FOUND": MessageNotFound,
    "PM_MESSAGE_CONFLICT": MessageConflict,
    "PM_HEAD_MOVED": HeadMoved,
    "PM_REVISION_CONFLICT": RevisionConflict,
    "PM_CHECKPOINT_BASE": CheckpointBaseMissing,
    "PM_ORPHAN_TOOL_RESULT": OrphanToolResult,
}

#: ARGV 14-16 of a call without an idempotency key (see redis.lua).
_NO_IDEMPOTENCY = ("", "", "0")

#: A run pointer's compare-and-delete (the sweep's): the key is declared.
_DELETE_IF_UNCHANGED = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
)

#: The values the answer lane writes.
ANSWER_KEYS = ("last_answer", "answer_count")


#: Replies that say a cluster node did not run the command (it belongs elsewhere, or the
#: cluster is between states): sending it again through the cluster client, which follows
#: them, cannot apply a write twice.
_REDIRECTS = (MovedError, AskError, TryAgainError, ClusterDownError)


#: Errors a call recovers from before it gives up (see RedisBackend._recover): the library
#: missing, then a read that must write.
_RECOVERIES = 2

#: Redirects a write that waits for replicas follows by hand before it gives up (see
#: RedisBackend._resend); the cluster client's own limit is 16.
_REDIRECT_LIMIT = 5


#: What RedisBackend._packet_replies asks of its reader: the next reply, or to drop the connection.
_READ = object()
_DROP = object()
#: What _replica_read answers for a read the primary must serve.
_ON_PRIMARY = object()


def _online(role: list[Any]) -> int | None:
    """The replicas a primary's ROLE reply lists (those online, the ones WAIT counts), or
    None for a replica's."""
    kind = role[0].decode() if isinstance(role[0], bytes) else role[0]
    return len(role[2]) if kind == "master" else None


def _parse_ttl(raw: bytes | None) -> float | None:
    if raw is None or raw == b"None":
        return None
    text = raw.decode()
    return int(text) if text.lstrip("-").isdigit() else float(text)


def _seconds(ms: str) -> float | int | None:
    """Milliseconds as the script writes them ('' for none) in seconds."""
    if not ms:
        return None
    seconds = int(ms) / 1000
    return int(seconds) if seconds.is_integer() else seconds


def _glob_escape(text: str) -> str:
    """``text`` as a literal in a SCAN/SSCAN MATCH pattern."""
    return re.sub(r"([\\*?\[\]])", r"\\\1", text)


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
    (every method one call of the library, through :meth:`_run`) and ``queues`` (the
    bucket queues). The contract's methods that a part serves are delegated to it by name
    below.
    """

    name = "redis"

    conversations: RedisConversations
    summaries: RedisSummaries
    checkpoints: RedisCheckpoints
    queues: BucketQueues

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

    #: The sweep leaves a run pointer younger than this alone (see _sweep_pointers).
    POINTER_GRACE_SECONDS = 60.0

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
        #: Behind Sentinel with REDIS_READ_FROM_REPLICAS, the replicas' client (see _replica_read).
        self.replicas = replicas
        self.owns_client = owns_client
        self.key_prefix = key_prefix
        self.layout = Layout(key_prefix, cluster=layout == "cluster")
        self.on_cluster = isinstance(client, RedisCluster)
        if self.on_cluster:
            declared_keys(client)  # the calls it sends for us after a MOVED
        self.wait_replicas = wait_replicas
        self.wait_timeout_ms = wait_timeout_ms
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
        self._library = Library(SOURCE)  # loaded where a call finds it missing (see _recover)
        self._loops: Any = None  # redis_bridge.LoopClients, made by the first async call
        self._ask_role = True  # ROLE beside a write that waits for replicas (see _packet)
        self._replica_reads = (
            replicas is not None or getattr(client, "load_balancing_strategy", None) is not None
        )
        self.queues = BucketQueues(
            layout=self.layout, client=client, batch=self._batch, checked=self._checked, errors=self._errors
        )
        self.conversations = RedisConversations(run=self._run, run_pointer=self._run_pointer)
        self.summaries = RedisSummaries(
            run=self._run, queues=self.queues, batch=self._batch, checked=self._checked
        )
        self.checkpoints = RedisCheckpoints(run=self._run)

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

    def _error(self, exc: redis.RedisError) -> Exception:
        """The store's exception for a redis-py error."""
        if isinstance(exc, redis.ResponseError):
            message = str(exc)
            code, _, text = message.partition(" ")
            if code in _SCRIPT_ERRORS:
                return _SCRIPT_ERRORS[code](text)
            if code == "PM_TOO_MANY":
                return _TooMany()
            if code == "PM_ROOM_CHECK":
                return _RoomCheck()
            # redis-py raises OutOfMemoryError for "OOM ..." replies, without the code.
            if code == "OOM" or isinstance(exc, redis.exceptions.OutOfMemoryError):
                return CapacityExceeded(f"Redis at {self.describe()} is out of memory: {message}")
            return BackendUnavailable(f"Redis at {self.describe()} refused the operation: {message}")
        return BackendUnavailable(f"Redis at {self.describe()} is unavailable: {exc}")

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """Turn redis-py errors into the store's exceptions."""
        try:
            yield
        except RedisClusterException as exc:  # no node answers, or a slot is not covered
            self._refresh_slots()
            raise BackendUnavailable(f"Redis at {self.describe()} is unavailable: {exc}") from None
        except redis.RedisError as exc:
            if self.on_cluster and isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
                self._refresh_slots()
            raise self._error(exc) from None

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
        head = self._library.head(op, read_only=not self.refresh_on_read)
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
        if self._replica_reads and command[0] == "FCALL_RO":
            reply = self._replica_read(command)
            if reply is not _ON_PRIMARY:
                return reply
        wait = 0 if op in _READS else self.wait_replicas
        side = None
        try:
            pool = self._pool(command[3])
            connection = pool.get_connection()
            try:
                if aside is not None:
                    side = self._send(aside, wait)
                return self._exchange(connection, command, wait)
            except redis.ResponseError:
                raise  # whole replies were read: the connection is fine
            except BaseException:
                connection.disconnect()  # a reply may be left half read
                raise
            finally:
                pool.release(connection)
                if side is not None:
                    self._receive(aside, *side)
        except _REDIRECTS as redirect:
            return self._redirected(command, wait, redirect)
        except (redis.RedisError, RedisClusterException) as exc:
            with self._errors():
                raise exc

    def _replica_read(self, command: tuple[Any, ...]) -> Any:
        """A read (FCALL_RO) on a replica, with REDIS_READ_FROM_REPLICAS; _ON_PRIMARY when the
        primary must answer it (nothing was written: a read is safe to send again): the
        replica is unreachable, lacks the library (a replica cannot load it: the primary's
        load reaches it by replication), no longer serves the slot, or the read must write."""
        try:
            pool = replica_pool(self.client, self.replicas, command[3])
            if pool is None:
                return _ON_PRIMARY
            connection = pool.get_connection()
        except (redis.RedisError, RedisClusterException):
            return _ON_PRIMARY
        try:
            connection.send_packed_command(_pack(connection, command))
            return connection.read_response()
        except redis.ResponseError as exc:
            if missing(exc) or write_needed(exc) or isinstance(exc, (*_REDIRECTS, ReadOnlyError)):
                return _ON_PRIMARY
            with self._errors():
                raise exc from None
        except (redis.ConnectionError, redis.TimeoutError):
            connection.disconnect()
            return _ON_PRIMARY
        except BaseException:
            connection.disconnect()  # a reply may be left half read
            raise
        finally:
            pool.release(connection)

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
        wait = 0 if op in _READS else self.wait_replicas
        replica = self._replica_reads and op in _READ_ONLY and not self.refresh_on_read
        if client is None or aside is not None or (wait and self.on_cluster) or replica:
            options = {"idempotency": idempotency, "bound": bound, "elsewhere": elsewhere, "aside": aside}
            return bridge.blocking(lambda: self._call(op, session_id, *args, **options, **names))
        command = self._command(op, session_id, args, idempotency, bound, elsewhere, **names)
        try:
            return bridge.await_only(bridge.exchange(self, client, command, wait))
        except (redis.RedisError, RedisClusterException) as exc:
            with self._errors():
                raise exc from None

    def _send(
        self, command: tuple[Any, ...], wait: int
    ) -> tuple[redis.ConnectionPool, redis.Connection, list[tuple[Any, ...]]]:
        """Send a plain command (with its WAIT) on its key's primary; :meth:`_receive` reads."""
        pool = self._pool(command[1])
        connection = pool.get_connection()
        packet = self._packet(command, wait)
        try:
            connection.send_packed_command(connection.pack_commands(packet))
        except BaseException:
            connection.disconnect()
            pool.release(connection)
            raise
        return pool, connection, packet

    def _receive(
        self,
        command: tuple[Any, ...],
        pool: redis.ConnectionPool,
        connection: redis.Connection,
        packet: list[tuple[Any, ...]],
    ) -> None:
        """The replies of :meth:`_send`. The command is one that may run twice (the run
        pointer's SET): once the script beside it has been applied, a lost reply is not
        worth a 503, so it is sent again once, where the cluster now says its key lives."""
        try:
            self._read_packet(connection, packet)
            return
        except (*_REDIRECTS, redis.ConnectionError, redis.TimeoutError) as exc:
            connection.disconnect()
            redirect = exc if isinstance(exc, _REDIRECTS) else None
        finally:
            pool.release(connection)
        wait = packet[-1][1] if packet[-1][0] == "WAIT" else 0
        if redirect is None:
            self._refresh_slots()
        with self._errors():  # a redirect raised here is not the script's: it must not resend it
            self._resend(command, 1, wait, redirect)

    def _redirected(self, command: tuple[Any, ...], wait: int, redirect: redis.ResponseError) -> Any:
        """A command a cluster node did not run (the slot moved, or is moving): the cluster
        client sends it where it belongs (ASKING included) and learns the new slot map.
        With WAIT, the command is sent again by hand instead (:meth:`_resend`)."""
        with self._errors():
            if wait:
                return self._resend(command, 3, wait, redirect)
            return self._via_cluster_client(command)

    def _resend(
        self, command: tuple[Any, ...], key_at: int, wait: int, redirect: redis.ResponseError | None
    ) -> Any:
        """``command`` (its key at ``key_at``) sent again where ``redirect`` points, its WAIT
        in the same packet: WAIT counts the replicas that have the writes of its own
        connection, so it cannot follow on another one. MOVED (a failover, or a finished
        migration) patches the slot map, as the cluster client does; ASK is followed with
        ASKING; TRYAGAIN and CLUSTERDOWN mean nothing ran: the map is read again and the
        caller told to retry."""
        for _ in range(_REDIRECT_LIMIT):
            asking = isinstance(redirect, AskError)
            if isinstance(redirect, MovedError):
                self.client.nodes_manager.move_slot(redirect)
            elif redirect is not None and not asking:
                self._refresh_slots()
                raise redirect
            if asking:
                node = self.client.get_node(host=redirect.host, port=redirect.port)
                if node is None:  # a node the map does not know yet
                    self._refresh_slots()
                    raise redirect
                pool = self.client.get_redis_connection(node).connection_pool
            else:
                pool = self._pool(command[key_at])
            connection = pool.get_connection()
            try:
                return self._exchange(connection, command, wait, asking=asking)
            except _REDIRECTS as exc:
                redirect = exc
            except redis.ResponseError:
                raise  # whole replies were read: the connection is fine
            except BaseException:
                connection.disconnect()
                raise
            finally:
                pool.release(connection)
        self._refresh_slots()
        raise redirect

    def _via_cluster_client(self, command: tuple[Any, ...]) -> Any:
        for _ in range(_RECOVERIES):
            try:
                return self.client.execute_command(*command)
            except redis.ResponseError as exc:  # a node new to the slot lacks the library
                command = self._recover(exc, command)
        return self.client.execute_command(*command)

    def _recover(self, exc: redis.ResponseError, command: tuple[Any, ...], on: Any = None) -> tuple[Any, ...]:
        """The command to send once more after its error ``exc``, or ``exc`` raised: a read
        that must write, as a write; a call that found the library missing, the same once
        the library is loaded on ``on`` (the connection that answered), if given, and on
        every primary."""
        if write_needed(exc):
            return self._library.writing(command)
        if not missing(exc):
            raise exc
        if on is not None:
            self._load(lambda *load: _execute(on, load))
        if self.on_cluster or on is None:
            self._load_everywhere()
        return self._library.again(command)

    def _load_everywhere(self) -> None:
        """The library loaded on the server, or on every primary of a cluster (its map read
        again first: a failover or a new node is why a call found it missing)."""
        if not self.on_cluster:
            self._load(self.client.execute_command)
            return
        self._refresh_slots()
        for node in self.client.get_primaries():
            # One the map still lists but that is down (it failed over) has no call to serve.
            with suppress(redis.ConnectionError, redis.TimeoutError):
                self._load(self.client.get_redis_connection(node).execute_command)

    def _load(self, execute: Callable[..., Any]) -> None:
        """Load the library on the server ``execute`` sends to (see Library.loading)."""
        steps = self._library.loading()
        with suppress(StopIteration):
            load = next(steps)
            while True:
                try:
                    reply = execute(*load)
                except redis.ResponseError as exc:
                    reply = exc
                load = steps.send(reply)

    def _pool(self, key: str) -> redis.ConnectionPool:
        """The connection pool of the primary that serves ``key``."""
        if not self.on_cluster:
            return self.client.connection_pool
        return cluster_pool(self.client, key)

    def _refresh_slots(self) -> None:
        """After a lost connection: the cluster may have failed over; read its slots again."""
        if self.on_cluster:
            with suppress(redis.RedisError, RedisClusterException):  # the next call finds out
                self.client.nodes_manager.initialize()

    def _exchange(
        self, connection: redis.Connection, command: tuple[Any, ...], wait: int, *, asking: bool = False
    ) -> Any:
        for _ in range(_RECOVERIES):
            try:
                return self._exchange_once(connection, command, wait, asking)
            except redis.ResponseError as exc:  # a restarted or flushed server, or one new to the slot
                command = self._recover(exc, command, connection)
        return self._exchange_once(connection, command, wait, asking)

    def _exchange_once(
        self, connection: redis.Connection, command: tuple[Any, ...], wait: int, asking: bool
    ) -> Any:
        if not wait and not asking:
            connection.send_packed_command(_pack(connection, command))
            return connection.read_response()
        packet = self._packet(command, wait, asking=asking)
        connection.send_packed_command(connection.pack_commands(packet))
        return self._read_packet(connection, packet)

    def _packet(self, command: tuple[Any, ...], wait: int, *, asking: bool = False) -> list[tuple[Any, ...]]:
        """``command`` and what goes in its packet: ASKING before it when ``asking``; with
        ``wait``, WAIT after it, and ROLE first (the replicas connected to the primary: with
        fewer than ``wait``, WAIT would only wait out its timeout)."""
        packet = [("ASKING",), command] if asking else [command]
        if wait:
            packet.append(("WAIT", wait, self.wait_timeout_ms))
            if self._ask_role:
                packet.insert(0, ("ROLE",))
        return packet

    def _read_packet(self, connection: redis.Connection, packet: list[tuple[Any, ...]]) -> Any:
        """The replies of :meth:`_packet` on ``connection`` (see :meth:`_packet_replies`)."""
        steps = self._packet_replies(packet)
        try:
            step = next(steps)
            while True:
                if step is _DROP:
                    connection.disconnect()
                    step = steps.send(None)
                    continue
                try:
                    reply = connection.read_response()
                except redis.ResponseError as exc:
                    reply = exc
                step = steps.send(reply)
        except StopIteration as done:
            return done.value

    def _packet_replies(self, packet: list[tuple[Any, ...]]) -> Generator[object, Any, Any]:
        """What to do with the replies of :meth:`_packet`, for a sync or an async reader: it
        yields _READ for the next reply (an error is sent in as a value) or _DROP to drop the
        connection, and returns the command's reply. It raises the command's error, or
        ReplicasBehind when fewer replicas than WAIT asked for have the write. Every reply
        is read, or the connection dropped, before anything is raised, and the command's
        error wins over WAIT's (a demoted primary answers MOVED, then refuses WAIT: the
        MOVED is what the caller must follow)."""
        role = packet[0][0] == "ROLE"
        wait = packet[-1][1] if packet[-1][0] == "WAIT" else 0
        online = None
        if role:
            answer = yield _READ
            if isinstance(answer, redis.ResponseError):
                # An ACL without @admin, a managed service that renames ROLE: WAIT alone
                # decides from now on. A passing error (LOADING, BUSY) changes nothing.
                if isinstance(answer, redis.exceptions.NoPermissionError) or "unknown command" in str(answer):
                    self._ask_role = False
            else:
                online = _online(answer)
        reply: Any = None
        error: redis.ResponseError | None = None
        for _ in range(len(packet) - int(role) - int(bool(wait))):  # ASKING's and the command's
            reply = yield _READ
            if isinstance(reply, redis.ResponseError):
                error = reply
        if wait and online is not None and online < wait:
            # Its WAIT cannot be met: it would hold the connection for its whole timeout,
            # so the connection goes, and the WAIT with it.
            yield _DROP
            if error is not None:
                raise error
            self._check_replicas(online, connected=True)
        acknowledged = (yield _READ) if wait else None
        if error is not None:
            raise error
        if isinstance(acknowledged, redis.ResponseError):
            raise acknowledged
        if wait:
            self._check_replicas(acknowledged)
        return reply

    def _check_replicas(self, acknowledged: int, *, connected: bool = False) -> None:
        """ReplicasBehind unless ``acknowledged`` replicas are enough; ``connected``: the
        count is of the replicas connected to the primary, so WAIT was not waited for."""
        if acknowledged >= self.wait_replicas:
            return
        if connected:
            reached = (
                f"{acknowledged} of {self.wait_replicas} replicas (REDIS_WAIT_REPLICAS) are "
                "connected to the primary: the write was not waited for."
            )
        else:
            reached = (
                f"The write reached {acknowledged} of {self.wait_replicas} replicas within "
                f"{self.wait_timeout_ms} ms (REDIS_WAIT_REPLICAS)."
            )
        raise ReplicasBehind(f"{reached} It may be applied: retry it with the same Idempotency-Key.")

    def _batch(self, commands: list[tuple[Any, ...]], key_at: int = 1) -> list[Any]:
        """``commands`` pipelined to the primaries their keys (at ``key_at``) belong to, sent to
        all before any reply is read (one round trip in time), replies or errors in order.
        Not the cluster client's pipeline: it sends a command again after a timeout, and a
        write must never run twice."""
        bridge = _bridged()
        if bridge is not None:  # several primaries at once: in a worker thread
            return bridge.blocking(self._batch, commands, key_at)
        groups: dict[int, tuple[redis.ConnectionPool, list[int]]] = {}
        replies: list[Any] = [None] * len(commands)
        sent: list[tuple[redis.ConnectionPool, redis.Connection, list[int]]] = []
        with self._errors():
            for i, command in enumerate(commands):
                pool = self._pool(command[key_at])
                groups.setdefault(id(pool), (pool, []))[1].append(i)
            try:
                for pool, indexes in groups.values():
                    connection = pool.get_connection()
                    sent.append((pool, connection, indexes))
                    connection.send_packed_command(_pack_all(connection, [commands[i] for i in indexes]))
                for _, connection, indexes in sent:
                    for i in indexes:
                        try:
                            replies[i] = connection.read_response()
                        except redis.ResponseError as exc:  # that command's own error
                            replies[i] = exc
            except BaseException:
                for _, connection, _ in sent:
                    connection.disconnect()  # replies may be left unread
                raise
            finally:
                for pool, connection, _ in sent:
                    pool.release(connection)
        return replies

    def _checked(self, replies: list[Any]) -> list[Any]:
        """``replies`` of :meth:`_batch`, the first error raised as the store's."""
        for reply in replies:
            if isinstance(reply, Exception):
                raise self._error(reply) if isinstance(reply, redis.RedisError) else reply
        return replies

    def _run_many(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """Several FCALLs, one pipeline per primary; replies or errors. Those a server did
        not run (the library not loaded there, a read that must write) are sent again
        once; those whose slot moved, alone."""
        bridge = _bridged()
        if bridge is not None:
            return bridge.blocking(self._run_many, commands)
        commands = list(commands)
        replies = self._batch(commands, key_at=3)
        failed = [i for i, reply in enumerate(replies) if missing(reply) or write_needed(reply)]
        if failed:
            if any(missing(replies[i]) for i in failed):
                with self._errors():
                    self._load_everywhere()
            library = self._library
            again = [
                library.writing(commands[i]) if write_needed(replies[i]) else library.again(commands[i])
                for i in failed
            ]
            for i, command, reply in zip(failed, again, self._batch(again, key_at=3), strict=True):
                commands[i], replies[i] = command, reply
        return self._redirected_again(commands, replies)

    def _redirected_again(self, commands: list[tuple[Any, ...]], replies: list[Any]) -> list[Any]:
        """``replies`` of :meth:`_batch`, those a server did not run (the slot moved) replaced by
        the command's reply through the cluster client, which follows redirects."""
        for i, reply in enumerate(replies):
            if isinstance(reply, _REDIRECTS):
                with self._errors():
                    try:
                        replies[i] = self._via_cluster_client(commands[i])
                    except redis.ResponseError as exc:  # as the pipeline would give it
                        replies[i] = exc
        return replies

    def _each_root(self, op: str, *args: Any, namespace: str = "") -> list[Any]:
        """``op`` (on no one session) in every bucket of the layout; their replies, errors raised."""
        roots = self.layout.roots()
        if len(roots) == 1:
            return [self._run(op, "", *args, root=roots[0], namespace=namespace)]
        replies = self._run_many(
            [self._command(op, "", args, root=root, namespace=namespace) for root in roots]
        )
        for reply in replies:
            if isinstance(reply, redis.ResponseError):
                raise self._error(reply)
        return replies

    @staticmethod
    def _info(session_id: str, reply: list[Any]) -> SessionInfo:
        created_at, ttl, key_count, history_length, expire_ms, idle = reply[:6]
        if created_at is None:  # the meta expired between the script's commands
            raise SessionExpired(f"Session {session_id!r} has expired.")
        idle_ms, _, deadline_ms = idle.decode().partition(" ")
        return session_info(
            session_id,
            created_at=float(created_at),
            ttl_seconds=_parse_ttl(ttl),
            expires_at=expire_ms / 1000 if expire_ms >= 0 else None,
            key_count=key_count,
            history_length=history_length,
            idle_ttl_seconds=_seconds(idle_ms),
            deadline=_seconds(deadline_ms),
        )

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
        return self._info(session_id, reply)

    def resume_session(self, session_id: str) -> SessionInfo:
        return self._info(session_id, self._run("info", session_id))

    session_info = resume_session

    def list_sessions(self) -> list[str]:
        try:
            replies = self._each_root("list", "", str(ONE_STEP_LIST_LIMIT))
        except _TooMany:
            return sorted(info["session_id"] for info in self._scan_infos(""))
        return sorted(item.decode() for reply in replies for item in reply)

    def list_session_infos(self, prefix: str = "") -> list[SessionInfo]:
        try:
            replies = self._each_root(
                "list_info", prefix, str(ONE_STEP_LIST_LIMIT), namespace=namespace_of(prefix)
            )
        except _TooMany:
            return self._scan_infos(prefix)
        return [
            self._info(flat[i].decode(), flat[i + 1 : i + 7])
            for flat in replies
            for i in range(0, len(flat), 7)
        ]

    def _scan_infos(self, prefix: str) -> list[SessionInfo]:
        """Many sessions: SSCAN and one pipelined step per batch, so Redis is never held long."""
        infos: list[SessionInfo] = []
        cursor = 0
        while True:
            cursor, ids = self.scan_sessions(cursor, 500, prefix)
            wanted = [sid for sid in dict.fromkeys(ids) if sid.startswith(prefix)]
            infos.extend(self.infos(wanted).values())
            if cursor == 0:
                return list({info["session_id"]: info for info in infos}.values())

    def list_session_page(
        self, prefix: str, offset: int, limit: int, *, after: tuple[float, str] | None = None
    ) -> tuple[int, list[SessionInfo]]:
        namespace = namespace_of(prefix)
        roots = self.layout.roots()
        if len(roots) == 1:  # one index: the script seeks the page itself
            position = _position(after)
            reply = self._run(
                "page", "", prefix, str(offset), str(limit), *position, "", root=roots[0], namespace=namespace
            )
            if reply[1]:
                _log_damaged(reply[1])
            return self._page_of(reply, ids_only=False)
        if offset:
            # The cluster layout: where the page starts (an offset counts index positions,
            # as in the node layout), read as ids alone; then the page from there.
            passed = self._passed(prefix, offset, after)
            if len(passed) < offset:  # past the end: the count alone
                return self._merged(0, after, self._bucket_pages(prefix, ids_only=False))[0], []
            after = _page_order(passed[-1])
        return self._merged(limit, after, self._bucket_pages(prefix, ids_only=False))

    def _passed(self, prefix: str, offset: int, after: tuple[float, str] | None) -> list[Any]:
        """The first ``offset`` entries of the listing's indexes after ``after`` (ids and
        creation times). From the top without a search, plain rank ranges of the time
        indexes (a script costs several times their reading); else 'bucket_page'."""
        namespace = namespace_of(prefix)
        if after is not None or prefix != namespace:
            return self._merged(offset, after, self._bucket_pages(prefix, ids_only=True))[1]
        by_time = {root: self.layout.bucket_keys(root, namespace)[5] for root in self.layout.roots()}

        def read(asked: dict[str, tuple[Any, float, int]]) -> dict[str, Any]:
            ranges = {root: (start or 0, keep) for root, (start, _, keep) in asked.items()}
            commands = [
                ("ZREVRANGE", by_time[root], str(first), str(first + keep - 1), "WITHSCORES")
                for root, (first, keep) in ranges.items()
            ]
            replies = self._checked(self._redirected_again(commands, self._batch(commands)))
            answers = {}
            for (root, (first, keep)), reply in zip(ranges.items(), replies, strict=True):
                entries = [{"session_id": i.decode(), "created_at": float(t)} for i, t in _scored(reply)]
                more = (first + keep, _page_order(entries[-1])) if len(entries) == keep else None
                answers[root] = (0, 0, entries, more)  # the count of the page is its own
            return answers

        return self._merged(offset, None, read)[1]

    def _bucket_pages(self, prefix: str, *, ids_only: bool) -> Callable[[dict[str, Any]], dict[str, Any]]:
        """A reader for :meth:`_merged`: each bucket's 'bucket_page' (indexes.lua) from its
        position, the damaged sessions skipped logged."""
        namespace = namespace_of(prefix)

        def read(asked: dict[str, tuple[Any, float, int]]) -> dict[str, Any]:
            commands = [
                self._command(
                    "bucket_page",
                    "",
                    (prefix, repr(part), str(keep), *_position(start), "1" if ids_only else ""),
                    root=root,
                    namespace=namespace,
                )
                for root, (start, part, keep) in asked.items()
            ]
            replies = self._checked(self._run_many(commands))
            damaged = sum(reply[1] for reply in replies)
            if damaged:
                _log_damaged(damaged)
            answers = {}
            for root, reply in zip(asked, replies, strict=True):
                count, infos = self._page_of(reply, ids_only=ids_only, first=5)
                last = (float(reply[3]), reply[4].decode()) if reply[4] else None
                answers[root] = (count, reply[1] + reply[2], infos, last and (last, last))
            return answers

        return read

    def _merged(
        self, want: int, after: tuple[float, str] | None, read: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> tuple[int, list[Any]]:
        """The ``want`` first sessions (or entries) after ``after`` over every bucket, and
        the count (of a ``read`` of index ranges: how far they reached).

        Each bucket is asked for its part of the page, twice its even part (the ids of a
        namespace are spread evenly over the buckets by a hash), and for at most two
        sessions more; ``read`` answers, for each bucket asked, its count, how many of it
        it found gone or damaged, what it found and, unless it holds nothing more, where
        to read on and the position (time, id) of the last id it examined. A bucket whose
        position would still be on the merged page may hold more of it, and is asked
        again from there for twice as much, until none can: a bucket reads about ``want``
        ids (of a search's matches) at most, and a page usually needs one round trip.
        """
        roots = self.layout.roots()
        found: dict[str, list[Any]] = {root: [] for root in roots}
        counts: dict[str, int] = {}
        parts = dict.fromkeys(roots, 2 * want / len(roots))
        pending: dict[str, Any] = dict.fromkeys(roots, after)
        while pending:
            answers = read(
                {
                    root: (start, parts[root], min(want, math.ceil(parts[root]) + 2))
                    for root, start in pending.items()
                }
            )
            reached = {}
            for root, (count, dropped, entries, more) in answers.items():
                # a bucket asked again counts on from its first count
                counts[root] = counts.get(root, count) - dropped
                found[root].extend(entries)
                if more is not None:
                    reached[root] = more
            merged = sorted(
                (entry for entries in found.values() for entry in entries), key=_page_order, reverse=True
            )[:want]
            end = _page_order(merged[-1]) if len(merged) == want and want else None
            pending = {}
            for root, (start, last) in reached.items():
                if end is None or last > end:
                    pending[root] = start
                    parts[root] = min(want, parts[root] * 2)
        return sum(counts.values()), merged

    def _page_of(self, reply: list[Any], *, ids_only: bool, first: int = 2) -> tuple[int, list[SessionInfo]]:
        """The count and the sessions of a 'page' reply (of a 'bucket_page' reply: its
        sessions start at ``first``); ``ids_only``: each one's id and creation time alone."""
        step = 2 if ids_only else 7
        infos: list[Any] = []
        for i in range(first, len(reply), step):
            session_id = reply[i].decode()
            if ids_only:
                infos.append({"session_id": session_id, "created_at": float(reply[i + 1])})
            else:
                infos.append(self._info(session_id, reply[i + 1 : i + 7]))
        return reply[0], infos

    def delete_session(self, session_id: str, *, idempotency: IdempotencyRecord | None = None) -> list[str]:
        cleared = sorted(item.decode() for item in self._run("delete", session_id, idempotency=idempotency))
        if _DAMAGED in cleared:
            # Keys of the session that were written over by hand named others, which only a
            # scan of its keys finds now (a rare repair, not a request's usual path).
            cleared.remove(_DAMAGED)
            root = self.layout.root_of(session_id)
            removed = self._unlink_matching([f"{_glob_escape(f'{root}:{session_id}:')}*"])
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
        values = self._checked(self._batch([("GET", self.layout.value_key(sid, key)) for sid in session_ids]))
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
            with self._errors():
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
                "info": self._info(session_id, info),
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

    # Maintenance in batches -------------------------------------------------

    def _session_sets(self, root: str, prefix: str) -> list[str]:
        """The sets ``prefix`` selects in the bucket ``root`` (the rule of redis.lua's
        ``sets_for``); an owner's is a sorted set."""
        namespace = namespace_of(prefix)
        if namespace:
            return [f"{root}:{namespace}:sessions"]
        node = f"{root}:__sessions__"
        return [node] if prefix else [node, f"{root}:~owned"]

    def scan_sessions(self, cursor: int, count: int, prefix: str = "") -> tuple[int, list[str]]:
        bridge = _bridged()
        if bridge is not None:
            return bridge.blocking(self.scan_sessions, cursor, count, prefix)
        # One cursor over every bucket and up to two sets in each: cursor = (position * 2
        # + set) * buckets + bucket, position being the set's SSCAN (ZSCAN) cursor.
        roots = self.layout.roots()
        cursor, bucket = divmod(cursor, len(roots))
        sets = self._session_sets(roots[bucket], prefix)
        phase, position = cursor % 2, cursor // 2
        owner_set = bool(namespace_of(prefix))
        following, ids = self._scan_set(sets[phase], position, count, prefix, sorted_set=owner_set)
        if following:
            following = following * 2 + phase
        elif phase + 1 < len(sets):
            following = 1  # the next set, from its start
        elif bucket + 1 < len(roots):
            return bucket + 1, ids  # the next bucket, from its start
        else:
            return 0, ids
        return following * len(roots) + bucket, ids

    def _scan_set(
        self, key: str, cursor: int, count: int, prefix: str, *, sorted_set: bool
    ) -> tuple[int, list[str]]:
        """One SSCAN (or ZSCAN) step of ``key``, ids starting with ``prefix``."""
        match = _glob_escape(prefix) + "*" if prefix else None
        with self._errors():
            if sorted_set:
                following, pairs = self.client.zscan(key, cursor, match=match, count=count)
                return following, [member.decode() for member, _ in pairs]
            following, ids = self.client.sscan(key, cursor, match=match, count=count)
        return following, [item.decode() for item in ids]

    def existing(self, session_ids: list[str]) -> set[str]:
        found = self._checked(
            self._batch([("EXISTS", self.layout.session_keys(sid)[0]) for sid in session_ids])
        )
        return {sid for sid, exists in zip(session_ids, found, strict=True) if exists}

    def _pipelined(self, op: str, session_ids: list[str], *args: Any) -> dict[str, Any]:
        """Run ``op`` for each session in one round trip per primary; sessions gone meanwhile
        are left out."""
        replies = self._run_many([self._command(op, session_id, args) for session_id in session_ids])
        result: dict[str, Any] = {}
        for session_id, reply in zip(session_ids, replies, strict=True):
            if isinstance(reply, redis.ResponseError):
                if str(reply).startswith(("PM_NOT_FOUND", "PM_EXPIRED")):
                    continue
                raise self._error(reply)
            result[session_id] = reply
        return result

    def infos(self, session_ids: list[str]) -> dict[str, SessionInfo]:
        return {sid: self._info(sid, reply) for sid, reply in self._pipelined("info", session_ids).items()}

    def summarize_many(self, session_ids: list[str], max_entries: int) -> dict[str, int]:
        return self._pipelined("summarize", session_ids, str(max_entries))

    def _unlink_matching(self, patterns: list[str], batch_size: int = 500) -> int:
        """UNLINK every key matching ``patterns`` (SCAN on every primary, never KEYS; the
        cluster client splits a batch by slot)."""
        deleted = 0
        with self._errors():
            for pattern in patterns:
                batch: list[bytes] = []
                for key in self.client.scan_iter(match=pattern, count=batch_size):
                    batch.append(key)
                    if len(batch) >= batch_size:
                        deleted += self.client.unlink(*batch)
                        batch = []
                if batch:
                    deleted += self.client.unlink(*batch)
        return deleted

    def _key_patterns(self, below: str) -> list[str]:
        """SCAN patterns of this deployment's keys whose name below the root starts with
        ``below`` (a literal): one for the node layout, one for every bucket otherwise."""
        literal = _glob_escape(below) + "*"
        if not self.layout.cluster:
            return [_glob_escape(f"{self.key_prefix}:") + literal]
        return [_glob_escape(f"{self.key_prefix}:") + "{*}:" + literal]

    def forget_namespace(self, namespace: str) -> int:
        # Every per-owner key that is no session's starts with "{namespace}:" below its root
        # (a session id never starts with ':'); in the cluster layout, run pointers too.
        patterns = self._key_patterns(f"{namespace}:")
        if self.layout.cluster:
            patterns.append(_glob_escape(f"{self.key_prefix}:{namespace}:") + "*")
        return self._unlink_matching(patterns)

    def sweep(self, *, dry_run: bool, batch_size: int, prefix: str = "") -> dict[str, int]:
        dry = "1" if dry_run else "0"
        counts = {"expired_sessions": 0, "leftover_keys": 0, "run_bindings": 0}
        namespace = namespace_of(prefix)
        # Ids in the sessions sets (and the unowned listing) whose meta has expired: one SSCAN
        # (ZSCAN) step, then a script that checks and removes those ids, their metas and
        # listings declared, in every bucket.
        places = [6] if namespace else [8] if prefix else [8, 9]
        if not namespace:
            places.append(6)  # the unowned listing: ids the node's set no longer holds
        for root in self.layout.roots():
            for place in places:
                key = self.layout.keys("", root=root, namespace=namespace)[place - 1]
                cursor = 0
                while True:
                    cursor, ids = self._scan_set(key, cursor, batch_size, prefix, sorted_set=place == 6)
                    if ids:
                        declared = self.layout.index_keys(root, ids)
                        options = {"root": root, "namespace": namespace, "extra": declared}
                        counts["expired_sessions"] += self._run(
                            "sweep_ids", "", dry, str(place), *ids, **options
                        )
                    if not cursor:
                        break
        # Every key under the prefix, never KEYS: SCAN in batches, grouped by bucket.
        with self._errors():
            for pattern in self._key_patterns(prefix):
                batches: dict[str, list[str]] = {}
                for raw in self.client.scan_iter(match=pattern, count=batch_size):
                    key = raw.decode()
                    root = self._root_of_key(key)
                    batch = batches.setdefault(root, [])
                    batch.append(key)
                    if len(batch) >= batch_size:
                        self._sweep_keys(root, batches.pop(root), dry, counts)
                for root, batch in batches.items():
                    self._sweep_keys(root, batch, dry, counts)
            if self.layout.cluster:
                self._sweep_pointers(prefix, dry_run, batch_size, counts)
        return counts

    def _sweep_pointers(self, prefix: str, dry_run: bool, batch_size: int, counts: dict[str, int]) -> None:
        """The cluster layout's run pointers (outside the buckets) whose binding in their
        session's bucket has gone: each deleted only if it still holds what was checked, and
        only once POINTER_GRACE_SECONDS old (its binding is set by a script sent beside it)."""
        namespace = namespace_of(prefix)
        patterns = [
            _glob_escape(f"{self.key_prefix}:{namespace}:run:" if namespace else f"{self.key_prefix}:~run:")
        ]
        if not prefix:
            patterns.append(_glob_escape(f"{self.key_prefix}:~o:") + "*~:run:")
        settled = time.time_ns() - int(self.POINTER_GRACE_SECONDS * 10**9)
        for pattern in patterns:
            with self._errors():
                keys = [raw.decode() for raw in self.client.scan_iter(match=pattern + "*", count=batch_size)]
            for first in range(0, len(keys), batch_size):
                batch = keys[first : first + batch_size]
                values = self._checked(self._batch([("GET", key) for key in batch]))
                pointers = []
                for key, raw in zip(batch, values, strict=True):
                    session, _, set_at = (raw or b"").decode().partition(" ")
                    if raw and session.startswith(prefix) and int(set_at or 0) < settled:
                        binding = f"{self.layout.root_of(session)}:{key[len(self.key_prefix) + 1 :]}"
                        pointers.append((key, raw, binding))
                bound = self._checked(self._batch([("EXISTS", binding) for _, _, binding in pointers]))
                stale = [(key, raw) for (key, raw, _), held in zip(pointers, bound, strict=True) if not held]
                counts["run_bindings"] += len(stale)
                if stale and not dry_run:
                    self._checked(
                        self._batch([("EVAL", _DELETE_IF_UNCHANGED, 1, k, v) for k, v in stale], key_at=3)
                    )

    def _root_of_key(self, key: str) -> str:
        if not self.layout.cluster:
            return self.key_prefix
        return key[: key.index("}", len(self.key_prefix)) + 1]

    def _sweep_keys(self, root: str, keys: list[str], dry: str, counts: dict[str, int]) -> None:
        if keys:
            # Each key's kind, and its session's meta declared after the keys.
            parsed = [swept(key[len(root) + 1 :]) for key in keys]
            placeholder = self.layout.keys("", root=root)[7]
            metas = [f"{root}:{sid}:__meta__" if sid else placeholder for _, sid in parsed]
            kinds = [kind for kind, _ in parsed]
            declared = [*keys, *metas]
            leftovers, runs = self._run(
                "sweep_keys", "", dry, str(len(keys)), *kinds, root=root, extra=declared
            )
            counts["leftover_keys"] += leftovers
            counts["run_bindings"] += runs

    # The bucket queues: the mirror's dirty set, the summarizers' marks ----------------

    def pop_dirty(self, count: int) -> list[str]:
        return [item.decode() for item in self.queues.pop(DIRTY, count)]

    def dirty_count(self) -> int:
        return self.queues.count(DIRTY)

    def mark_dirty(self, session_ids: list[str]) -> None:
        self.queues.add(DIRTY, [(sid, sid) for sid in session_ids])

    # Health -----------------------------------------------------------------

    def ping(self) -> None:
        with self._errors():
            self.client.ping()

    def close(self) -> None:
        # A connection borrowed from a django-redis cache belongs to that cache.
        if self.replicas is not None:
            self.replicas.close()
        if self.owns_client:
            self.client.close()
            if not self.on_cluster:
                self.client.connection_pool.disconnect()
