"""The REST API under gunicorn (2 workers, Redis backend), driven by bench/load.py.

The load generator is another process on loopback; each endpoint is driven in turn,
``rounds`` times, and the best round counts (the machine is shared and noisy). The
floor is ``bench/noop/`` (bench/site_urls.py) under the same server and token.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis
from django.contrib.auth import get_user_model
from local_redis import free_port
from rest_framework.authtoken.models import Token
from server_time import command_stats, per_op
from store_bench import ANSWER, build_store, fill

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
WORKERS = 2
FLOOR = "no-op DRF view"


@contextmanager
def gunicorn(redis_url: str) -> Iterator[str]:
    """The demo site on the Redis backend under gunicorn; yields its base URL."""
    port = free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "site_settings",
        "MEMORY_BACKEND": "redis",
        "REDIS_URL": redis_url,
        "DJANGO_DEBUG": "0",
    }
    command = [sys.executable, "-m", "gunicorn", "--workers", str(WORKERS), "--bind", f"127.0.0.1:{port}"]
    command += ["--pythonpath", f"{BENCH},{ROOT}", "--log-level", "warning", "memory_site.wsgi:application"]
    server = subprocess.Popen(command, env=env, cwd=ROOT)
    try:
        for _ in range(300):
            if server.poll() is not None:
                raise RuntimeError(f"gunicorn exited with status {server.returncode}")
            try:
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                connection.request("GET", "/api/memory/health/")
                connection.getresponse().read()
                connection.close()
                break
            except OSError:
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=30)


def endpoints(redis_url: str, sessions: int, keys: int) -> dict[str, tuple[str, list[dict[str, Any]]]]:
    """Path and request bodies of each measured endpoint, on sessions of their own."""
    store = build_store("redis", redis_url)
    try:
        enriched = fill(store, "api-enrich", sessions, keys)
    finally:
        store.close()

    def question(sid: str) -> dict[str, Any]:
        return {"text": "Where?", "metadata": {"session_id": sid}}

    def answer(sid: str) -> dict[str, Any]:
        return {"text": ANSWER, "metadata": {"session_id": sid}}

    ids = [f"bench-api-{i}" for i in range(sessions)]
    enrich_bodies = [{"question": question(sid)} for sid in enriched]
    return {
        FLOOR: ("/bench/noop/", enrich_bodies),
        f"enrich ({keys} keys)": ("/api/memory/enrich/", enrich_bodies),
        "store": ("/api/memory/store/", [{"answer": answer(sid)} for sid in ids]),
        "process (2 entries)": (
            "/api/memory/process/",
            [
                {
                    "entries": [
                        {"lane": "questions", "entry": question(sid)},
                        {"lane": "answers", "entry": answer(sid)},
                    ]
                }
                for sid in ids
            ],
        ),
    }


def load(
    url: str, bodies_file: Path, token: str, duration: float, max_requests: int, concurrency: int
) -> dict:
    """One run of bench/load.py in a process of its own."""
    command = [sys.executable, str(BENCH / "load.py"), url, str(bodies_file), "--token", token]
    command += ["--duration", str(duration), "--max-requests", str(max_requests)]
    command += ["--concurrency", str(concurrency)]
    done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=duration + 120)
    return json.loads(done.stdout)


def api_figures(
    redis_url: str,
    *,
    duration: float,
    rounds: int,
    sessions: int,
    keys: int,
    max_requests: int,
    concurrency: int,
) -> dict[str, dict[str, Any]]:
    """Best-of-``rounds`` figures per endpoint, with each one's ratio to the floor."""
    user, _ = get_user_model().objects.get_or_create(username="bench")
    token = Token.objects.get_or_create(user=user)[0].key
    plan = endpoints(redis_url, sessions, keys)
    stats = redis.Redis.from_url(redis_url)
    best: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="pm-bench-") as folder, gunicorn(redis_url) as base:
        files = {}
        for n, (name, (path, bodies)) in enumerate(plan.items()):
            files[name] = Path(folder, f"{n}.json")
            files[name].write_text(json.dumps(bodies))
            # Warm both workers up: imports, connections, the library.
            load(base + path, files[name], token, min(1.0, duration), 2000, concurrency)
        for _ in range(rounds):
            for name, (path, _bodies) in plan.items():
                # Redis's counts over the run: the requests' calls and the workers' beside them.
                before = command_stats([stats])
                figures = load(base + path, files[name], token, duration, max_requests, concurrency)
                spent = command_stats([stats]) - before
                figures.update(
                    {
                        key.replace("_per_op", "_per_request"): value
                        for key, value in per_op(spent, figures["requests"]).items()
                    }
                )
                if name not in best or figures["rps"] > best[name]["rps"]:
                    best[name] = figures
    stats.close()
    for figures in best.values():
        figures["ratio_to_floor"] = round(figures["rps"] / best[FLOOR]["rps"], 3)
    return best
