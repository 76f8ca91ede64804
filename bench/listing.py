"""Benchmark of the session listing at scale: one owner's sessions, any page.

    python bench/listing.py [--sessions 100000] [--rounds 30]
                            [--backend redis|memory|both] [--layout node|cluster|both]
                            [--bulk] [--output PATH]

Starts a redis-server of its own on a free loopback port (never REDIS_URL, never
6379) and a temporary SQLite database for the API's token, creates the sessions of
one owner (so the listing's indexes are the ones the app maintains), then times one
page (50 sessions) through the store (``session_page``) and through
``GET /api/memory/sessions/`` (DRF's ``APIClient``, token authentication): the first
page, the deepest page an offset reaches (``MAX_PAGE_OFFSET``), the page after the
middle session and the last page by cursor (the cursor a client holds there, made
from that session's position), a prefix search matching 100 sessions, and the first
and a deep page by cursor of one matching 10,000. Redis runs in the node and the
cluster key layout, one after the other on a flushed server. Prints p50 and max in
ms; writes the figures as JSON only with ``--output``.

``--bulk`` creates the Redis sessions by writing what the 'create' script writes
(plain commands pipelined 2,000 sessions at a time), for a million sessions; it first
checks on a sample that the keys it writes are those of ``create_session`` (types,
members, fields and whether they expire; creation times aside).
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
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(1, str(ROOT))  # the project (bench/ itself is sys.path[0])

import django  # noqa: E402
from local_redis import redis_url  # noqa: E402
from timing import percentile  # noqa: E402

OWNER_PK = 1
PAGE_SIZE = 50
SEED = 1
BULK_BATCH = 2000


def setup_django(folder: str) -> None:
    """The bench site's settings on a fresh SQLite file (never the project's database)."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "site_settings"
    os.environ["DATABASE_URL"] = f"sqlite:///{folder}/bench.sqlite3"
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def numbers_in_creation_order(sessions: int) -> list[int]:
    """Ids ``s0000000``... in a shuffled order (ids say nothing of age, as with real ones)."""
    numbers = list(range(sessions))
    random.Random(SEED).shuffle(numbers)  # noqa: S311 - an order for a benchmark, not a secret
    return numbers


def bulk_create(store: Any, session_ids: list[str]) -> None:
    """Create ``session_ids`` by writing what the 'create' script writes for a new
    session (lanes.lua, sessions.lua's create()), pipelined: a bench's shortcut to a
    million sessions (:func:`check_bulk` compares the keys with ``create_session``'s)."""
    from persistent_memory.backends.redis.backend import _ttl_ms, _ttl_text
    from persistent_memory.owners import namespace_of, storage_id

    backend = store.backend
    ttl, idle = store._ttl(None), backend.idle_ttl_seconds
    ttl_text, ttl_ms, idle_ms = _ttl_text(ttl), int(_ttl_ms(ttl)), int(_ttl_ms(idle))
    for first in range(0, len(session_ids), BULK_BATCH):
        pipe = backend.client.pipeline(transaction=False)
        for sid in session_ids[first : first + BULK_BATCH]:
            stored = storage_id(store.owner, sid)
            meta, _, _, _, _, by_time, by_name, node_set, owned = backend.layout.session_keys(stored)[:9]
            now = time.time()
            pipe.zadd(by_time, {stored: now})
            pipe.zadd(by_name, {stored: 0})
            pipe.sadd(owned if namespace_of(stored) else node_set, stored)
            pipe.hset(meta, mapping={"created_at": repr(now), "ttl_seconds": ttl_text})
            at = int(now * 1000) + ttl_ms if ttl_ms > 0 else -1
            if idle_ms > 0:
                pipe.hset(meta, "idle_ttl_ms", idle_ms)
                if at > 0:
                    pipe.hset(meta, "deadline_ms", at)
                if at < 0 or int(now * 1000) + idle_ms < at:
                    at = int(now * 1000) + idle_ms
            if at > 0:
                pipe.pexpireat(meta, at)
        pipe.execute()


def keyspace(client: Any) -> dict[str, Any]:
    """Every key's type, content and whether it expires, creation times left out."""
    found: dict[str, Any] = {}
    for key in client.scan_iter(count=1000):
        kind = client.type(key).decode()
        if kind == "hash":
            content: Any = {k: v for k, v in client.hgetall(key).items() if k != b"created_at"}
        elif kind == "zset":
            content = sorted(client.zrange(key, 0, -1))
        elif kind == "set":
            content = sorted(client.smembers(key))
        else:
            content = client.dump(key)
        found[key.decode()] = (kind, content, client.pttl(key) > 0)
    return found


