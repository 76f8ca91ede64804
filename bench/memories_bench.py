"""Benchmark of long-term memories at scale: search, injection and extraction.

    python bench/memories_bench.py [--counts 10000 100000] [--rounds 100]
                                   [--databases sqlite postgresql] [--postgres URL]
                                   [--conversations 40] [--output PATH]
    python bench/maintenance.py --memories [the same options]

Each database is measured in a process of its own (the search runs on Django's default
connection, one per process): a temporary SQLite file with the demo site's settings
(WAL), and PostgreSQL at --postgres in a database the benchmark creates and drops (it
refuses one that exists); when PostgreSQL does not answer there, it is left out with
a note.

At each count (ascending; the table grows in place) one owner holds that many memories:
varied English sentences from bench/memories_corpus.py, written with ``bulk_create``
(on SQLite the FTS5 table follows through migration 0009's triggers, on PostgreSQL the
GIN index is the database's), beside a tenth as many of another owner. It then times,
taking turns call by call so that a machine slowing down shifts them all alike:

1. the floors: ``SELECT 1``, and one memory by id through the service (``get``);
2. ``search`` (limit 10) with the ``keyword`` and ``hybrid`` strategies, for each query
   of memories_corpus.QUERIES (from a word no memory holds to a question most match);
3. the enrich lane (memory backend, recording the question) with INJECT_MEMORIES on
   and off, asking the same queries.

Then extraction: the rule-based extractor over a fixed corpus of conversations, alone
(its floor), then through ``extract_messages`` into an owner with no memories, then
again over the same corpus (nothing changes): messages read and memories written (created
or changed) per second.

Prints p50 and p99 in ms, the searches' also as multiples of the floor's p50 (p99 of
--rounds calls: below 100 calls, the slowest), and writes every figure as JSON to
bench/results/local/memories.json (git ignores bench/results/local/) or --output. The
README's figures are in bench/results/2026-11-22-memories.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from importlib.metadata import version
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(1, str(ROOT))  # the project (bench/ itself is sys.path[0])

from memories_corpus import QUERIES, conversation, memory  # noqa: E402
from timing import percentile  # noqa: E402

OWNER = "user:bench"
OTHER_OWNER = "user:bench-other"
EXTRACTION_OWNER = "user:bench-extract"
STRATEGIES = ("keyword", "hybrid")
FLOOR = "get one memory by id"
SELECT_1 = "SELECT 1"
BATCH = 2000
DEFAULT_POSTGRES = "postgres://postgres@127.0.0.1:5432/pm_bench_memories"


# The worker: one database, in its own process ----------------------------------------


def setup_django(database_url: str) -> None:
    """The bench site's settings on ``database_url``, migrated."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "site_settings"
    os.environ["DATABASE_URL"] = database_url
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


def progress(message: str) -> None:
    """A line on standard error: a run at 100,000 memories takes minutes."""
    print(message, file=sys.stderr, flush=True)


def seed(owner: str, start: int, stop: int, *, offset: int = 0) -> None:
    """Memories ``start`` to ``stop`` of ``owner`` (the corpus's memories from ``offset``),
    written as the service writes them (normalized content, tokens counted) but in bulk.
    Their updates spread over the past year."""
    from django.db import connection, transaction
    from django.utils import timezone

    from persistent_memory.chat.tokens import text_counter
    from persistent_memory.conf import memory_settings
    from persistent_memory.models import LongTermMemory

    count_tokens = text_counter(memory_settings.TOKENIZER)
    now = timezone.now()
    year = 365 * 86400
    for first in range(start, stop, BATCH):
        rows = []
        for n in range(first, min(stop, first + BATCH)):
            type_, content = memory(offset + n)
            updated = now - timedelta(seconds=(n * 7919) % year)
            rows.append(
                LongTermMemory(
                    owner=owner,
                    key=f"bench.{n:07d}",
                    type=type_,
                    content=content,
                    source="extraction" if n % 10 < 7 else "api",
                    created_at=updated - timedelta(days=n % 30),
                    updated_at=updated,
                    tokens=count_tokens(content),
                )
            )
        with transaction.atomic():
            LongTermMemory.objects.bulk_create(rows)
    if connection.vendor == "postgresql":
        # What autovacuum does a little after a bulk load: statistics for the planner, and
        # the GIN index's pending entries merged (until then each search reads them all).
        with connection.cursor() as cursor:
            cursor.execute(f"VACUUM ANALYZE {LongTermMemory._meta.db_table}")


