"""Our conversations beside the libraries a project would otherwise pick, side by side.

    python bench/peers.py [--duration 1] [--rounds 5] [--sizes 100 10000] [--output PATH]

Starts a redis-server of its own (bench/local_redis.py; REDIS_URL when set) and a
temporary SQLite database (bench/run.py's ``setup_django``), fills a thread of each
size for every library, then times two operations:

* ``read``: what to send to a model now, the newest ~2,000 tokens of the thread. Ours:
  ``get_context(max_tokens=2000)`` (token counts made at write time, o200k_base). The
  Agents SDK's sessions, and ours (``PersistentMemorySession`` on the same two stores,
  the "ours: Agents SDK session" rows): ``get_items(limit=20)`` (20 messages of 400
  characters are about 2,000 tokens). LangChain: the history's ``messages``, then
  ``trim_messages`` (``strategy="last"``, ``count_tokens_approximately``, LangChain's
  cheap counter). LangGraph: ``get_tuple`` of the thread's latest checkpoint, then
  ``trim_messages`` of its ``messages`` channel alike. Django ORM: every row of the
  thread from our memory store's mirror (``MemoryMessage`` by ``seq``), then the newest
  within 2,000 tokens by their ``tokens`` column.
* ``append``: one turn, here ONE user message. Ours: ``add_messages``; the SDK's
  sessions and ours: ``add_items``; LangChain: ``add_messages([HumanMessage])``;
  LangGraph: ``put`` of a checkpoint whose ``messages`` channel holds the whole thread
  plus the message, as a graph with a messages channel writes it (the read of the state
  the graph does first is not included: it is the read above). Each call appends to the
  next of APPEND_THREADS threads of that size, so a thread grows by the calls timed
  divided by APPEND_THREADS (the JSON says by how much); LangGraph's threads do not grow
  (each put holds the filled thread plus one message), and their checkpoints are deleted
  between turns, outside the timing, to bound memory.

Libraries take turns within each of ``--rounds`` rounds, each operation of each library
running ``--duration`` seconds a turn (the order rotates each round). Reported per
operation and size: each library's ops/s (median over rounds) and p50 latency, and our
ratio to it per round, median over rounds ("ours / this": above 1, ours is faster),
for ours on Redis and ours on memory. The EVALSHA of ``return 1`` through redis-py on the
same server is one more row, for scale (its ratio: our read of the smallest size over it).
Our two Agents SDK sessions are also compared with the SDK's ``RedisSession`` and
``SQLiteSession`` the same way (JSON ``session_ratios``, a second table).

Notes for reading the figures: the SDK's sessions are async, driven by one event loop
(``asyncio.Runner``), so their figures include that loop's step (and for SQLiteSession
its worker thread hop), as an async app pays them; so do our sessions' (on Redis, their
worker thread hop too); our store's own rows are sync and called directly.
Our stores run with their defaults (the memory extraction worker on; the memory store
with its journal and immediate mirror, whose catch-up after each of its append turns is
waited for outside the timing). LangChain's ``RedisChatMessageHistory`` needs the
RediSearch and RedisJSON modules: on a redis-server without them it is left out and the
JSON says why.

Writes the figures to bench/results/local/peers.json (git ignores that folder) or
--output, and prints two markdown tables.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(1, str(ROOT))  # the project (bench/ itself is sys.path[0])

import redis  # noqa: E402
from local_redis import redis_url  # noqa: E402
from run import _version, machine, setup_django  # noqa: E402

#: About 400 characters (99 tokens with o200k_base and the message overhead).
TEXT = "Paris is mild today: 18 degrees, light wind from the west and no rain expected. " * 5
MAX_TOKENS = 2000
#: The SDK's sessions read by count: 20 messages of TEXT are about MAX_TOKENS.
READ_ITEMS = 20
#: Threads each library's appends take turns on, per size.
APPEND_THREADS = 8
BATCH = 100
READ, APPEND, FLOOR = "read", "append", "floor"
OURS_REDIS, OURS_MEMORY = "ours (Redis)", "ours (memory)"
EVALSHA = "redis-py EVALSHA (return 1)"
SESSION_REDIS, SESSION_MEMORY = "ours: Agents SDK session (Redis)", "ours: Agents SDK session (memory)"
REDIS_SESSION, SQLITE_SESSION = "RedisSession (Agents SDK)", "SQLiteSession (Agents SDK)"
PEER_PACKAGES = (
    "openai-agents",
    "langchain-core",
    "langchain-redis",
    "langgraph",
    "langgraph-checkpoint",
    "langgraph-checkpoint-sqlite",
)


@dataclass
class Library:
    """One library's timed operations on one size, and what to run between its turns."""

    name: str
    operations: dict[str, Callable[[], Any]]
    #: Run after each turn of an operation, outside the timing.
    after_turn: dict[str, Callable[[], Any]] = field(default_factory=dict)


