"""Fixtures: a real redis-server for the session, and a store on each backend.

The suite never touches the shared Redis on 6379: it starts its own redis-server on a
free loopback port (or uses REDIS_URL when set) and stops it at the end. Without a
Redis the Redis tests are skipped with the reason, except under CI=true, where that
is a failure.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis

from persistent_memory import get_store
from persistent_memory.conf import DEFAULTS, memory_settings
from persistent_memory.store import MemoryStore

BACKENDS = ["memory", "redis"]

#: What the contract suites run on: both backends, and Redis as one server in the node and
#: the cluster layout, a real Redis Cluster, and a Sentinel-managed primary and replica.
TOPOLOGIES = ["memory", "redis", "redis-cluster-layout", "redis-cluster", "redis-sentinel"]


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker more than the cores. Most tests wait on servers, subprocesses
    and Chromium rather than compute: on a 2-core machine two workers left a core idle much
    of the time (one at ~12% CPU while the other computed)."""
    return (os.cpu_count() or 1) + 1


@pytest.fixture(autouse=True)
def no_extraction_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """The extraction worker is off unless a test turns it on (MEMORY_EXTRACTION_WORKER
    True): from its own thread and database connection it would write memories outside
    the test's transaction, behind its back. Its default, not each test's dict: many tests
    set PERSISTENT_MEMORY whole."""
    monkeypatch.setitem(DEFAULTS, "MEMORY_EXTRACTION_WORKER", False)
    memory_settings.reload()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for(url: str, seconds: float = 60.0) -> None:
    client = redis.Redis.from_url(url)
    deadline = time.monotonic() + seconds
    while True:
        try:
            client.ping()
            return
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
        finally:
            client.close()


class RedisServer:
    """A redis-server process of the test session's own, which can be stopped and restarted."""

    def __init__(self, *options: str) -> None:
        self.options = options  # more redis-server options
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.dir = tempfile.mkdtemp(prefix="pm-redis-")
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                shutil.which("redis-server") or "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.dir,
                *self.options,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        _wait_for(self.url)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None


def _no_redis(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI needs a Redis for the Redis tests: {reason}")
    pytest.skip(f"no Redis for the Redis tests: {reason}")


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer | None]:
    """Our own redis-server (None when REDIS_URL points at one to use instead)."""
    if os.environ.get("REDIS_URL"):
        yield None
        return
    if shutil.which("redis-server") is None:
        yield None
        return
    server = RedisServer()
    server.start()
    yield server
    server.stop()
    shutil.rmtree(server.dir, ignore_errors=True)


