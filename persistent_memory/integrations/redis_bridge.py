"""Async calls of the Redis backend on the event loop, without a worker thread.

The store's code is synchronous: one service layer for the API, the admin, the commands
and the integrations. An async caller (the agent frameworks' sessions and stores) runs a
store method in a *bridge*, a greenlet (the mechanism SQLAlchemy's asyncio support uses):
the method runs unchanged, and where the backend would send its one script call on a
socket, it hands an awaitable to the event loop and is resumed with the reply. So the
call is one FCALL on a redis.asyncio connection of the loop, and no thread waits on it.

What the bridge sends itself: a script call on one server or Sentinel's master (on a
pooled connection, with ``WAIT`` in the same packet when REDIS_WAIT_REPLICAS asks), and on
Redis Cluster through redis.asyncio's cluster client (which follows MOVED and ASK).
Everything else a store method might do on Redis (pipelines over several primaries, a
write beside another slot's, a cluster write that waits for replicas, a client whose
connections the bridge cannot make, TLS among them) runs in a worker thread as before,
still awaited. Each event loop gets its own connections (redis.asyncio's are bound to
the loop that made them).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import sys
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

import greenlet
import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.sentinel import SentinelConnectionPool, SentinelManagedConnection

from persistent_memory.backends.redis.functions import missing, write_needed
from persistent_memory.backends.redis.transport import (
    _DROP,
    _RECOVERIES,
    _pack_all,
)

if TYPE_CHECKING:
    from persistent_memory.backends.redis.transport import RedisTransport

T = TypeVar("T")

#: The connection classes whose connections the bridge can make on the loop.
_PLAIN = (redis.Connection, redis.UnixDomainSocketConnection, SentinelManagedConnection)
#: The connection options the bridge carries over from the backend's client.
_OPTIONS = ("host", "port", "db", "path", "username", "password", "socket_timeout", "socket_connect_timeout")


class _Bridge(greenlet.greenlet):
    """A store call running for a coroutine, which ``await_only`` hands its awaitables to."""

    def __init__(self, run: Callable[..., Any], driver: greenlet.greenlet) -> None:
        super().__init__(run, driver)
        self.driver = driver


def current() -> _Bridge | None:
    """The bridge this code runs in (None: a plain call)."""
    here = greenlet.getcurrent()
    return here if isinstance(here, _Bridge) else None


def await_only(awaitable: Awaitable[T]) -> T:
    """Await ``awaitable`` on the event loop of the bridge this code runs in."""
    bridge = current()
    if bridge is None:
        if isinstance(awaitable, Coroutine):
            awaitable.close()  # never to be awaited
        raise RuntimeError("await_only() outside a bridge")
    return bridge.driver.switch(awaitable)


async def run_bridged(method: Callable[..., T], *args: Any) -> T:
    """``method(*args)`` in a bridge: what it awaits is awaited here, on this loop."""
    bridge = _Bridge(method, greenlet.getcurrent())
    bridge.gr_context = contextvars.copy_context()  # the caller's, as in a worker thread
    result = bridge.switch(*args)
    while not bridge.dead:
        try:
            value = await result
        except BaseException:
            result = bridge.throw(*sys.exc_info())
        else:
            result = bridge.switch(value)
    return result


def blocking(method: Callable[..., T], *args: Any) -> T:
    """``method(*args)``, in a worker thread when called in a bridge (it would block the loop)."""
    if current() is None:
        return method(*args)
    return await_only(asyncio.to_thread(method, *args))


# The loop's connections ---------------------------------------------------------------


def _options(kwargs: dict[str, Any], connection: type | None = None) -> dict[str, Any] | None:
    """The async connections' options from a sync pool's (None: ones the bridge cannot make)."""
    connection = kwargs.get("connection_class", connection)
    if connection is not None and connection not in _PLAIN:
        return None  # TLS, or a class of the project's own
    if kwargs.get("credential_provider") is not None:
        return None
    return {name: kwargs[name] for name in _OPTIONS if kwargs.get(name) is not None}


def _declared_keys(cluster: AsyncRedisCluster) -> None:
    """Let ``cluster`` read an FCALL's keys where the call declares them, as it reads an
    EVALSHA's: redis-py asks a node (``COMMAND GETKEYS``) for them on every call
    otherwise, one round trip more, and none answers while that node is down."""
    parser = cluster.commands_parser
    asked = parser.get_keys

    async def get_keys(*args: Any) -> Any:
        if str(args[0]).upper() in ("FCALL", "FCALL_RO"):
            return args[3 : 3 + int(args[2])]
        return await asked(*args)

    parser.get_keys = get_keys


def async_client(client: Any) -> aioredis.Redis | AsyncRedisCluster | None:
    """A redis.asyncio client for the current loop that reaches what ``client`` reaches
    (None: the bridge does not handle its kind). Retries off, as the backend's are."""
    if isinstance(client, RedisCluster):
        options = _options(client.nodes_manager.connection_kwargs)
        if options is None:
            return None
        options = {name: options[name] for name in options.keys() - {"host", "port", "db", "path"}}
        nodes = [ClusterNode(node.host, node.port) for node in client.get_primaries()]
        cluster = AsyncRedisCluster(startup_nodes=nodes, retry=Retry(NoBackoff(), 0), **options)
        _declared_keys(cluster)
        return cluster
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        return None
    options = _options(pool.connection_kwargs, pool.connection_class)
    if options is None:
        return None
    if isinstance(pool, SentinelConnectionPool):
        sentinels = []
        for sentinel in pool.sentinel_manager.sentinels:
            kwargs = sentinel.connection_pool.connection_kwargs
            sentinels.append((kwargs["host"], kwargs["port"]))
        sentinel_options = _options(pool.sentinel_manager.sentinel_kwargs) or {}
        manager = Sentinel(sentinels, sentinel_kwargs={**sentinel_options, "retry": Retry(NoBackoff(), 0)})
        master = {name: value for name, value in options.items() if name not in ("host", "port", "path")}
        return manager.master_for(pool.service_name, retry=Retry(NoBackoff(), 0), **master)
    if "path" in options:
        options["connection_class"] = aioredis.UnixDomainSocketConnection
    return aioredis.Redis(connection_pool=aioredis.ConnectionPool(**options), retry=Retry(NoBackoff(), 0))


