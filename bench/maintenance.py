"""Benchmark of the maintenance commands on Redis at scale.

    python bench/maintenance.py [--sessions 100000] [--history 30] [--expired 0.1]
    python bench/maintenance.py --memories [options of bench/memories_bench.py]

Fills a redis-server of its own (or REDIS_URL) with sessions in the node's layout,
some of them expired with leftover keys, then runs `manage.py memory_sweep` and
`manage.py memory_summarize --all` as separate processes and reports each one's
wall time and peak memory (max RSS), beside a `manage.py check` for the baseline.
Figures go to standard output and to bench/results/local/maintenance.json (ignored by
git) or --output; the README's are in bench/results/2026-11-22-maintenance.json.

With --memories it runs the long-term memories at scale instead (search at 10,000 and
100,000 memories on SQLite and PostgreSQL, injection, extraction): bench/memories_bench.py,
whose options follow (``--memories --help`` lists them).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from local_redis import redis_url  # noqa: E402


def fill(url: str, sessions: int, history: int, expired_share: float) -> int:
    """Write sessions the way the original node lays them out; return how many expire."""
    client = redis.Redis.from_url(url)
    client.flushdb()
    now = time.time()
    expired = 0
    pipe = client.pipeline(transaction=False)
    for i in range(sessions):
        base = f"rr:memory:bench-{i:06d}:"
        entries = [
            json.dumps({"op": "put", "key": f"k{n % 3}", "timestamp": now + n}) for n in range(history)
        ]
        pipe.sadd("rr:memory:__sessions__", f"bench-{i:06d}")
        pipe.hset(base + "__meta__", mapping={"created_at": str(now), "ttl_seconds": "None"})
        pipe.mset({base + f"k{n}": json.dumps({"n": n, "text": "x" * 40}) for n in range(3)})
        pipe.sadd(base + "__keys__", "k0", "k1", "k2")
        pipe.rpush(base + "__history__", *entries)
        if i < sessions * expired_share:
            pipe.pexpire(base + "__meta__", 1)  # expired: its other keys are left behind
            expired += 1
        if i % 500 == 499:
            pipe.execute()
    pipe.execute()
    time.sleep(0.05)
    client.close()
    return expired


def measure(env: dict[str, str], *args: str) -> dict:
    """Run a manage.py command; its wall time, its own peak RSS and its output."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        process = subprocess.Popen(
            [sys.executable, "manage.py", *args], cwd=ROOT, env=env, stdout=out, stderr=err
        )
        _, status, usage = os.wait4(process.pid, 0)  # this child's own resource usage
        seconds = time.perf_counter() - started
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if process.returncode:
            raise SystemExit(f"{' '.join(args)} failed:\n{err.read().decode()}")
        text = out.read().decode().strip()
    return {"seconds": round(seconds, 2), "peak_rss_mib": round(usage.ru_maxrss / 1024, 1), "output": text}


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if "--memories" in argv:
        from memories_bench import main as memories

        memories([arg for arg in argv if arg != "--memories"])
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--memories", action="store_true", help="run bench/memories_bench.py instead, with the options after"
    )
    parser.add_argument("--sessions", type=int, default=100_000)
    parser.add_argument("--history", type=int, default=30, help="history entries per session")
    parser.add_argument("--expired", type=float, default=0.1, help="share of sessions already expired")
    parser.add_argument(
        "--output",
        type=Path,
        default=ROOT / "bench" / "results" / "local" / "maintenance.json",
        help="where the JSON goes (default: bench/results/local/maintenance.json, which git ignores)",
    )
    options = parser.parse_args(argv)

    with redis_url() as url, tempfile.TemporaryDirectory() as folder:
        env = {
            **os.environ,
            "MEMORY_BACKEND": "redis",
            "REDIS_URL": url,
            "DATABASE_URL": f"sqlite:///{folder}/bench.sqlite3",
        }
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
        started = time.perf_counter()
        expired = fill(url, options.sessions, options.history, options.expired)
        filled = time.perf_counter() - started
        baseline = measure(env, "check")
        results = {
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
            "sessions": options.sessions,
            "history_per_session": options.history,
            "expired": expired,
            "fill_seconds": round(filled, 1),
            "baseline_check": baseline,
            "memory_sweep": measure(env, "memory_sweep", "--json"),
            "memory_summarize": measure(env, "memory_summarize", "--all", "--max-history", "10", "--json"),
        }
    print(f"{options.sessions} sessions, {options.history} history entries each, {expired} expired")
    print(f"{'command':<40} {'seconds':>8} {'peak RSS MiB':>13}")
    for name in ("baseline_check", "memory_sweep", "memory_summarize"):
        row = results[name]
        print(f"{name:<40} {row['seconds']:>8} {row['peak_rss_mib']:>13}")
        if row["output"]:
            print(f"  {row['output']}")
    options.output.parent.mkdir(parents=True, exist_ok=True)
    options.output.write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {options.output}")


if __name__ == "__main__":
    main()
