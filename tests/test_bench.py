"""bench/run.py works end to end (a short run): every section, and the counts it reports.

Only counts are asserted (round trips, Redis calls, statuses, mirror equality),
never timings: those belong to the benchmark's output, not to a test.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench" / "run.py"


def test_a_short_benchmark_run_reports_every_section(tmp_path):
    output = tmp_path / "latest.json"
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("REDIS_URL", "DATABASE_URL", "DJANGO_SETTINGS_MODULE")
    }
    command = [sys.executable, str(BENCH), "--duration", "0.3", "--sessions", "5", "--keys", "10", "50"]
    command += ["--long-conversation", "500", "--counted", "20"]
    command += ["--summarizer-conversations", "3", "--summarizer-messages", "120"]
    command += ["--api-duration", "0.5", "--rounds", "1", "--max-requests", "300", "--output", str(output)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(output.read_text())

    assert "| redis: enrich lane (10 keys) |" in done.stdout and "| Target | Measured | Met |" in done.stdout
    assert set(results["floor"]) == {
        "PING",
        "EVALSHA (return 1)",
        "EVALSHA (return 1) on a pooled connection",
    }
    operations = {"put", "get", "get_all (10 keys)", "get_all (50 keys)", "increment"}
    operations |= {"enrich lane (10 keys)", "store lane"}
    operations |= {
        "add_messages (1 message)",
        "get_context (20 of 20 messages, about 10 KB)",
        "get_context (20 of the short conversation)",
        "get_context (20 of the long conversation)",
        "get_context rolling_summary (a summary and the 20 messages after it)",
        "get_context truncation (the same conversations' newest 20)",
    }
    for variant in ("recording off", "idle TTL on"):
        operations |= {f"enrich lane ({variant})", f"store lane ({variant})"}
    assert set(results["memory"]) == set(results["memory_journal"]) == operations
    # On Redis, in both layouts, a default turn beside the turn with recording and extraction off.
    turns = {
        "turn (enrich + store)",
        "turn (enrich + store) (recording and extraction off)",
        "turn (enrich + store) (window 20)",
    }
    assert set(results["redis"]) == set(results["redis_cluster_layout"]) == operations | turns
    # One round trip and one script per lane call and operation with the default settings,
    # the extraction worker's calls included: counted on the client and on the server.
    for figures in [*results["floor"].values(), *results["floor_cluster_layout"].values()]:
        assert figures["round_trips_per_op"] == 1.0
    for name, figures in [*results["redis"].items(), *results["redis_cluster_layout"].items()]:
        calls = 2.0 if name in turns else 1.0
        assert figures["round_trips_per_op"] == figures["scripts_per_op"] == calls, name
        assert figures["ops"] > 0 and figures["p50_us"] <= figures["p99_us"]
    assert results["redis"]["get"]["commands_per_op"] == 3.0  # FCALL_RO, EXISTS, GET
    assert all(f["round_trips_per_op"] == 0.0 for f in results["memory"].values())
    for catch_up in ("memory_mirror_catch_up", "memory_journal_mirror_catch_up"):
        assert results[catch_up]["rows_equal_store"] is True
        assert results[catch_up]["seconds"] is not None

    api = results["api"]
    assert set(api) == {"no-op DRF view", "enrich (10 keys)", "store", "process (2 entries)"}
    for name, figures in api.items():
        assert figures["requests"] > 0 and figures["statuses"] == {"200": figures["requests"]}, name
    calls = {name: figures["scripts_per_request"] for name, figures in api.items()}
    assert calls == {"no-op DRF view": 0.0, "enrich (10 keys)": 1.0, "store": 1.0, "process (2 entries)": 2.0}
    # Redis commands beside every Redis figure; and per store operation, the Redis time
    # of the commands clients sent.
    assert all(api[name]["commands_per_request"] >= 1 for name in calls if name != "no-op DRF view")
    assert all(f["server_us_per_op"] > 0 for f in results["redis"].values())

    targets = [check["target"] for check in results["targets"]]
    for layout in ("node", "cluster"):
        one = f"Redis ({layout} layout, default settings): "
        one += "1 round trip and 1 script per lane call and operation"
        assert results["targets"][targets.index(one)]["met"] is True
        assert any(t.startswith(f"Redis ({layout} layout): default turn >= 60%") for t in targets)
    assert len(results["targets"]) == 29
    assert results["conversation_sizes"] == {"short": 100, "long": 500}
    assert [t["target"] for t in results["targets"]].count(
        "Memory with the journal store lane (recording off): >= 50,000 ops/s"
    ) == 1

    # The summarizer worker drained every marked conversation, folding what the floor summarized.
    summarizer = results["summarizer"]
    assert (summarizer["conversations"], summarizer["messages"]) == (3, 120)
    assert "| Summarizing (3 conversations of 120 messages) |" in done.stdout
    for backend in ("redis", "memory"):
        figures = summarizer[backend]
        worker = figures["worker"]
        assert figures["marked"] == worker["taken"] == worker["summarized"] == 3, backend
        assert worker["failed"] == worker["skipped"] == 0 and worker["folded_what_the_floor_summarized"]
        assert 0 < figures["messages_folded"] < 3 * 120  # the pending zone of each stays
        assert figures["floor"]["conversations_per_s"] > 0 and worker["conversations_per_s"] > 0
    # Per conversation: its read and its commit, and the health record; the batch's pop.
    assert 3 <= summarizer["redis"]["worker"]["round_trips_per_conversation"] <= 5
    assert summarizer["memory"]["worker"]["round_trips_per_conversation"] == 0.0


@pytest.mark.parametrize(
    ("script", "default"),
    [
        ("run.py", "latest.json"),
        ("maintenance.py", "maintenance.json"),
        ("memories_bench.py", "memories.json"),
        ("message_search_bench.py", "message-search.json"),
    ],
)
def test_a_run_writes_where_git_does_not_look(script, default):
    """By default the figures go to bench/results/local/, which git ignores: a run leaves
    the checkout unmodified. The README's figures stay in files named for their run."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / script), "--help"], capture_output=True, text=True, check=True
    )
    output = f"bench/results/local/{default}"
    assert output in " ".join(done.stdout.split()), done.stdout
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    ignored = subprocess.run(["git", "check-ignore", "-q", output], cwd=ROOT)
    assert ignored.returncode == 0, f"git does not ignore {output}"
    tracked = subprocess.run(["git", "ls-files", "bench/results"], cwd=ROOT, capture_output=True, text=True)
    assert f"bench/results/{default}" not in tracked.stdout.split()  # no file a run would rewrite
    assert "bench/results/2026-11-22-run.json" in tracked.stdout.split()


