"""The REST API under gunicorn (2 workers, Redis backend), driven by bench/load.py.

    python bench/api_bench.py [--duration 3] [--rounds 5] [--in-process-rounds 15] [--no-gunicorn]

The load generator is another process on loopback; each endpoint is driven in turn,
``rounds`` times, and the best round counts (the machine is shared and noisy); beside
it, the median over rounds of each endpoint's requests per second over the floor's in
the same round. The floor is ``bench/noop/`` (bench/site_urls.py) under the same server
and token. Run alone, it also times the site's WSGI application in this process: client
CPU per request of each endpoint, interleaved in slices, as a ratio to the floor's in
the same round (what the view itself costs, without the server or Redis beside it).
Default settings as a user gets them: Redis backend (a redis-server of its own on a
free port), conversations recorded, the extraction worker on, a window of 100.
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis
from local_redis import free_port
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


def endpoints(
    redis_url: str, sessions: int, keys: int, owner: str = ""
) -> dict[str, tuple[str, list[dict[str, Any]]]]:
    """Path and request bodies of each measured endpoint, on sessions of their own; the
    enriched sessions' keys are written in ``owner``'s namespace (the API caller's)."""
    store = build_store("redis", redis_url)
    try:
        enriched = fill(store.for_owner(owner), "api-enrich", sessions, keys)
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
    token, owner = bench_token()
    plan = endpoints(redis_url, sessions, keys, owner)
    stats = redis.Redis.from_url(redis_url)
    best: dict[str, dict[str, Any]] = {}
    ratios: dict[str, list[float]] = {name: [] for name in plan}
    with tempfile.TemporaryDirectory(prefix="pm-bench-") as folder, gunicorn(redis_url) as base:
        files = {}
        for n, (name, (path, bodies)) in enumerate(plan.items()):
            files[name] = Path(folder, f"{n}.json")
            files[name].write_text(json.dumps(bodies))
            # Warm both workers up: imports, connections, the library.
            load(base + path, files[name], token, min(1.0, duration), 2000, concurrency)
        for _ in range(rounds):
            rps: dict[str, float] = {}
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
                rps[name] = figures["rps"]
                if name not in best or figures["rps"] > best[name]["rps"]:
                    best[name] = figures
            for name, value in rps.items():
                ratios[name].append(value / rps[FLOOR] if rps[FLOOR] else 0.0)
    stats.close()
    for name, figures in best.items():
        figures["ratio_to_floor"] = round(figures["rps"] / best[FLOOR]["rps"], 3)
        figures["median_round_ratio"] = round(statistics.median(ratios[name]), 3)
    return best


def bench_token() -> tuple[str, str]:
    """The bench user's API token and the owner the API gives its requests."""
    # Here: the models need Django set up, which main() does after the imports.
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    user, _ = get_user_model().objects.get_or_create(username="bench")
    return Token.objects.get_or_create(user=user)[0].key, f"user:{user.pk}"


def _environ(path: str, body: bytes, token: str) -> dict[str, Any]:
    """A WSGI environ of a POST as gunicorn hands it to the application."""
    return {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": path,
        "SCRIPT_NAME": "",
        "QUERY_STRING": "",
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8000",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1",
        "HTTP_HOST": "127.0.0.1:8000",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(body)),
        "HTTP_AUTHORIZATION": f"Token {token}",
        "wsgi.input": io.BytesIO(body),
        "wsgi.url_scheme": "http",
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": False,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
        "wsgi.version": (1, 0),
    }