class LoopClients:
    """One redis.asyncio client per event loop (None where the bridge cannot make one),
    closed when its loop shuts down (``asyncio.run``, asgiref's ``async_to_sync`` and
    Django's async views under WSGI start a loop per call)."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._lock = threading.Lock()
        self._clients: dict[asyncio.AbstractEventLoop, tuple[Any, Any, Any]] = {}

    def ready(self) -> tuple[bool, Any]:
        """``(True, client)`` when the running loop's client is made and started, so that a
        call need not switch to the loop to ask :meth:`get` (``(False, None)`` otherwise)."""
        entry = self._clients.get(asyncio.get_running_loop())  # one dict read: no lock needed
        if entry is None:
            return False, None
        client, started, _ = entry
        if started is None or (started.done() and not started.cancelled() and started.exception() is None):
            return True, client
        return False, None

    async def get(self) -> aioredis.Redis | AsyncRedisCluster | None:
        loop = asyncio.get_running_loop()
        with self._lock:
            entry = self._clients.get(loop)
        if entry is None:
            client = async_client(self._client)
            # A cluster client's first calls, made at once, race its lazy start and lose
            # their connections (redis-py, retries off): the loop's calls all wait for one
            # start instead.
            cluster = isinstance(client, AsyncRedisCluster)
            started = loop.create_task(client.initialize()) if cluster else None
            closer = self._closer(loop, client)
            await closer.__anext__()  # now the loop closes it when it shuts down
            entry = (client, started, closer)
            with self._lock:
                self._clients[loop] = entry
        client, started, _ = entry
        if started is not None:
            try:
                await asyncio.shield(started)  # once done, at once
            except BaseException:
                with self._lock:  # the next call starts again
                    self._clients.pop(loop, None)
                raise
        return client

    async def _closer(self, loop: asyncio.AbstractEventLoop, client: Any) -> AsyncIterator[None]:
        """An async generator the loop finalizes at its shutdown (``shutdown_asyncgens``):
        then the loop's connections are closed, while it can still close them."""
        try:
            yield
        finally:
            with self._lock:
                self._clients.pop(loop, None)
            if isinstance(client, AsyncRedisCluster):
                await client.aclose()
            elif client is not None:
                await client.connection_pool.disconnect()


