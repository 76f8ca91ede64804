"""Benchmark of searching what was said (issue 41): the mirror's message rows at scale.

    python bench/message_search_bench.py [--sqlite-counts 6000 100000]
                                         [--postgres-counts 6000 1000000]
                                         [--databases sqlite postgresql] [--postgres URL]
                                         [--rounds 50] [--output PATH]

Each database is measured in a process of its own, as bench/memories_bench.py does: a
temporary SQLite file with the demo site's settings (WAL), and PostgreSQL at --postgres
in a database the benchmark creates and drops (it refuses one that exists; when
PostgreSQL does not answer, it is left out with a note).

At each count (ascending; the tables grow in place) one owner holds that many messages,
written straight into the mirror's tables (MemorySession, MemoryConversation and
MemoryMessage rows, the columns a sync fills; the store never holds them, so the worker
makes its store first and nothing restores them into it): sessions of 20 to 200
messages, said in time order, each a two-person chat whose turns are the sentences of
bench/recall_corpus.py recombined (one turn, sometimes two), the speakers' names on the
rows; a word in one message of 250 ("xylophone") and one of 2,500 ("Quillon") for rare
matches. One session in twenty has expired and one in forty was deleted (the search
must pass them over), and three other owners hold a tenth as many messages with the
same words. The owner also has --memories long-term memories (bench/memories_corpus.py),
since the default search looks through both kinds. On SQLite the FTS5 table follows
through migration 0016's triggers; on PostgreSQL the rows are COPYed, the GIN index
rebuilt after the load, and the tables analyzed (what autovacuum does a little later).

It then times, taking turns call by call, ``memories_for(owner).search(query)`` with
the default settings (hybrid, no embedder, both kinds, limit 10) and with
``strategy="keyword"``, for each of QUERIES; ``message_search.catch_up()`` alone (the
mirror sync a search runs first: nothing is dirty here, so it is the floor every search
pays), and again right after a turn is written through the store. Prints p50 / p95 in
ms with the matching messages' count, and writes every figure as JSON to
bench/results/local/message-search.json (git ignores bench/results/local/) or --output.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(1, str(BENCH.parent))  # the project (bench/ itself is sys.path[0])

from memories_bench import (  # noqa: E402
    create_postgres_database,
    drop_postgres_database,
    latency,
    machine,
    markdown,
    progress,
    setup_django,
    take_turns,
)
from memories_bench import seed as seed_memories  # noqa: E402
from recall_corpus import CONVERSATIONS  # noqa: E402

OWNER = "user:bench"
LIVE_OWNER = "user:bench-live"
OTHER_OWNERS = ("user:bench-other-1", "user:bench-other-2", "user:bench-other-3")
STRATEGIES = ("hybrid", "keyword")
CATCH_UP = "catch_up() alone"
AFTER_A_TURN = "catch_up() after a turn"
SPACING = timedelta(seconds=30)
DEFAULT_POSTGRES = "postgres://postgres@127.0.0.1:5432/pm_bench_messages"
#: From no match to words in many messages; "xylophone" is in one message of 250,
#: "Quillon" in one of 2,500 (see :func:`text`).
QUERIES = {
    "no match": "harpsichords",
    "very rare word": "Quillon",
    "rare word": "Who had xylophone lessons?",
    "a speaker's name": "Priya",
    "common word": "week",
    "question": "How was the studio deadline last week?",
    "broad question": "What did you do at the weekend with the kids and the dog?",
}
#: The turns of the recall corpus: (speaker, text).
TURNS = [
    (speaker, said) for c in CONVERSATIONS.values() for _, turns in c.sessions for _, speaker, said in turns
]
PAIRS = [c.speakers for c in CONVERSATIONS.values()]
MESSAGE_COLUMNS = (
    "conversation_id",
    "message_id",
    "parent_id",
    "seq",
    "role",
    "content_text",
    "name",
    "tool_call_id",
    "tokens",
    "tokenizer",
    "created_at",
    "stored",
    "digest",
)


# The worker: one database, in its own process ----------------------------------------


def text(n: int, rng: random.Random) -> str:
    """The n-th message's text: a turn of the corpus, sometimes two."""
    said = rng.choice(TURNS)[1]
    if rng.random() < 0.3:
        said += " " + rng.choice(TURNS)[1]
    if n % 250 == 100:
        said += " My niece started xylophone lessons, the whole flat rings."
    if n % 2_500 == 7:
        said += " The heron on the canal is back; we call him Quillon."
    return said