def in_process_figures(
    redis_url: str, *, rounds: int, sessions: int, keys: int, slice_s: float = 0.2
) -> dict[str, dict[str, Any]]:
    """Client CPU per request of each endpoint, the site's WSGI application called here:
    ``rounds`` rounds of a ``slice_s`` CPU-second slice per endpoint, interleaved; each
    endpoint's ratio is the floor's CPU per request over its own in the same round
    (median of rounds), so 0.75 means it runs at 75% of the floor's rate."""
    from django.core.wsgi import get_wsgi_application

    token, owner = bench_token()
    application = get_wsgi_application()
    plan = {
        name: (path, [json.dumps(body).encode() for body in bodies])
        for name, (path, bodies) in endpoints(redis_url, sessions, keys, owner).items()
    }
    statuses: list[str] = []

    def start_response(status: str, headers: Any, exc_info: Any = None) -> Callable[[bytes], None]:
        statuses.append(status)
        return lambda _: None

    def call(path: str, body: bytes) -> None:
        result = application(_environ(path, body, token), start_response)
        b"".join(result)
        result.close()  # type: ignore[attr-defined]

    for path, bodies in plan.values():  # warm up: imports, connections, the windows filled
        for n in range(sessions * 2):
            call(path, bodies[n % len(bodies)])
    if any(not status.startswith("200") for status in statuses):
        raise RuntimeError(f"a warm-up request failed: {sorted(set(statuses))}")
    cpu: dict[str, list[float]] = {name: [] for name in plan}
    clock = time.thread_time
    for _ in range(rounds):
        for name, (path, bodies) in plan.items():
            count, start = 0, clock()
            while clock() - start < slice_s:
                call(path, bodies[count % len(bodies)])
                count += 1
            cpu[name].append((clock() - start) / count)
    return {
        name: {
            "cpu_us_per_request": round(statistics.median(spent) * 1e6, 1),
            "ratio_to_floor": round(
                statistics.median(floor / own for floor, own in zip(cpu[FLOOR], spent, strict=True)), 3
            ),
        }
        for name, spent in cpu.items()
    }


def _loadavg() -> str:
    """The machine's load averages (1, 5, 15 minutes): the figures are ratios for that."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per gunicorn run")
    parser.add_argument("--rounds", type=int, default=5, help="gunicorn runs per endpoint")
    parser.add_argument("--in-process-rounds", type=int, default=15, help="0: no in-process section")
    parser.add_argument("--no-gunicorn", action="store_true", help="only the in-process section")
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--keys", type=int, default=10)
    parser.add_argument("--max-requests", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--output", type=Path, help="where the figures go as JSON")
    args = parser.parse_args()
    sys.path.insert(1, str(ROOT))
    from local_redis import redis_url
    from run import setup_django

    results: dict[str, Any] = {"options": {k: str(v) for k, v in vars(args).items()}}
    with tempfile.TemporaryDirectory(prefix="pm-bench-") as folder, redis_url(use_env=False) as url:
        # The gunicorn workers read the same settings from the environment.
        os.environ.update({"MEMORY_BACKEND": "redis", "REDIS_URL": url, "DJANGO_DEBUG": "0"})
        setup_django(folder)
        if args.in_process_rounds:
            results["load_before_in_process"] = _loadavg()
            results["in_process"] = in_process_figures(
                url, rounds=args.in_process_rounds, sessions=args.sessions, keys=args.keys
            )
            print(f"In process (client CPU per request; load {results['load_before_in_process']}):")
            for name, figures in results["in_process"].items():
                print(f"  {name:24} {figures['cpu_us_per_request']:8.1f} µs  {figures['ratio_to_floor']:.3f}")
        if not args.no_gunicorn:
            redis.Redis.from_url(url).flushdb()  # the sessions again, as new
            results["load_before_gunicorn"] = _loadavg()
            results["gunicorn"] = api_figures(
                url,
                duration=args.duration,
                rounds=args.rounds,
                sessions=args.sessions,
                keys=args.keys,
                max_requests=args.max_requests,
                concurrency=args.concurrency,
            )
            load = f"load before {results['load_before_gunicorn']}, after {_loadavg()}"
            print(f"gunicorn, {WORKERS} workers ({load}):")
            for name, figures in results["gunicorn"].items():
                print(
                    f"  {name:24} {figures['rps']:8.1f} req/s  best/best {figures['ratio_to_floor']:.3f}"
                    f"  median of rounds {figures['median_round_ratio']:.3f}  statuses {figures['statuses']}"
                )
    if args.output:
        args.output.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
