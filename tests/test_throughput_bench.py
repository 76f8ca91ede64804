"""bench/throughput.py works end to end (a short run): client processes against clusters
of 1 and 2 primaries that it starts and stops, and the counts it reports per turn.

Counts only, never timings: those belong to the benchmark's output, not to a test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_a_short_throughput_run_reports_each_cluster(tmp_path):
    output = tmp_path / "throughput.json"
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("REDIS_URL", "DATABASE_URL", "DJANGO_SETTINGS_MODULE")
    }
    command = [sys.executable, str(ROOT / "bench" / "throughput.py"), "--processes", "2", "--duration", "0.5"]
    command += ["--primaries", "1", "2", "--sessions", "2", "--output", str(output)]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(output.read_text())

    assert "| Primaries | Client processes | turns/s |" in done.stdout
    runs = results["runs"]
    assert [run["primaries"] for run in runs] == [1, 2]
    for run in runs:
        assert run["processes"] == 2 and run["turns"] > 0 and run["turns_per_s"] > 0
        # Every primary's CPU is read, and the turns' commands are counted on all of them:
        # a turn is two lane calls, one script call each, the extraction worker's included.
        assert len(run["primary_cpu_share"]) == run["primaries"]
        assert run["scripts_per_turn"] == 2
        assert run["commands_per_turn"] > 2
        assert run["server_cpu_us_per_turn"] > 0
        assert isinstance(run["saturated"], bool)
    assert len(results["load_average"]["start"]) == 3
