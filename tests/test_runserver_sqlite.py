"""The embedded default under a real threaded server: runserver on an SQLite file, the
memory backend with its immediate mirror, concurrent API writers and admin page
loads. No request may fail, no "database is locked", no mirror row lost, and the
mirror is complete after the server stops (the worker flushes at shutdown)."""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import _free_port

ROOT = Path(__file__).resolve().parent.parent
THREADS, WRITES = 8, 25


def manage(env: dict[str, str], *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    return result.stdout


def call(url: str, token: str, body: dict | None = None, method: str = "POST") -> dict:
    request = urllib.request.Request(
        url,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Authorization": f"Token {token}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        assert 200 <= response.status < 300
        return json.loads(response.read())


def admin_opener(base: str) -> urllib.request.OpenerDirector:
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    page = opener.open(f"{base}/admin/login/", timeout=30).read().decode()
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page).group(1)
    form = urllib.parse.urlencode(
        {"csrfmiddlewaretoken": csrf, "username": "admin", "password": "pw-for-tests", "next": "/admin/"}
    ).encode()
    request = urllib.request.Request(
        f"{base}/admin/login/", data=form, headers={"Referer": f"{base}/admin/login/"}
    )
    assert "Log out" in opener.open(request, timeout=30).read().decode()
    return opener


#: Runs the command after it (argv[2:]) in place of this process, made to be killed when
#: the process whose pid is argv[1] (the test's) dies, whatever kills it: SIGKILL, a
#: timeout's SIGTERM, an exception no finalizer saw. prctl(PR_SET_PDEATHSIG) lasts across
#: exec; set here, not in a preexec_fn, which is unsafe in a process with threads.
DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit('the test process died before its server started')\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def start_server(env: dict[str, str], port: int, output: Any = subprocess.PIPE) -> subprocess.Popen:
    """``runserver`` on ``port``, in a process group of its own, killed if this process
    dies; its output to ``output`` (a pipe: see :func:`stop_server`)."""
    return subprocess.Popen(
        [sys.executable, "-c", DIE_WITH_PARENT, str(os.getpid()), sys.executable, "manage.py"]
        + ["runserver", "--noreload", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env=env,
        stdout=output,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def stop_server(server: subprocess.Popen, grace: float = 60) -> str:
    """Ctrl-C (the mirror worker flushes at exit), then SIGKILL to the server's whole
    process group if it has not exited within ``grace`` seconds; its output."""
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGINT)
    try:
        output, _ = server.communicate(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)
        output, _ = server.communicate()
    return output


@pytest.fixture
def runserver():
    """Start servers with ``runserver(env, port)``; each is stopped when the test ends,
    however it ends (a failed assertion, a timeout's exception)."""
    started: list[subprocess.Popen] = []

    def start(env: dict[str, str], port: int) -> subprocess.Popen:
        started.append(start_server(env, port))
        return started[-1]

    yield start
    for server in started:
        stop_server(server, grace=10)


def gone(pid: int, seconds: float = 120) -> bool:
    """Whether process ``pid`` (not a child of this one) ends within ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.skipif(sys.platform != "linux", reason="prctl(PR_SET_PDEATHSIG) is Linux's")
def test_a_server_dies_with_the_test_process_that_started_it(tmp_path):
    """A test process killed outright (no finalizer runs) takes its runserver with it."""
    env = {**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}", "MEMORY_BACKEND": "memory"}
    script = (
        "import sys, time\n"
        "from tests.test_runserver_sqlite import start_server\n"
        # Its output to a file: a pipe to a dead process would end it at its next line.
        f"log = open({str(tmp_path / 'server.log')!r}, 'w')\n"
        f"print(start_server(dict(__import__('os').environ), {_free_port()}, log).pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    test = subprocess.Popen(
        [sys.executable, "-c", script], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        pid = int(test.stdout.readline())
        assert not gone(pid, seconds=0.5)  # serving, or starting
    finally:
        test.kill()
        test.wait()
    assert gone(pid), "the server outlived the test process that started it"


@pytest.mark.skipif(sys.platform == "win32", reason="uses process groups")
def test_a_server_that_ignores_ctrl_c_is_killed_with_its_group():
    server = subprocess.Popen(
        [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
         "print('ready', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )  # fmt: skip
    assert server.stdout.readline() == "ready\n"
    stop_server(server, grace=1)
    assert server.returncode == -signal.SIGKILL


@pytest.mark.skipif(sys.platform == "win32", reason="uses SIGINT")
def test_threaded_runserver_on_sqlite(tmp_path, runserver):
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
        "MEMORY_BACKEND": "memory",
        "DJANGO_SUPERUSER_PASSWORD": "pw-for-tests",
    }
    env.pop("REDIS_URL", None)
    manage(env, "migrate", "-v0")
    manage(env, "createsuperuser", "--noinput", "--username", "admin", "--email", "admin@example.com")
    token = manage(env, "drf_create_token", "admin").split()[2]
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    server = runserver(env, port)
    errors: list[BaseException] = []
    try:
        deadline = time.monotonic() + 120  # a loaded machine starts it later, not never
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/memory/health/", timeout=2)
                break
            except OSError:
                assert time.monotonic() < deadline, "runserver did not start"
                time.sleep(0.2)

        def writer(index: int) -> None:
            try:
                session_id = f"t{index}"
                for i in range(WRITES):
                    call(
                        f"{base}/api/memory/enrich/",
                        token,
                        {"question": {"metadata": {"session_id": session_id}}},
                    )
                    answer = {"text": f"a{i}", "metadata": {"session_id": session_id}}
                    call(f"{base}/api/memory/store/", token, {"answer": answer})
                    call(
                        f"{base}/api/memory/sessions/{session_id}/memory/k{i % 5}/",
                        token,
                        {"value": i},
                        "PUT",
                    )
            except BaseException as exc:
                errors.append(exc)

        def browser() -> None:
            try:
                opener = admin_opener(base)
                for _ in range(10):
                    opener.open(f"{base}/admin/persistent_memory/memorysession/", timeout=30).read()
                    opener.open(f"{base}/admin/persistent_memory/historyentry/", timeout=30).read()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(THREADS)]
        threads += [threading.Thread(target=browser) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=300)
        assert errors == []
        expected = {
            f"t{i}": call(f"{base}/api/memory/sessions/t{i}/memory/", token, method="GET")["values"]
            for i in range(THREADS)
        }
    finally:
        output = stop_server(server)
    assert "database is locked" not in output
    assert "Traceback" not in output, output[-3000:]
    assert not re.search(r'" 5\d\d ', output), output[-3000:]

    db = sqlite3.connect(tmp_path / "db.sqlite3")
    rows = db.execute(
        "SELECT s.session_id, v.key, v.value FROM persistent_memory_memoryvalue v "
        "JOIN persistent_memory_memorysession s ON s.id = v.session_id"
    ).fetchall()
    mirrored: dict[str, dict] = {}
    for session_id, key, value in rows:
        mirrored.setdefault(session_id, {})[key] = json.loads(value)
    assert mirrored == expected
    for values in expected.values():
        assert values["answer_count"] == WRITES
    counts = dict(db.execute("SELECT session_id, key_count FROM persistent_memory_memorysession").fetchall())
    assert counts == {session_id: len(values) for session_id, values in expected.items()}
