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

* ``turn``: ours on Redis only, a pipeline item (a question through the enrich lane, its
  answer through the store lane, bench/store_bench.py's turn) on sessions of 10 values
  and 120 messages: with the default settings (window 100, recording and the extraction
  worker on) first, then at a window of 20, then with recording and extraction off
  (JSON ``turn_ratios``: the first two over the last).

Libraries take turns within each of ``--rounds`` rounds, each operation of each library
running ``--duration`` seconds a turn (the order rotates each round). Reported per
operation and size: each library's ops/s (median over rounds) and p50 latency, and our
ratio to it per round, median over rounds ("ours / this": above 1, ours is faster),
for ours on Redis and ours on memory. The EVALSHA of ``return 1`` through redis-py on the
same server is one more row, for scale (its ratio: our read of the smallest size over it).
Our two Agents SDK sessions are also compared with the SDK's ``RedisSession`` and
``SQLiteSession`` the same way (JSON ``session_ratios``, a second table).

How each is called, as the JSON's ``variant`` labels it: async libraries (the SDK's
sessions, and ours behind the SDK's protocol) are awaited as an async app awaits them,
inside one running event loop: a turn is one batch of awaited calls, timed call by call
inside the loop, so entering the loop is paid once a turn and charged to no call. Sync
libraries (our store, LangGraph's savers, the ORM) are called as sync code, with no loop
running. Our stores run with their defaults (window 100, the memory extraction worker
on; the memory store with its journal and immediate mirror, whose catch-up after each of
its append turns is waited for outside the timing). The extraction worker's work is
charged to the turn whose calls queued it: a turn's time ends when the worker is idle
again (in the same process, it would otherwise slow whichever library came next).

Redis time, CPU and commands per call: after the rounds, each operation on the bench's
Redis runs ``--counted`` more calls, untimed, between two readings of ``INFO commandstats``
and ``INFO cpu`` (bench/server_time.py: the commands scripts call are counted as commands,
and their time once, inside their script's), the extraction worker's calls for them included.
LangChain's ``RedisChatMessageHistory`` needs the RediSearch and RedisJSON modules: on a
redis-server without them it is left out and the JSON says why.

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
from collections.abc import Awaitable, Callable, Iterator
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
from server_time import server_cost  # noqa: E402
from store_bench import BARE  # noqa: E402
from store_bench import TURN as LANE_TURN  # noqa: E402
from store_bench import turn as lane_turn  # noqa: E402

#: About 400 characters (99 tokens with o200k_base and the message overhead).
TEXT = "Paris is mild today: 18 degrees, light wind from the west and no rain expected. " * 5
MAX_TOKENS = 2000
#: The SDK's sessions read by count: 20 messages of TEXT are about MAX_TOKENS.
READ_ITEMS = 20
#: Threads each library's appends take turns on, per size.
APPEND_THREADS = 8
BATCH = 100
READ, APPEND, FLOOR, TURN = "read", "append", "floor", "turn"
OURS_REDIS, OURS_MEMORY = "ours (Redis)", "ours (memory)"
#: The default turn and its variants (the TURN operation), ours on Redis only.
TURN_DEFAULT = f"ours (Redis): {LANE_TURN}, default settings"
TURN_WINDOW_20 = f"ours (Redis): {LANE_TURN}, window 20"
TURN_BARE = f"ours (Redis): {LANE_TURN}, {BARE}"
#: Sessions the turns cycle through, each holding this many messages before the timing
#: (so the default window of 100 is full).
TURN_SESSIONS, TURN_FILL = 20, 120
SYNC, AWAITED = "sync", "async, awaited in one running loop"
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
    #: Sync calls, or (``awaited``) functions returning what to await.
    operations: dict[str, Callable[[], Any]]
    #: Run after each turn of an operation, outside the timing.
    after_turn: dict[str, Callable[[], Any]] = field(default_factory=dict)
    #: Whether the operations are awaited (in one running loop) rather than called.
    awaited: bool = False
    #: The server's client when the library stores on the bench's Redis: its Redis time
    #: and commands per operation are then counted too.
    redis: redis.Redis | None = None
    #: Waits for the background work an operation causes (counted as the operation's).
    settle: Callable[[], Any] = lambda: None
    #: What this variant is, beyond its name (window, recording, workers).
    variant: str = ""


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


def our_store(backend: str, url: str, journal_dir: str, **extra: Any) -> Any:
    """A store with the defaults plus only what the bench needs (10,000-message threads)
    and ``extra``."""
    from persistent_memory.conf import MemorySettings
    from persistent_memory.store import MemoryStore

    conf: dict[str, Any] = {"BACKEND": backend, "MAX_MESSAGES": 20_000, "MAX_SESSION_BYTES": None, **extra}
    if backend == "redis":
        conf["REDIS_URL"] = url
    else:
        conf["JOURNAL_DIR"] = journal_dir
    return described(MemoryStore.from_settings(MemorySettings(conf)), **extra)


def described(store: Any, **extra: Any) -> Any:
    """``store``, labelled with the settings that shape a variant's cost (``extra``: those
    the bench set, the defaults otherwise), as the JSON shows them."""
    from persistent_memory.conf import MemorySettings

    conf = MemorySettings(extra)
    store.bench_variant = (
        f"window {conf.CONTEXT_MAX_MESSAGES}, recording {'on' if conf.RECORD_CONVERSATION else 'off'}, "
        f"extraction worker {'on' if conf.MEMORY_EXTRACTION_WORKER else 'off'}"
    )
    return store


def settled(store: Any) -> Callable[[], Any]:
    """Waits until the store's extraction worker has done what the calls so far asked."""
    return lambda: store.extraction_worker.wait_idle(30)


def ours(
    name: str, store: Any, size: int, slug: str, *, mirrored: bool = False, client: redis.Redis | None = None
) -> Library:
    """Our store with a thread of ``size`` to read and APPEND_THREADS to append to; with
    ``mirrored``, each append turn waits (untimed) for the immediate mirror to catch up;
    ``client``: the store's Redis server, to count its time."""
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
        redis=client,
        settle=settled(store),
        variant=f"{SYNC}; {store.bench_variant}",
    )
    if mirrored:
        library.after_turn[APPEND] = lambda: wait_for_mirror(store)
    return library


def turns(name: str, slug: str, store: Any, client: redis.Redis) -> Library:
    """A pipeline item a turn (a question through the enrich lane, its answer through the
    store lane, as bench/store_bench.py times it) on TURN_SESSIONS sessions of 10 values
    and TURN_FILL messages each."""
    session_ids = [f"peers-turn-{slug}-{n}" for n in range(TURN_SESSIONS)]
    chat = [{"role": role, "content": content} for role, content in texts(TURN_FILL)]
    for session_id in session_ids:
        store.create_session(session_id)
        for key in range(10):
            store.put(session_id, f"k{key}", {"text": TEXT[:80], "n": key})
        for batch in batches(chat):
            store.add_messages(session_id, batch)
    return Library(
        name,
        {TURN: lane_turn(store, session_ids)},
        redis=client,
        settle=settled(store),
        variant=f"{SYNC}; {store.bench_variant}",
    )


def wait_for_mirror(store: Any, timeout: float = 120.0) -> None:
    """Until the memory store's mirror has written every pending session."""
    deadline = time.monotonic() + timeout
    while store.backend.dirty_count():
        if time.monotonic() > deadline:
            raise TimeoutError(f"the mirror did not catch up within {timeout} s")
        time.sleep(0.01)


def django_orm(store: Any, size: int) -> Library:
    """The whole thread from our memory store's mirror rows, trimmed in Python."""
    from persistent_memory.chat.messages import DEFAULT_CONVERSATION
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

    return Library("Django ORM (our mirror's rows)", {READ: read}, variant=SYNC)


# The OpenAI Agents SDK -------------------------------------------------------------


def agents_sessions(
    make: Callable[[str], Any],
    name: str,
    size: int,
    runner: asyncio.Runner,
    *,
    slug: str | None = None,
    client: redis.Redis | None = None,
) -> Library:
    """A session class of the SDK (or ours), one session object per thread, its calls
    awaited in ``runner``'s loop; ``slug`` names its threads (default: the first word of
    ``name``); ``client``: the Redis server it stores on, to count its time."""
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
            READ: lambda: reader.get_items(limit=READ_ITEMS),
            APPEND: lambda: appended().add_items(message),
        },
        awaited=True,
        redis=client,
        variant=AWAITED,
    )