def latency(latencies: list[float], high: int = 99) -> dict[str, Any]:
    """Calls, p50 and p``high`` in milliseconds."""
    ordered = sorted(latencies)
    return {
        "calls": len(ordered),
        "p50_ms": round(percentile(ordered, 0.50) * 1000, 3),
        f"p{high}_ms": round(percentile(ordered, high / 100) * 1000, 3),
    }


def take_turns(
    operations: dict[str, Callable[[], Any]], rounds: int, high: int = 99
) -> dict[str, dict[str, Any]]:
    """Each operation once per round, in turn, after one warm-up call each; p50 and p``high``."""
    clock = time.perf_counter
    latencies: dict[str, list[float]] = {name: [] for name in operations}
    for operation in operations.values():
        operation()
    for _ in range(rounds):
        for name, operation in operations.items():
            started = clock()
            operation()
            latencies[name].append(clock() - started)
    return {name: latency(values, high) for name, values in latencies.items()}


def search_figures(rounds: int) -> dict[str, Any]:
    """The floors and each query's keyword and hybrid search, taking turns."""
    from django.db import connection

    from persistent_memory.memories import memories_for, search
    from persistent_memory.models import LongTermMemory

    service = memories_for(OWNER)
    ids = list(LongTermMemory.objects.filter(owner=OWNER).order_by("?").values_list("id", flat=True)[:100])
    some_id = itertools.cycle(ids).__next__

    def select_1() -> Any:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            return cursor.fetchone()

    operations: dict[str, Callable[[], Any]] = {SELECT_1: select_1, FLOOR: lambda: service.get(some_id())}
    found: dict[tuple[str, str], int] = {}
    for (name, text), strategy in itertools.product(QUERIES.items(), STRATEGIES):
        operations[f"{strategy}: {name}"] = lambda text=text, strategy=strategy: service.search(
            text, strategy=strategy, limit=10
        )
        found[name, strategy] = len(service.search(text, strategy=strategy, limit=10))
    timed = take_turns(operations, rounds)
    floor = timed[FLOOR]["p50_ms"]
    owned = LongTermMemory.objects.filter(owner=OWNER)
    queries: dict[str, Any] = {}
    for name, text in QUERIES.items():
        queries[name] = {"query": text, "matches": len(search.Pool(owned).keyword(text, 10**9))}
        for strategy in STRATEGIES:
            figures = timed[f"{strategy}: {name}"]
            queries[name][strategy] = {
                **figures,
                "results": found[name, strategy],
                "p50_to_floor": round(figures["p50_ms"] / floor, 1) if floor else None,
            }
    return {"floor": {SELECT_1: timed[SELECT_1], FLOOR: timed[FLOOR]}, "queries": queries}