def texts(count: int) -> Iterator[tuple[str, str]]:
    """``count`` (role, content) pairs, user and assistant alternating."""
    for n in range(count):
        yield ("user" if n % 2 == 0 else "assistant"), f"{n}: {TEXT}"


def batches(items: list[Any], size: int = BATCH) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def thread_ids(library: str, size: int) -> tuple[str, list[str]]:
    """The read thread's id and the append threads' ids of ``library`` at ``size``."""
    return f"peers-{library}-read-{size}", [
        f"peers-{library}-append-{size}-{i}" for i in range(APPEND_THREADS)
    ]


# Ours ------------------------------------------------------------------------------


def our_store(backend: str, url: str, journal_dir: str) -> Any:
    """A store with the defaults plus only what the bench needs (10,000-message threads)."""
    from persistent_memory.conf import MemorySettings
    from persistent_memory.store import MemoryStore

    conf: dict[str, Any] = {"BACKEND": backend, "MAX_MESSAGES": 20_000, "MAX_SESSION_BYTES": None}
    if backend == "redis":
        conf["REDIS_URL"] = url
    else:
        conf["JOURNAL_DIR"] = journal_dir
    return MemoryStore.from_settings(MemorySettings(conf))


def ours(name: str, store: Any, size: int, slug: str, *, mirrored: bool = False) -> Library:
    """Our store with a thread of ``size`` to read and APPEND_THREADS to append to; with
    ``mirrored``, each append turn waits (untimed) for the immediate mirror to catch up."""
    read_id, append_ids = thread_ids(slug, size)
    chat = [{"role": role, "content": content} for role, content in texts(size)]
    for session_id in [read_id, *append_ids]:
        for batch in batches(chat):
            store.add_messages(session_id, batch)
    appended = itertools.cycle(append_ids).__next__
    message = [{"role": "user", "content": TEXT}]
    library = Library(
        name,
        {
            READ: lambda: store.get_context(read_id, max_tokens=MAX_TOKENS),
            APPEND: lambda: store.add_messages(appended(), message),
        },
    )
    if mirrored:
        library.after_turn[APPEND] = lambda: wait_for_mirror(store)
    return library


def wait_for_mirror(store: Any, timeout: float = 120.0) -> None:
    """Until the memory store's mirror has written every pending session."""
    deadline = time.monotonic() + timeout
    while store.backend.dirty_count():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the mirror did not catch up within {timeout} s")
        time.sleep(0.01)


def django_orm(store: Any, size: int) -> Library:
    """The whole thread from our memory store's mirror rows, trimmed in Python."""
    from persistent_memory.conversations.messages import DEFAULT_CONVERSATION
    from persistent_memory.models import MemoryConversation, MemoryMessage
    from persistent_memory.owners import storage_id

    read_id, _ = thread_ids("memory", size)
    deadline = time.monotonic() + 300
    conversation = None
    while conversation is None or conversation.message_count < size:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the mirror did not write {read_id} within 300 s")
        time.sleep(0.05)
        wait_for_mirror(store)
        conversation = MemoryConversation.objects.filter(
            session__session_id=storage_id(store.owner, read_id), name=DEFAULT_CONVERSATION
        ).first()

    def read() -> list[dict[str, Any]]:
        rows = list(MemoryMessage.objects.filter(conversation=conversation).order_by("seq"))
        tokens, start = 0, len(rows)
        while start > 0 and tokens + rows[start - 1].tokens <= MAX_TOKENS:
            start -= 1
            tokens += rows[start].tokens
        return [row.decoded for row in rows[start:]]

    return Library("Django ORM (our mirror's rows)", {READ: read})