def our_session(
    name: str,
    store: Any,
    size: int,
    runner: asyncio.Runner,
    slug: str,
    *,
    mirrored: bool = False,
    client: redis.Redis | None = None,
) -> Library:
    """``PersistentMemorySession`` on our ``store``, filled and driven as the SDK's sessions
    are; ``mirrored`` and ``client`` as for :func:`ours`."""
    from persistent_memory.integrations.openai_agents import PersistentMemorySession

    library = agents_sessions(
        lambda sid: PersistentMemorySession(sid, store=store), name, size, runner, slug=slug, client=client
    )
    library.settle = settled(store)
    library.variant = f"{AWAITED}; {store.bench_variant}"
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


def langchain_history(make: Callable[[str], Any], name: str, size: int, client: redis.Redis) -> Library:
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
        redis=client,
        variant=SYNC,
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
        variant=SYNC,
    )


# Timing ----------------------------------------------------------------------------


Timing = tuple[int, float, list[float]]  # calls, wall seconds, each call's latency


def timed_turn(operation: Callable[[], Any], duration: float) -> Timing:
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


async def awaited_turn(operation: Callable[[], Awaitable[Any]], duration: float) -> Timing:
    """:func:`timed_turn` for an async operation: its calls awaited back to back in the
    running loop, as an async app awaits them (the clock starts inside the loop, so
    entering it is not charged to the calls)."""
    clock = time.perf_counter
    latencies: list[float] = []
    record = latencies.append
    start = now = clock()
    deadline = start + duration
    while now < deadline or not latencies:
        before = clock()
        await operation()
        now = clock()
        record(now - before)
    return len(latencies), now - start, latencies