def test_a_short_memories_run_reports_search_injection_and_extraction(tmp_path):
    """bench/maintenance.py --memories (bench/memories_bench.py) with small counts: every
    figure is there and positive. SQLite always; PostgreSQL too when the suite runs on it
    (in a database of the benchmark's own, next to the suite's)."""
    output = tmp_path / "memories.json"
    databases = ["sqlite"]
    command = [sys.executable, str(ROOT / "bench" / "maintenance.py"), "--memories"]
    command += ["--counts", "300", "150", "--rounds", "3", "--conversations", "2", "--output", str(output)]
    url = os.environ.get("DATABASE_URL", "")
    if url.startswith(("postgres://", "postgresql://")):
        databases.append("postgresql")
        command += ["--postgres", f"{url.rsplit('/', 1)[0]}/pm_test_memories_bench_{os.getpid()}"]
    command += ["--databases", *databases]
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(output.read_text())

    assert "| Search (p50 / p99 ms, × floor p50) | memories | matches |" in done.stdout
    assert "| Enrich lane (memory backend) |" in done.stdout and "| Extraction (rule-based) |" in done.stdout
    queries = results["queries"]
    assert len(queries) == 6 and results["machine"]["cores"] >= 1
    assert [db for db in ("sqlite", "postgresql") if db in results] == databases
    for database in databases:
        figures = results[database]
        assert figures["server"].startswith("SQLite" if database == "sqlite" else "PostgreSQL")
        assert list(figures["counts"]) == ["150", "300"]  # ascending: the table grows in place
        for count, at in figures["counts"].items():
            assert at["seed_seconds"] >= 0
            assert set(at["floor"]) == {"SELECT 1", "get one memory by id"}
            timed = list(at["floor"].values())  # each called once a round
            assert set(at["queries"]) == set(queries)
            for name, query in at["queries"].items():
                assert query["query"] == queries[name] and 0 <= query["matches"] <= int(count)
                for strategy in ("keyword", "hybrid"):
                    found = query[strategy]
                    assert found["results"] == min(10, query["matches"]), (database, count, name, strategy)
                    assert found["p50_to_floor"] > 0
                    timed.append(found)
            assert at["queries"]["no match"]["matches"] == 0
            assert at["queries"]["broad question"]["matches"] > int(count) // 10
            enrich = at["enrich"]
            assert enrich["on_to_off_p50"] > 0 and enrich["memories_injected_per_call"] > 0
            for one in timed:
                assert one["calls"] == 3 and 0 < one["p50_ms"] <= one["p99_ms"]
            for one in (enrich["injection off"], enrich["injection on"]):  # every query each round
                assert one["calls"] == 3 * len(queries) and 0 < one["p50_ms"] <= one["p99_ms"]
        extraction = figures["extraction"]
        assert extraction["messages"] == 100 and extraction["rules alone"]["messages_per_s"] > 0
        first, again = extraction["first run (inserts)"], extraction["again (nothing changes)"]
        assert first["candidates"] == again["candidates"] == extraction["rules alone"]["candidates"] > 0
        # Every candidate is written; the second run reads them all again and changes nothing
        # (the count is of memories created or changed).
        assert first["upserts"] == first["candidates"] and again["upserts"] == 0
        assert 0 < first["memories_after"] == again["memories_after"] <= first["upserts"]
        assert first["refused"] == again["refused"] == 0
        assert first["upserts_per_s"] > 0 and again["upserts_per_s"] == 0
        for run in (first, again):  # the ratio of two timings is the machine's: reported, not bounded
            assert run["messages_per_s"] > 0 and run["of_rules_alone"] >= 0


