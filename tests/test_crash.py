"""The embedded default keeps every write it answered 2xx through SIGKILL.

A real server (the demo under runserver: memory backend, immediate mirror, SQLite
file, journal beside it) takes writes from client threads until it is killed with
SIGKILL at a random moment; after a restart every write answered 2xx is there, with
its history. One round holds the SQLite database locked while the writes are made,
so the mirror cannot write any of them. ``PM_CRASH_KILLS`` sets the number of kills
(5 by default; the README's figures come from 20).
"""

from __future__ import annotations

import http.client
import os
import random
import signal
import sqlite3
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from persistent_memory.history import operation_count
from tests.servers import Server, demo_env, prepare_database, serve

KILLS = int(os.environ.get("PM_CRASH_KILLS", "5"))
WRITERS = 3
API = "/api/memory/"


def call(server: Server, token: str, method: str, path: str, body: Any = None) -> dict[str, Any]:
    """A 2xx answer's body; anything else (the server killed mid-request) raises."""
    response = server.request(method, API + path, body, token=token)
    if not 200 <= response.status < 300:
        raise OSError(f"{method} {path}: {response.status}")
    return response.json()


class Acknowledged:
    """Every write the server answered 2xx, per session."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.values: dict[str, dict[str, Any]] = defaultdict(dict)  # session -> key -> value put
        self.counters: dict[str, dict[str, int]] = defaultdict(dict)  # session -> key -> highest result
        self.operations: dict[str, int] = defaultdict(int)  # session -> history entries it makes
        self.count = 0

    def writer(self, server: Server, token: str, session_id: str, prefix: str, stop: threading.Event) -> None:
        i = 0
        while not stop.is_set():
            try:
                if i % 3 == 0:
                    answer = {"text": f"{prefix}-{i}", "metadata": {"session_id": session_id}}
                    result = call(server, token, "POST", "store/", {"answer": answer})
                    self._count(session_id, "answer_count", result["memory"]["answer_count"], 2)
                elif i % 3 == 1:
                    key = f"{prefix}_{i}"
                    call(
                        server,
                        token,
                        "PUT",
                        f"sessions/{session_id}/memory/{key}/",
                        {"value": [i, prefix]},
                    )
                    with self.lock:
                        self.values[session_id][key] = [i, prefix]
                        self.operations[session_id] += 1
                        self.count += 1
                else:
                    result = call(server, token, "POST", f"sessions/{session_id}/memory/n/increment/", {})
                    self._count(session_id, "n", result["value"], 1)
            except (OSError, http.client.HTTPException, ValueError):
                return  # the server is gone: what it answered is recorded
            i += 1

    def _count(self, session_id: str, key: str, value: int, operations: int) -> None:
        with self.lock:
            self.counters[session_id][key] = max(value, self.counters[session_id].get(key, 0))
            self.operations[session_id] += operations
            self.count += 1

    def missing(self, server: Server, token: str) -> list[str]:
        """What the restarted server lacks of what was acknowledged."""
        lost = []
        for session_id in sorted(set(self.values) | set(self.counters)):
            values = call(server, token, "GET", f"sessions/{session_id}/memory/")["values"]
            lost += [f"{session_id}/{k}" for k, v in self.values[session_id].items() if values.get(k) != v]
            lost += [
                f"{session_id}/{k}={v}>{values.get(k)}"
                for k, v in self.counters[session_id].items()
                if not isinstance(values.get(k), int) or values[k] < v
            ]
            history = call(server, token, "GET", f"sessions/{session_id}/history/?limit=0")["entries"]
            if operation_count(history) < self.operations[session_id]:
                lost.append(
                    f"{session_id}: history of {operation_count(history)} < {self.operations[session_id]}"
                )
        return lost


@pytest.mark.skipif(sys.platform == "win32", reason="uses SIGKILL")
def test_sigkill_loses_no_acknowledged_write(tmp_path: Path) -> None:
    database = tmp_path / "db.sqlite3"
    env = demo_env(DATABASE_URL=f"sqlite:///{database}", MEMORY_BACKEND="memory")
    token = prepare_database(env)
    acknowledged = Acknowledged()
    rng = random.Random()
    report = []
    for kill in range(KILLS + 1):
        with serve("runserver", env, tmp_path / f"server{kill}.log") as server:
            lost = acknowledged.missing(server, token)
            report.append((kill, acknowledged.count, len(lost)))
            assert lost == [], f"after kill {kill}: {lost[:10]}"
            if kill == KILLS:
                break
            locker = None
            if kill == 1:  # the mirror cannot write while the writes are made
                locker = sqlite3.connect(database, timeout=30, isolation_level=None)
                locker.execute("BEGIN IMMEDIATE")
            stop = threading.Event()
            threads = [
                threading.Thread(
                    target=acknowledged.writer, args=(server, token, f"c{w}", f"r{kill}w{w}", stop)
                )
                for w in range(WRITERS)
            ]
            for thread in threads:
                thread.start()
            time.sleep(rng.uniform(0.3, 1.5))
            assert server.process is not None
            server.process.send_signal(signal.SIGKILL)
            server.process.wait(timeout=30)
            stop.set()
            for thread in threads:
                thread.join(timeout=60)
            if locker is not None:
                locker.execute("ROLLBACK")
                locker.close()
    print(f"\nkills={KILLS} acknowledged writes={acknowledged.count} lost=0 (per kill: {report})")
    assert acknowledged.count > 50 * KILLS  # the writers did write between the kills
