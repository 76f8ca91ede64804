"""LangGraph checkpointers side by side: one chat graph, a turn at a time.

    python bench/checkpointers.py [--duration 1] [--rounds 5] [--sizes 100 10000] [--output PATH]

The companion of bench/peers.py (its Redis server, database and our stores' defaults).
The graph is LangGraph's usual chat shape: a ``messages`` channel (``operator.add`` over a
list of ~400-character messages) and one node that appends a reply; a turn is
``graph.invoke`` of one user message on a thread that holds ``size`` messages (read the
state, run the node, write its checkpoints). Checkpointers: ours on Redis and on memory
(the defaults: journal, immediate mirror), LangGraph's ``InMemorySaver``, ``SqliteSaver``
(a file) and ``PostgresSaver`` (a database of its own on DATABASE_URL's server, else the
local one; left out when none answers).

Each round every checkpointer runs one block per size, taking turns (the order rotates
each round): at most TURNS turns or ``--duration`` seconds, on a thread filled to the
size before the block and reset after it (outside the timing), so a thread stays near
its size. Reported per size: turns/s (median over rounds), the bytes a turn adds to the
checkpointer's storage (measured in the first round), and our turns/s over each peer's
per round, median over rounds ("ours / this": above 1, ours is faster). Writes the
figures to bench/results/local/checkpointers.json (or --output) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypedDict

BENCH = Path(__file__).resolve().parent
sys.path.insert(1, str(BENCH.parent))

from local_redis import redis_url  # noqa: E402
from peers import OURS_MEMORY, OURS_REDIS, TEXT, our_store  # noqa: E402
from run import _version, machine, setup_django  # noqa: E402

#: Turns in a block at most: a thread of 100 messages ends a block with at most 2 x TURNS more.
TURNS = 50
POSTGRES = os.environ.get("DATABASE_URL", "") or "postgresql://postgres@127.0.0.1:5432/test"
PACKAGES = (
    "langgraph",
    "langgraph-checkpoint",
    "langgraph-checkpoint-sqlite",
    "langgraph-checkpoint-postgres",
)


class Chat(TypedDict):
    messages: Annotated[list[dict[str, str]], operator.add]


def reply(chat: Chat) -> dict[str, Any]:
    return {"messages": [{"role": "assistant", "content": f"{len(chat['messages'])}: {TEXT}"}]}


def chat_graph(saver: Any) -> Any:
    from langgraph.graph import END, START, StateGraph

    graph = StateGraph(Chat)
    graph.add_node("reply", reply)
    graph.add_edge(START, "reply")
    graph.add_edge("reply", END)
    return graph.compile(checkpointer=saver)


@dataclass
class Saver:
    """One checkpointer: its graph, how to empty a thread, and its bytes for a thread."""

    name: str
    graph: Any
    delete: Callable[[str], None]
    stored_bytes: Callable[[str], int]


def filled(saver: Saver, thread: str, size: int) -> dict[str, Any]:
    """Fill ``thread`` with ``size`` messages (one invoke, as a long chat leaves it); its config."""
    config = {"configurable": {"thread_id": thread}}
    saver.delete(thread)
    history = [{"role": "user" if n % 2 else "assistant", "content": f"{n}: {TEXT}"} for n in range(size - 2)]
    saver.graph.invoke({"messages": [*history, {"role": "user", "content": TEXT}]}, config)
    return config


def block(saver: Saver, config: dict[str, Any], duration: float) -> tuple[int, float]:
    """Turns until TURNS or ``duration``; (turns, seconds)."""
    message = {"messages": [{"role": "user", "content": TEXT}]}
    turns, started = 0, time.perf_counter()
    while turns < TURNS and time.perf_counter() - started < duration:
        saver.graph.invoke(message, config)
        turns += 1
    return turns, time.perf_counter() - started


# The checkpointers -------------------------------------------------------------------


def ours(name: str, store: Any) -> Saver:
    from persistent_memory.integrations.langgraph import PersistentMemorySaver, thread_session

    saver = PersistentMemorySaver(store=store)

    def stored_bytes(thread: str) -> int:
        entries = store.checkpoint_entries(thread_session(thread))
        return sum(len(name) + len(text) for name, text in entries.items())

    return Saver(name, chat_graph(saver), saver.delete_thread, stored_bytes)


def in_memory() -> Saver:
    from langgraph.checkpoint.memory import InMemorySaver

    saver = InMemorySaver()

    def stored_bytes(thread: str) -> int:
        total = sum(
            len(checkpoint[1]) + len(metadata[1])
            for by_ns in saver.storage.get(thread, {}).values()
            for checkpoint, metadata, _ in by_ns.values()
        )
        total += sum(len(value[1]) for key, value in saver.blobs.items() if key[0] == thread)
        return total + sum(
            len(write[2][1])
            for key, writes in saver.writes.items()
            if key[0] == thread
            for write in writes.values()
        )

    return Saver("LangGraph InMemorySaver", chat_graph(saver), saver.delete_thread, stored_bytes)


def sqlite_saver(folder: str, stack: ExitStack) -> Saver:
    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(os.path.join(folder, "checkpoints.sqlite3"), check_same_thread=False)
    stack.callback(conn.close)
    saver = SqliteSaver(conn)
    saver.setup()

    def stored_bytes(thread: str) -> int:
        (checkpoints,) = conn.execute(
            "SELECT COALESCE(SUM(LENGTH(checkpoint) + LENGTH(metadata)), 0) FROM checkpoints "
            "WHERE thread_id = ?",
            (thread,),
        ).fetchone()
        (writes,) = conn.execute(
            "SELECT COALESCE(SUM(LENGTH(value)), 0) FROM writes WHERE thread_id = ?", (thread,)
        ).fetchone()
        return checkpoints + writes

    return Saver("LangGraph SqliteSaver", chat_graph(saver), saver.delete_thread, stored_bytes)


def postgres_saver(stack: ExitStack, skipped: dict[str, str]) -> Saver | None:
    try:
        import psycopg
        from langgraph.checkpoint.postgres import PostgresSaver
    except ImportError as exc:
        skipped["LangGraph PostgresSaver"] = f"not installed ({exc})"
        return None
    from urllib.parse import urlsplit

    name = f"pm_bench_{uuid.uuid4().hex[:12]}"
    try:
        admin = psycopg.connect(POSTGRES, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        skipped["LangGraph PostgresSaver"] = f"no PostgreSQL ({str(exc).splitlines()[0]})"
        return None
    admin.execute(f'CREATE DATABASE "{name}"')
    stack.callback(admin.close)
    stack.callback(lambda: admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    conn = psycopg.connect(urlsplit(POSTGRES)._replace(path=f"/{name}").geturl(), autocommit=True)
    stack.callback(conn.close)
    saver = PostgresSaver(conn)
    saver.setup()

    def stored_bytes(thread: str) -> int:
        row = conn.execute(
            """SELECT
                (SELECT COALESCE(SUM(octet_length(checkpoint::text) + octet_length(metadata::text)), 0)
                 FROM checkpoints WHERE thread_id = %(t)s)
                + (SELECT COALESCE(SUM(octet_length(blob)), 0)
                   FROM checkpoint_blobs WHERE thread_id = %(t)s)
                + (SELECT COALESCE(SUM(octet_length(blob)), 0)
                   FROM checkpoint_writes WHERE thread_id = %(t)s)""",
            {"t": thread},
        )
        return row.fetchone()[0]

    return Saver("LangGraph PostgresSaver", chat_graph(saver), saver.delete_thread, stored_bytes)


@contextmanager
def savers(url: str, folder: str, skipped: dict[str, str]) -> Iterator[list[Saver]]:
    with ExitStack() as stack:
        redis_store = our_store("redis", url, folder)
        stack.callback(redis_store.close)
        memory_store = our_store("memory", url, os.path.join(folder, "journal"))
        stack.callback(memory_store.close)
        found = [ours(OURS_REDIS, redis_store), ours(OURS_MEMORY, memory_store), in_memory()]
        found.append(sqlite_saver(folder, stack))
        postgres = postgres_saver(stack, skipped)
        if postgres is not None:
            found.append(postgres)
        yield found


# The run -----------------------------------------------------------------------------


def measure(found: list[Saver], sizes: list[int], duration: float, count: int) -> dict[str, Any]:
    rates: dict[tuple[int, str], list[float]] = {(size, s.name): [] for size in sizes for s in found}
    added: dict[tuple[int, str], float] = {}
    turns = [(size, saver) for size in sizes for saver in found]
    for number in range(count):
        shift = number % len(turns)
        for size, saver in turns[shift:] + turns[:shift]:
            thread = f"bench-{size}"
            config = filled(saver, thread, size)
            block(saver, config, min(duration, 0.2))  # warm: the graph's and the saver's caches
            config = filled(saver, thread, size)
            before = saver.stored_bytes(thread) if number == 0 else 0
            done, seconds = block(saver, config, duration)
            rates[(size, saver.name)].append(done / seconds)
            if number == 0:
                added[(size, saver.name)] = (saver.stored_bytes(thread) - before) / done
            saver.delete(thread)
    results: dict[str, Any] = {}
    for (size, name), per_round in rates.items():
        entry: dict[str, Any] = {
            "turns_per_s": round(statistics.median(per_round), 1),
            "turns_per_s_rounds": [round(rate, 1) for rate in per_round],
            "bytes_per_turn": round(added[(size, name)]),
        }
        ratios = {}
        for ours_name in (OURS_REDIS, OURS_MEMORY):
            if name != ours_name:
                mine = rates[(size, ours_name)]
                ratios[ours_name] = round(
                    statistics.median(o / p for o, p in zip(mine, per_round, strict=True)), 2
                )
        entry["ours_over_this"] = ratios
        results.setdefault(str(size), {})[name] = entry
    return results


def table(results: dict[str, Any]) -> str:
    lines = [
        f"| Size | Checkpointer | turns/s | bytes a turn adds | {OURS_REDIS} ÷ this | {OURS_MEMORY} ÷ this |",
        "| ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for size, found in results.items():
        for name, entry in found.items():
            ratios = entry["ours_over_this"]
            cells = [f"{ratios[n]:.2f}" if n in ratios else "" for n in (OURS_REDIS, OURS_MEMORY)]
            lines.append(
                f"| {size} | {name} | {entry['turns_per_s']:,.0f} | {entry['bytes_per_turn']:,} "
                f"| {cells[0]} | {cells[1]} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=1.0, help="seconds per block at most")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 10_000])
    parser.add_argument("--output", type=Path, default=BENCH / "results" / "local" / "checkpointers.json")
    args = parser.parse_args()
    load_start = os.getloadavg()
    skipped: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="pm-bench-checkpointers-") as folder, redis_url() as url:
        setup_django(folder)
        with savers(url, folder, skipped) as found:
            results = measure(found, args.sizes, args.duration, args.rounds)
        about = machine(url) | {name: _version(name) for name in PACKAGES}
    report = {
        "settings": {"duration_s": args.duration, "rounds": args.rounds, "sizes": args.sizes, "turns": TURNS},
        "machine": about,
        "load_average": {"start": list(load_start), "end": list(os.getloadavg())},
        "skipped": skipped,
        "results": results,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(table(results))
    for name, why in skipped.items():
        print(f"\nNot measured: {name}: {why}")
    print(f"\nLoad average: {load_start[0]:.2f} at start, {report['load_average']['end'][0]:.2f} at end.")
    print(f"Figures written to {args.output}")


if __name__ == "__main__":
    main()
