"""Redis servers of the benchmark's own on free loopback ports: one (or REDIS_URL), or a cluster."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import redis

#: A cluster node's bus listens on its port plus this.
CLUSTER_BUS_OFFSET = 10000
CLUSTER_SLOTS = 16384


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _server(port: int, folder: str, *options: str) -> subprocess.Popen[bytes]:
    """A redis-server on ``port`` that keeps nothing on disk (its files go to ``folder``)."""
    return subprocess.Popen(
        [
            shutil.which("redis-server") or "redis-server",
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            folder,
            *options,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _wait_for(url: str) -> None:
    """Wait (10 s at most) until the server at ``url`` answers PING."""
    client = redis.Redis.from_url(url)
    for _ in range(200):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    client.close()


@contextmanager
def redis_url(*, use_env: bool = True) -> Iterator[str]:
    """REDIS_URL when set (and ``use_env``); otherwise a fresh redis-server, stopped on exit."""
    if use_env and os.environ.get("REDIS_URL"):
        yield os.environ["REDIS_URL"]
        return
    port = free_port()
    folder = tempfile.mkdtemp(prefix="pm-bench-redis-")
    server = _server(port, folder)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        _wait_for(url)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)


def _free_cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free too."""
    while True:
        port = free_port()
        if port + CLUSTER_BUS_OFFSET > 65535:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port + CLUSTER_BUS_OFFSET))
            except OSError:
                continue
        return port


@contextmanager
def redis_cluster(primaries: int = 3) -> Iterator[str]:
    """A Redis Cluster of ``primaries`` redis-servers of its own (no replicas), its slots
    split evenly by ``redis-cli --cluster create``; the URL of its first node. Stopped on exit."""
    folder = tempfile.mkdtemp(prefix="pm-bench-cluster-")
    servers: list[subprocess.Popen[bytes]] = []
    try:
        ports = [_free_cluster_port() for _ in range(primaries)]
        for port in ports:
            servers.append(
                _server(
                    port, folder, "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf"
                )
            )
        for port in ports:
            _wait_for(f"redis://127.0.0.1:{port}/0")
        if primaries >= 3:
            subprocess.run(
                [shutil.which("redis-cli") or "redis-cli", "--cluster", "create"]
                + [f"127.0.0.1:{port}" for port in ports]
                + ["--cluster-replicas", "0", "--cluster-yes"],
                check=True,
                capture_output=True,
                timeout=60,
            )
        else:  # redis-cli creates clusters of 3 primaries or more
            _join(ports)
        deadline = time.monotonic() + 60
        while not all(_cluster_ok(port) for port in ports):
            if time.monotonic() > deadline:
                raise TimeoutError("the benchmark's Redis Cluster did not become ok within 60 s")
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{ports[0]}/0"
    finally:
        for server in servers:
            server.terminate()
        for server in servers:
            server.wait(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)


def _join(ports: list[int]) -> None:
    """Split the slots evenly over the nodes on ``ports`` and make them meet."""
    share = CLUSTER_SLOTS // len(ports)
    for n, port in enumerate(ports):
        last = CLUSTER_SLOTS - 1 if n == len(ports) - 1 else (n + 1) * share - 1
        with redis.Redis(port=port) as client:
            client.execute_command("CLUSTER", "ADDSLOTSRANGE", n * share, last)
            client.execute_command("CLUSTER", "SET-CONFIG-EPOCH", n + 1)
            if n:
                client.execute_command("CLUSTER", "MEET", "127.0.0.1", ports[0])


def _cluster_ok(port: int) -> bool:
    """Whether the node on ``port`` says the cluster is ok with every slot served."""
    with redis.Redis(port=port, decode_responses=True) as client:
        info = client.cluster("INFO")
    return info["cluster_state"] == "ok" and int(info["cluster_slots_ok"]) == CLUSTER_SLOTS