def sessions(owner: str, start: int, stop: int, seed: int) -> Iterator[tuple[int, int]]:
    """Sessions of 20 to 200 messages covering messages ``start`` to ``stop``: (first, count)."""
    rng = random.Random(seed * 1_000_003 + start)  # noqa: S311 - test data
    first = start
    while first < stop:
        count = min(stop - first, rng.randint(20, 200))
        yield first, count
        first += count


def seed(owner: str, start: int, stop: int, *, seed: int = 0) -> None:
    """Messages ``start`` to ``stop`` of ``owner``, in sessions of their own, written in
    bulk into the mirror's tables."""
    from django.db import transaction
    from django.utils import timezone

    from persistent_memory.models import MemoryConversation, MemoryMessage, MemorySession

    now = timezone.now()
    # Said in order, 30 s apart, from a year ago (a million messages reach the present):
    # the mirror inserts messages as they are said, so the table is in time order.
    origin = now.replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=365)
    for first, count in _batched(sessions(owner, start, stop, seed), 20_000):
        sessions_made, rows = [], []
        for at, size in zip(first, count, strict=True):
            rng = random.Random(f"{owner}:{at}")  # noqa: S311 - test data
            began = origin + at * SPACING
            state, expires = MemorySession.State.LIVE, None
            if rng.random() < 0.05:
                expires = now - timedelta(days=1)  # expired, not swept yet
            elif rng.random() < 0.025:
                state = MemorySession.State.DELETED
            sessions_made.append(
                (
                    MemorySession(
                        owner=owner,
                        session_id=f"chat-{seed}-{at}",
                        state=state,
                        created_at=began,
                        expires_at=expires,
                        last_activity=began + size * SPACING,
                        history_length=size,
                    ),
                    at,
                    size,
                    rng,
                    began,
                )
            )
        with transaction.atomic():
            MemorySession.objects.bulk_create([s for s, *_ in sessions_made])
            conversations = MemoryConversation.objects.bulk_create(
                [
                    MemoryConversation(session=s, name="default", seq=size, message_count=size)
                    for s, _, size, *_ in sessions_made
                ]
            )
            for conversation, (_, at, size, rng, began) in zip(conversations, sessions_made, strict=True):
                speakers = rng.choice(PAIRS)
                for i in range(size):
                    said = text(at + i, rng)
                    role = "user" if i % 2 == 0 else "assistant"
                    message_id = f"m{at + i}"
                    stored = json.dumps(
                        {"id": message_id, "role": role, "content": said, "name": speakers[i % 2]}
                    )
                    rows.append(
                        (
                            conversation.pk,
                            message_id,
                            f"m{at + i - 1}" if i else "",
                            i + 1,
                            role,
                            said,
                            speakers[i % 2],
                            "",
                            len(said) // 4,
                            "",
                            began + i * SPACING,
                            stored,
                            hashlib.md5(stored.encode()).hexdigest(),  # noqa: S324 - a row digest
                        )
                    )
            _insert(MemoryMessage._meta.db_table, rows)


def _batched(found: Iterator[tuple[int, int]], messages: int) -> Iterator[tuple[list[int], list[int]]]:
    """Sessions in groups of about ``messages`` messages: (firsts, counts)."""
    firsts: list[int] = []
    counts: list[int] = []
    for first, count in found:
        firsts.append(first)
        counts.append(count)
        if sum(counts) >= messages:
            yield firsts, counts
            firsts, counts = [], []
    if firsts:
        yield firsts, counts


def _insert(table: str, rows: list[tuple[Any, ...]]) -> None:
    """Rows into ``table``: COPY on PostgreSQL, one executemany elsewhere."""
    from django.db import connection

    columns = ", ".join(MESSAGE_COLUMNS)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            with cursor.cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
                for row in rows:
                    copy.write_row(row)
        else:
            marks = ", ".join(["%s"] * len(MESSAGE_COLUMNS))
            cursor.executemany(f"INSERT INTO {table} ({columns}) VALUES ({marks})", rows)  # noqa: S608 - constants