def test_a_quick_cluster_run_counts_one_round_trip_per_operation(tmp_path):
    """bench/cluster_bench.py --quick: its own server and 3-primary cluster, every operation
    counted on each setup, the hot operations timed against their floor, and the keys of
    5,000 sessions spread over the 3 primaries. Counts only, never timings."""
    output = tmp_path / "cluster.json"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
    command = [sys.executable, str(ROOT / "bench" / "cluster_bench.py"), "--quick", "--json", str(output)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(output.read_text())
    assert "| Operation | single/node | single/cluster | cluster |" in done.stdout

    setups = ["single/node", "single/cluster", "cluster"]
    trips = results["round_trips"]
    assert len(trips) == 13 and all(list(row) == setups for row in trips.values())
    # The documented exceptions of the cluster layout: an answer given only a run id reads the
    # run's pointer first; enrich sets that pointer beside its script, waiting for both at once.
    exceptions = {
        ("answer lane (run id only)", "single/cluster"): {"sent": 2.0, "in_sequence": 2.0},
        ("answer lane (run id only)", "cluster"): {"sent": 2.0, "in_sequence": 2.0},
        ("enrich lane (run id)", "single/cluster"): {"sent": 2.0, "in_sequence": 1.0},
        ("enrich lane (run id)", "cluster"): {"sent": 2.0, "in_sequence": 1.0},
    }
    page = "list_session_page (50)"  # the cluster layout's every bucket: see below
    one = {"sent": 1.0, "in_sequence": 1.0}
    for name, row in trips.items():
        for setup, counted in row.items():
            if (name, setup) not in ((page, "single/cluster"), (page, "cluster")):
                assert counted == exceptions.get((name, setup), one), (name, setup)

    speed = results["throughput"]
    assert set(speed["floor"]) == {"single", "cluster"} and all(v > 0 for v in speed["floor"].values())
    assert len(speed["operations"]) == 7
    for row in speed["operations"].values():
        assert all(row[setup]["ops_per_s"] > 0 and row[setup]["of_floor"] > 0 for setup in setups)
        # Redis time beside each figure, summed over the cluster's primaries: the cluster
        # layout's commands, the same on one server as on the cluster.
        assert all(row[setup]["server_us_per_op"] > 0 for setup in setups)
        assert row["single/cluster"]["commands_per_op"] == row["cluster"]["commands_per_op"] >= 1

    spread = results["distribution"]
    assert len(spread["primaries"]) == 3
    assert sum(p["buckets"] for p in spread["primaries"].values()) == spread["per_bucket"]["buckets"] == 64
    assert sum(p["sessions"] for p in spread["primaries"].values()) == spread["per_bucket"]["total"] == 5000
    assert all(p["keys"] > p["sessions"] > 0 for p in spread["primaries"].values())

    # A page in the cluster layout reads every bucket: a pipelined step, a packet per primary
    # (redis-py's cluster pipeline would ask a node for each EVALSHA's keys first unless the
    # command names its node), and a second step only for the buckets whose part of the page
    # the first step's reads could not settle.
    for setup, primaries in (("single/cluster", 1), ("cluster", 3)):
        counted = trips[page][setup]
        assert 1.0 <= counted["in_sequence"] <= 2.0, (setup, counted)
        assert primaries <= counted["sent"] <= 2 * primaries, (setup, counted)
