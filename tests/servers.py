"""The demo site as a real server process (runserver or gunicorn) on a free port, and a
TCP proxy that can take a database off the network, for the tests that need them."""

from __future__ import annotations

import atexit
import http.client
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.conftest import _free_port

ROOT = Path(__file__).resolve().parent.parent

#: Migrates the database of ``DATABASE_URL`` and prints a staff user's token.
PREPARE = """
from django.contrib.auth import get_user_model
from django.core.management import call_command
from rest_framework.authtoken.models import Token
call_command("migrate", verbosity=0)
user = get_user_model().objects.create_user("ops", password="pw-for-tests", is_staff=True)
print(Token.objects.create(user=user).key)
"""


def demo_env(**extra: str) -> dict[str, str]:
    """The environment of a demo process: this one's, less what the demo reads, plus ``extra``.

    Its memory backend's journal goes to a temporary folder of this environment's own
    unless the database is an SQLite file (the default then puts it beside the file):
    on another database the default is a folder in the project named after the database,
    which servers of other tests on the same database would share.
    """
    read = ("REDIS_URL", "DJANGO_DEBUG", "MEMORY_BACKEND", "MEMORY_JOURNAL_DIR")
    env = {**{k: v for k, v in os.environ.items() if k not in read}, **extra}
    if not env.get("DATABASE_URL", "sqlite:").startswith("sqlite:") and "MEMORY_JOURNAL_DIR" not in env:
        env["MEMORY_JOURNAL_DIR"] = folder = tempfile.mkdtemp(prefix="pm-journal-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)  # the servers are gone by then
    return env


def manage(env: dict[str, str], *args: str) -> str:
    """Run ``manage.py`` with ``args``; its standard output."""
    result = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    return result.stdout


def prepare_database(env: dict[str, str]) -> str:
    """Migrate the demo's database and create a staff user; the user's API token."""
    return manage(env, "shell", "--no-imports", "-c", PREPARE).split()[-1]


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Server:
    """A running demo server: call it with :meth:`request`; its output is in ``log``."""

    port: int
    log_path: Path
    process: subprocess.Popen[bytes] | None = None

    def request(
        self, method: str, path: str, body: Any = None, *, token: str | None = None, **kwargs: Any
    ) -> Response:
        """One request on a connection of its own (``kwargs`` go to ``http.client``)."""
        headers = {"Content-Type": "application/json", **kwargs.pop("headers", {})}
        if token:
            headers["Authorization"] = f"Token {token}"
        if body is not None and not isinstance(body, bytes | list):
            body = json.dumps(body).encode()
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            # The server may answer and close before it has read the whole body (runserver's
            # 411 to a chunked one): the sending then fails, and its answer is there to read.
            with suppress(BrokenPipeError, ConnectionResetError):
                connection.request(method, path, body=body, headers=headers, **kwargs)
            response = connection.getresponse()
            return Response(response.status, dict(response.getheaders()), response.read())
        finally:
            connection.close()

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


COMMANDS = {
    "runserver": lambda port: [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
    "gunicorn": lambda port: [
        sys.executable,
        "-m",
        "gunicorn",
        "--workers",
        "1",
        "--bind",
        f"127.0.0.1:{port}",
        "memory_site.wsgi:application",
    ],
    # The ASGI entry point: Django and the MCP endpoint at /mcp/.
    "uvicorn": lambda port: [
        sys.executable,
        "-m",
        "uvicorn",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "memory_site.asgi:application",
    ],
}


@contextmanager
def serve(kind: str, env: dict[str, str], log_path: Path, *, cwd: Path = ROOT) -> Iterator[Server]:
    """The demo site under ``kind`` (runserver, gunicorn or uvicorn) until the block ends.

    ``cwd``: another project's folder, whose ``manage.py`` runserver then serves.
    """
    port = _free_port()
    with open(log_path, "w") as log:
        process = subprocess.Popen(COMMANDS[kind](port), cwd=cwd, env=env, stdout=log, stderr=log)
    server = Server(port, log_path, process)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, f"{kind} exited:\n{server.log}"
            try:
                server.request("GET", "/api/memory/health/")
                break
            except OSError:
                assert time.monotonic() < deadline, f"{kind} did not start:\n{server.log}"
                time.sleep(0.2)
        yield server
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


class TcpProxy:
    """Forwards a free loopback port to ``target``. :meth:`stop` cuts every connection
    through it and refuses new ones, as a database server gone from the network would;
    :meth:`start` serves again on the same port."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.port = _free_port()
        self._listener: socket.socket | None = None
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()

    def start(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._listener.settimeout(0.1)
        threading.Thread(target=self._accept, args=(self._listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while self._listener is listener:
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            client.settimeout(None)
            upstream.settimeout(None)
            with self._lock:
                self._sockets |= {client, upstream}
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        for sock in (source, sink):
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, set()
        for sock in sockets:
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def project_folder(folder: Path) -> dict[str, str]:
    """``folder`` made a copy of the demo's project (its ``manage.py``, the site imported from
    the checkout, an SQLite database of its own); the environment its commands run in, with
    ``python`` this interpreter."""
    shutil.copy(ROOT / "manage.py", folder)
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    # A script, not a symlink: a symlink to a virtualenv's python, called by another name
    # in another folder, finds no pyvenv.cfg and runs the base Python without the venv's packages.
    python = bin_dir / "python"
    python.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    python.chmod(0o755)
    return demo_env(
        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        PYTHONPATH=str(ROOT),
        DATABASE_URL=f"sqlite:///{folder / 'db.sqlite3'}",
        DJANGO_SETTINGS_MODULE="memory_site.settings",
    )


def run_bash(script: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``script`` run by bash, which must succeed."""
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"{script}\n-- stdout:\n{result.stdout}\n-- stderr:\n{result.stderr}"
    return result
