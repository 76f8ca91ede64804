"""The Tracing and metrics page (docs/tracing.md): its OTLP setup sends the store's spans and
metrics to an OTLP/HTTP receiver (the test's own, decoding the protocol's protobuf messages
with opentelemetry-proto), and its Prometheus setup serves the lines the page shows. Each
runs in a process of its own: the API's providers are set once per process."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.conftest import _free_port
from tests.readme_blocks import DOCS, ROOT, example

#: Runs a page's setup, then a store operation, then flushes what the setup exports.
SCRIPT = """
import os, sys, urllib.request
os.environ["DJANGO_SETTINGS_MODULE"] = "memory_site.settings"
import django
django.setup()
exec(sys.argv[1])
from django.conf import settings
from opentelemetry import metrics, trace
settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "MIRROR_MODE": "off"}
from persistent_memory.store import get_store
store = get_store()
store.create_session("s1")
store.put("s1", "lang", "en")
if len(sys.argv) > 2:
    print(urllib.request.urlopen(sys.argv[2]).read().decode())
for provider in (trace.get_tracer_provider(), metrics.get_meter_provider()):
    getattr(provider, "force_flush", lambda: None)()  # those the setup set
"""


def _run(code: str, *args: str, **env: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, code, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


class _Receiver(BaseHTTPRequestHandler):
    """OTLP/HTTP with protobuf bodies: /v1/traces and /v1/metrics."""

    received: dict[str, list[Any]]

    def do_POST(self) -> None:  # noqa: N802 - the handler's protocol
        body = self.rfile.read(int(self.headers["Content-Length"]))
        kinds = {
            "/v1/traces": (ExportTraceServiceRequest, ExportTraceServiceResponse),
            "/v1/metrics": (ExportMetricsServiceRequest, ExportMetricsServiceResponse),
        }
        request, response = kinds[self.path]
        self.received.setdefault(self.path, []).append(request.FromString(body))
        answer = response().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args: Any) -> None:
        pass


def test_the_otlp_setup_sends_the_stores_spans_and_metrics() -> None:
    handler = type("Handler", (_Receiver,), {"received": {}})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        endpoint = f"http://127.0.0.1:{server.server_address[1]}"
        _run(example("otel-otlp"), OTEL_EXPORTER_OTLP_ENDPOINT=endpoint)
    finally:
        server.shutdown()
        server.server_close()
    spans = {
        span.name: {a.key: a.value for a in span.attributes}
        for request in handler.received["/v1/traces"]
        for resource in request.resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    }
    put = spans["upsert_memory sessions"]
    assert put["gen_ai.operation.name"].string_value == "upsert_memory"
    assert put["gen_ai.memory.record.id"].string_value == "lang"
    assert "create_memory_store sessions" in spans
    names = {
        metric.name
        for request in handler.received["/v1/metrics"]
        for resource in request.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }
    assert "persistent_memory.operation.duration" in names


def test_the_prometheus_setup_serves_the_line_the_page_shows() -> None:
    port = _free_port()
    code = example("otel-prometheus").replace("9464", str(port))
    scraped = _run(code, f"http://127.0.0.1:{port}/metrics")
    page = (DOCS / "tracing.md").read_text()
    shown = next(line for line in page.splitlines() if line.startswith("persistent_memory_operation"))
    assert shown in scraped.splitlines(), scraped
