"""The Redis backend on Redis Cluster: round trips, throughput against the floor, key spread.

    python bench/cluster_bench.py [--quick] [--rounds 11] [--slice 0.25] [--sessions 100]
                                  [--spread 100000] [--output PATH] [--json PATH]

Starts one redis-server and a 3-primary Redis Cluster (no replicas) of its own on free
loopback ports, and a temporary SQLite database (the enrich lane loads the memories'
models), then measures three setups in one run:

* ``single/node``: one server, the node's layout (the default);
* ``single/cluster``: the same server, the cluster layout (64 hash-tagged buckets);
* ``cluster``: the cluster, REDIS_TOPOLOGY "cluster" (the cluster layout).

1. Round trips per store operation: every request packet sent to any node by this
   thread (a pipeline's packet counts once), and how many of them waited for a reply
   one after another ("in sequence": packets sent before the first reply is read count
   once).
2. Throughput of the hot operations, each as a ratio to the EVALSHA floor (``return 1``
   with one declared key, on a pooled connection as the store sends its script) of the
   same server, or of the primary that holds the sessions on the cluster: every timed
   session of the cluster setup is on one primary (the holder of bucket 0), the same
   session ids everywhere. The setups and their floors take turns in short slices, round
   after round; the median round's figure counts.
3. Key distribution: sessions created through the store on the cluster (in threads),
   then the keys each primary holds and the sessions in each bucket.

Prints text tables; a full run also writes them to bench/results/cluster-<date>.txt
(--output), and --json writes every figure (the test reads that).
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

BENCH = Path(__file__).resolve().parent
sys.path.insert(1, str(BENCH.parent))  # the project (bench/ itself is sys.path[0])

import redis  # noqa: E402
from local_redis import redis_cluster, redis_url  # noqa: E402
from redis.cluster import RedisCluster  # noqa: E402
from redis.connection import AbstractConnection  # noqa: E402
from run import machine, markdown, setup_django  # noqa: E402
from server_time import server_cost  # noqa: E402
from store_bench import ANSWER, VALUE, build_store  # noqa: E402

from persistent_memory.backends.redis.layout import Layout  # noqa: E402

#: The three setups, in the order of every table.
SETUPS = ("single/node", "single/cluster", "cluster")
PREFIXES = {"single/node": "rr:memory", "single/cluster": "rr:memory-c", "cluster": "rr:memory"}
KEYS = 10  # values of the sessions that get_all and the enrich lane read
MESSAGE = [{"role": "user", "content": "What is the weather in Paris today?"}]
TURN = "The user asked about the weather in Paris and wanted a short answer. " * 7  # about 500 bytes


def setup_store(setup: str, url: str, **extra: Any) -> Any:
    """The store of ``setup`` with the benchmark's settings (see store_bench.build_store)."""
    topology = "cluster" if setup == "cluster" else "single"
    layout = "node" if setup == "single/node" else "cluster"
    return build_store(
        "redis", url, REDIS_TOPOLOGY=topology, REDIS_LAYOUT=layout, KEY_PREFIX=PREFIXES[setup], **extra
    )


def _question(session_id: str) -> dict[str, Any]:
    return {"text": "Where?", "metadata": {"session_id": session_id}}


# Round trips -----------------------------------------------------------------------------


