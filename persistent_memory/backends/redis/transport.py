"""The Redis backend's transport: what carries a command to Redis and its reply back.

:class:`RedisTransport` holds the client (one server, Sentinel or a cluster; see
:mod:`.topology`), the replicas' client and the function library (:mod:`.functions`),
and knows the way there: the connection pool of the primary that serves a key, a
command packed and sent on a pooled connection with its ``WAIT`` in the same packet,
the cluster's redirects followed, a library found missing loaded again, commands to
several primaries pipelined at once, and redis-py's errors turned into the store's.
The backend builds each call of the library (its keys and ARGV) and sends it through
the transport it holds; its parts are given the transport's methods they need.
"""

from __future__ import annotations

import sys
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

from persistent_memory.backends.redis.functions import SOURCE, Library, missing, write_needed
from persistent_memory.backends.redis.topology import cluster_pool, declared_keys, describe, replica_pool
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

#: Replies that say a cluster node did not run the command (it belongs elsewhere, or the
#: cluster is between states): sending it again through the cluster client, which follows
#: them, cannot apply a write twice.
_REDIRECTS = (MovedError, AskError, TryAgainError, ClusterDownError)


#: Errors a call recovers from before it gives up (see RedisTransport._recover): the library
#: missing, then a read that must write.
_RECOVERIES = 2

#: Redirects a write that waits for replicas follows by hand before it gives up (see
#: RedisTransport._resend); the cluster client's own limit is 16.
_REDIRECT_LIMIT = 5


#: What RedisTransport.packet_replies asks of its reader: the next reply, or to drop the connection.
_READ = object()
_DROP = object()
#: What RedisTransport.replica_read answers for a read the primary must serve.
_ON_PRIMARY = object()


def _online(role: list[Any]) -> int | None:
    """The replicas a primary's ROLE reply lists (those online, the ones WAIT counts), or
    None for a replica's."""
    kind = role[0].decode() if isinstance(role[0], bytes) else role[0]
    return len(role[2]) if kind == "master" else None