# The OpenAI Agents SDK -------------------------------------------------------------


def agents_sessions(
    make: Callable[[str], Any], name: str, size: int, runner: asyncio.Runner, *, slug: str | None = None
) -> Library:
    """A session class of the SDK (or ours), one session object per thread, driven by
    ``runner``; ``slug`` names its threads (default: the first word of ``name``)."""
    read_id, append_ids = thread_ids(slug or name.split()[0], size)
    sessions = {session_id: make(session_id) for session_id in [read_id, *append_ids]}
    items = [{"role": role, "content": content} for role, content in texts(size)]
    for session in sessions.values():
        for batch in batches(items):
            runner.run(session.add_items(batch))
    reader = sessions[read_id]
    appended = itertools.cycle([sessions[i] for i in append_ids]).__next__
    message = [{"role": "user", "content": TEXT}]
    return Library(
        name,
        {
            READ: lambda: runner.run(reader.get_items(limit=READ_ITEMS)),
            APPEND: lambda: runner.run(appended().add_items(message)),
        },
    )


def our_session(
    name: str, store: Any, size: int, runner: asyncio.Runner, slug: str, *, mirrored: bool = False
) -> Library:
    """``PersistentMemorySession`` on our ``store``, filled and driven as the SDK's sessions
    are; ``mirrored`` as for :func:`ours`."""
    from persistent_memory.integrations.openai_agents import PersistentMemorySession

    library = agents_sessions(
        lambda sid: PersistentMemorySession(sid, store=store), name, size, runner, slug=slug
    )
    if mirrored:
        library.after_turn[APPEND] = lambda: wait_for_mirror(store)
    return library


# LangChain and LangGraph -----------------------------------------------------------


def chat_messages(size: int) -> list[Any]:
    from langchain_core.messages import AIMessage, HumanMessage

    return [HumanMessage(content) if role == "user" else AIMessage(content) for role, content in texts(size)]


def newest(messages: list[Any]) -> list[Any]:
    """The newest messages within MAX_TOKENS, as LangChain's docs trim a history."""
    from langchain_core.messages.utils import count_tokens_approximately, trim_messages

    return trim_messages(
        messages, max_tokens=MAX_TOKENS, token_counter=count_tokens_approximately, strategy="last"
    )


def langchain_history(make: Callable[[str], Any], name: str, size: int) -> Library:
    from langchain_core.messages import HumanMessage

    read_id, append_ids = thread_ids(name.split()[1], size)
    histories = {session_id: make(session_id) for session_id in [read_id, *append_ids]}
    chat = chat_messages(size)
    for history in histories.values():
        for batch in batches(chat):
            history.add_messages(batch)
    reader = histories[read_id]
    appended = itertools.cycle([histories[i] for i in append_ids]).__next__
    message = [HumanMessage(TEXT)]
    return Library(
        name,
        {READ: lambda: newest(reader.messages), APPEND: lambda: appended().add_messages(message)},
    )


def langchain_redis_missing(url: str) -> str | None:
    """Why langchain_redis cannot run on the server at ``url`` (None: it can)."""
    client = redis.Redis.from_url(url)
    try:
        for command in (("FT._LIST",), ("JSON.GET", "peers-probe")):
            try:
                client.execute_command(*command)
            except redis.ResponseError:
                return f"the redis-server has no {command[0]} command (it needs RediSearch and RedisJSON)"
    finally:
        client.close()
    return None


