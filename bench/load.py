"""A closed-loop HTTP load generator, run as a process of its own by bench/api_bench.py.

    python bench/load.py URL BODIES_FILE --token T --duration 5 --max-requests 20000 --concurrency 4

Each of ``concurrency`` threads POSTs the bodies of BODIES_FILE (a JSON list) in turn,
one request at a time, until the duration or the request budget runs out. Prints
one JSON object: requests, statuses, requests per second, p50/p99 latency in ms,
and the CPU seconds this process used (its share of the machine).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import threading
import time
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

from timing import percentile


def drive(
    url: str, bodies: list[bytes], headers: dict[str, str], *, deadline: float, budget: int, offset: int
) -> tuple[list[float], Counter[int]]:
    """One client: requests back to back on one connection (reopened when the server closes it)."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
    latencies: list[float] = []
    statuses: Counter[int] = Counter()
    clock = time.perf_counter
    for n in range(budget):
        if clock() >= deadline:
            break
        body = bodies[(offset + n) % len(bodies)]
        before = clock()
        connection.request("POST", parts.path, body, headers)
        response = connection.getresponse()
        response.read()
        latencies.append(clock() - before)
        statuses[response.status] += 1
    connection.close()
    return latencies, statuses


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("url")
    parser.add_argument("bodies", type=Path, help="a JSON list of request bodies")
    parser.add_argument("--token", required=True)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--max-requests", type=int, default=50_000)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()

    bodies = [json.dumps(body).encode() for body in json.loads(args.bodies.read_text())]
    headers = {"Authorization": f"Token {args.token}", "Content-Type": "application/json"}
    results: list[tuple[list[float], Counter[int]]] = []
    cpu = os.times()
    start = time.perf_counter()
    deadline = start + args.duration
    threads = [
        threading.Thread(
            target=lambda i=i: results.append(
                drive(
                    args.url,
                    bodies,
                    headers,
                    deadline=deadline,
                    budget=args.max_requests // args.concurrency,
                    offset=i * len(bodies) // args.concurrency,
                )
            )
        )
        for i in range(args.concurrency)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - start
    used = os.times()
    latencies = sorted(x for found, _ in results for x in found)
    statuses = sum((counts for _, counts in results), Counter())
    print(
        json.dumps(
            {
                "requests": len(latencies),
                "statuses": {str(code): n for code, n in sorted(statuses.items())},
                "seconds": round(elapsed, 3),
                "rps": round(len(latencies) / elapsed, 1),
                "p50_ms": round(percentile(latencies, 0.50) * 1000, 2),
                "p99_ms": round(percentile(latencies, 0.99) * 1000, 2),
                "client_cpu_s": round(used.user + used.system - cpu.user - cpu.system, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
