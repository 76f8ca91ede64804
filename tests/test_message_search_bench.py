"""bench/message_search_bench.py at a tiny size: every figure is there, in its shape, and
no search ever answers with another owner's message (no timing is asserted)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_a_tiny_message_search_run_reports_every_query(tmp_path):
    """SQLite always; PostgreSQL too when the suite runs on it (in a database of the
    benchmark's own, next to the suite's)."""
    output = tmp_path / "message-search.json"
    databases = ["sqlite"]
    command = [sys.executable, str(ROOT / "bench" / "message_search_bench.py"), "--rounds", "2"]
    command += ["--sqlite-counts", "600", "300", "--postgres-counts", "300", "--memories", "50"]
    command += ["--output", str(output)]
    url = os.environ.get("DATABASE_URL", "")
    if url.startswith(("postgres://", "postgresql://")):
        databases.append("postgresql")
        command += ["--postgres", f"{url.rsplit('/', 1)[0]}/pm_test_message_bench_{os.getpid()}"]
    command += ["--databases", *databases]
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(output.read_text())

    assert "| messages of the owner | matching | hybrid (default) | keyword |" in done.stdout
    queries = results["queries"]
    assert len(queries) == 7 and results["machine"]["cores"] >= 1
    assert [db for db in ("sqlite", "postgresql") if db in results] == databases
    for database in databases:
        figures = results[database]
        assert figures["server"].startswith("SQLite" if database == "sqlite" else "PostgreSQL")
        counts = ["300", "600"] if database == "sqlite" else ["300"]
        assert list(figures["counts"]) == counts  # ascending: the tables grow in place
        for count, at in figures["counts"].items():
            # The owner's messages, and a tenth as many of three other owners.
            assert at["messages_of_owner"] == int(count)
            assert at["messages_in_all"] == int(count) + 3 * (int(count) // 30)
            for catch_up in (at["catch_up"], at["catch_up_after_a_turn"]):
                assert catch_up["calls"] == 2 and 0 < catch_up["p50_ms"] <= catch_up["p95_ms"]
            assert set(at["queries"]) == set(queries)
            for name, query in at["queries"].items():
                assert query["query"] == queries[name]
                # Of the owner's live sessions only: some expired or were deleted.
                assert 0 <= query["matching_messages"] < int(count)
                for strategy in ("hybrid", "keyword"):
                    found = query[strategy]
                    assert found["calls"] == 2 and 0 < found["p50_ms"] <= found["p95_ms"]
                    assert found["foreign"] == 0, (database, count, name, strategy)
                    assert found["messages"] <= min(found["results"], query["matching_messages"])
                    assert found["results"] <= 10
            nothing = at["queries"]["no match"]
            assert nothing["matching_messages"] == 0 and nothing["keyword"]["results"] == 0
            common = at["queries"]["common word"]
            assert common["matching_messages"] > 0 and common["keyword"]["messages"] > 0