class RoundTrips:
    """Counts this thread's requests to Redis on every connection of every pool while
    ``on``: ``sent`` packets, and ``waits``, the packets whose reply was waited for in
    turn (a read after a send: packets sent before the first read are one wait)."""

    def __init__(self) -> None:
        self.thread = threading.get_ident()
        self.on = False
        self.sent = self.waits = 0
        self._pending = False

    @contextmanager
    def patched(self) -> Iterator[RoundTrips]:
        """Count on every redis-py connection (the cluster's per-node pools included)."""
        send, read = AbstractConnection.send_packed_command, AbstractConnection.read_response
        counter = self

        def counted_send(connection: AbstractConnection, *args: Any, **kwargs: Any) -> Any:
            if counter.on and threading.get_ident() == counter.thread:
                counter.sent += 1
                counter._pending = True
            return send(connection, *args, **kwargs)

        def counted_read(connection: AbstractConnection, *args: Any, **kwargs: Any) -> Any:
            if counter._pending and threading.get_ident() == counter.thread:
                counter.waits += 1
                counter._pending = False
            return read(connection, *args, **kwargs)

        with (
            mock.patch.object(AbstractConnection, "send_packed_command", counted_send),
            mock.patch.object(AbstractConnection, "read_response", counted_read),
        ):
            yield self

    def count(self, prepare: Callable[[int], Any], operation: Callable[[Any], Any], calls: int) -> dict:
        """Sent and waited-for packets per call of ``operation(prepare(n))``, ``prepare``
        not counted; two calls first, not counted either (script loads, new connections)."""
        for n in range(calls, calls + 2):
            operation(prepare(n))
        self.sent = self.waits = 0
        for n in range(calls):
            argument = prepare(n)
            self.on = True
            try:
                operation(argument)
            finally:
                self.on = False
                self._pending = False
        return {"sent": self.sent / calls, "in_sequence": self.waits / calls}


def round_trip_operations(
    store: Any, tag: str
) -> dict[str, tuple[Callable[[int], Any], Callable[[Any], Any]]]:
    """Each counted operation as (prepare, operation) on the sessions of ``tag``."""
    from persistent_memory.pipeline import MemoryFilter

    sid = f"rt-{tag}"
    store.create_session(sid)
    for n in range(KEYS):
        store.put(sid, f"k{n}", {**VALUE, "n": n})
    store.add_messages(sid, [{"role": "user", "content": TURN}] * 20)
    lanes = MemoryFilter(store)

    def bound(n: int) -> str:
        run = f"rt-run-{tag}-{n}"
        MemoryFilter(store).enrich(_question(sid), run_id=run)
        return run

    def stored(outcome: tuple[dict[str, Any], dict[str, Any]]) -> None:
        if outcome[1]["status"] != "stored":  # else the count would be of another path
            raise RuntimeError(f"the answer was not stored: {outcome[1]}")

    def created(n: int) -> str:
        store.create_session(f"rt-{tag}-delete-{n}")
        return f"rt-{tag}-delete-{n}"

    def put_key(n: int) -> None:
        store.put(sid, "scratch", n)

    same = lambda n: None  # noqa: E731
    return {
        "create_session": (lambda n: f"rt-{tag}-create-{n}", store.create_session),
        "put": (same, lambda _: store.put(sid, "k0", VALUE)),
        "get": (same, lambda _: store.get(sid, "k0")),
        f"get_all ({KEYS} keys)": (same, lambda _: store.get_all(sid)),
        "increment": (same, lambda _: store.increment(sid, "counter")),
        "clear (one key)": (put_key, lambda _: store.clear(sid, "scratch")),
        "delete_session": (created, store.delete_session),
        "enrich lane (run id)": (
            lambda n: f"rt-enrich-{tag}-{n}",
            lambda run: lanes.enrich(_question(sid), run_id=run),
        ),
        "answer lane (session id)": (same, lambda _: stored(lanes.store({"text": ANSWER, **_question(sid)}))),
        "answer lane (run id only)": (
            bound,
            lambda run: stored(MemoryFilter(store).store({"text": ANSWER, "metadata": {}}, run_id=run)),
        ),
        "add_messages (1 message)": (same, lambda _: store.add_messages(sid, MESSAGE)),
        "get_context (20 messages)": (same, lambda _: store.get_context(sid, max_messages=20)),
        "list_session_page (50)": (same, lambda _: store.list_session_page(limit=50)),
    }


def open_connections(client: redis.Redis | RedisCluster, count: int = 2) -> None:
    """Open ``count`` connections to the server, or to every primary, before counting: a new
    connection's handshake (CLIENT SETINFO) is not a round trip of the operation that needed it."""
    if isinstance(client, RedisCluster):
        pools = [client.get_redis_connection(node).connection_pool for node in client.get_primaries()]
    else:
        pools = [client.connection_pool]
    for pool in pools:
        connections = [pool.get_connection() for _ in range(count)]  # each connected
        for connection in connections:
            pool.release(connection)


