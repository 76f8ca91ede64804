"""bench/peers.py works end to end (a short run): every library's figure at every size;
its awaited calls run in one loop; its Redis counts are the operation's.

Only presence and counts are asserted (every figure positive, every ratio there, calls
and commands counted), never timings: those belong to the benchmark's output, not to a test.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest
import redis

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench" / "peers.py"

OURS = {"ours (Redis)", "ours (memory)"}
OUR_SESSIONS = {"ours: Agents SDK session (Redis)", "ours: Agents SDK session (memory)"}
SDK_SESSIONS = {"RedisSession (Agents SDK)", "SQLiteSession (Agents SDK)"}
LANGGRAPH = {"LangGraph InMemorySaver", "LangGraph SqliteSaver"}
APPENDERS = OURS | OUR_SESSIONS | SDK_SESSIONS | LANGGRAPH
READERS = APPENDERS | {"Django ORM (our mirror's rows)"}
#: Measured only on a redis-server with RediSearch and RedisJSON; the JSON says why not.
LANGCHAIN = "LangChain RedisChatMessageHistory"
#: Those on the bench's Redis: their Redis time and commands per call are counted.
ON_REDIS = {"ours (Redis)", "ours: Agents SDK session (Redis)", "RedisSession (Agents SDK)", LANGCHAIN}
TURNS = {
    "ours (Redis): turn (enrich + store), default settings",
    "ours (Redis): turn (enrich + store), window 20",
    "ours (Redis): turn (enrich + store), recording and extraction off",
}
DEFAULTS = "window 100, recording on, extraction worker on"
AWAITED = "async, awaited in one running loop"


@pytest.fixture(scope="module")
def bench() -> dict[str, ModuleType]:
    """bench/peers.py, bench/server_time.py and bench/local_redis.py, imported as the bench does."""
    sys.path.insert(0, str(BENCH.parent))
    try:
        return {name: importlib.import_module(name) for name in ("peers", "server_time", "local_redis")}
    finally:
        sys.path.remove(str(BENCH.parent))


def test_awaited_calls_run_in_one_loop_entered_once_a_slice(bench):
    """An async library's calls are awaited back to back inside the running loop (not one
    loop entry per call), and a sync library's are called with no loop running."""
    peers = bench["peers"]
    loops: set[asyncio.AbstractEventLoop] = set()
    entries: list[object] = []
    sync_calls: list[bool] = []

    class CountingRunner(asyncio.Runner):
        def run(self, coro, **kwargs):
            entries.append(coro)
            return super().run(coro, **kwargs)

    async def awaited() -> None:
        loops.add(asyncio.get_running_loop())
        await asyncio.sleep(0)

    def called() -> None:
        try:
            asyncio.get_running_loop()
            sync_calls.append(False)
        except RuntimeError:
            sync_calls.append(True)

    libraries = {
        1: [
            peers.Library("async", {peers.READ: awaited}, awaited=True),
            peers.Library("sync", {peers.READ: called}),
        ]
    }
    with CountingRunner() as runner:
        per_round, _, calls, _ = peers.rounds(libraries, lambda: None, 0.02, 3, runner)
    assert len(loops) == 1
    assert len(entries) == 1 + 3  # the warm-up's slice, then one slice a round
    assert calls[(peers.READ, 1, "async")] > 10 * len(entries)
    assert len(per_round[(peers.READ, 1, "async")]) == 3
    assert sync_calls and all(sync_calls)


def test_server_cost_counts_the_operations_commands_and_scripts(bench):
    """Every command an operation makes is counted once a call, those its script or
    function calls included, and the measuring commands never; the commands scripts
    called are found as such."""
    server_time = bench["server_time"]
    with bench["local_redis"].redis_url(use_env=False) as url, redis.Redis.from_url(url) as client:
        sha = client.script_load("redis.call('INCR', KEYS[1]); return redis.call('GET', KEYS[1])")
        client.function_load(
            "#!lua name=benchtest\n"
            "redis.register_function{function_name='bump', callback=function(keys) "
            "return redis.call('INCR', keys[1]) end}"
        )

        def pipelined() -> None:
            with client.pipeline(transaction=True) as pipe:
                pipe.incr("p").get("p").execute()

        operations = {
            "plain": lambda: client.incr("n"),
            "script": lambda: client.evalsha(sha, 1, "s"),
            "function": lambda: client.fcall("bump", 1, "f"),
            "transaction": pipelined,
        }
        costs = {name: server_time.server_cost([client], op, 25) for name, op in operations.items()}
        nested = {
            name: server_time.nested_calls([client], op, 25, lambda: None) for name, op in operations.items()
        }
        slowlog = client.config_get("slowlog-*")
    assert {name: (cost["commands_per_op"], cost["scripts_per_op"]) for name, cost in costs.items()} == {
        "plain": (1, 0),
        "script": (3, 1),  # EVALSHA, and the INCR and GET it calls
        "function": (2, 1),
        "transaction": (4, 0),  # MULTI, INCR, GET, EXEC
    }
    assert nested == {
        "plain": {},
        "script": {"incr": 25, "get": 25},
        "function": {"incr": 25},
        "transaction": {},
    }
    assert all(cost["server_us_per_op"] > 0 for cost in costs.values())
    assert slowlog["slowlog-log-slower-than"] != "0"  # the server's slow log as it was