@instrument
class RedisTransport:
    """The way to Redis of one backend: its client (and the replicas' client, with
    REDIS_READ_FROM_REPLICAS), the function library, and the primaries' connections.

    Each method is one step the backend (or a part) takes on the wire; none builds a call
    of the library (the backend does: see ``RedisBackend._command``).
    """

    def __init__(
        self,
        client: redis.Redis | RedisCluster,
        *,
        replicas: redis.Redis | None = None,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 1000,
    ) -> None:
        self.client = client
        #: Behind Sentinel with REDIS_READ_FROM_REPLICAS, the replicas' client (see replica_read).
        self.replicas = replicas
        self.on_cluster = isinstance(client, RedisCluster)
        if self.on_cluster:
            declared_keys(client)  # the calls it sends for us after a MOVED
        self.wait_replicas = wait_replicas
        self.wait_timeout_ms = wait_timeout_ms
        self.library = Library(SOURCE)  # loaded where a call finds it missing (see _recover)
        self.ask_role = True  # ROLE beside a write that waits for replicas (see packet)
        #: Reads (FCALL_RO) go to a replica first (see replica_read).
        self.replica_reads = (
            replicas is not None or getattr(client, "load_balancing_strategy", None) is not None
        )

    def describe(self) -> str:
        """The server (or the cluster's primaries, or Sentinel's current master), with no
        credentials."""
        return describe(self.client)

    def error(self, exc: redis.RedisError) -> Exception:
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
    def errors(self) -> Iterator[None]:
        """Turn redis-py errors into the store's exceptions."""
        try:
            yield
        except RedisClusterException as exc:  # no node answers, or a slot is not covered
            self.refresh_slots()
            raise BackendUnavailable(f"Redis at {self.describe()} is unavailable: {exc}") from None
        except redis.RedisError as exc:
            if self.on_cluster and isinstance(exc, (redis.ConnectionError, redis.TimeoutError)):
                self.refresh_slots()
            raise self.error(exc) from None

    def replica_read(self, command: tuple[Any, ...]) -> Any:
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
            with self.errors():
                raise exc from None
        except (redis.ConnectionError, redis.TimeoutError):
            connection.disconnect()
            return _ON_PRIMARY
        except BaseException:
            connection.disconnect()  # a reply may be left half read
            raise
        finally:
            pool.release(connection)

    def send(
        self, command: tuple[Any, ...], wait: int
    ) -> tuple[redis.ConnectionPool, redis.Connection, list[tuple[Any, ...]]]:
        """Send a plain command (with its WAIT) on its key's primary; :meth:`receive` reads."""
        pool = self.pool(command[1])
        connection = pool.get_connection()
        packet = self.packet(command, wait)
        try:
            connection.send_packed_command(connection.pack_commands(packet))
        except BaseException:
            connection.disconnect()
            pool.release(connection)
            raise
        return pool, connection, packet

    def receive(
        self,
        command: tuple[Any, ...],
        pool: redis.ConnectionPool,
        connection: redis.Connection,
        packet: list[tuple[Any, ...]],
    ) -> None:
        """The replies of :meth:`send`. The command is one that may run twice (the run
        pointer's SET): once the script beside it has been applied, a lost reply is not
        worth a 503, so it is sent again once, where the cluster now says its key lives."""
        try:
            self.read_packet(connection, packet)
            return
        except (*_REDIRECTS, redis.ConnectionError, redis.TimeoutError) as exc:
            connection.disconnect()
            redirect = exc if isinstance(exc, _REDIRECTS) else None
        finally:
            pool.release(connection)
        wait = packet[-1][1] if packet[-1][0] == "WAIT" else 0
        if redirect is None:
            self.refresh_slots()
        with self.errors():  # a redirect raised here is not the script's: it must not resend it
            self._resend(command, 1, wait, redirect)

    def redirected(self, command: tuple[Any, ...], wait: int, redirect: redis.ResponseError) -> Any:
        """A command a cluster node did not run (the slot moved, or is moving): the cluster
        client sends it where it belongs (ASKING included) and learns the new slot map.
        With WAIT, the command is sent again by hand instead (:meth:`_resend`)."""
        with self.errors():
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
                self.refresh_slots()
                raise redirect
            if asking:
                node = self.client.get_node(host=redirect.host, port=redirect.port)
                if node is None:  # a node the map does not know yet
                    self.refresh_slots()
                    raise redirect
                pool = self.client.get_redis_connection(node).connection_pool
            else:
                pool = self.pool(command[key_at])
            connection = pool.get_connection()
            try:
                return self.exchange(connection, command, wait, asking=asking)
            except _REDIRECTS as exc:
                redirect = exc
            except redis.ResponseError:
                raise  # whole replies were read: the connection is fine
            except BaseException:
                connection.disconnect()
                raise
            finally:
                pool.release(connection)
        self.refresh_slots()
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
            return self.library.writing(command)
        if not missing(exc):
            raise exc
        if on is not None:
            self._load(lambda *load: _execute(on, load))
        if self.on_cluster or on is None:
            self.load_everywhere()
        return self.library.again(command)

    def load_everywhere(self) -> None:
        """The library loaded on the server, or on every primary of a cluster (its map read
        again first: a failover or a new node is why a call found it missing)."""
        if not self.on_cluster:
            self._load(self.client.execute_command)
            return
        self.refresh_slots()
        for node in self.client.get_primaries():
            # One the map still lists but that is down (it failed over) has no call to serve.
            with suppress(redis.ConnectionError, redis.TimeoutError):
                self._load(self.client.get_redis_connection(node).execute_command)

    def _load(self, execute: Callable[..., Any]) -> None:
        """Load the library on the server ``execute`` sends to (see Library.loading)."""
        steps = self.library.loading()
        with suppress(StopIteration):
            load = next(steps)
            while True:
                try:
                    reply = execute(*load)
                except redis.ResponseError as exc:
                    reply = exc
                load = steps.send(reply)

    def pool(self, key: str) -> redis.ConnectionPool:
        """The connection pool of the primary that serves ``key``."""
        if not self.on_cluster:
            return self.client.connection_pool
        return cluster_pool(self.client, key)

    def refresh_slots(self) -> None:
        """After a lost connection: the cluster may have failed over; read its slots again."""
        if self.on_cluster:
            with suppress(redis.RedisError, RedisClusterException):  # the next call finds out
                self.client.nodes_manager.initialize()

    def exchange(
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
        packet = self.packet(command, wait, asking=asking)
        connection.send_packed_command(connection.pack_commands(packet))
        return self.read_packet(connection, packet)

    def packet(self, command: tuple[Any, ...], wait: int, *, asking: bool = False) -> list[tuple[Any, ...]]:
        """``command`` and what goes in its packet: ASKING before it when ``asking``; with
        ``wait``, WAIT after it, and ROLE first (the replicas connected to the primary: with
        fewer than ``wait``, WAIT would only wait out its timeout)."""
        packet = [("ASKING",), command] if asking else [command]
        if wait:
            packet.append(("WAIT", wait, self.wait_timeout_ms))
            if self.ask_role:
                packet.insert(0, ("ROLE",))
        return packet

    def read_packet(self, connection: redis.Connection, packet: list[tuple[Any, ...]]) -> Any:
        """The replies of :meth:`packet` on ``connection`` (see :meth:`packet_replies`)."""
        steps = self.packet_replies(packet)
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

    def packet_replies(self, packet: list[tuple[Any, ...]]) -> Generator[object, Any, Any]:
        """What to do with the replies of :meth:`packet`, for a sync or an async reader: it
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
                    self.ask_role = False
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

    def batch(self, commands: list[tuple[Any, ...]], key_at: int = 1) -> list[Any]:
        """``commands`` pipelined to the primaries their keys (at ``key_at``) belong to, sent to
        all before any reply is read (one round trip in time), replies or errors in order.
        Not the cluster client's pipeline: it sends a command again after a timeout, and a
        write must never run twice."""
        bridge = _bridged()
        if bridge is not None:  # several primaries at once: in a worker thread
            return bridge.blocking(self.batch, commands, key_at)
        groups: dict[int, tuple[redis.ConnectionPool, list[int]]] = {}
        replies: list[Any] = [None] * len(commands)
        sent: list[tuple[redis.ConnectionPool, redis.Connection, list[int]]] = []
        with self.errors():
            for i, command in enumerate(commands):
                pool = self.pool(command[key_at])
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

    def checked(self, replies: list[Any]) -> list[Any]:
        """``replies`` of :meth:`batch`, the first error raised as the store's."""
        for reply in replies:
            if isinstance(reply, Exception):
                raise self.error(reply) if isinstance(reply, redis.RedisError) else reply
        return replies

    def run_many(self, commands: list[tuple[Any, ...]]) -> list[Any]:
        """Several FCALLs, one pipeline per primary; replies or errors. Those a server did
        not run (the library not loaded there, a read that must write) are sent again
        once; those whose slot moved, alone."""
        bridge = _bridged()
        if bridge is not None:
            return bridge.blocking(self.run_many, commands)
        commands = list(commands)
        replies = self.batch(commands, key_at=3)
        failed = [i for i, reply in enumerate(replies) if missing(reply) or write_needed(reply)]
        if failed:
            if any(missing(replies[i]) for i in failed):
                with self.errors():
                    self.load_everywhere()
            library = self.library
            again = [
                library.writing(commands[i]) if write_needed(replies[i]) else library.again(commands[i])
                for i in failed
            ]
            for i, command, reply in zip(failed, again, self.batch(again, key_at=3), strict=True):
                commands[i], replies[i] = command, reply
        return self.redirected_again(commands, replies)

    def redirected_again(self, commands: list[tuple[Any, ...]], replies: list[Any]) -> list[Any]:
        """``replies`` of :meth:`batch`, those a server did not run (the slot moved) replaced by
        the command's reply through the cluster client, which follows redirects."""
        for i, reply in enumerate(replies):
            if isinstance(reply, _REDIRECTS):
                with self.errors():
                    try:
                        replies[i] = self._via_cluster_client(commands[i])
                    except redis.ResponseError as exc:  # as the pipeline would give it
                        replies[i] = exc
        return replies