def langgraph_saver(saver: Any, name: str, size: int) -> Library:
    """A checkpointer holding a thread in its ``messages`` channel, as a chat graph keeps it."""
    from langchain_core.messages import HumanMessage
    from langgraph.checkpoint.base import create_checkpoint, empty_checkpoint

    read_id, append_ids = thread_ids(name.split()[1], size)
    chat = chat_messages(size)
    steps = itertools.count(1)

    def put(thread_id: str, messages: list[Any]) -> None:
        version = saver.get_next_version(None, None)
        base = empty_checkpoint()
        base["channel_versions"] = {"messages": version}
        checkpoint = create_checkpoint(base, None, next(steps))
        checkpoint["channel_values"] = {"messages": messages}
        config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
        saver.put(config, checkpoint, {"source": "loop", "step": 1}, {"messages": version})

    put(read_id, chat)  # the whole thread in one checkpoint: how a graph leaves it
    config = {"configurable": {"thread_id": read_id}}
    appended = itertools.cycle(append_ids).__next__
    message = HumanMessage(TEXT)

    def reset() -> None:
        for thread_id in append_ids:
            saver.delete_thread(thread_id)

    return Library(
        name,
        {
            READ: lambda: newest(saver.get_tuple(config).checkpoint["channel_values"]["messages"]),
            APPEND: lambda: put(appended(), [*chat, message]),
        },
        after_turn={APPEND: reset},
    )


# Timing ----------------------------------------------------------------------------


def turn(operation: Callable[[], Any], duration: float) -> tuple[int, float, list[float]]:
    """Calls of ``operation`` back to back for ``duration`` seconds (one call at least):
    the count, the wall time and each call's latency."""
    clock = time.perf_counter
    latencies: list[float] = []
    record = latencies.append
    start = now = clock()
    deadline = start + duration
    while now < deadline or not latencies:
        before = clock()
        operation()
        now = clock()
        record(now - before)
    return len(latencies), now - start, latencies


def warm_up(operation: Callable[[], Any], budget: float = 0.2, calls: int = 50) -> None:
    start = time.perf_counter()
    for _ in range(calls):
        operation()
        if time.perf_counter() - start > budget:
            break


Key = tuple[str, int, str]  # operation, size, library


def rounds(
    libraries: dict[int, list[Library]], floor: Callable[[], Any], duration: float, count: int
) -> tuple[dict[Key, list[float]], dict[Key, list[float]], dict[Key, int]]:
    """Each operation of each library one turn a round, libraries taking turns (their
    order rotating each round): ops/s per round, all latencies, calls made."""
    turns: list[tuple[Key, Callable[[], Any], Callable[[], Any] | None]] = [
        ((FLOOR, 0, EVALSHA), floor, None)
    ]
    for size, group in libraries.items():
        for operation in (READ, APPEND):
            for library in group:
                if operation in library.operations:
                    turns.append(
                        (
                            (operation, size, library.name),
                            library.operations[operation],
                            library.after_turn.get(operation),
                        )
                    )
    for _, operation, after in turns:
        warm_up(operation)
        if after:
            after()
    per_round: dict[Key, list[float]] = {key: [] for key, _, _ in turns}
    latencies: dict[Key, list[float]] = {key: [] for key, _, _ in turns}
    calls: dict[Key, int] = dict.fromkeys(per_round, 0)
    for number in range(count):
        shift = number % len(turns)
        for key, operation, after in turns[shift:] + turns[:shift]:
            done, seconds, taken = turn(operation, duration)
            per_round[key].append(done / seconds)
            latencies[key].extend(taken)
            calls[key] += done
            if after:
                after()
    return per_round, latencies, calls


def ratio(ours_rates: list[float], rates: list[float]) -> float:
    """The median over rounds of ours / this, per round."""
    return round(statistics.median(o / p for o, p in zip(ours_rates, rates, strict=True)), 3)


