"""What a request costs while the embedder hangs: the demo site under gunicorn (one
worker, eight threads, SQLite), its EMBEDDER an OpenAI-compatible server that never
answers (tests/embeddings_server.py in its hanging mode), the embedder's options the
defaults (timeout 10 s, 2 retries).

Timed over HTTP from this process: a POST memories/ (the first, then more), a PATCH,
eight hybrid searches of one user at once with another user's GET sessions/ sent while
they run, then, the server answering again, how long until every memory has its vector.
``--root DIR`` serves another checkout (main, say) for the figures before a change.

    python bench/embedder_outage.py [--root /work/main]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(ROOT), str(BENCH)]

from local_redis import free_port  # noqa: E402

from tests.embeddings_server import embeddings_server  # noqa: E402


def call(
    port: int, method: str, path: str, token: str, body: Any = None, timeout: float = 120
) -> tuple[int, Any, float]:
    started = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    headers = {"Authorization": f"Token {token}", "Content-Type": "application/json"}
    connection.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
    answer = connection.getresponse()
    data = answer.read()
    connection.close()
    return answer.status, json.loads(data or b"null"), time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", default=str(ROOT), help="the checkout to serve")
    args = parser.parse_args()
    root = Path(args.root).resolve()
    folder = tempfile.mkdtemp(prefix="embedder-outage-")
    with embeddings_server() as server:
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "memory_site.settings",
            "DATABASE_URL": f"sqlite:///{folder}/db.sqlite3",
            "MEMORY_JOURNAL_DIR": "off",
            "EMBEDDER_BASE_URL": server.url,
            "EMBEDDER_MODEL": "stand-in",
            "PYTHONPATH": str(root),
        }
        subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=root, env=env, check=True)
        script = (
            "import django; django.setup()\n"
            "from django.contrib.auth import get_user_model\n"
            "from rest_framework.authtoken.models import Token\n"
            "for name in ('alice', 'bob'):\n"
            "    user = get_user_model().objects.create_user(name, password='pw', is_staff=name == 'alice')\n"
            "    print(Token.objects.create(user=user).key)\n"
        )
        tokens = subprocess.run(
            [sys.executable, "-c", script], cwd=root, env=env, check=True, capture_output=True, text=True
        ).stdout.split()
        alice, bob = tokens
        port = free_port()
        command = [sys.executable, "-m", "gunicorn", "--workers", "1", "--threads", "8", "--timeout", "300"]
        command += ["--bind", f"127.0.0.1:{port}", "--log-level", "warning", "memory_site.wsgi:application"]
        gunicorn = subprocess.Popen(command, cwd=root, env=env)
        try:
            for _ in range(600):
                try:
                    call(port, "GET", "/api/memory/health/", alice, timeout=5)
                    break
                except OSError:
                    time.sleep(0.1)
            # Warm: the embedder built, every view loaded, a memory with a vector.
            call(port, "POST", "/api/memory/memories/", alice, {"content": "I prefer Python over Java."})
            call(port, "POST", "/api/memory/memories/search/", alice, {"query": "Which language?"})
            call(port, "GET", "/api/memory/sessions/", bob)
            figures: dict[str, Any] = {"root": str(root), "load": os.getloadavg()}
            server.hang()
            writes = [
                call(port, "POST", "/api/memory/memories/", alice, {"content": f"Drinks tea, cup {n}."})
                for n in range(4)
            ]
            figures["writes"] = [(status, round(seconds, 3)) for status, _, seconds in writes]
            memory_id = writes[0][1]["id"]
            status, _, seconds = call(
                port, "PATCH", f"/api/memory/memories/{memory_id}/", alice, {"content": "Drinks green tea."}
            )
            figures["patch"] = (status, round(seconds, 3))
            results: list[tuple[int, Any, float]] = []
            threads = [
                threading.Thread(
                    target=lambda: results.append(
                        call(port, "POST", "/api/memory/memories/search/", alice, {"query": "tea or coffee?"})
                    )
                )
                for _ in range(8)
            ]
            for thread in threads:
                thread.start()
            time.sleep(0.1)  # the searches sent first
            sessions = call(port, "GET", "/api/memory/sessions/", bob)
            for thread in threads:
                thread.join()
            figures["searches"] = sorted(
                (status, body.get("strategy") if isinstance(body, dict) else None, round(seconds, 3))
                for status, body, seconds in results
            )
            figures["other_user_sessions"] = (sessions[0], round(sessions[2], 3))
            _, health, _ = call(port, "GET", "/api/memory/health/", alice)
            figures["health_embedder_while_hanging"] = health.get("embedder")
            server.recover()
            started = time.perf_counter()
            deadline = started + 180
            count = (
                "import django; django.setup()\n"
                "from persistent_memory.models import LongTermMemory\n"
                "print(LongTermMemory.objects.filter(embedding__isnull=True).count())"
            )
            while time.perf_counter() < deadline:
                left = subprocess.run(
                    [sys.executable, "-c", count], cwd=root, env=env, capture_output=True, text=True
                ).stdout.strip()
                if left == "0":
                    break
                time.sleep(1)
            figures["seconds_until_all_embedded_after_recovery"] = round(time.perf_counter() - started, 1)
            print(json.dumps(figures, default=str))
        finally:
            gunicorn.terminate()
            gunicorn.wait(timeout=30)


if __name__ == "__main__":
    main()
