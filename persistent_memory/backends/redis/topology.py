"""The Redis backend's client for each ``REDIS_TOPOLOGY``: one server, Redis Cluster, Sentinel.

Every topology shares one rule: a command is sent once. A reply lost to a timeout or a
dropped connection cannot be told from a command never sent, and running a write twice
(an increment, a history entry) is wrong, so the caller gets the error instead (the
store's BackendUnavailable, the API's 503 with Retry-After). Redirections that prove the
command did not run (Cluster's MOVED, ASK, TRYAGAIN; Sentinel's new master on the next
connection) are still followed.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import redis
from django.core.exceptions import ImproperlyConfigured
from django.views.decorators.debug import sensitive_variables
from redis.backoff import NoBackoff
from redis.cluster import LoadBalancingStrategy, RedisCluster
from redis.connection import SSLConnection, parse_url
from redis.crc import key_slot
from redis.exceptions import SlotNotCoveredError
from redis.retry import Retry
from redis.sentinel import Sentinel, SentinelConnectionPool

from persistent_memory.conf import MemorySettings

#: The values of REDIS_TOPOLOGY.
TOPOLOGIES = ("single", "cluster", "sentinel")

#: A Redis client of any topology.
Client = redis.Redis | RedisCluster


def _no_retry() -> Retry:
    """A fresh no-retry policy (each client gets its own: Retry objects hold state)."""
    return Retry(NoBackoff(), 0)


def _timeouts(conf: MemorySettings) -> dict[str, Any]:
    return {"socket_timeout": conf.REDIS_SOCKET_TIMEOUT, "socket_connect_timeout": conf.REDIS_SOCKET_TIMEOUT}


def parse_sentinels(entries: Any) -> list[tuple[str, int]]:
    """REDIS_SENTINELS' ``"host:port"`` strings as (host, port) pairs; ValueError if malformed."""
    if not isinstance(entries, list | tuple):
        raise ValueError("REDIS_SENTINELS must be a list of 'host:port' strings")
    pairs = []
    for entry in entries:
        host, sep, port = entry.rpartition(":") if isinstance(entry, str) else ("", "", "")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{entry!r} is not 'host:port'")
        pairs.append((host.strip("[]"), int(port)))  # [::1]:26379 is an IPv6 address
    return pairs


# Error reports (DEBUG off) hide every local of this call and of the calls it makes
# (redis-py's URL parsing holds the password).
@sensitive_variables()
def _single(conf: MemorySettings) -> redis.Redis:
    """One server from REDIS_URL or host/port."""
    options: dict[str, Any] = {
        **_timeouts(conf),
        # No retries: a reply lost after the script ran cannot be told from a command
        # never sent, and running a write twice (an increment, a history entry) is
        # wrong. The caller gets BackendUnavailable (the API: 503 with Retry-After).
        "retry": _no_retry(),
    }
    if conf.REDIS_URL:
        return redis.Redis.from_url(conf.REDIS_URL, **options)
    if not conf.REDIS_HOST:
        raise ImproperlyConfigured("PERSISTENT_MEMORY: the redis backend needs REDIS_URL or REDIS_HOST.")
    return redis.Redis(
        host=conf.REDIS_HOST, port=conf.REDIS_PORT, db=conf.REDIS_DB, password=conf.REDIS_PASSWORD, **options
    )


@sensitive_variables()
def _cluster(conf: MemorySettings) -> RedisCluster:
    """A Redis Cluster client from REDIS_URL (or REDIS_HOST/PORT/PASSWORD) as its seed node.

    ``retry`` is the cluster client's own loop around a whole command: on a
    ConnectionError or TimeoutError (also ClusterDownError, SlotNotCoveredError) it
    refreshes the slot map and, with retries left, sends the command again. With none
    the refresh still happens and the error reaches the caller (ClusterDownError too, for
    the seconds of a failover, though the command never ran). MOVED, ASK and TRYAGAIN
    are followed by an inner loop that does not read ``retry`` (the node refused the
    command, so it never ran). The per-node connections never retry: redis-py fixes
    that itself. (``cluster_error_retry_attempts`` is deprecated and ignored with a
    ``retry``.)
    """
    options: dict[str, Any] = {**_timeouts(conf), "retry": _no_retry()}
    if conf.REDIS_READ_FROM_REPLICAS is True:
        # Every connection then starts with READONLY, which lets a replica answer reads of
        # its slots (a primary ignores it); see replica_pool.
        options["load_balancing_strategy"] = LoadBalancingStrategy.ROUND_ROBIN_REPLICAS
    if conf.REDIS_URL:
        return RedisCluster.from_url(conf.REDIS_URL, **options)
    if not conf.REDIS_HOST:
        raise ImproperlyConfigured(
            "PERSISTENT_MEMORY: REDIS_TOPOLOGY 'cluster' needs REDIS_URL or REDIS_HOST."
        )
    return RedisCluster(host=conf.REDIS_HOST, port=conf.REDIS_PORT, password=conf.REDIS_PASSWORD, **options)


