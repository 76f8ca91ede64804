"""bench/checkpointers.py works end to end (a short run): every checkpointer at every size.

Timings are only checked for presence; what a turn stores is not a timing: ours stores
the new messages, the peers the whole thread again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench" / "checkpointers.py"
OURS = {"ours (Redis)", "ours (memory)"}
PEERS = {"LangGraph InMemorySaver", "LangGraph SqliteSaver", "LangGraph PostgresSaver"}


def test_a_short_run_reports_every_checkpointer_at_every_size(tmp_path):
    output = tmp_path / "checkpointers.json"
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL", "DJANGO_SETTINGS_MODULE")}
    command = [sys.executable, str(BENCH), "--duration", "0.05", "--rounds", "2", "--sizes", "100", "1000"]
    done = subprocess.run(
        [*command, "--output", str(output)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(output.read_text())
    assert "| Size | Checkpointer | turns/s |" in done.stdout
    peers = PEERS - set(report["skipped"])
    assert {"LangGraph InMemorySaver", "LangGraph SqliteSaver"} <= peers
    assert set(report["results"]) == {"100", "1000"}
    for size, found in report["results"].items():
        assert set(found) == OURS | peers, size
        for name, entry in found.items():
            assert entry["turns_per_s"] > 0 and len(entry["turns_per_s_rounds"]) == 2, (size, name)
            assert set(entry["ours_over_this"]) == OURS - {name}, (size, name)
    # A turn at 1,000 messages: the peers store the thread again, ours the new messages.
    at_1000 = report["results"]["1000"]
    for ours in OURS:
        assert all(at_1000[ours]["bytes_per_turn"] < at_1000[peer]["bytes_per_turn"] / 3 for peer in peers)