def load(owner_messages: int, already: int, memories: int) -> float:
    """Grow the owner to ``owner_messages`` messages (others to a tenth as many, split
    among them); seconds taken."""
    from django.db import connection

    from persistent_memory.models import MemoryMessage

    started = time.perf_counter()
    postgresql = connection.vendor == "postgresql"
    table = MemoryMessage._meta.db_table
    if postgresql:  # a GIN index is built faster at once than row by row
        with connection.cursor() as cursor:
            cursor.execute("DROP INDEX IF EXISTS pm_message_search_tsv")
    seed(OWNER, already, owner_messages)
    for number, other in enumerate(OTHER_OWNERS, start=1):
        share = len(OTHER_OWNERS) * 10
        seed(other, already // share, owner_messages // share, seed=number)
    if already == 0 and memories:
        seed_memories(OWNER, 0, memories)
    if postgresql:
        with connection.cursor() as cursor:
            cursor.execute(f"CREATE INDEX pm_message_search_tsv ON {table} USING GIN (search_tsv)")
            cursor.execute("VACUUM ANALYZE")
    else:
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    return time.perf_counter() - started


def search_figures(rounds: int) -> dict[str, Any]:
    """catch_up() alone, and each query's search with each strategy, taking turns."""
    from persistent_memory.memories import memories_for, message_search
    from persistent_memory.memories.search import query_words

    service = memories_for(OWNER)
    operations: dict[str, Callable[[], Any]] = {CATCH_UP: message_search.catch_up}
    for name, query in QUERIES.items():
        for strategy in STRATEGIES:
            operations[f"{strategy}: {name}"] = lambda q=query, s=strategy: service.search(q, strategy=s)
    timed = take_turns(operations, rounds, high=95)
    timed[AFTER_A_TURN] = catch_up_after_a_turn(rounds)
    queries: dict[str, Any] = {}
    for name, query in QUERIES.items():
        owned = message_search.rows(OWNER)
        matches = len(message_search.keyword(owned, query_words(query), 10**9))
        queries[name] = {"query": query, "matching_messages": matches}
        for strategy in STRATEGIES:
            found = service.search(query, strategy=strategy)
            queries[name][strategy] = {
                **timed[f"{strategy}: {name}"],
                "results": len(found),
                "messages": sum(item["kind"] == "message" for item in found),
                "foreign": sum(item.get("owner", OWNER) != OWNER for item in found),
            }
    return {"catch_up": timed[CATCH_UP], "catch_up_after_a_turn": timed[AFTER_A_TURN], "queries": queries}


def catch_up_after_a_turn(rounds: int) -> dict[str, Any]:
    """``catch_up()`` right after a turn (a question and its answer) is written through
    the store: what a search asked just after pays when the mirror's own worker (the
    memory backend's default, "immediate") has not synced that session yet."""
    from persistent_memory.memories import message_search
    from persistent_memory.store import get_store

    # Another owner's session: the catch-up syncs whatever is dirty, and the owner's
    # messages stay the count measured.
    store = get_store().for_owner(LIVE_OWNER)
    clock = time.perf_counter
    latencies = []
    for n in range(rounds + 1):  # the first creates the session
        turn = [
            {"role": "user", "content": f"Turn {n}: did the xylophone lessons go well this week?"},
            {"role": "assistant", "content": "They did; the teacher moved them to Thursdays."},
        ]
        store.add_messages("bench-live", turn)
        started = clock()
        message_search.catch_up()
        if n:
            latencies.append(clock() - started)
    return latency(latencies, high=95)


def database_figures(counts: list[int], rounds: int, memories: int) -> dict[str, Any]:
    """Every figure of one database (the worker process's)."""
    from django.db import connection

    from persistent_memory.models import MemoryMessage

    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SHOW server_version")
            server = f"PostgreSQL {cursor.fetchone()[0]}"
        else:
            cursor.execute("SELECT sqlite_version()")
            server = f"SQLite {cursor.fetchone()[0]}"
    result: dict[str, Any] = {"server": server, "counts": {}}
    seeded = 0
    for count in sorted(counts):
        progress(f"{server}: seeding {count:,} messages")
        seconds = load(count, seeded, memories)
        seeded = count
        total = MemoryMessage.objects.exclude(conversation__session__owner=LIVE_OWNER).count()
        owned = MemoryMessage.objects.filter(conversation__session__owner=OWNER).count()
        progress(
            f"{server}: {owned:,} messages of the owner ({total:,} in all) in {seconds:.1f} s; searching"
        )
        result["counts"][str(count)] = {
            "seed_seconds": round(seconds, 1),
            "messages_of_owner": owned,
            "messages_in_all": total,
            **search_figures(rounds),
        }
    return result


# The parent: a worker per database, the report --------------------------------------


def run_worker(database_url: str, counts: list[int], args: argparse.Namespace) -> dict[str, Any]:
    """One database's figures, measured by a process of its own."""
    with tempfile.TemporaryDirectory(prefix="pm-bench-messages-") as folder:
        output = Path(folder) / "figures.json"
        command = [sys.executable, str(Path(__file__).resolve()), "--worker", database_url]
        command += ["--worker-output", str(output), "--worker-counts", *map(str, counts)]
        command += ["--rounds", str(args.rounds), "--memories", str(args.memories)]
        env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "REDIS_URL")}
        env["MEMORY_JOURNAL_DIR"] = "off"  # the bench process's store holds nothing to keep
        subprocess.run(command, cwd=BENCH, env=env, check=True)
        return json.loads(output.read_text())


