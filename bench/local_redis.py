"""A redis-server of the benchmark's own on a free loopback port (or REDIS_URL)."""

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


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def redis_url(*, use_env: bool = True) -> Iterator[str]:
    """REDIS_URL when set (and ``use_env``); otherwise a fresh redis-server, stopped on exit."""
    if use_env and os.environ.get("REDIS_URL"):
        yield os.environ["REDIS_URL"]
        return
    port = free_port()
    folder = tempfile.mkdtemp(prefix="pm-bench-redis-")
    server = subprocess.Popen(
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
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    try:
        client = redis.Redis.from_url(url)
        for _ in range(200):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        client.close()
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)
        shutil.rmtree(folder, ignore_errors=True)
