"""bench/peers.py works end to end (a short run): every library's figure at every size.

Only presence is asserted (every figure positive, every ratio there), never timings:
those belong to the benchmark's output, not to a test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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


def test_a_short_peers_run_reports_every_library_at_every_size(tmp_path):
    output = tmp_path / "peers.json"
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("REDIS_URL", "DATABASE_URL", "DJANGO_SETTINGS_MODULE")
    }
    command = [sys.executable, str(BENCH), "--duration", "0.05", "--rounds", "2"]
    command += ["--sizes", "100", "300", "--output", str(output)]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(output.read_text())

    assert "| Operation | Size | Library | ops/s |" in done.stdout
    langchain = set() if LANGCHAIN in results["skipped"] else {LANGCHAIN}
    figures = results["results"]
    assert set(figures) == {"floor", "read", "append"}
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
    for figure in figures["floor"]["0"].values():
        assert set(figure["ours_over_this"]) == OURS
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