def check_bulk(url: str, layout: str, sample: int = 300) -> None:
    """``bulk_create`` writes the keys ``create_session`` writes (on a sample, two databases)."""
    import redis
    from django.test.utils import override_settings

    from persistent_memory import get_store

    ids = [f"s{n:07d}" for n in numbers_in_creation_order(sample)]
    spaces = []
    for db, make in ((14, "one by one"), (15, "bulk")):
        db_url = url.rsplit("/", 1)[0] + f"/{db}"
        client = redis.Redis.from_url(db_url)
        client.flushdb()
        with override_settings(PERSISTENT_MEMORY=redis_conf(db_url, layout)):
            store = get_store().for_owner(f"user:{OWNER_PK}")
            if make == "bulk":
                bulk_create(store, ids)
            else:
                for sid in ids:
                    store.create_session(sid)
        spaces.append(keyspace(client))
        client.flushdb()
    if spaces[0] != spaces[1]:
        differ = sorted(set(spaces[0].items()) ^ set(spaces[1].items()), key=str)[:5]
        raise SystemExit(f"bulk create differs from create_session ({layout}): {differ}")
    print(f"bulk create checked ({layout} layout): {len(spaces[0])} keys as create_session writes them")


def fill(owner: str, sessions: int, *, bulk: bool) -> float:
    """Create ``sessions`` sessions of ``owner`` in a shuffled order; the seconds it took."""
    from persistent_memory import get_store

    store = get_store().for_owner(owner)
    ids = [f"s{number:07d}" for number in numbers_in_creation_order(sessions)]
    started = time.perf_counter()
    if bulk:
        bulk_create(store, ids)
    else:
        for session_id in ids:
            store.create_session(session_id)
    return time.perf_counter() - started


def cursor_after(store: Any, prefix: str, session_id: str) -> str:
    """The cursor a client holds after a page that ends with ``session_id``."""
    from persistent_memory.cursors import encode_cursor
    from persistent_memory.owners import owner_namespace

    info = store.session_info(session_id)
    return encode_cursor(owner_namespace(store.owner), prefix, (info["created_at"], session_id))