def round_trips(stores: dict[str, Any], calls: int) -> dict[str, dict[str, dict[str, float]]]:
    """Operation -> setup -> packets sent and waited for per call."""
    counter = RoundTrips()
    table: dict[str, dict[str, dict[str, float]]] = {}
    with counter.patched():
        for setup, store in stores.items():
            open_connections(store.backend.client)
            # A page reads every bucket: the library is then loaded on every primary (a node's
            # first call of it otherwise loads it: function not found, FUNCTION LOAD, the call again).
            store.list_session_page(limit=1)
            for name, (prepare, operation) in round_trip_operations(store, setup.replace("/", "-")).items():
                table.setdefault(name, {})[setup] = counter.count(prepare, operation, calls)
    return table


# Throughput ------------------------------------------------------------------------------


def rate(operation: Callable[[], Any], seconds: float) -> float:
    """Calls per second of ``operation`` called back to back for about ``seconds``."""
    clock = time.perf_counter
    calls, start = 0, clock()
    deadline = start + seconds
    while True:
        for _ in range(10):  # look at the clock every 10 calls
            operation()
        calls += 10
        now = clock()
        if now >= deadline:
            return calls / (now - start)


def evalsha_floor(pool: redis.ConnectionPool, key: str) -> Callable[[], Any]:
    """EVALSHA of ``return 1`` with ``key`` declared, on a connection of ``pool`` taken and
    given back each call, as the store sends its script."""
    connection = pool.get_connection()
    try:
        connection.send_command("SCRIPT", "LOAD", "return 1")
        sha = connection.read_response()
    finally:
        pool.release(connection)

    def call() -> Any:
        connection = pool.get_connection()
        try:
            connection.send_command("EVALSHA", sha, 1, key)
            return connection.read_response()
        finally:
            pool.release(connection)

    return call


def primary_of(client: RedisCluster, key: str) -> str:
    node = client.get_node_from_key(key)
    return f"{node.host}:{node.port}"


def timed_sessions(client: RedisCluster, prefix: str, sessions: int) -> dict[str, list[str]]:
    """Ids of ``sessions`` sessions per group whose bucket is on the primary of bucket 0."""
    layout = Layout(prefix, cluster=True)
    target = primary_of(client, layout.roots()[0])
    groups: dict[str, list[str]] = {}
    for group in ("write", "full", "enrich", "enrich-run", "append", "window"):
        candidates = (f"bench-{group}-{n}" for n in itertools.count())
        groups[group] = list(
            itertools.islice(
                (s for s in candidates if primary_of(client, layout.root_of(s)) == target), sessions
            )
        )
    return groups


def hot_operations(store: Any, groups: dict[str, list[str]]) -> dict[str, Callable[[], Any]]:
    """The timed operations, each cycling through its group's sessions (filled here)."""
    from persistent_memory.pipeline import MemoryFilter

    for session_id in groups["write"] + groups["append"]:
        store.create_session(session_id)
    for session_id in groups["full"] + groups["enrich"] + groups["enrich-run"]:
        store.create_session(session_id)
        for n in range(KEYS):
            store.put(session_id, f"k{n}", {**VALUE, "n": n})
    for session_id in groups["window"]:
        store.add_messages(session_id, [{"role": "user", "content": TURN}] * 20)
    cycle = {group: itertools.cycle(ids).__next__ for group, ids in groups.items()}
    lanes = MemoryFilter(store)
    runs = itertools.cycle([(sid, f"run-{sid}") for sid in groups["enrich-run"]]).__next__

    def enrich_with_run() -> Any:
        session_id, run = runs()
        return lanes.enrich(_question(session_id), run_id=run)

    return {
        "put": lambda: store.put(cycle["write"](), "k0", VALUE),
        f"get_all ({KEYS} keys)": lambda: store.get_all(cycle["full"]()),
        "increment": lambda: store.increment(cycle["write"](), "counter"),
        f"enrich lane ({KEYS} keys)": lambda: lanes.enrich(_question(cycle["enrich"]())),
        f"enrich lane ({KEYS} keys, run id)": enrich_with_run,
        "add_messages (1 message)": lambda: store.add_messages(cycle["append"](), MESSAGE),
        "get_context (20 messages)": lambda: store.get_context(cycle["window"](), max_messages=20),
    }