@sensitive_variables()
def _sentinel_parts(conf: MemorySettings) -> tuple[Sentinel, dict[str, Any]]:
    """The sentinels' client, and the options of a connection to the servers they name."""
    try:
        sentinels = parse_sentinels(conf.REDIS_SENTINELS)
    except ValueError as exc:
        raise ImproperlyConfigured(f"PERSISTENT_MEMORY: {exc}.") from None
    if not sentinels:
        raise ImproperlyConfigured("PERSISTENT_MEMORY: REDIS_TOPOLOGY 'sentinel' needs REDIS_SENTINELS.")
    # The sentinels are only asked where the master is: no retries either, since every
    # sentinel is asked in turn, and retries would multiply the wait when all are down.
    sentinel_options: dict[str, Any] = {**_timeouts(conf), "retry": _no_retry()}
    if conf.REDIS_SENTINEL_PASSWORD:
        sentinel_options["password"] = conf.REDIS_SENTINEL_PASSWORD
    master: dict[str, Any] = {"db": conf.REDIS_DB, "password": conf.REDIS_PASSWORD}
    if conf.REDIS_URL:
        url = parse_url(conf.REDIS_URL)
        for address in ("host", "port", "path"):
            url.pop(address, None)
        if url.pop("connection_class", None) is SSLConnection:
            url["ssl"] = True
        master = {**master, **url}
    return Sentinel(sentinels, sentinel_kwargs=sentinel_options), {**master, **_timeouts(conf)}


@sensitive_variables()
def _sentinel(conf: MemorySettings) -> redis.Redis:
    """The master of REDIS_SENTINEL_SERVICE as the sentinels name it.

    The pool asks the sentinels for the master on every new connection: after a
    failover the command that met the dead master fails (once, not re-sent), the
    connection is dropped, and the next one goes to the new master. REDIS_URL, when
    set, gives only the master's credentials, database and TLS (its host is ignored).
    """
    manager, options = _sentinel_parts(conf)
    return manager.master_for(conf.REDIS_SENTINEL_SERVICE, **options, retry=_no_retry())


@sensitive_variables()
def build_replicas(conf: MemorySettings) -> redis.Redis | None:
    """With REDIS_READ_FROM_REPLICAS behind Sentinel, a client of the replicas it names
    (each new connection to the next; to the master when it names none); else None (a
    cluster client finds its replicas itself: see :func:`replica_pool`)."""
    if (
        conf.REDIS_READ_FROM_REPLICAS is not True
        or conf.REDIS_CACHE_ALIAS
        or conf.REDIS_TOPOLOGY != "sentinel"
    ):
        return None
    manager, options = _sentinel_parts(conf)
    return manager.slave_for(conf.REDIS_SENTINEL_SERVICE, **options, retry=_no_retry())


@lru_cache(maxsize=8192)
def _slot(key: str) -> int:
    """The cluster slot of ``key``: a pure function of the key (its hash tag), so cached; a
    session's keys come back call after call. UTF-8, as the command packer encodes it."""
    return key_slot(key.encode())


def cluster_pool(client: RedisCluster, key: str) -> redis.ConnectionPool:
    """The connection pool of the primary that serves ``key`` in ``client``'s slot map.

    What ``client.get_redis_connection(client.get_node_from_key(key))`` answers, without
    encoding and hashing the key again on every call: this runs once per operation, and
    that lookup was what a cluster put cost the client beyond a plain client's put to the
    same node. The slot map itself is read on every call, so a MOVED, a failover or a
    refresh is seen by the next call, as through the client.
    """
    slot = _slot(key)
    nodes = client.nodes_manager.slots_cache.get(slot)
    if not nodes:
        raise SlotNotCoveredError(f'Slot "{slot}" is not covered by the cluster.')
    node = nodes[0]
    return (node.redis_connection or client.get_redis_connection(node)).connection_pool


