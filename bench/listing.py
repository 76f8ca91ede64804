"""Benchmark of ``GET sessions/`` at scale: one owner's sessions, any page.

    python bench/listing.py [--sessions 100000] [--rounds 30] [--backend redis|memory|both]
                            [--output PATH]

Starts a redis-server of its own on a free loopback port (never REDIS_URL, never
6379) and a temporary SQLite database for the API's token, creates the sessions of
one owner through the store (so the listing's indexes are the ones the app
maintains), then times ``GET /api/memory/sessions/`` through DRF's ``APIClient``
with token authentication: the first, a middle and the last page (50 sessions each),
a prefix search matching 100 sessions, and the first, a middle and the last page of
one matching 10,000. Prints p50 and max in ms; writes the figures as JSON only with
``--output``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(1, str(ROOT))  # the project (bench/ itself is sys.path[0])

import django  # noqa: E402
from local_redis import redis_url  # noqa: E402
from timing import percentile  # noqa: E402

OWNER_PK = 1
PAGE_SIZE = 50
SEED = 1


def setup_django(folder: str) -> None:
    """The bench site's settings on a fresh SQLite file (never the project's database)."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "site_settings"
    os.environ["DATABASE_URL"] = f"sqlite:///{folder}/bench.sqlite3"
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def fill(owner: str, sessions: int) -> float:
    """Create ``sessions`` sessions of ``owner``, ids ``s000000``... in a shuffled order
    (ids say nothing of age, as with real ones); the seconds it took."""
    from persistent_memory import get_store

    store = get_store().for_owner(owner)
    numbers = list(range(sessions))
    random.Random(SEED).shuffle(numbers)  # noqa: S311 - an order for a benchmark, not a secret
    started = time.perf_counter()
    for number in numbers:
        store.create_session(f"s{number:06d}")
    return time.perf_counter() - started


def cases(sessions: int) -> dict[str, str]:
    """The queries timed, by name (the searches' match counts are at 100,000 sessions)."""
    last = max(1, -(-sessions // PAGE_SIZE))
    narrow, wide = f"s{sessions // 2 // 100:04d}", f"s{sessions // 2 // 10_000:02d}"
    return {
        "first page": "",
        "middle page": f"?page={max(1, last // 2)}",
        "last page": f"?page={last}",
        "search 100, first page": f"?search={narrow}",  # s0500: 100 ids
        "search 10k, first page": f"?search={wide}",  # s05: 10,000 ids
        "search 10k, middle page": f"?search={wide}&page={max(1, last // 20)}",
        "search 10k, last page": f"?search={wide}&page={max(1, last // 10)}",
    }


def time_listing(client: Any, sessions: int, rounds: int) -> dict[str, dict[str, Any]]:
    """p50 and max of each query over ``rounds`` calls, after one warm-up call."""
    figures: dict[str, dict[str, Any]] = {}
    for name, query in cases(sessions).items():
        url = "/api/memory/sessions/" + query
        response = client.get(url)
        if response.status_code != 200:
            raise SystemExit(f"GET {url}: {response.status_code} {response.content[:200]!r}")
        body = response.json()
        latencies = []
        for _ in range(rounds):
            started = time.perf_counter()
            client.get(url)
            latencies.append(time.perf_counter() - started)
        latencies.sort()
        figures[name] = {
            "query": query or "(none)",
            "count": body["count"],
            "results": len(body["results"]),
            "p50_ms": round(percentile(latencies, 0.5) * 1000, 2),
            "max_ms": round(latencies[-1] * 1000, 2),
        }
    return figures


def measure(backend: str, url: str, sessions: int, rounds: int) -> dict[str, Any]:
    """Fill one backend and time the listing on it."""
    from django.contrib.auth import get_user_model
    from django.test.utils import override_settings
    from rest_framework.authtoken.models import Token
    from rest_framework.test import APIClient

    user, _ = get_user_model().objects.get_or_create(pk=OWNER_PK, defaults={"username": "bench"})
    token, _ = Token.objects.get_or_create(user=user)
    client = APIClient(HTTP_HOST="localhost")
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    conf: dict[str, Any] = {"BACKEND": backend, "MIRROR_MODE": "off", "API_THROTTLE_CLASSES": []}
    if backend == "redis":
        conf["REDIS_URL"] = url
    else:
        conf.update(MAX_SESSIONS=sessions + 1, MAX_SESSIONS_PER_OWNER=sessions)
    with override_settings(PERSISTENT_MEMORY=conf):
        filled = fill(f"user:{OWNER_PK}", sessions)
        return {"fill_seconds": round(filled, 1), "queries": time_listing(client, sessions, rounds)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=30, help="timed calls per query")
    parser.add_argument("--backend", choices=["redis", "memory", "both"], default="both")
    parser.add_argument("--output", type=Path, help="also write the figures as JSON here")
    options = parser.parse_args()
    backends = ["redis", "memory"] if options.backend == "both" else [options.backend]

    results: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "sessions": options.sessions,
        "page_size": PAGE_SIZE,
        "rounds": options.rounds,
    }
    with redis_url(use_env=False) as url, tempfile.TemporaryDirectory() as folder:
        setup_django(folder)
        for backend in backends:
            results[backend] = measure(backend, url, options.sessions, options.rounds)

    print(f"GET sessions/ over {options.sessions} sessions of one owner, {options.rounds} calls each")
    for backend in backends:
        print(f"\n{backend} (filled in {results[backend]['fill_seconds']} s)")
        print(f"{'query':<26} {'count':>7} {'results':>8} {'p50 ms':>8} {'max ms':>8}")
        for name, row in results[backend]["queries"].items():
            print(f"{name:<26} {row['count']:>7} {row['results']:>8} {row['p50_ms']:>8} {row['max_ms']:>8}")
    if options.output:
        options.output.write_text(json.dumps(results, indent=2) + "\n")
        print(f"\nwritten to {options.output}")


if __name__ == "__main__":
    main()