def primaries(url: str, *, cluster: bool) -> list[redis.Redis]:
    """A client of each primary behind ``url`` (the server itself when not a cluster)."""
    if not cluster:
        return [redis.Redis.from_url(url)]
    with RedisCluster.from_url(url) as client:
        return [redis.Redis(host=node.host, port=node.port) for node in client.get_primaries()]


def throughput(
    stores: dict[str, Any],
    groups: dict[str, list[str]],
    rounds: int,
    seconds: float,
    servers: dict[str, list[redis.Redis]],
    counted: int,
) -> dict[str, Any]:
    """Ops/s and ratio to the floor of each hot operation on each setup (median of rounds),
    then Redis time and commands per call over ``counted`` more calls, summed over the
    ``servers`` of each setup."""
    single_pool = stores["single/node"].backend.client.connection_pool
    cluster = stores["cluster"].backend.client
    held = Layout(PREFIXES["cluster"], cluster=True).root_of(groups["write"][0])
    floors = {
        "single": evalsha_floor(single_pool, "bench-floor"),
        "cluster": evalsha_floor(
            cluster.get_redis_connection(cluster.get_node_from_key(held)).connection_pool, held
        ),
    }
    operations = {setup: hot_operations(store, groups) for setup, store in stores.items()}
    names = list(operations[SETUPS[0]])
    for operation in [*floors.values(), *(op for ops in operations.values() for op in ops.values())]:
        rate(operation, seconds / 2)  # warm up
    rates: dict[str, list[float]] = {}
    ratios: dict[str, list[float]] = {}
    for _ in range(rounds):
        # The floors before and after each round: a round's ratio is to their mean.
        before = {server: rate(floor, seconds) for server, floor in floors.items()}
        measured = {
            (setup, name): rate(operations[setup][name], seconds) for name in names for setup in SETUPS
        }
        after = {server: rate(floor, seconds) for server, floor in floors.items()}
        floor = {server: (before[server] + after[server]) / 2 for server in floors}
        for server, value in floor.items():
            rates.setdefault(f"floor {server}", []).append(value)
        for (setup, name), value in measured.items():
            rates.setdefault(f"{setup} {name}", []).append(value)
            server = "cluster" if setup == "cluster" else "single"
            ratios.setdefault(f"{setup} {name}", []).append(value / floor[server])
    figures: dict[str, Any] = {
        "floor": {server: round(statistics.median(rates[f"floor {server}"])) for server in floors},
        "operations": {},
    }
    for name in names:
        row = {}
        for setup in SETUPS:
            row[setup] = {
                "ops_per_s": round(statistics.median(rates[f"{setup} {name}"])),
                "of_floor": round(statistics.median(ratios[f"{setup} {name}"]), 3),
            }
        # The layout's cost on one server, in points of the floor, round by round.
        row["cluster_minus_node_points"] = round(
            100
            * statistics.median(
                c - n
                for c, n in zip(ratios[f"single/cluster {name}"], ratios[f"single/node {name}"], strict=True)
            ),
            1,
        )
        for setup in SETUPS:
            store = stores[setup]
            row[setup].update(
                server_cost(
                    servers[setup],
                    operations[setup][name],
                    counted,
                    lambda store=store: store.extraction_worker.wait_idle(30),
                )
            )
        figures["operations"][name] = row
    return figures


# Distribution ----------------------------------------------------------------------------