def enrich_figures(rounds: int) -> dict[str, Any]:
    """The enrich lane with INJECT_MEMORIES off and on, asking each query in turn.

    The setting is read when the lane runs, so the two take turns a round at a time
    (each round asks every query once); the settings change is not timed."""
    from django.conf import settings
    from django.test.utils import override_settings

    from persistent_memory.conf import MemorySettings
    from persistent_memory.pipeline import MemoryFilter
    from persistent_memory.store import MemoryStore

    conf = {"BACKEND": "memory", "MIRROR_MODE": "off", "JOURNAL_DIR": False, "CONTEXT_MAX_MESSAGES": 20}
    store = MemoryStore.from_settings(MemorySettings(conf)).for_owner(OWNER)
    lanes = MemoryFilter(store)
    questions = [
        {"text": text, "metadata": {"session_id": f"chat-{n}"}} for n, text in enumerate(QUERIES.values())
    ]
    for question in questions:
        store.create_session(question["metadata"]["session_id"])
    latencies: dict[str, list[float]] = {"injection off": [], "injection on": []}
    injected: list[int] = []
    clock = time.perf_counter
    try:
        for turn in range(rounds + 1):  # the first round warms up
            for name, inject in (("injection off", False), ("injection on", True)):
                conf = {**settings.PERSISTENT_MEMORY, "INJECT_MEMORIES": inject}
                with override_settings(PERSISTENT_MEMORY=conf):
                    for question in questions:
                        started = clock()
                        enriched, _ = lanes.enrich(question)
                        elapsed = clock() - started
                        if turn:
                            latencies[name].append(elapsed)
                            if inject:
                                injected.append(len(enriched["metadata"]["memories"]))
    finally:
        store.close()
    figures: dict[str, Any] = {name: latency(values) for name, values in latencies.items()}
    off, on = figures["injection off"]["p50_ms"], figures["injection on"]["p50_ms"]
    figures["on_to_off_p50"] = round(on / off, 1) if off else None
    figures["memories_injected_per_call"] = round(sum(injected) / len(injected), 2) if injected else 0
    return figures


def extraction_figures(conversations: int, messages_each: int = 50) -> dict[str, Any]:
    """The rule-based extractor over a fixed corpus: alone, then upserting twice."""
    from persistent_memory.memories import memories_for
    from persistent_memory.memories.extraction import ExtractionReport, extract_messages
    from persistent_memory.memories.extraction.rules import extract

    corpus = [conversation(n, messages_each) for n in range(conversations)]
    messages = sum(len(thread) for thread in corpus)
    clock = time.perf_counter
    started = clock()
    candidates = sum(len(extract(thread)) for thread in corpus)
    alone = clock() - started
    memories_for(EXTRACTION_OWNER).delete_all()
    result: dict[str, Any] = {
        "conversations": conversations,
        "messages": messages,
        "rules alone": {
            "seconds": round(alone, 3),
            "candidates": candidates,
            "messages_per_s": round(messages / alone, 1),
        },
    }
    for name in ("first run (inserts)", "again (nothing changes)"):
        report = ExtractionReport()
        started = clock()
        for thread in corpus:
            report.messages += len(thread)
            extract_messages(EXTRACTION_OWNER, thread, report=report)
        seconds = clock() - started
        result[name] = {
            "seconds": round(seconds, 3),
            "candidates": report.candidates,
            "upserts": report.written,
            "refused": report.refused,
            "messages_per_s": round(report.messages / seconds, 1),
            "upserts_per_s": round(report.written / seconds, 1),
            "of_rules_alone": round(alone / seconds, 3),
            "memories_after": memories_for(EXTRACTION_OWNER).stats()["count"],
        }
    return result