#: Packets up to this size are written without send_packed_command's wait_for (see _send):
#: far below the transport's high-water mark (64 KiB), so the write never waits.
_DIRECT_WRITE = 32 * 1024


async def _send(connection: Any, packed: list[bytes]) -> None:
    """``connection.send_packed_command(packed)``, without the cost of its write timeout
    for a small packet: with a socket timeout, redis.asyncio writes in ``asyncio.wait_for``,
    which on Python 3.11 runs the write as a task of its own, two more turns of the event
    loop per call (a quarter of a bridged read's time, measured). A small packet only fills
    the transport's buffer, so it cannot wait on the network; the reply's read keeps its
    timeout. Larger packets, and a connection not yet made, go the usual way."""
    if not connection.is_connected or sum(map(len, packed)) > _DIRECT_WRITE:
        await connection.send_packed_command(packed)
        return
    try:
        connection._writer.writelines(packed)
        await connection._writer.drain()
    except OSError as exc:
        await connection.disconnect(nowait=True)
        raise redis.ConnectionError("Error while writing to the socket.") from exc


async def _load(transport: RedisTransport, execute: Callable[..., Awaitable[Any]]) -> None:
    """``RedisTransport._load`` with an async ``execute``."""
    steps = transport.library.loading()
    try:
        load = next(steps)
        while True:
            try:
                reply = await execute(*load)
            except redis.ResponseError as exc:
                reply = exc
            load = steps.send(reply)
    except StopIteration:
        return


async def _recover(
    transport: RedisTransport, exc: redis.ResponseError, command: tuple[Any, ...], client: Any, on: Any = None
) -> tuple[Any, ...]:
    """``RedisTransport._recover`` on the loop: the library loaded on ``on`` (the connection
    that answered), if given, and on every primary of a cluster ``client``."""
    if write_needed(exc):
        return transport.library.writing(command)
    if not missing(exc):
        raise exc
    if on is not None:

        async def execute(*load: Any) -> Any:
            await on.send_command(*load)
            return await on.read_response()

        await _load(transport, execute)
    if isinstance(client, AsyncRedisCluster):
        for node in client.get_primaries():
            # One the map still lists but that is down (it failed over) has no call to serve.
            with contextlib.suppress(redis.ConnectionError, redis.TimeoutError):
                await _load(transport, node.execute_command)
    return transport.library.again(command)


async def _read_packet(transport: RedisTransport, connection: Any, packet: list[tuple[Any, ...]]) -> Any:
    """``RedisTransport.read_packet`` on an asyncio connection."""
    steps = transport.packet_replies(packet)
    try:
        step = next(steps)
        while True:
            if step is _DROP:
                await connection.disconnect()
                step = steps.send(None)
                continue
            try:
                reply = await connection.read_response()
            except redis.ResponseError as exc:
                reply = exc
            step = steps.send(reply)
    except StopIteration as done:
        return done.value


async def exchange(transport: RedisTransport, client: Any, command: tuple[Any, ...], wait: int) -> Any:
    """The library call ``command`` (an FCALL), and its ``WAIT`` when ``wait``; as
    ``RedisTransport.exchange`` does on a sync connection."""
    if isinstance(client, AsyncRedisCluster):  # wait is 0 here (see RedisBackend._call)
        for _ in range(_RECOVERIES):
            try:
                return await client.execute_command(*command)
            except redis.ResponseError as exc:  # a node new to the slot, or restarted
                command = await _recover(transport, exc, command, client)
        return await client.execute_command(*command)
    pool = client.connection_pool
    connection = await pool.get_connection()
    try:
        for attempt in range(_RECOVERIES + 1):
            try:
                packet = transport.packet(command, wait)
                await _send(connection, _pack_all(connection, packet))
                if not wait:
                    return await connection.read_response()
                return await _read_packet(transport, connection, packet)
            except redis.ResponseError as exc:  # a restarted or flushed server, or a read that must write
                if attempt == _RECOVERIES:
                    raise
                command = await _recover(transport, exc, command, client, connection)
    except redis.ResponseError:
        raise  # whole replies were read: the connection is fine
    except BaseException:
        await connection.disconnect()  # a reply may be left half read
        raise
    finally:
        await pool.release(connection)