def distribution(store: Any, count: int, threads: int = 4) -> dict[str, Any]:
    """Create ``count`` sessions through the store in ``threads`` threads; keys per primary
    (DBSIZE), sessions per primary and per bucket (each bucket's set of session ids)."""
    client: RedisCluster = store.backend.client
    for node in client.get_primaries():
        client.get_redis_connection(node).flushall()
    started = time.perf_counter()
    chunks = [range(start, min(start + 1000, count)) for start in range(0, count, 1000)]

    def create(numbers: range) -> None:
        for n in numbers:
            store.create_session(f"spread-{n}")

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(create, chunks))
    seconds = time.perf_counter() - started
    layout = Layout(store.backend.key_prefix, cluster=True)
    primaries = {f"{node.host}:{node.port}": node for node in client.get_primaries()}
    keys = {name: client.get_redis_connection(node).dbsize() for name, node in sorted(primaries.items())}
    per_bucket: list[int] = []
    sessions = dict.fromkeys(keys, 0)
    buckets = dict.fromkeys(keys, 0)
    for root in layout.roots():
        # KEYS[8] of a bucket's call (redis.lua): the bucket's set of session ids.
        in_bucket = client.scard(layout.bucket_keys(root, "")[7])
        per_bucket.append(in_bucket)
        sessions[primary_of(client, root)] += in_bucket
        buckets[primary_of(client, root)] += 1
    return {
        "sessions": count,
        "create_seconds": round(seconds, 1),
        "threads": threads,
        "primaries": {
            name: {"keys": keys[name], "sessions": sessions[name], "buckets": buckets[name]} for name in keys
        },
        "keys_max_to_min": round(max(keys.values()) / min(keys.values()), 3),
        "sessions_max_to_min": round(max(sessions.values()) / min(sessions.values()), 3),
        "per_bucket": {
            "buckets": len(per_bucket),
            "total": sum(per_bucket),
            "min": min(per_bucket),
            "median": statistics.median(per_bucket),
            "max": max(per_bucket),
            "max_to_min": round(max(per_bucket) / min(per_bucket), 3),
            "stdev_of_mean": round(statistics.pstdev(per_bucket) / statistics.mean(per_bucket), 3),
        },
    }


# Report ----------------------------------------------------------------------------------


def _trips(cell: dict[str, float]) -> str:
    sent, waits = cell["sent"], cell["in_sequence"]
    return f"{sent:g}" if sent == waits else f"{sent:g} sent, {waits:g} in sequence"


def _server(cell: dict[str, float]) -> str:
    return (
        f"{cell['server_us_per_op']:,.1f} ({cell['server_cpu_us_per_op']:,.1f}), {cell['commands_per_op']:g}"
    )


def report(results: dict[str, Any]) -> str:
    parts = [
        f"Redis Cluster benchmark, {results['date']}: {results['machine']['cpu']} "
        f"({results['machine']['cores']} cores), Python {results['machine']['python']}, "
        f"redis-server {results['machine']['redis_server']}, redis-py {results['machine']['redis']}. "
        f"The cluster: 3 primaries, no replicas, on this machine. Options: {results['options']}. "
        f"Load average at the end (1, 5, 15 min): {results['load_average']}; {results['seconds']} s."
    ]
    trips = results["round_trips"]
    parts.append(
        f"Round trips per operation (request packets sent to any node, per call, mean of "
        f"{results['options']['calls']} calls; 'in sequence' when some were sent together)\n\n"
        + markdown(
            ["Operation", *SETUPS], [[name, *(_trips(row[s]) for s in SETUPS)] for name, row in trips.items()]
        )
    )
    speed = results["throughput"]
    floor = speed["floor"]
    rows = [
        [
            "EVALSHA floor (return 1, 1 key)",
            f"{floor['single']:,}",
            "100%",
            f"{floor['single']:,}",
            "100%",
            f"{floor['cluster']:,}",
            "100%",
            "",
        ]
    ]
    for name, row in speed["operations"].items():
        cells = [cell for s in SETUPS for cell in (f"{row[s]['ops_per_s']:,}", f"{row[s]['of_floor']:.0%}")]
        rows.append([name, *cells, f"{row['cluster_minus_node_points']:+.1f}"])
    server_rows = [
        [name, *(_server(row[setup]) for setup in SETUPS)] for name, row in speed["operations"].items()
    ]
    headers = ["Operation (one thread)"]
    headers += [cell for s in SETUPS for cell in (f"{s} ops/s", "of floor")]
    headers.append("cluster - node layout (points)")
    parts.append(
        f"Throughput (median of {results['options']['rounds']} rounds of {results['options']['slice']} s "
        "slices; each setup's ratio is to the floor of its own server, on the cluster of the primary "
        "holding every timed session; the last column is single/cluster minus single/node, round by "
        "round, in points of the floor)\n\n" + markdown(headers, rows)
    )
    parts.append(
        f"Redis µs (Redis CPU µs), commands per call (INFO commandstats and cpu over "
        f"{results['options']['counted']} more calls, summed over the setup's primaries; "
        "bench/server_time.py)\n\n" + markdown(["Operation", *SETUPS], server_rows)
    )
    spread = results["distribution"]
    rows = [
        [name, f"{p['keys']:,}", f"{p['sessions']:,}", p["buckets"]]
        for name, p in spread["primaries"].items()
    ]
    bucket = spread["per_bucket"]
    parts.append(
        f"Key distribution ({spread['sessions']:,} sessions created through the store on the cluster in "
        f"{spread['threads']} threads, {spread['create_seconds']} s)\n\n"
        + markdown(["Primary", "keys (DBSIZE)", "sessions", "buckets"], rows)
        + f"\n\nKeys max/min across primaries: {spread['keys_max_to_min']:.3f}x; sessions max/min: "
        f"{spread['sessions_max_to_min']:.3f}x. Sessions per bucket ({bucket['buckets']} buckets): "
        f"min {bucket['min']:,}, median {bucket['median']:,}, max {bucket['max']:,} "
        f"(max/min {bucket['max_to_min']:.3f}x, "
        f"standard deviation {bucket['stdev_of_mean']:.1%} of the mean)."
    )
    return "\n\n".join(parts)