def timer(library: Library, runner: asyncio.Runner) -> Callable[[Callable[[], Any], float], Timing]:
    """How ``library``'s operations are timed: sync calls as they are, awaited ones in a
    batch per slice, ``runner``'s loop entered once for the whole slice."""
    if library.awaited:
        return lambda operation, duration: runner.run(awaited_turn(operation, duration))
    return timed_turn


Key = tuple[str, int, str]  # operation, size, library
#: Each operation a library can have, in the order they take turns.
OPERATIONS = (READ, APPEND, TURN)


@dataclass
class Slot:
    """One library's operation as the rounds time it."""

    key: Key
    operation: Callable[[], Any]
    time: Callable[[Callable[[], Any], float], Timing]
    after: Callable[[], Any] | None
    library: Library | None = None

    def run(self, duration: float) -> Timing:
        """One turn: the calls, then (inside the turn's time, outside any call's latency)
        the background work they left, such as the extraction worker's, so that it is
        charged to the calls that caused it rather than to the next library's turn."""
        done, seconds, latencies = self.time(self.operation, duration)
        if self.library is not None:
            start = time.perf_counter()
            self.library.settle()
            seconds += time.perf_counter() - start
        return done, seconds, latencies


def rounds(
    libraries: dict[int, list[Library]],
    floor: Callable[[], Any],
    duration: float,
    count: int,
    runner: asyncio.Runner,
) -> tuple[dict[Key, list[float]], dict[Key, list[float]], dict[Key, int], list[Slot]]:
    """Each operation of each library one turn a round, libraries taking turns (their
    order rotating each round): ops/s per round, all latencies, calls made, the slots."""
    slots = [Slot((FLOOR, 0, EVALSHA), floor, timed_turn, None)]
    for size, group in libraries.items():
        for operation in OPERATIONS:
            for library in group:
                if operation in library.operations:
                    slots.append(
                        Slot(
                            (operation, size, library.name),
                            library.operations[operation],
                            timer(library, runner),
                            library.after_turn.get(operation),
                            library,
                        )
                    )
    for slot in slots:  # warm up
        slot.run(min(duration, 0.2))
        if slot.after:
            slot.after()
    per_round: dict[Key, list[float]] = {slot.key: [] for slot in slots}
    latencies: dict[Key, list[float]] = {slot.key: [] for slot in slots}
    calls: dict[Key, int] = dict.fromkeys(per_round, 0)
    for number in range(count):
        shift = number % len(slots)
        for slot in slots[shift:] + slots[:shift]:
            done, seconds, taken = slot.run(duration)
            per_round[slot.key].append(done / seconds)
            latencies[slot.key].extend(taken)
            calls[slot.key] += done
            if slot.after:
                slot.after()
    return per_round, latencies, calls, slots