def test_the_commands_scripts_call_are_not_timed_twice(bench):
    """A script's time holds its commands' time: they count once, in the script's."""
    server_time = bench["server_time"]
    spent = server_time.CommandStats(
        calls=Counter({"evalsha": 10, "get": 30, "lrange": 20}),
        usec=Counter({"evalsha": 1000, "get": 300, "lrange": 400}),
    )
    # Every GET from the scripts, half the LRANGEs sent by the client (200 of their µs).
    figures = server_time.per_op(spent, 10, Counter({"get": 30, "lrange": 10}))
    assert figures["server_us_per_op"] == 120.0
    assert (figures["commands_per_op"], figures["scripts_per_op"]) == (6, 1)


def test_a_short_peers_run_reports_every_library_at_every_size(tmp_path):
    output = tmp_path / "peers.json"
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("REDIS_URL", "DATABASE_URL", "DJANGO_SETTINGS_MODULE")
    }
    command = [sys.executable, str(BENCH), "--duration", "0.05", "--rounds", "2", "--counted", "10"]
    command += ["--sizes", "100", "300", "--output", str(output)]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(output.read_text())

    assert "| Operation | Size | Library | How | ops/s | p50 µs | Redis µs/op |" in done.stdout
    langchain = set() if LANGCHAIN in results["skipped"] else {LANGCHAIN}
    figures = results["results"]
    assert set(figures) == {"floor", "read", "append", "turn"}
    assert set(figures["floor"]["0"]) == {"redis-py EVALSHA (return 1)"}
    for operation, libraries in (("read", READERS | langchain), ("append", APPENDERS | langchain)):
        assert set(figures[operation]) == {"100", "300"}, operation
        for size, found in figures[operation].items():
            assert set(found) == libraries, (operation, size)
            for library, entry in found.items():
                assert entry["ops_per_s"] > 0 and entry["p50_us"] > 0, (operation, size, library)
                assert len(entry["ops_per_s_rounds"]) == 2
                # Ours against each other library, and each of ours against the other one.
                assert set(entry["ours_over_this"]) == (OURS - {library}), (operation, size, library)
                assert all(ratio > 0 for ratio in entry["ours_over_this"].values())
                assert set(entry["ours_over_this_p50"]) == set(entry["ours_over_this"])
                # Ours run with the default settings; the SDK's sessions and ours awaited.
                if library in OURS | OUR_SESSIONS:
                    assert DEFAULTS in entry["variant"], (library, entry["variant"])
                assert (AWAITED in entry["variant"]) == (library in OUR_SESSIONS | SDK_SESSIONS), library
                # Redis time and commands per call for those on Redis, and only those.
                assert ("server_us_per_op" in entry) == (library in ON_REDIS), (operation, size, library)
                if library in ON_REDIS:
                    assert entry["server_us_per_op"] > 0 and entry["commands_per_op"] >= 1
    for figure in figures["floor"]["0"].values():
        assert set(figure["ours_over_this"]) == OURS
        # The floor is one EVALSHA a call, and the server counts exactly that.
        assert (figure["commands_per_op"], figure["scripts_per_op"]) == (1, 1)
    # Our store's read and append are script calls (one at least) on the server.
    for operation in ("read", "append"):
        assert figures[operation]["100"]["ours (Redis)"]["scripts_per_op"] >= 1
    # The default turn, at window 20, and with recording and extraction off.
    assert set(figures["turn"]["0"]) == TURNS
    default_turn = figures["turn"]["0"]["ours (Redis): turn (enrich + store), default settings"]
    assert DEFAULTS in default_turn["variant"]
    assert all(entry["scripts_per_op"] >= 2 for entry in figures["turn"]["0"].values())
    assert len(results["turn_ratios"]) == 2 and all(r > 0 for r in results["turn_ratios"].values())
    assert set(results["turn_ratios_p50"]) == set(results["turn_ratios"])
    assert set(results["session_ratios_p50"]) == set(results["session_ratios"])
    assert len(results["load_average"]["start"]) == len(results["load_average"]["end"]) == 3
    assert results["settings"]["append"] == "one user message"

    # Each of our Agents SDK sessions over each of the SDK's, per operation and size.
    assert "| Operation | Size | Our session | ops/s |" in done.stdout
    pairs = {f"{ours} / {sdk}" for ours in OUR_SESSIONS for sdk in SDK_SESSIONS}
    session_ratios = results["session_ratios"]
    assert set(session_ratios) == {"read", "append"}
    for operation, sizes in session_ratios.items():
        assert set(sizes) == {"100", "300"}, operation
        for size, ratios in sizes.items():
            assert set(ratios) == pairs, (operation, size)
            assert all(ratio > 0 for ratio in ratios.values()), (operation, size)