def replica_pool(client: Client, replicas: redis.Redis | None, key: str) -> redis.ConnectionPool | None:
    """The connection pool a read of ``key`` goes to with REDIS_READ_FROM_REPLICAS (None:
    the setting is off, or the client knows no replicas, as on one server): on a cluster
    the next of the slot's replicas in turn (its primary when it has none), behind
    Sentinel the pool of ``replicas`` (:func:`build_replicas`)."""
    if replicas is not None:
        return replicas.connection_pool
    if not isinstance(client, RedisCluster) or client.load_balancing_strategy is None:
        return None
    node = client.nodes_manager.get_node_from_slot(
        _slot(key), load_balancing_strategy=client.load_balancing_strategy
    )
    return (node.redis_connection or client.get_redis_connection(node)).connection_pool


_BUILDERS = {"single": _single, "cluster": _cluster, "sentinel": _sentinel}


def declared_keys(client: RedisCluster) -> None:
    """Let ``client`` read an FCALL's keys where the call declares them, as it reads an
    EVALSHA's: redis-py asks a node (``COMMAND GETKEYS``) for them on every FCALL it routes
    otherwise (one round trip more, and none answers while that node is down). Only the
    calls the backend hands to the client go that way (after a MOVED); the async client
    gets the same in :mod:`persistent_memory.integrations.redis_bridge`. Safe on a user's
    client: the keys are those the server would name."""
    parser = client.commands_parser
    asked = parser.get_keys
    if getattr(asked, "reads_declared_keys", False):
        return  # another backend on this client did it

    def get_keys(redis_conn: Any, *args: Any) -> Any:
        if str(args[0]).upper() in ("FCALL", "FCALL_RO"):
            return list(args[3 : 3 + int(args[2])])
        return asked(redis_conn, *args)

    get_keys.reads_declared_keys = True  # type: ignore[attr-defined]
    parser.get_keys = get_keys


def build_client(conf: MemorySettings) -> Client:
    """A client from REDIS_CACHE_ALIAS (a django-redis cache's own connection, whatever
    its kind) or else for REDIS_TOPOLOGY."""
    if conf.REDIS_CACHE_ALIAS:
        from django_redis import get_redis_connection

        return get_redis_connection(conf.REDIS_CACHE_ALIAS)
    try:
        builder = _BUILDERS[conf.REDIS_TOPOLOGY]
    except (KeyError, TypeError):
        raise ImproperlyConfigured(
            f"PERSISTENT_MEMORY: REDIS_TOPOLOGY must be one of {', '.join(TOPOLOGIES)}."
        ) from None
    return builder(conf)


def describe(client: Client) -> str:
    """The server ``client`` uses now, without credentials; never raises.

    ``redis://host:port/db`` (``redis+unix://path``) for one server,
    ``redis-cluster://host:port,...`` with the primaries of the client's slot map,
    ``redis-sentinel://service@host:port/db`` with the master the sentinels name now.
    """
    try:
        if isinstance(client, RedisCluster):
            primaries = sorted(f"{node.host}:{node.port}" for node in client.get_primaries())
            return f"redis-cluster://{','.join(primaries)}"
        pool = client.connection_pool
        kwargs = pool.connection_kwargs
        if isinstance(pool, SentinelConnectionPool):
            return _describe_sentinel(pool)
        if "path" in kwargs:
            return f"redis+unix://{kwargs['path']}"
        return f"redis://{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"
    except Exception:  # noqa: BLE001 - an error message must not fail on its own description
        return f"redis ({type(client).__name__})"


def _describe_sentinel(pool: SentinelConnectionPool) -> str:
    try:
        # Also what a new connection would do: asks the sentinels, and drops idle
        # connections to a master they no longer name.
        host, port = pool.get_master_address()
    except (redis.RedisError, OSError):
        return f"redis-sentinel://{pool.service_name} (master unknown)"
    return f"redis-sentinel://{pool.service_name}@{host}:{port}/{pool.connection_kwargs.get('db', 0)}"