def server_costs(
    slots: list[Slot], client: redis.Redis, runner: asyncio.Runner, count: int
) -> dict[Key, dict[str, float]]:
    """Redis time and commands per call of every operation stored on the bench's Redis,
    each counted over ``count`` calls of its own (untimed, after the rounds)."""
    costs: dict[Key, dict[str, float]] = {}
    for slot in slots:
        library = slot.library
        if library is None:  # the floor
            costs[slot.key] = server_cost([client], slot.operation, count)
        elif library.redis is not None:
            operation = slot.operation
            if library.awaited:
                operation = lambda awaited=operation: runner.run(awaited())  # noqa: E731
            costs[slot.key] = server_cost([library.redis], operation, count, library.settle)
        if slot.after:
            slot.after()
    return costs


def ratio(ours_rates: list[float], rates: list[float]) -> float:
    """The median over rounds of ours / this, per round."""
    return round(statistics.median(o / p for o, p in zip(ours_rates, rates, strict=True)), 3)


def figures(
    per_round: dict[Key, list[float]],
    latencies: dict[Key, list[float]],
    calls: dict[Key, int],
    costs: dict[Key, dict[str, float]],
    variants: dict[str, str],
) -> dict[str, Any]:
    """``{operation: {size: {library: figures}}}`` with our ratios to each library, and
    Redis time and commands per call for those on Redis."""
    results: dict[str, Any] = {}
    speeds = p50_speeds(latencies)
    for (operation, size, library), rates in per_round.items():
        entry: dict[str, Any] = {
            "variant": variants.get(library, SYNC),
            "ops_per_s": round(statistics.median(rates), 1),
            "ops_per_s_rounds": [round(rate, 1) for rate in rates],
            "p50_us": round(statistics.median(latencies[(operation, size, library)]) * 1e6, 1),
            "calls": calls[(operation, size, library)],
            **costs.get((operation, size, library), {}),
        }
        if operation == APPEND:
            entry["appended_per_thread"] = round(calls[(operation, size, library)] / APPEND_THREADS, 1)
        ratios, p50_ratios = {}, {}
        for ours_name in (OURS_REDIS, OURS_MEMORY):
            # The floor is compared with our read of the smallest size.
            ours_key = (READ, min(s for _, s, _ in per_round if s), ours_name) if operation == FLOOR else None
            ours_key = ours_key or (operation, size, ours_name)
            if ours_key in per_round and library != ours_name:
                ratios[ours_name] = ratio(per_round[ours_key], rates)
                p50_ratios[ours_name] = ratio(speeds[ours_key], speeds[(operation, size, library)])
        entry["ours_over_this"] = ratios
        entry["ours_over_this_p50"] = p50_ratios
        results.setdefault(operation, {}).setdefault(str(size), {})[library] = entry
    return results


def p50_speeds(latencies: dict[Key, list[float]]) -> dict[Key, list[float]]:
    """Each operation's calls per second at its median latency, as one round: the ratios
    of these are ratios of p50 latencies, which a loaded machine moves less than rates
    (a call the scheduler holds up is one slow call, not a slower turn)."""
    return {key: [1 / statistics.median(taken)] for key, taken in latencies.items()}


