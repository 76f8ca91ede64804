"""What tracing costs per store operation: OpenTelemetry absent, the API installed with no
SDK configured, and the SDK on (spans batched to an exporter that drops them, metrics
aggregated by an in-memory reader), beside the code of another checkout (main) in the
same run.

Each configuration runs in a process of its own (the absent ones with ``opentelemetry``
made unimportable, as where it is not installed), one after another in rounds, so a
slower minute of a loaded machine falls on every configuration alike; the figure of a
configuration is its median over the rounds. The operations are the store's, called from
Python with the default settings but the mirror off, on the memory backend and on a
redis-server of the benchmark's own.

    python bench/otel_cost.py --baseline /tmp/pm-main [--rounds 7] [--n 2000] [--backends memory]

``--baseline``: a checkout of the code to compare with (``git archive main | tar -x -C
/tmp/pm-main``); it runs with OpenTelemetry absent.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOADAVG = Path("/proc/loadavg")
CONFIGS = ("baseline", "absent", "api", "sdk")
OPERATIONS = ("put", "get", "add_messages", "get_context")


def child(config: str, backend: str, redis_url: str | None, n: int) -> None:
    """Time ``n`` calls of each operation here; print µs per call as JSON."""
    if config in ("baseline", "absent"):
        sys.modules["opentelemetry"] = None  # type: ignore[assignment]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "memory_site.settings")
    import django

    django.setup()
    from django.conf import settings

    if config == "sdk":
        from opentelemetry import metrics, trace
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

        class Drop(SpanExporter):
            def export(self, spans):  # type: ignore[no-untyped-def]
                return SpanExportResult.SUCCESS

        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(Drop()))
        trace.set_tracer_provider(provider)
        metrics.set_meter_provider(MeterProvider(metric_readers=[InMemoryMetricReader()]))

    conf = {"BACKEND": backend, "MIRROR_MODE": "off"}
    if redis_url:
        conf["REDIS_URL"] = redis_url
    settings.PERSISTENT_MEMORY = conf
    from persistent_memory.store import get_store

    store = get_store()
    session = f"bench-{config}-{os.getpid()}"
    store.create_session(session)
    calls = {
        "put": lambda i: store.put(session, "k", i),
        "get": lambda i: store.get(session, "k"),
        "add_messages": lambda i: store.add_messages(
            session, [{"role": "user", "content": "hello"}], conversation=f"c{i % 50}"
        ),
        "get_context": lambda i: store.get_context(session, conversation=f"c{i % 50}"),
    }
    figures = {}
    for name in OPERATIONS:
        call = calls[name]
        for i in range(n // 10):  # warm up
            call(i)
        began = time.perf_counter()
        for i in range(n):
            call(i)
        figures[name] = (time.perf_counter() - began) / n * 1e6
    store.delete_session(session)
    print(json.dumps(figures))


def run(config: str, baseline: Path, backend: str, redis_url: str | None, n: int) -> dict[str, float]:
    code = baseline if config == "baseline" else ROOT
    command = [sys.executable, __file__, "--child", config, "--backend", backend, "--n", str(n)]
    if redis_url:
        command += ["--redis-url", redis_url]
    env = {**os.environ, "PYTHONPATH": str(code)}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=code, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--child", choices=CONFIGS)
    parser.add_argument("--backend", default="memory")
    parser.add_argument("--redis-url")
    parser.add_argument("--backends", default="memory,redis", help="of the parent: which to time")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.backend, args.redis_url, args.n)
        return
    if args.baseline is None:
        parser.error("--baseline is required")
    sys.path.insert(0, str(ROOT))
    from bench.local_redis import redis_url

    print(f"load before: {Path('/proc/loadavg').read_text().strip()}")
    results: dict[str, dict[str, dict[str, list[float]]]] = {}
    with redis_url(use_env=False) as url:
        for backend, server in (("memory", None), ("redis", url)):
            if backend not in args.backends.split(","):
                continue
            per = results.setdefault(backend, {c: {op: [] for op in OPERATIONS} for c in CONFIGS})
            for round_ in range(args.rounds):
                order = CONFIGS[round_ % len(CONFIGS) :] + CONFIGS[: round_ % len(CONFIGS)]
                for config in order:
                    for op, us in run(config, args.baseline, backend, server, args.n).items():
                        per[config][op].append(us)
    print(f"load after: {Path('/proc/loadavg').read_text().strip()}")
    for backend, per in results.items():
        print(f"\n{backend}: µs per call, median of {args.rounds} rounds (ratio to baseline)")
        print("| operation | " + " | ".join(CONFIGS) + " |")
        print("|---" * (len(CONFIGS) + 1) + "|")
        for op in OPERATIONS:
            base = statistics.median(per["baseline"][op])
            cells = []
            for config in CONFIGS:
                value = statistics.median(per[config][op])
                spread = max(per[config][op]) - min(per[config][op])
                cells.append(f"{value:.1f} ±{spread / 2:.1f} ({value / base:.3f})")
            print(f"| {op} | " + " | ".join(cells) + " |")
    print("\n" + json.dumps(results))


if __name__ == "__main__":
    main()