def database_figures(args: argparse.Namespace) -> dict[str, Any]:
    """Every figure of one database (the worker process's)."""
    from django.db import connection

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SHOW server_version")
            server = f"PostgreSQL {cursor.fetchone()[0]}"
        else:
            cursor.execute("SELECT sqlite_version()")
            server = f"SQLite {cursor.fetchone()[0]}"
    result: dict[str, Any] = {"server": server, "counts": {}}
    seeded = 0
    for count in sorted(args.counts):
        progress(f"{server}: seeding {count:,} memories")
        started = time.perf_counter()
        seed(OWNER, seeded, count)
        seed(OTHER_OWNER, seeded // 10, count // 10, offset=50_000_000)
        seconds = time.perf_counter() - started
        seeded = count
        progress(f"{server}: {count:,} memories seeded in {seconds:.1f} s; searching")
        figures = {"seed_seconds": round(seconds, 1), **search_figures(args.rounds)}
        progress(f"{server}: {count:,} memories; the enrich lane")
        figures["enrich"] = enrich_figures(args.rounds)
        result["counts"][str(count)] = figures
    progress(f"{server}: extraction")
    result["extraction"] = extraction_figures(args.conversations)
    return result


# The parent: a worker per database, the report --------------------------------------


def _connect_admin(url: str) -> tuple[Any, str]:
    """A connection to ``url``'s server (its ``postgres`` database) and the database's name."""
    import dj_database_url
    import psycopg

    parsed = dj_database_url.parse(url)
    connection = psycopg.connect(
        host=parsed["HOST"] or None,
        port=parsed["PORT"] or None,
        user=parsed["USER"] or None,
        password=parsed["PASSWORD"] or None,
        dbname="postgres",
        connect_timeout=3,
        autocommit=True,
    )
    return connection, parsed["NAME"]


def create_postgres_database(url: str) -> str | None:
    """Create ``url``'s database; None, or why PostgreSQL cannot be used."""
    import psycopg
    from psycopg import sql

    try:
        connection, name = _connect_admin(url)
    except psycopg.OperationalError as exc:
        return f"PostgreSQL at {url} is not reachable ({str(exc).strip().splitlines()[0]})"
    with connection:
        exists = connection.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if exists:
            message = f"Database {name!r} exists: the benchmark makes its own (drop it, or --postgres)."
            raise SystemExit(message)
        connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return None


def drop_postgres_database(url: str) -> None:
    from psycopg import sql

    connection, name = _connect_admin(url)
    with connection:
        connection.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def run_worker(database_url: str, args: argparse.Namespace) -> dict[str, Any]:
    """One database's figures, measured by a process of its own."""
    with tempfile.TemporaryDirectory(prefix="pm-bench-memories-") as folder:
        output = Path(folder) / "figures.json"
        command = [sys.executable, str(Path(__file__).resolve()), "--worker", database_url]
        command += ["--worker-output", str(output), "--counts", *map(str, args.counts)]
        command += ["--rounds", str(args.rounds), "--conversations", str(args.conversations)]
        env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "REDIS_URL")}
        subprocess.run(command, cwd=BENCH, env=env, check=True)
        return json.loads(output.read_text())


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    cpu = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "")
    return {
        "cpu": cpu or platform.processor(),
        "cores": os.cpu_count(),
        "arch": platform.machine(),
        "python": platform.python_version(),
        "django": version("django"),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
    }