def cases(store: Any, sessions: int) -> dict[str, dict[str, Any]]:
    """The pages timed, by name: the store call's arguments (the API's query is made of them)."""
    from persistent_memory.store import MAX_PAGE_OFFSET

    created = [f"s{n:07d}" for n in numbers_in_creation_order(sessions)]  # oldest first
    newest_first = created[::-1]
    narrow, wide = f"s{sessions // 2 // 100:05d}", f"s{sessions // 2 // 10_000:03d}"
    wide_matches = [sid for sid in newest_first if sid.startswith(wide)]
    deepest = min(MAX_PAGE_OFFSET, max(0, sessions - PAGE_SIZE))
    return {
        "first page": {},
        f"offset {deepest:,}": {"offset": deepest},
        "middle, by cursor": {"cursor": cursor_after(store, "", newest_first[sessions // 2 - 1])},
        "last page, by cursor": {"cursor": cursor_after(store, "", newest_first[-PAGE_SIZE - 1])},
        "search 100, first page": {"prefix": narrow},
        "search 10k, first page": {"prefix": wide},
        "search 10k, middle, by cursor": {
            "prefix": wide,
            "cursor": cursor_after(store, wide, wide_matches[len(wide_matches) // 2 - 1]),
        },
    }


def query_of(case: dict[str, Any]) -> str:
    """The API query of a case (page numbers: the offsets are multiples of the page size)."""
    params = {"page_size": PAGE_SIZE}
    if "prefix" in case:
        params["search"] = case["prefix"]
    if "cursor" in case:
        params["cursor"] = case["cursor"]
    if case.get("offset"):
        params["page"] = case["offset"] // PAGE_SIZE + 1
    return "?" + urlencode(params)


def timed(call: Any, rounds: int) -> list[float]:
    """Seconds of ``rounds`` calls, sorted, after one warm-up call."""
    call()
    latencies = []
    for _ in range(rounds):
        started = time.perf_counter()
        call()
        latencies.append(time.perf_counter() - started)
    return sorted(latencies)


def time_listing(client: Any, store: Any, sessions: int, rounds: int) -> dict[str, dict[str, Any]]:
    """p50 and max of each page through the store and through the API."""
    figures: dict[str, dict[str, Any]] = {}
    for name, case in cases(store, sessions).items():
        arguments = {
            "prefix": case.get("prefix", ""),
            "offset": case.get("offset", 0),
            "cursor": case.get("cursor"),
            "limit": PAGE_SIZE,
        }
        page = store.session_page(**arguments)
        url = "/api/memory/sessions/" + query_of(case)
        response = client.get(url)
        if response.status_code != 200:
            raise SystemExit(f"GET {url}: {response.status_code} {response.content[:200]!r}")
        body = response.json()
        if [s["session_id"] for s in body["results"]] != [i["session_id"] for i in page.sessions]:
            raise SystemExit(f"GET {url}: not the store's page")
        in_store = timed(partial(store.session_page, **arguments), rounds)
        in_api = timed(partial(client.get, url), rounds)
        figures[name] = {
            "count": body["count"],
            "results": len(body["results"]),
            "store_p50_ms": round(percentile(in_store, 0.5) * 1000, 2),
            "store_max_ms": round(in_store[-1] * 1000, 2),
            "api_p50_ms": round(percentile(in_api, 0.5) * 1000, 2),
            "api_max_ms": round(in_api[-1] * 1000, 2),
        }
    return figures


def redis_conf(url: str, layout: str) -> dict[str, Any]:
    conf: dict[str, Any] = {"BACKEND": "redis", "REDIS_URL": url, "MIRROR_MODE": "off"}
    if layout == "cluster":
        conf["REDIS_LAYOUT"] = "cluster"
    return conf


def measure(target: str, url: str, sessions: int, rounds: int, *, bulk: bool) -> dict[str, Any]:
    """Fill one backend (``memory``, ``redis node``, ``redis cluster``) and time the listing on it."""
    import redis
    from django.contrib.auth import get_user_model
    from django.test.utils import override_settings
    from rest_framework.authtoken.models import Token
    from rest_framework.test import APIClient

    from persistent_memory import get_store

    user, _ = get_user_model().objects.get_or_create(pk=OWNER_PK, defaults={"username": "bench"})
    token, _ = Token.objects.get_or_create(user=user)
    client = APIClient(HTTP_HOST="localhost")
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    if target == "memory":
        conf: dict[str, Any] = {"BACKEND": "memory", "MIRROR_MODE": "off"}
        conf.update(MAX_SESSIONS=sessions + 1, MAX_SESSIONS_PER_OWNER=sessions)
    else:
        # a million keys: no socket timeout, and the server frees them in the background
        redis.Redis.from_url(url, socket_timeout=None).flushdb(asynchronous=True)
        conf = redis_conf(url, target.split()[1])
    conf["API_THROTTLE_CLASSES"] = []
    with override_settings(PERSISTENT_MEMORY=conf):
        owner = f"user:{OWNER_PK}"
        filled = fill(owner, sessions, bulk=bulk and target != "memory")
        store = get_store().for_owner(owner)
        return {"fill_seconds": round(filled, 1), "pages": time_listing(client, store, sessions, rounds)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=30, help="timed calls per page")
    parser.add_argument("--backend", choices=["redis", "memory", "both"], default="both")
    parser.add_argument("--layout", choices=["node", "cluster", "both"], default="both")
    parser.add_argument("--bulk", action="store_true", help="pipelined creates (Redis)")
    parser.add_argument("--output", type=Path, help="also write the figures as JSON here")
    options = parser.parse_args()
    layouts = ["node", "cluster"] if options.layout == "both" else [options.layout]
    targets = [f"redis {layout}" for layout in layouts] if options.backend != "memory" else []
    if options.backend != "redis":
        targets.append("memory")

    results: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "load": os.getloadavg()[0],
        "sessions": options.sessions,
        "page_size": PAGE_SIZE,
        "rounds": options.rounds,
    }
    with redis_url(use_env=False) as url, tempfile.TemporaryDirectory() as folder:
        setup_django(folder)
        if options.bulk:
            for layout in layouts:
                check_bulk(url, layout)
        for target in targets:
            results[target] = measure(target, url, options.sessions, options.rounds, bulk=options.bulk)

    print(f"A page of {PAGE_SIZE} of {options.sessions:,} sessions of one owner, {options.rounds} calls each")
    for target in targets:
        print(f"\n{target} (filled in {results[target]['fill_seconds']} s)")
        print(
            f"{'page':<30} {'count':>8} {'results':>7} {'store p50':>9} {'max':>7} {'API p50':>8} {'max':>7}"
        )
        for name, row in results[target]["pages"].items():
            print(
                f"{name:<30} {row['count']:>8} {row['results']:>7} {row['store_p50_ms']:>9}"
                f" {row['store_max_ms']:>7} {row['api_p50_ms']:>8} {row['api_max_ms']:>7}"
            )
    if options.output:
        options.output.write_text(json.dumps(results, indent=2) + "\n")
        print(f"\nwritten to {options.output}")


if __name__ == "__main__":
    main()