def measure(args: argparse.Namespace, single_url: str, cluster_url: str) -> dict[str, Any]:
    stores = {
        "single/node": setup_store("single/node", single_url),
        "single/cluster": setup_store("single/cluster", single_url),
        "cluster": setup_store("cluster", cluster_url),
    }
    single, cluster = primaries(single_url, cluster=False), primaries(cluster_url, cluster=True)
    servers = {"single/node": single, "single/cluster": single, "cluster": cluster}
    try:
        results: dict[str, Any] = {"round_trips": round_trips(stores, args.calls)}
        groups = timed_sessions(stores["cluster"].backend.client, PREFIXES["cluster"], args.sessions)
        results["throughput"] = throughput(stores, groups, args.rounds, args.slice, servers, args.counted)
    finally:
        for store in stores.values():
            store.close()
        for client in single + cluster:
            client.close()
    spread = setup_store("cluster", cluster_url, max_sessions=args.spread + 1000)
    try:
        results["distribution"] = distribution(spread, args.spread)
    finally:
        spread.close()
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a short run (seconds): the test's")
    parser.add_argument("--rounds", type=int, help="timing rounds (default 11; quick 3)")
    parser.add_argument(
        "--slice", type=float, help="seconds per operation per round (default 0.25; quick 0.02)"
    )
    parser.add_argument("--sessions", type=int, help="sessions each timed operation cycles through (100; 10)")
    parser.add_argument("--spread", type=int, help="sessions created for the distribution (100,000; 5,000)")
    parser.add_argument("--calls", type=int, help="calls counted per operation for round trips (20; 5)")
    parser.add_argument(
        "--counted", type=int, help="calls per operation counting Redis time and commands (200; 10)"
    )
    parser.add_argument("--output", type=Path, help="the text report (default: a full run's results file)")
    parser.add_argument("--json", type=Path, help="every figure as JSON")
    args = parser.parse_args(argv)
    defaults = (3, 0.02, 10, 5000, 5, 10) if args.quick else (11, 0.25, 100, 100_000, 20, 200)
    names = ("rounds", "slice", "sessions", "spread", "calls", "counted")
    for name, default in zip(names, defaults, strict=True):
        if getattr(args, name) is None:
            setattr(args, name, default)
    today = datetime.date.today().isoformat()
    if args.output is None and not args.quick:
        args.output = BENCH / "results" / f"cluster-{today}.txt"

    with (
        tempfile.TemporaryDirectory(prefix="pm-bench-") as folder,
        redis_url(use_env=False) as single_url,
        redis_cluster() as cluster_url,
    ):
        setup_django(folder)
        started = time.time()
        options = {k: v for k, v in vars(args).items() if k not in ("output", "json")}
        results: dict[str, Any] = {"date": today, "machine": machine(single_url), "options": options}
        results.update(measure(args, single_url, cluster_url))
        results["seconds"] = round(time.time() - started, 1)
        results["load_average"] = [round(load, 1) for load in os.getloadavg()]
    text = report(results)
    print(text)
    if args.output:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text + "\n")
        print(f"\nWritten to {args.output}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
