"""bench/semantic_bench.py's latency run works end to end (a short run on SQLite): every
strategy and the floor are timed and the vector backend named. Only presence is
asserted, never timings. Its quality run needs a sentence model that is a bench-only
dependency; its labelled set is checked here: every question shares no keyword with the
memory that answers it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_a_short_latency_run_reports_every_strategy(tmp_path):
    output = tmp_path / "semantic.json"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "DJANGO_SETTINGS_MODULE")}
    command = [sys.executable, str(ROOT / "bench" / "semantic_bench.py"), "latency", "--counts", "300"]
    command += ["--rounds", "5", "--output", str(output)]
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(output.read_text())["figures"]["300"]
    assert figures["vector_backend"] in ("numpy", "sqlite-vec")
    for name in ("get_by_id", "keyword", "semantic", "hybrid"):
        assert figures[name]["calls"] == 5 and figures[name]["p50_ms"] > 0
    assert figures["semantic"]["x_floor_p50"] > 0 and figures["semantic"]["x_keyword_p50"] > 0


def test_the_labelled_set_shares_no_keyword_between_a_question_and_its_answer():
    sys.path.insert(0, str(ROOT / "bench"))
    from semantic_corpus import DISTRACTORS, PAIRS

    from persistent_memory.memories.search import query_words

    def stems(text: str) -> set[str]:
        return {word.removesuffix("s").removesuffix("ing").removesuffix("ed") for word in query_words(text)}

    assert len(PAIRS) >= 100 and len(PAIRS) + len(DISTRACTORS) >= 200
    assert len({memory for memory, _ in PAIRS} | set(DISTRACTORS)) == len(PAIRS) + len(DISTRACTORS)
    shared = [(memory, question) for memory, question in PAIRS if stems(memory) & stems(question)]
    assert shared == []
