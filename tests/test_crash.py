"""The embedded default keeps every write it answered 2xx through SIGKILL.

A real server (the demo under runserver with its default settings: memory backend,
immediate mirror, and the journal wherever the default puts it) takes writes from
client threads until it is killed with SIGKILL at a random moment, on an SQLite file
and on a PostgreSQL database of the test's own; after a restart every write answered
2xx is there, with its history. One round holds the mirror's table locked while the
writes are made, so the mirror cannot write any of them. ``PM_CRASH_KILLS`` sets the
number of kills (5 by default; the README's figures come from 20). However many writes
the machine manages is fine: each round waits for one acknowledged write, no more.

Idempotency keys outlive a restart too: writes sent with a key, the mirror caught up
and the journal's segments that held them deleted, the server killed (or stopped),
and every retry after the restart answers as the first time and applies nothing.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import shutil
import signal
import sqlite3
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from persistent_memory.backends.memory.history import operation_count
from tests.servers import ROOT, Server, demo_env, prepare_database, serve

KILLS = int(os.environ.get("PM_CRASH_KILLS", "5"))
WRITERS = 3
API = "/api/memory/"
#: How long a round waits for the server to acknowledge a write (a loaded machine).
DEADLINE_SECONDS = 180
# The PostgreSQL server of CI's PostgreSQL pass (DATABASE_URL), else the local one.
POSTGRES = os.environ.get("DATABASE_URL", "")
if not POSTGRES.startswith("postgres"):
    POSTGRES = "postgres://postgres@127.0.0.1:5432/test"


class Database:
    """A database of the test's own: its ``url``, and :meth:`locked` to keep the mirror
    from writing (the mirror's table locked against writes; reads go on)."""

    def __init__(self, url: str, locked: Callable[[], AbstractContextManager[None]], journal: Path) -> None:
        self.url = url
        self.locked = locked
        #: Where the default puts the journal of this database.
        self.journal = journal


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    if request.param == "sqlite":
        path = tmp_path / "db.sqlite3"

        @contextmanager
        def sqlite_locked() -> Iterator[None]:
            locker = sqlite3.connect(path, timeout=30, isolation_level=None)
            locker.execute("BEGIN IMMEDIATE")
            try:
                yield
            finally:
                locker.execute("ROLLBACK")
                locker.close()

        yield Database(f"sqlite:///{path}", sqlite_locked, tmp_path / "db.sqlite3.memory-journal")
        return
    psycopg = pytest.importorskip("psycopg")
    name = f"pm_crash_{uuid.uuid4().hex[:12]}"
    server = urlsplit(POSTGRES)
    try:
        # A refused connection fails at once; a slow one on a loaded machine must not skip.
        admin = psycopg.connect(POSTGRES, autocommit=True, connect_timeout=60)
    except psycopg.OperationalError as exc:
        pytest.skip(f"no PostgreSQL at {server.hostname}:{server.port}: {exc}")
    admin.execute(f'CREATE DATABASE "{name}"')
    url = server._replace(path=f"/{name}").geturl()

    @contextmanager
    def postgres_locked() -> Iterator[None]:
        with psycopg.connect(url) as locker:  # one transaction, rolled back at the end
            locker.execute("LOCK TABLE persistent_memory_memorysession IN EXCLUSIVE MODE")
            yield
            locker.rollback()

    # The default journal of a database that is not a file: in the project's folder.
    journal = ROOT / "memory-journal" / f"postgresql-{server.hostname}-{server.port}-{name}"
    try:
        yield Database(url, postgres_locked, journal)
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()
        shutil.rmtree(journal, ignore_errors=True)


def default_env(database: Database) -> dict[str, str]:
    """The demo's environment on ``database`` with the default journal (whatever is set here)."""
    env = demo_env(DATABASE_URL=database.url, MEMORY_BACKEND="memory")
    env.pop("MEMORY_JOURNAL_DIR", None)
    return env


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
        self.acknowledged = threading.Condition(self.lock)

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
                        self.acknowledged.notify_all()
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
            self.acknowledged.notify_all()

    def wait_for_more_than(self, count: int) -> None:
        """Wait until more than ``count`` writes are acknowledged (however long a loaded
        machine takes, within a generous deadline)."""
        with self.lock:
            done = self.acknowledged.wait_for(lambda: self.count > count, timeout=DEADLINE_SECONDS)
        assert done, f"no write acknowledged in {DEADLINE_SECONDS} s"

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
def test_sigkill_loses_no_acknowledged_write(database: Database, tmp_path: Path) -> None:
    env = default_env(database)
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
            # In round 1 the mirror cannot write while the writes are made.
            with database.locked() if kill == 1 else nullcontext():
                stop = threading.Event()
                threads = [
                    threading.Thread(
                        target=acknowledged.writer, args=(server, token, f"c{w}", f"r{kill}w{w}", stop)
                    )
                    for w in range(WRITERS)
                ]
                before = acknowledged.count
                for thread in threads:
                    thread.start()
                acknowledged.wait_for_more_than(before)
                time.sleep(rng.uniform(0, 1.0))  # then a random moment
                assert server.process is not None
                server.process.send_signal(signal.SIGKILL)
                server.process.wait(timeout=30)
                stop.set()
                for thread in threads:
                    thread.join(timeout=60)
    # The figures the README quotes (pytest -s shows them).
    print(f"\n{database.url.split(':')[0]}: kills={KILLS} acknowledged writes={acknowledged.count} lost=0")
    print(f"(kill, acknowledged so far, lost): {report}")


#: Writes sent with an Idempotency-Key: (method, path, body); each changes what a second
#: run would answer (a counter, a history, an answer count).
KEYED_WRITES = [
    ("POST", "store/", {"answer": {"text": "first", "metadata": {"session_id": "idem"}}}),
    ("PUT", "sessions/idem/memory/colour/", {"value": "blue"}),
    ("POST", "sessions/idem/memory/n/increment/", {}),
    ("POST", "sessions/idem/memory/n/increment/", {"amount": 5}),
    ("POST", "store/", {"answer": {"text": "second", "metadata": {"session_id": "idem"}}}),
    ("PUT", "sessions/idem/memory/colour/", {"value": "green"}),
]


def keyed(server: Server, token: str, key: str, write: tuple[str, str, Any]) -> tuple[int, Any]:
    method, path, body = write
    response = server.request(method, API + path, body, token=token, headers={"Idempotency-Key": key})
    return response.status, response.json()


def state(server: Server, token: str) -> tuple[Any, int]:
    """The session's values and how many operations its history holds."""
    values = call(server, token, "GET", "sessions/idem/memory/")["values"]
    history = call(server, token, "GET", "sessions/idem/history/?limit=0")["entries"]
    return values, operation_count(history)


def wait_until_mirrored(server: Server, token: str, journal: Path, keys: list[str]) -> None:
    """Poll until the mirror holds every write and the journal's segments that held the
    keyed writes are deleted: a retry then has only the idempotency records to go by."""
    deadline = time.monotonic() + DEADLINE_SECONDS
    while True:
        mirror = call(server, token, "GET", "health/")["mirror"]
        segments = b"".join(path.read_bytes() for path in journal.glob("*.journal") if path.exists())
        if mirror["pending_sessions"] == 0 and not any(key.encode() in segments for key in keys):
            return
        assert time.monotonic() < deadline, f"the mirror did not catch up: {mirror}"
        time.sleep(0.2)


@pytest.mark.skipif(sys.platform == "win32", reason="uses SIGKILL")
@pytest.mark.parametrize("stop", ["sigkill", "stop"])
def test_an_idempotent_retry_after_a_restart_gets_the_first_answer(
    database: Database, tmp_path: Path, stop: str
) -> None:
    env = default_env(database)
    token = prepare_database(env)
    keys = [f"retry-{uuid.uuid4()}" for _ in KEYED_WRITES]
    with serve("runserver", env, tmp_path / "first.log") as server:
        first = [keyed(server, token, key, write) for key, write in zip(keys, KEYED_WRITES, strict=True)]
        assert all(200 <= status < 300 for status, _ in first), first
        applied = state(server, token)
        wait_until_mirrored(server, token, database.journal, keys)
        if stop == "sigkill":
            assert server.process is not None
            server.process.send_signal(signal.SIGKILL)
            server.process.wait(timeout=30)
        # else: serve() stops it as an operator would (SIGINT)
    with serve("runserver", env, tmp_path / "second.log") as server:
        assert state(server, token) == applied  # the mirror had it all
        retries = [keyed(server, token, key, write) for key, write in zip(keys, KEYED_WRITES, strict=True)]
        assert retries == first
        assert state(server, token) == applied  # nothing applied twice
    print(f"\n{database.url.split(':')[0]} ({stop}): retries={len(retries)} applied twice=0")


#: Journal lines that parse but are no record a write made (a disk's corruption, an
#: edit): each kept a restarted server down (500 to everything, or 503 "waiting for its
#: database" forever), some after applying half of the record.
NOT_RECORDS = [
    b"5",
    b'{"a": 1}',
    b"[999999]",
    b'[999999, "put", "c0", 1.0]',  # a list too short
    b'[999999, "nope", "c0", 1.0, null]',  # an unknown operation
    b'[999999, "put", "c0", 1.0, null, 5, 6]',  # arguments of the wrong type
    b'[999999, "increment", "c0", 1.0, null, "n", "x"]',
    b'[999999, "create", "made", 1.0, ["a"], null, null]',  # a malformed idempotency record
    b'[999999, "answer", "made", 1.0, null, "\\"a\\"", null, ["c", 5, null], null]',  # deep inside
    b"\x00" * 16,
]


def put_values(server: Server, token: str, prefix: str, count: int) -> dict[str, Any]:
    """Write ``count`` values to session c0 (and bump its counter), each answered 2xx."""
    written = {}
    for i in range(count):
        written[f"{prefix}{i}"] = [i, prefix]
        call(server, token, "PUT", f"sessions/c0/memory/{prefix}{i}/", {"value": [i, prefix]})
        written["n"] = call(server, token, "POST", "sessions/c0/memory/n/increment/", {})["value"]
    return written


@pytest.mark.skipif(sys.platform == "win32", reason="uses SIGKILL")
def test_journal_lines_that_are_no_records_keep_no_restart_down(database: Database, tmp_path: Path) -> None:
    env = default_env(database)
    token = prepare_database(env)
    # The mirror writes none of it (its table locked): every write is in the journal only.
    with serve("runserver", env, tmp_path / "first.log") as server, database.locked():
        call(server, token, "POST", "sessions/", {"session_id": "c0"})
        written = put_values(server, token, "a", 5)
        segment = max(database.journal.glob("*.journal"), key=lambda path: path.name)
        with segment.open("ab") as file:  # between two writes, as a disk or an edit would
            file.write(b"".join(line + b"\n" for line in NOT_RECORDS))
        written.update(put_values(server, token, "b", 5))
        assert server.process is not None
        server.process.send_signal(signal.SIGKILL)
        server.process.wait(timeout=30)
    with serve("runserver", env, tmp_path / "second.log") as server:
        deadline = time.monotonic() + DEADLINE_SECONDS
        while (health := server.request("GET", API + "health/", token=token)).status != 200:
            assert time.monotonic() < deadline, f"the restart answers {health.status}: {health.body!r}"
            time.sleep(0.2)
        mirror = health.json()["mirror"]
        assert mirror["status"] == "ok"
        assert mirror["journal_skipped"] == len(NOT_RECORDS)
        assert call(server, token, "GET", "sessions/c0/memory/")["values"] == written
        sessions = call(server, token, "GET", "sessions/")
        assert "made" not in json.dumps(sessions)
        log = server.log
    assert log.count("skipping journal line") == len(NOT_RECORDS), log
    print(f"\n{database.url.split(':')[0]}: lines skipped={len(NOT_RECORDS)} writes back={len(written)}")