def markdown(headers: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + " --- |" * len(headers)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _ms(figures: dict[str, Any], ratio: bool = False) -> str:
    cell = f"{figures['p50_ms']:g} / {figures['p99_ms']:g}"
    return f"{cell} ({figures['p50_to_floor']:g}×)" if ratio and figures.get("p50_to_floor") else cell


def report(results: dict[str, Any]) -> str:
    """The tables the README shows: search, the enrich lane, extraction."""
    databases = [db for db in ("sqlite", "postgresql") if "counts" in results.get(db, {})]
    parts = [f"{results[db]['server']}" for db in databases]
    parts = ["Measured on: " + ", ".join(parts)] if parts else []
    headers = ["Search (p50 / p99 ms, × floor p50)", "memories", "matches"]
    for db in databases:
        name = "SQLite" if db == "sqlite" else "PostgreSQL"
        headers += [f"{name} keyword", f"{name} hybrid"]
    rows = []
    counts = sorted({int(c) for db in databases for c in results[db]["counts"]})
    for count in counts:
        at = [results[db]["counts"][str(count)] for db in databases]
        for floor in (FLOOR, SELECT_1):
            rows.append(
                [f"floor: {floor}", f"{count:,}", ""]
                + [_ms(figures["floor"][floor]) for figures in at for _ in STRATEGIES]
            )
        for query in QUERIES:
            matches = "/".join(str(figures["queries"][query]["matches"]) for figures in at)
            row = [query, f"{count:,}", matches]
            for figures in at:
                row += [_ms(figures["queries"][query][s], ratio=True) for s in STRATEGIES]
            rows.append(row)
    if rows:
        parts.append(markdown(headers, rows))
        parts.append("Queries: " + "; ".join(f"{name} {text!r}" for name, text in results["queries"].items()))
    enrich = [
        [
            "SQLite" if db == "sqlite" else "PostgreSQL",
            f"{int(count):,}",
            _ms(figures["enrich"]["injection off"]),
            _ms(figures["enrich"]["injection on"]),
            f"{figures['enrich']['on_to_off_p50']:g}×",
            figures["enrich"]["memories_injected_per_call"],
        ]
        for db in databases
        for count, figures in results[db]["counts"].items()
    ]
    if enrich:
        headers = ["Enrich lane (memory backend)", "memories", "injection off p50 / p99 ms"]
        headers += ["injection on p50 / p99 ms", "on / off p50", "memories injected per call"]
        parts.append(markdown(headers, enrich))
    extraction = []
    for db in databases:
        figures = results[db]["extraction"]
        alone = figures["rules alone"]
        name = "SQLite" if db == "sqlite" else "PostgreSQL"
        extraction.append(
            [f"{name}: rules alone", figures["messages"], alone["candidates"], "", alone["seconds"]]
            + [f"{alone['messages_per_s']:,.0f}", "", "100%"]
        )
        for run in ("first run (inserts)", "again (nothing changes)"):
            f = figures[run]
            extraction.append(
                [f"{name}: {run}", figures["messages"], f["candidates"], f["upserts"], f["seconds"]]
                + [f"{f['messages_per_s']:,.0f}", f"{f['upserts_per_s']:,.0f}", f"{f['of_rules_alone']:.1%}"]
            )
    if extraction:
        headers = ["Extraction (rule-based)", "messages", "candidates", "upserts", "seconds"]
        headers += ["messages/s", "upserts/s", "of rules alone"]
        parts.append(markdown(headers, extraction))
    parts += [results[db]["skipped"] for db in ("sqlite", "postgresql") if "skipped" in results.get(db, {})]
    return "\n\n".join(parts)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="memories_bench.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--counts", type=int, nargs="+", default=[10_000, 100_000], help="memories of the owner (each)"
    )
    parser.add_argument("--rounds", type=int, default=100, help="timed calls of each operation per count")
    parser.add_argument(
        "--databases", nargs="+", choices=["sqlite", "postgresql"], default=["sqlite", "postgresql"]
    )
    parser.add_argument(
        "--postgres",
        default=DEFAULT_POSTGRES,
        help=f"PostgreSQL database to create, use and drop (default: {DEFAULT_POSTGRES})",
    )
    parser.add_argument(
        "--conversations", type=int, default=40, help="conversations of 50 messages for extraction"
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=BENCH / "results" / "local" / "memories.json",
        help="where the JSON goes (default: bench/results/local/memories.json, which git ignores)",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # a database URL: measure it
    parser.add_argument("--worker-output", type=Path, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.worker:
        setup_django(args.worker)
        args.worker_output.write_text(json.dumps(database_figures(args)))
        return
    started = time.time()
    results: dict[str, Any] = {
        "machine": machine(),
        "options": {k: v for k, v in vars(args).items() if k not in ("output", "worker", "worker_output")},
        "queries": QUERIES,
    }
    for database in args.databases:
        if database == "sqlite":
            with tempfile.TemporaryDirectory(prefix="pm-bench-memories-") as folder:
                results["sqlite"] = run_worker(f"sqlite:///{folder}/bench.sqlite3", args)
            continue
        skipped = create_postgres_database(args.postgres)
        if skipped:
            progress(f"{skipped}: PostgreSQL left out.")
            results["postgresql"] = {"skipped": f"{skipped}: left out."}
            continue
        try:
            results["postgresql"] = run_worker(args.postgres, args)
        finally:
            drop_postgres_database(args.postgres)
    results["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    results["seconds"] = round(time.time() - started, 1)
    print(report(results))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nWritten to {args.output}")


if __name__ == "__main__":
    main()