def figures(
    per_round: dict[Key, list[float]], latencies: dict[Key, list[float]], calls: dict[Key, int]
) -> dict[str, Any]:
    """``{operation: {size: {library: figures}}}`` with our ratios to each library."""
    results: dict[str, Any] = {}
    for (operation, size, library), rates in per_round.items():
        entry: dict[str, Any] = {
            "ops_per_s": round(statistics.median(rates), 1),
            "ops_per_s_rounds": [round(rate, 1) for rate in rates],
            "p50_us": round(statistics.median(latencies[(operation, size, library)]) * 1e6, 1),
            "calls": calls[(operation, size, library)],
        }
        if operation == APPEND:
            entry["appended_per_thread"] = round(calls[(operation, size, library)] / APPEND_THREADS, 1)
        ratios = {}
        for ours_name in (OURS_REDIS, OURS_MEMORY):
            # The floor is compared with our read of the smallest size.
            ours_key = (READ, min(s for _, s, _ in per_round if s), ours_name) if operation == FLOOR else None
            ours_rates = per_round.get(ours_key or (operation, size, ours_name))
            if ours_rates and library != ours_name:
                ratios[ours_name] = ratio(ours_rates, rates)
        entry["ours_over_this"] = ratios
        results.setdefault(operation, {}).setdefault(str(size), {})[library] = entry
    return results


def session_ratios(per_round: dict[Key, list[float]]) -> dict[str, Any]:
    """``{operation: {size: {"<our session> / <SDK session>": ratio}}}``: each of our
    Agents SDK sessions over the SDK's RedisSession and SQLiteSession."""
    results: dict[str, Any] = {}
    for (operation, size, library), rates in per_round.items():
        if library not in (SESSION_REDIS, SESSION_MEMORY):
            continue
        for peer in (REDIS_SESSION, SQLITE_SESSION):
            peer_rates = per_round.get((operation, size, peer))
            if peer_rates:
                found = results.setdefault(operation, {}).setdefault(str(size), {})
                found[f"{library} / {peer}"] = ratio(rates, peer_rates)
    return results