def report(results: dict[str, Any]) -> str:
    """One table per database: p50 / p95 ms of each query and strategy."""
    parts = []
    for db in ("sqlite", "postgresql"):
        figures = results.get(db, {})
        if "skipped" in figures:
            parts.append(figures["skipped"])
        if "counts" not in figures:
            continue
        headers = [f"{figures['server']}: p50 / p95 ms", "messages of the owner", "matching"]
        headers += [f"{strategy} (default)" if strategy == "hybrid" else strategy for strategy in STRATEGIES]
        rows = []
        for at in figures["counts"].values():
            owned = f"{at['messages_of_owner']:,}"
            rows.append([CATCH_UP, owned, "", _ms(at["catch_up"]), ""])
            rows.append([AFTER_A_TURN, owned, "", _ms(at["catch_up_after_a_turn"]), ""])
            for name, query in at["queries"].items():
                rows.append(
                    [name, owned, f"{query['matching_messages']:,}"] + [_ms(query[s]) for s in STRATEGIES]
                )
        parts.append(markdown(headers, rows))
    parts.append("Queries: " + "; ".join(f"{name} {text!r}" for name, text in QUERIES.items()))
    return "\n\n".join(parts)


def _ms(figures: dict[str, Any]) -> str:
    return f"{figures['p50_ms']:g} / {figures['p95_ms']:g}"


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="message_search_bench.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--sqlite-counts", type=int, nargs="+", default=[6_000, 100_000])
    parser.add_argument("--postgres-counts", type=int, nargs="+", default=[6_000, 1_000_000])
    parser.add_argument("--rounds", type=int, default=50, help="timed calls of each operation per count")
    parser.add_argument("--memories", type=int, default=1_000, help="long-term memories of the owner")
    parser.add_argument(
        "--databases", nargs="+", choices=["sqlite", "postgresql"], default=["sqlite", "postgresql"]
    )
    parser.add_argument(
        "--postgres",
        default=DEFAULT_POSTGRES,
        help=f"PostgreSQL database to create, use and drop (default: {DEFAULT_POSTGRES})",
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=BENCH / "results" / "local" / "message-search.json",
        help="where the JSON goes (default: bench/results/local/message-search.json, which git ignores)",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # a database URL: measure it
    parser.add_argument("--worker-counts", type=int, nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--worker-output", type=Path, help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.worker:
        setup_django(args.worker)
        # The store first: the memory backend restores sessions from an empty mirror, not
        # from the rows written below (a restart's cost, not a search's).
        from persistent_memory.store import get_store

        get_store()
        figures = database_figures(args.worker_counts, args.rounds, args.memories)
        args.worker_output.write_text(json.dumps(figures))
        return
    started = time.time()
    results: dict[str, Any] = {
        "machine": machine(),
        "options": {k: v for k, v in vars(args).items() if not k.startswith("worker") and k != "output"},
        "queries": QUERIES,
    }
    for database in args.databases:
        if database == "sqlite":
            with tempfile.TemporaryDirectory(prefix="pm-bench-messages-") as folder:
                results["sqlite"] = run_worker(f"sqlite:///{folder}/bench.sqlite3", args.sqlite_counts, args)
            continue
        skipped = create_postgres_database(args.postgres)
        if skipped:
            progress(f"{skipped}: PostgreSQL left out.")
            results["postgresql"] = {"skipped": f"{skipped}: left out."}
            continue
        try:
            results["postgresql"] = run_worker(args.postgres, args.postgres_counts, args)
        finally:
            drop_postgres_database(args.postgres)
    results["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    results["seconds"] = round(time.time() - started, 1)
    print(report(results))
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"\nWritten to {args.output}")


if __name__ == "__main__":
    main()