def turn_ratios(per_round: dict[Key, list[float]]) -> dict[str, float]:
    """The default turn and the turn at a window of 20 over the same turn with recording
    and extraction off."""
    bare = per_round.get((TURN, 0, TURN_BARE))
    return {
        f"{name} / {TURN_BARE}": ratio(per_round[(TURN, 0, name)], bare)
        for name in (TURN_DEFAULT, TURN_WINDOW_20)
        if bare and (TURN, 0, name) in per_round
    }


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
        f"| Operation | Size | Library | How | ops/s | p50 µs | Redis µs/op | Redis CPU µs/op "
        f"| Redis commands/op | {OURS_REDIS} ÷ this | {OURS_MEMORY} ÷ this |",
        "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for operation, sizes in results.items():
        for size, libraries in sizes.items():
            for library, entry in libraries.items():
                ratios = entry["ours_over_this"]
                cells = [
                    f"{ratios[name]:.2f}" if name in ratios else "" for name in (OURS_REDIS, OURS_MEMORY)
                ]
                shown = "" if operation in (FLOOR, TURN) else size
                server = (
                    f"{entry['server_us_per_op']:,.1f} | {entry['server_cpu_us_per_op']:,.1f} "
                    f"| {entry['commands_per_op']:g}"
                    if "server_us_per_op" in entry
                    else " | "
                )
                lines.append(
                    f"| {operation} | {shown} | {library} | {entry['variant']} | {entry['ops_per_s']:,.0f} "
                    f"| {entry['p50_us']:,.1f} | {server} | {cells[0]} | {cells[1]} |"
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
    url: str, sizes: list[int], folder: str, skipped: dict[str, str], runner: asyncio.Runner
) -> Iterator[dict[int, list[Library]]]:
    """Every library, filled at every size (the turns under size 0, first); closed on exit."""
    from agents import SQLiteSession
    from agents.extensions.memory.redis_session import RedisSession
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.checkpoint.sqlite import SqliteSaver
    from redis.asyncio import Redis as AsyncRedis

    with ExitStack() as stack:
        stats = redis.Redis.from_url(url)  # counts Redis time and commands
        stack.callback(stats.close)
        redis_store = our_store("redis", url, folder)
        stack.callback(redis_store.close)
        window_20 = our_store("redis", url, folder, CONTEXT_MAX_MESSAGES=20)
        stack.callback(window_20.close)
        bare = our_store("redis", url, folder, RECORD_CONVERSATION=False, MEMORY_EXTRACTION_WORKER=False)
        stack.callback(bare.close)
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

        print("filling the turns' sessions", file=sys.stderr)
        found: dict[int, list[Library]] = {
            0: [
                turns(TURN_DEFAULT, "default", redis_store, stats),
                turns(TURN_WINDOW_20, "window-20", window_20, stats),
                turns(TURN_BARE, "bare", bare, stats),
            ]
        }
        for size in sizes:
            print(f"filling threads of {size} messages", file=sys.stderr)
            group = [
                ours(OURS_REDIS, redis_store, size, "redis", client=stats),
                ours(OURS_MEMORY, memory_store, size, "memory", mirrored=True),
                agents_sessions(
                    lambda sid: RedisSession(sid, redis_client=async_client),
                    REDIS_SESSION,
                    size,
                    runner,
                    client=stats,
                ),
                agents_sessions(sqlite_session, SQLITE_SESSION, size, runner),
                our_session(SESSION_REDIS, redis_store, size, runner, "session-redis", client=stats),
                our_session(SESSION_MEMORY, memory_store, size, runner, "session-memory", mirrored=True),
            ]
            if langchain_redis is not None:
                group.append(
                    langchain_history(
                        lambda sid: langchain_redis(session_id=sid, redis_url=url),
                        "LangChain RedisChatMessageHistory",
                        size,
                        stats,
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
    parser.add_argument(
        "--counted", type=int, default=200, help="calls per operation counting Redis time and commands"
    )
    parser.add_argument("--output", type=Path, default=BENCH / "results" / "local" / "peers.json")
    args = parser.parse_args()

    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="pm-bench-peers-") as folder, redis_url() as url:
        setup_django(folder)
        skipped: dict[str, str] = {}
        client = redis.Redis.from_url(url)
        floor_sha = client.script_load("return 1")
        try:
            # One event loop for every awaited call of the run, as an async app has.
            with (
                asyncio.Runner() as runner,
                libraries_at(url, args.sizes, folder, skipped, runner) as libraries,
            ):
                per_round, latencies, calls, slots = rounds(
                    libraries, lambda: client.evalsha(floor_sha, 0), args.duration, args.rounds, runner
                )
                costs = server_costs(slots, client, runner, args.counted)
        finally:
            client.close()
        variants = {library.name: library.variant for group in libraries.values() for library in group}
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
            "counted_calls": args.counted,
            "turn_sessions": TURN_SESSIONS,
            "turn_session_messages_before": TURN_FILL,
        },
        "machine": about,
        "load_average": {"start": list(load_start), "end": list(os.getloadavg())},
        "skipped": skipped,
        "results": figures(per_round, latencies, calls, costs, variants),
        "session_ratios": session_ratios(per_round),
        "turn_ratios": turn_ratios(per_round),
        # The same ratios of p50 latencies (the turns' leave out the extraction worker's work).
        "session_ratios_p50": session_ratios(p50_speeds(latencies)),
        "turn_ratios_p50": turn_ratios(p50_speeds(latencies)),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    print(table(results["results"]))
    print()
    print(session_table(results["results"], results["session_ratios"]))
    print()
    for pair, value in results["turn_ratios"].items():
        print(f"{pair}: {value:.2f} (p50 latencies: {results['turn_ratios_p50'][pair]:.2f})")
    for library, why in skipped.items():
        print(f"\nNot measured: {library}: {why}")
    print(f"\nLoad average: {load_start[0]:.2f} at start, {results['load_average']['end'][0]:.2f} at end.")
    print(f"Figures written to {args.output}")


if __name__ == "__main__":
    main()