def table(results: dict[str, Any]) -> str:
    lines = [
        f"| Operation | Size | Library | ops/s | p50 µs | {OURS_REDIS} ÷ this | {OURS_MEMORY} ÷ this |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    for operation, sizes in results.items():
        for size, libraries in sizes.items():
            for library, entry in libraries.items():
                ratios = entry["ours_over_this"]
                cells = [
                    f"{ratios[name]:.2f}" if name in ratios else "" for name in (OURS_REDIS, OURS_MEMORY)
                ]
                shown = "" if operation == FLOOR else size
                lines.append(
                    f"| {operation} | {shown} | {library} | {entry['ops_per_s']:,.0f} "
                    f"| {entry['p50_us']:,.1f} | {cells[0]} | {cells[1]} |"
                )
    return "\n".join(lines)


def session_table(results: dict[str, Any], ratios: dict[str, Any]) -> str:
    lines = [
        f"| Operation | Size | Our session | ops/s | ÷ {REDIS_SESSION} | ÷ {SQLITE_SESSION} |",
        "| --- | ---: | --- | ---: | ---: | ---: |",
    ]
    for operation, sizes in ratios.items():
        for size, found in sizes.items():
            for library in (SESSION_REDIS, SESSION_MEMORY):
                cells = [found.get(f"{library} / {peer}") for peer in (REDIS_SESSION, SQLITE_SESSION)]
                if cells == [None, None]:
                    continue
                shown = ["" if cell is None else f"{cell:.2f}" for cell in cells]
                ops = results[operation][size][library]["ops_per_s"]
                lines.append(f"| {operation} | {size} | {library} | {ops:,.0f} | {shown[0]} | {shown[1]} |")
    return "\n".join(lines)


# The run ---------------------------------------------------------------------------


@contextmanager
def libraries_at(
    url: str, sizes: list[int], folder: str, skipped: dict[str, str]
) -> Iterator[dict[int, list[Library]]]:
    """Every library, filled at every size; closed on exit."""
    from agents import SQLiteSession
    from agents.extensions.memory.redis_session import RedisSession
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.checkpoint.sqlite import SqliteSaver
    from redis.asyncio import Redis as AsyncRedis

    with ExitStack() as stack:
        runner = stack.enter_context(asyncio.Runner())
        redis_store = our_store("redis", url, folder)
        stack.callback(redis_store.close)
        memory_store = our_store("memory", url, os.path.join(folder, "journal"))
        stack.callback(memory_store.close)
        async_client = AsyncRedis.from_url(url)
        stack.callback(lambda: runner.run(async_client.aclose()))
        sdk_sqlite = os.path.join(folder, "agents.sqlite3")
        sdk_sessions: list[Any] = []
        stack.callback(lambda: [session.close() for session in sdk_sessions])

        def sqlite_session(session_id: str) -> Any:
            sdk_sessions.append(SQLiteSession(session_id, sdk_sqlite))
            return sdk_sessions[-1]

        graph_conn = sqlite3.connect(os.path.join(folder, "langgraph.sqlite3"), check_same_thread=False)
        stack.callback(graph_conn.close)
        sqlite_saver = SqliteSaver(graph_conn)
        sqlite_saver.setup()
        memory_saver = InMemorySaver()
        langchain_redis = None
        why = langchain_redis_missing(url)
        if why:
            skipped["LangChain RedisChatMessageHistory"] = why
        else:
            from langchain_redis import RedisChatMessageHistory

            langchain_redis = RedisChatMessageHistory

        found: dict[int, list[Library]] = {}
        for size in sizes:
            print(f"filling threads of {size} messages", file=sys.stderr)
            group = [
                ours(OURS_REDIS, redis_store, size, "redis"),
                ours(OURS_MEMORY, memory_store, size, "memory", mirrored=True),
                agents_sessions(
                    lambda sid: RedisSession(sid, redis_client=async_client), REDIS_SESSION, size, runner
                ),
                agents_sessions(sqlite_session, SQLITE_SESSION, size, runner),
                our_session(SESSION_REDIS, redis_store, size, runner, "session-redis"),
                our_session(SESSION_MEMORY, memory_store, size, runner, "session-memory", mirrored=True),
            ]
            if langchain_redis is not None:
                group.append(
                    langchain_history(
                        lambda sid: langchain_redis(session_id=sid, redis_url=url),
                        "LangChain RedisChatMessageHistory",
                        size,
                    )
                )
            group += [
                langgraph_saver(memory_saver, "LangGraph InMemorySaver", size),
                langgraph_saver(sqlite_saver, "LangGraph SqliteSaver", size),
                django_orm(memory_store, size),
            ]
            found[size] = group
        yield found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--duration", type=float, default=1.0, help="seconds per operation per library per round"
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 10_000])
    parser.add_argument("--output", type=Path, default=BENCH / "results" / "local" / "peers.json")
    args = parser.parse_args()

    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="pm-bench-peers-") as folder, redis_url() as url:
        setup_django(folder)
        skipped: dict[str, str] = {}
        client = redis.Redis.from_url(url)
        floor_sha = client.script_load("return 1")
        try:
            with libraries_at(url, args.sizes, folder, skipped) as libraries:
                per_round, latencies, calls = rounds(
                    libraries, lambda: client.evalsha(floor_sha, 0), args.duration, args.rounds
                )
        finally:
            client.close()
        about = machine(url) | {name: _version(name) for name in PEER_PACKAGES}
    results = {
        "settings": {
            "duration_s": args.duration,
            "rounds": args.rounds,
            "sizes": args.sizes,
            "message_chars": len(TEXT),
            "max_tokens": MAX_TOKENS,
            "read_items": READ_ITEMS,
            "append_threads": APPEND_THREADS,
            "append": "one user message",
        },
        "machine": about,
        "load_average": {"start": list(load_start), "end": list(os.getloadavg())},
        "skipped": skipped,
        "results": figures(per_round, latencies, calls),
        "session_ratios": session_ratios(per_round),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    print(table(results["results"]))
    print()
    print(session_table(results["results"], results["session_ratios"]))
    for library, why in skipped.items():
        print(f"\nNot measured: {library}: {why}")
    print(f"\nLoad average: {load_start[0]:.2f} at start, {results['load_average']['end'][0]:.2f} at end.")
    print(f"Figures written to {args.output}")


if __name__ == "__main__":
    main()
