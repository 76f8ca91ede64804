"""Default turns from several client processes against Redis Clusters of 1, 2 and 3 primaries.

    python bench/throughput.py [--processes 4] [--duration 10] [--primaries 1 2 3]
                               [--sessions 20] [--output PATH]

For each number of primaries, starts a Redis Cluster of its own (no replicas, on free
loopback ports; bench/local_redis.py, stopped by PID on exit) and ``--processes`` client
processes. Each process makes a store with the default settings (window 100, recording
and the extraction worker on; REDIS_TOPOLOGY "cluster"), fills ``--sessions`` sessions
of its own (10 values and 120 messages each, so the window is full), then, once every
process is ready, runs default turns (bench/store_bench.py's turn: a question through
the enrich lane, its answer through the store lane) back to back for ``--duration``
seconds, and waits for its extraction worker to finish what the turns asked.

Reported per cluster: turns/s (every process's turns over its own time, summed); Redis
CPU per turn (``used_cpu_sys`` + ``used_cpu_user`` of ``INFO cpu``, their growth over the
run summed over the primaries, over the turns); Redis time and commands per turn from
``INFO commandstats`` (bench/server_time.py); each primary's CPU over the run's wall time
(a primary at 90% of a core or more is reported saturated: adding clients would not add
its turns); and the clients' CPU per turn.

Clients and servers share this machine's cores: on a small machine the clients take most
of them, the primaries are not saturated and turns/s is bound by the machine, not by
Redis. There the figures to compare are per turn (Redis CPU, Redis time, commands), and
turns/s only as a ratio between runs of the same machine at the same load (printed).

Writes every figure as JSON to bench/results/local/throughput.json (or --output) and
prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
import time
from multiprocessing.synchronize import Barrier, Event
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(1, str(BENCH.parent))  # the project (bench/ itself is sys.path[0])

import redis  # noqa: E402
from local_redis import redis_cluster  # noqa: E402
from redis.cluster import RedisCluster  # noqa: E402
from run import machine, markdown, setup_django  # noqa: E402
from server_time import CommandStats, command_stats, per_op  # noqa: E402

#: A primary using this share of a core over the run or more is saturated.
SATURATED = 0.9
#: Messages each session holds before the run: more than the default window of 100.
FILL = 120
TEXT = "Paris is mild today: 18 degrees, light wind from the west and no rain expected. " * 5
VALUE = {"text": "The user prefers short answers in French.", "score": 0.87}


def client_process(
    url: str, index: int, sessions: int, duration: float, ready: Barrier, go: Event, results: Any
) -> None:
    """One client: a default store on the cluster at ``url``, its sessions filled; once
    every process is ``ready``, and told to ``go``, turns for ``duration`` seconds; puts
    its counts on ``results``."""
    import django

    django.setup()
    from store_bench import build_store, turn

    store = build_store("redis", url, REDIS_TOPOLOGY="cluster", REDIS_LAYOUT="cluster")
    try:
        session_ids = [f"throughput-{index}-{n}" for n in range(sessions)]
        chat = [
            {"role": "user" if n % 2 == 0 else "assistant", "content": f"{n}: {TEXT}"} for n in range(FILL)
        ]
        for session_id in session_ids:
            store.create_session(session_id)
            for key in range(10):
                store.put(session_id, f"k{key}", {**VALUE, "n": key})
            for start in range(0, FILL, 100):
                store.add_messages(session_id, chat[start : start + 100])
        store.extraction_worker.wait_idle(60)
        call = turn(store, session_ids)
        ready.wait()
        go.wait()
        cpu, start = time.process_time(), time.perf_counter()
        turns = 0
        while time.perf_counter() - start < duration:
            call()
            turns += 1
        seconds = time.perf_counter() - start
        store.extraction_worker.wait_idle(60)
        results.put({"turns": turns, "seconds": seconds, "client_cpu_s": time.process_time() - cpu})
    finally:
        store.close()


def run_against(url: str, processes: int, sessions: int, duration: float) -> dict[str, Any]:
    """``processes`` clients running default turns against the cluster at ``url``."""
    with RedisCluster.from_url(url) as cluster:
        servers = [redis.Redis(host=node.host, port=node.port) for node in cluster.get_primaries()]
    context = multiprocessing.get_context("spawn")
    ready, go = context.Barrier(processes + 1), context.Event()
    results = context.Queue()
    workers = [
        context.Process(target=client_process, args=(url, n, sessions, duration, ready, go, results))
        for n in range(processes)
    ]
    try:
        for worker in workers:
            worker.start()
        ready.wait(timeout=600)  # every client filled
        before = [command_stats([server]) for server in servers]
        started = time.perf_counter()
        go.set()
        counts = [results.get(timeout=duration + 300) for _ in workers]
        wall = time.perf_counter() - started
        each = [command_stats([server]) - start for server, start in zip(servers, before, strict=True)]
        for worker in workers:
            worker.join(timeout=60)
            if worker.exitcode != 0:
                raise RuntimeError(f"a client process ended with {worker.exitcode}")
    finally:
        for worker in workers:
            if worker.is_alive():
                worker.terminate()
        for server in servers:
            server.close()
    turns = sum(count["turns"] for count in counts)
    spent = sum(each, CommandStats())
    busy = [round(server.cpu_s / wall, 3) for server in each]
    return {
        "primaries": len(servers),
        "processes": processes,
        "turns": turns,
        "turns_per_s": round(sum(count["turns"] / count["seconds"] for count in counts), 1),
        **{key.replace("_per_op", "_per_turn"): value for key, value in per_op(spent, turns).items()},
        "client_cpu_us_per_turn": round(sum(count["client_cpu_s"] for count in counts) / turns * 1e6, 1),
        "wall_s": round(wall, 2),
        "primary_cpu_share": busy,
        "saturated": any(share >= SATURATED for share in busy),
    }


def table(runs: list[dict[str, Any]]) -> str:
    rows = [
        [
            run["primaries"],
            run["processes"],
            f"{run['turns_per_s']:,.0f}",
            f"{run['turns_per_s'] / runs[0]['turns_per_s']:.2f}x",
            f"{run['server_cpu_us_per_turn']:,.1f}",
            f"{run['commands_per_turn']:g}",
            f"{run['client_cpu_us_per_turn']:,.0f}",
            " ".join(f"{share:.0%}" for share in run["primary_cpu_share"]),
            "yes" if run["saturated"] else "no",
        ]
        for run in runs
    ]
    headers = [
        "Primaries",
        "Client processes",
        "turns/s",
        "of 1 primary",
        "Redis CPU µs/turn",
        "Redis commands/turn",
        "client CPU µs/turn",
        "each primary's CPU",
        "saturated",
    ]
    return markdown(headers, rows)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=4, help="client processes")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of turns per cluster")
    parser.add_argument("--primaries", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--sessions", type=int, default=20, help="sessions per client process")
    parser.add_argument("--output", type=Path, default=BENCH / "results" / "local" / "throughput.json")
    args = parser.parse_args(argv)

    load_start = os.getloadavg()
    runs = []
    with tempfile.TemporaryDirectory(prefix="pm-bench-throughput-") as folder:
        setup_django(folder)  # the clients' database (the enrich lane loads memories' models)
        for count in args.primaries:
            print(f"{args.processes} client processes against {count} primaries", file=sys.stderr)
            with redis_cluster(count) as url:
                about = machine(url)
                runs.append(run_against(url, args.processes, args.sessions, args.duration))
    results = {
        "settings": {
            "processes": args.processes,
            "duration_s": args.duration,
            "sessions_per_process": args.sessions,
            "session_messages_before": FILL,
            "store": "default settings (window 100, recording and extraction worker on), cluster topology",
            "saturated_at_cpu_share": SATURATED,
        },
        "machine": about,
        "load_average": {"start": list(load_start), "end": list(os.getloadavg())},
        "runs": runs,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    print(table(runs))
    print(
        f"\n{about['cores']} cores shared by the clients and the primaries; load average "
        f"{load_start[0]:.2f} at start, {results['load_average']['end'][0]:.2f} at end."
    )
    print(f"Figures written to {args.output}")
    return results


if __name__ == "__main__":
    main()