def _worker_url(url: str) -> str:
    """REDIS_URL for this pytest-xdist worker: its database number plus the worker's
    index, so that workers never flush each other's keys (each has its own server
    otherwise)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return url
    parts = urlsplit(url)
    database = int(parts.path.strip("/") or 0) + int(worker.removeprefix("gw"))
    return urlunsplit(parts._replace(path=f"/{database}"))


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisServer | None) -> str:
    given = os.environ.get("REDIS_URL")
    url = _worker_url(given) if given else (redis_server.url if redis_server else None)
    if url is None:
        _no_redis("redis-server is not installed and REDIS_URL is not set")
    if redis_server is None:
        # Every test flushes the database: refuse one that holds data (the demo's REDIS_URL).
        client = redis.Redis.from_url(url)
        try:
            size = client.dbsize()
        except redis.ConnectionError as exc:
            _no_redis(str(exc))
        finally:
            client.close()
        if size:
            pytest.exit(
                f"REDIS_URL={url} holds {size} keys and the tests flush it: point it at an empty database."
            )
    return url  # type: ignore[return-value]


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    """A raw client on a clean keyspace, for looking at what the backend wrote."""
    client = redis.Redis.from_url(redis_url)
    try:
        client.flushdb()
    except redis.ConnectionError as exc:
        _no_redis(str(exc))
    yield client
    client.close()


def memory_settings_for(backend: str, redis_url: str | None = None, **extra: Any) -> dict[str, Any]:
    """A PERSISTENT_MEMORY dict for ``backend``."""
    # The mirror is off unless a test turns it on: its worker thread would otherwise
    # write to the database behind the test's back.
    conf: dict[str, Any] = {"BACKEND": backend, "MIRROR_MODE": "off", **extra}
    if backend == "redis":
        conf["REDIS_URL"] = redis_url
    return conf


@pytest.fixture(params=BACKENDS)
def backend_name(request: pytest.FixtureRequest) -> str:
    return request.param


def topology_settings(name: str, request: pytest.FixtureRequest) -> dict[str, Any]:
    """PERSISTENT_MEMORY keys for Redis setup ``name`` (one of TOPOLOGIES but "memory"), on a
    clean keyspace."""
    if name in ("redis", "redis-cluster-layout"):
        request.getfixturevalue("redis_client")  # a clean keyspace
        layout = {"REDIS_LAYOUT": "cluster"} if name == "redis-cluster-layout" else {}
        return {"REDIS_URL": request.getfixturevalue("redis_url"), **layout}
    if name == "redis-cluster":
        cluster = request.getfixturevalue("redis_cluster")
        request.getfixturevalue("redis_cluster_client")  # whole again, and flushed
        return {"REDIS_TOPOLOGY": "cluster", "REDIS_URL": cluster.url}
    sentinel = request.getfixturevalue("redis_sentinel")
    sentinel.heal()
    sentinel.flush()
    return {
        "REDIS_TOPOLOGY": "sentinel",
        "REDIS_URL": None,
        "REDIS_SENTINELS": sentinel.sentinels,
        "REDIS_SENTINEL_SERVICE": sentinel.service,
    }


@pytest.fixture
def configure(backend_name: str, settings: Any, request: pytest.FixtureRequest):
    """Point PERSISTENT_MEMORY at the parametrized backend; call again with extra keys."""
    topology = topology_settings(backend_name, request) if backend_name != "memory" else {}
    backend = "memory" if backend_name == "memory" else "redis"

    def apply(**extra: Any) -> MemoryStore:
        settings.PERSISTENT_MEMORY = {**memory_settings_for(backend, None), **topology, **extra}
        return get_store()

    return apply


@pytest.fixture
def store(configure: Any) -> MemoryStore:
    """The process store on the parametrized backend, with default settings."""
    return configure()


@pytest.fixture
def redis_store(settings: Any, redis_client: redis.Redis, redis_url: str) -> MemoryStore:
    """The process store on Redis (for tests that only make sense there)."""
    settings.PERSISTENT_MEMORY = memory_settings_for("redis", redis_url)
    return get_store()


class CountingConnection(redis.Connection):
    """Counts network round trips: one per packed send (a command or a whole pipeline)."""

    sends = 0

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        type(self).sends += 1
        super().send_packed_command(command, check_health)


@pytest.fixture
def counting_client(redis_url: str, redis_client: redis.Redis) -> Iterator[redis.Redis]:
    """A client whose round trips are counted in ``CountingConnection.sends``."""
    pool = redis.ConnectionPool.from_url(redis_url, connection_class=CountingConnection)
    client = redis.Redis(connection_pool=pool)
    CountingConnection.sends = 0
    yield client
    pool.disconnect()


class AsyncSends:
    """Counts what redis.asyncio connections send (the async bridge's): one packet written
    is one round trip (counted where the bridge and redis-py both write: the stream's
    ``writelines``). A new connection's handshake is not counted."""

    HANDSHAKE = (b"HELLO", b"CLIENT", b"SELECT", b"AUTH", b"PING")

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.sends = 0
        original = asyncio.StreamWriter.writelines

        def counted(writer: asyncio.StreamWriter, data: Any) -> None:
            data = list(data)
            packed = b"".join(data)
            is_redis = packed[:1] == b"*"  # a command in the Redis protocol
            if is_redis and not any(word in packed[:40].upper() for word in self.HANDSHAKE):
                self.sends += 1
            original(writer, data)

        monkeypatch.setattr(asyncio.StreamWriter, "writelines", counted)


def pttls(client: redis.Redis, keys: list[Any]) -> list[int]:
    """PTTL of each key, read in one MULTI so that all are read at the same moment (reads
    one by one drift apart by however long the test waits for the CPU between them)."""
    pipe = client.pipeline(transaction=True)
    for key in keys:
        pipe.pttl(key)
    return pipe.execute()


@pytest.fixture
def server():
    """A local chat-completions endpoint (tests/chat_server.py), the stand-in for an LLM provider."""
    from tests.chat_server import chat_server

    with chat_server() as running:
        yield running


def _topology(kind: type[Any]) -> Iterator[Any]:
    """Start a ``tests.redis_topologies`` topology for the session (each pytest-xdist worker
    is a session of its own, so workers never share one), stop it at the end."""
    from tests.redis_topologies import redis_binaries_missing

    missing = redis_binaries_missing()
    if missing:
        _no_redis(missing)
    servers = kind()
    try:
        servers.start()
        yield servers
    finally:
        servers.stop()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[Any]:
    """A Redis Cluster of our own: 3 masters with a replica each (``ClusterServers``)."""
    from tests.redis_topologies import ClusterServers

    yield from _topology(ClusterServers)


@pytest.fixture(scope="session")
def redis_sentinel() -> Iterator[Any]:
    """A primary, a replica and 3 sentinels of our own, without passwords (``SentinelServers``)."""
    from tests.redis_topologies import SentinelServers

    yield from _topology(SentinelServers)


@pytest.fixture
def redis_cluster_client(redis_cluster: Any) -> Iterator[redis.cluster.RedisCluster]:
    """A ``RedisCluster`` client on the session's cluster, whole again (a test may have killed
    a node) and flushed."""
    redis_cluster.heal()
    redis_cluster.flush()
    client = redis.cluster.RedisCluster.from_url(redis_cluster.url)
    yield client
    client.close()
