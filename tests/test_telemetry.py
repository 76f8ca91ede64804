"""Tracing and metrics (persistent_memory.telemetry) with the OpenTelemetry SDK's in-memory
exporter and reader: the spans and attributes of each kind of operation, their parent under
a Django request, content capture off by default, the Redis client spans on a real
redis-server, the metrics, and nothing imported without the package."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from persistent_memory import telemetry
from persistent_memory.memories import memories_for
from persistent_memory.telemetry.operations import OPERATIONS
from persistent_memory.telemetry.otel import CAPTURE_CONTENT
from tests.conftest import memory_settings_for
from tests.readme_blocks import ROOT


class _Armed(InMemorySpanExporter):
    """Keeps spans only during a test of this module: the providers stay set for the rest of
    the test process, whose other tests' spans would otherwise pile up here."""

    armed = False

    def export(self, spans: Any) -> SpanExportResult:
        return super().export(spans) if self.armed else SpanExportResult.SUCCESS


EXPORTER = _Armed()
READER = InMemoryMetricReader()


@pytest.fixture(scope="session")
def providers() -> None:
    """The SDK, once per test process (the API's global providers are set once)."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
    trace.set_tracer_provider(provider)
    metrics.set_meter_provider(MeterProvider(metric_readers=[READER]))


@pytest.fixture
def spans(providers: None, monkeypatch: pytest.MonkeyPatch):
    """The spans finished during the test (content capture unset)."""
    monkeypatch.delenv(CAPTURE_CONTENT, raising=False)
    EXPORTER.clear()
    EXPORTER.armed = True

    def finished(operation: str | None = None) -> list[ReadableSpan]:
        found = list(EXPORTER.get_finished_spans())
        if operation is None:
            return found
        return [span for span in found if span.attributes.get("persistent_memory.operation") == operation]

    yield finished
    EXPORTER.armed = False
    EXPORTER.clear()


def _metrics() -> dict[str, list[Any]]:
    """Every data point collected now, by metric name."""
    points: dict[str, list[Any]] = {}
    data = READER.get_metrics_data()
    for resource in data.resource_metrics if data else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                points.setdefault(metric.name, []).extend(metric.data.data_points)
    return points


def test_every_listed_operation_names_a_method_of_its_class() -> None:
    from persistent_memory.backends.redis import RedisBackend
    from persistent_memory.backends.redis.transport import RedisTransport
    from persistent_memory.conversations.worker import SummarizerWorker
    from persistent_memory.memories.embedding_worker import EmbeddingWorker
    from persistent_memory.memories.extraction.worker import ExtractionWorker
    from persistent_memory.memories.service import MemoryService
    from persistent_memory.mirror import Mirror
    from persistent_memory.store import MemoryStore

    classes = [MemoryStore, MemoryService, RedisBackend, RedisTransport, SummarizerWorker, EmbeddingWorker]
    classes += [ExtractionWorker, Mirror]
    for name in ("langgraph", "langgraph_saver", "openai_agents", "pydantic_ai"):
        module = pytest.importorskip(f"persistent_memory.integrations.{name}")
        classes += [value for value in vars(module).values() if getattr(value, "__name__", "") in OPERATIONS]
    assert {cls.__name__ for cls in classes} == set(OPERATIONS)
    for cls in classes:
        for method in OPERATIONS[cls.__name__]:
            assert getattr(cls, method).__wrapped__, (cls, method)  # wrapped once, by instrument


@pytest.mark.django_db
@pytest.mark.parametrize("backend_name", ["memory", "redis"])
def test_each_kind_of_store_operation_is_a_span_after_the_genai_memory_conventions(
    spans: Any, store: Any
) -> None:
    store.create_session("s1")
    store.put("s1", "lang", "en")
    assert store.get("s1", "lang") == "en"
    store.add_messages("s1", [{"role": "user", "content": "I like tea"}])
    store.get_messages("s1")
    store.clear("s1", "lang")
    store.delete_session("s1")

    expected = {
        "create_session": ("create_memory_store", "sessions"),
        "put": ("upsert_memory", "sessions"),
        "get": ("search_memory", "sessions"),
        "add_messages": ("create_memory", "conversations"),
        "get_messages": ("search_memory", "conversations"),
        "clear": ("delete_memory", "sessions"),
        "delete_session": ("delete_memory_store", "sessions"),
    }
    for method, (operation, store_id) in expected.items():
        (span,) = spans(method)
        assert span.name == f"{operation} {store_id}"
        assert span.kind == SpanKind.INTERNAL
        assert span.attributes["gen_ai.operation.name"] == operation
        assert span.attributes["gen_ai.memory.store.id"] == store_id
        assert span.attributes["gen_ai.provider.name"] == "persistent_memory"
        assert span.attributes["gen_ai.conversation.id"] == "s1"
    assert spans("put")[0].attributes["gen_ai.memory.record.id"] == "lang"
    assert spans("get")[0].attributes["gen_ai.memory.record.count"] == 1
    assert spans("get_messages")[0].attributes["gen_ai.memory.record.count"] == 1
    assert spans("add_messages")[0].attributes["gen_ai.memory.record.count"] == 1


@pytest.mark.django_db
def test_a_failed_operation_records_its_error_code(spans: Any, store: Any) -> None:
    from persistent_memory.exceptions import SessionNotFound

    with pytest.raises(SessionNotFound):
        store.get("nobody", "k")
    (span,) = spans("get")
    assert span.attributes["error.type"] == "session_not_found"
    assert span.status.status_code == trace.StatusCode.ERROR
    failed = [p for p in _metrics()["persistent_memory.operation.duration"] if "error.type" in p.attributes]
    assert any(p.attributes["error.type"] == "session_not_found" for p in failed)


@pytest.mark.django_db
def test_long_term_memories_are_spans_of_the_memories_store(spans: Any) -> None:
    alice = memories_for("user:alice")
    added = alice.add("Alice drinks green tea", key="drink")
    alice.update(added["id"], content="Alice drinks black tea")
    found = alice.search_results("tea")
    alice.delete(added["id"])

    kinds = {span.attributes["persistent_memory.operation"]: span for span in spans()}
    assert kinds["add"].attributes["gen_ai.operation.name"] == "create_memory"
    assert kinds["update"].attributes["gen_ai.operation.name"] == "update_memory"
    assert kinds["update"].attributes["gen_ai.memory.record.id"] == str(added["id"])
    assert kinds["search_results"].attributes["gen_ai.operation.name"] == "search_memory"
    assert kinds["search_results"].attributes["gen_ai.memory.record.count"] == len(found.results) == 1
    assert kinds["delete"].attributes["gen_ai.operation.name"] == "delete_memory"
    assert {span.attributes["gen_ai.memory.store.id"] for span in kinds.values()} == {"memories"}


@pytest.mark.django_db
@pytest.mark.parametrize("backend_name", ["memory"])
def test_contents_stay_out_of_spans_unless_asked(spans: Any, store: Any, monkeypatch: Any) -> None:
    secret = "my card number is 4111"
    store.add_messages("s1", [{"role": "user", "content": secret}])
    memories_for("user:bob").search_results(secret)
    store.get_messages("s1")
    captured = json.dumps([dict(span.attributes) for span in spans()])
    assert "4111" not in captured

    EXPORTER.clear()
    monkeypatch.setenv(CAPTURE_CONTENT, "true")
    store.add_messages("s1", [{"role": "user", "content": secret}])
    memories_for("user:bob").search_results(secret)
    store.get_messages("s1")
    assert secret in spans("add_messages")[0].attributes["gen_ai.memory.records"]
    assert spans("search_results")[0].attributes["gen_ai.memory.query.text"] == secret
    assert secret in spans("get_messages")[0].attributes["gen_ai.memory.records"]


@pytest.mark.django_db
@pytest.mark.parametrize("backend_name", ["memory", "redis"])
def test_a_request_is_the_parent_of_its_store_spans(spans: Any, store: Any) -> None:
    user = get_user_model().objects.create_user("traced", password="pw-for-tests")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    tracer = trace.get_tracer("tests")
    body = {"question": {"text": "hello", "metadata": {"session_id": "s1"}}}
    with tracer.start_as_current_span("POST /api/memory/enrich/", kind=SpanKind.SERVER) as request:
        response = client.post("/api/memory/enrich/", body, format="json")
    assert response.status_code == 200, response.content
    (enrich,) = spans("enrich_recording") or spans("enrich")
    assert enrich.parent is not None and enrich.parent.span_id == request.get_span_context().span_id
    assert enrich.context.trace_id == request.get_span_context().trace_id


@pytest.mark.django_db
def test_redis_round_trips_are_client_spans_without_the_keys(
    spans: Any, redis_store: Any, redis_url: str
) -> None:
    tracer = trace.get_tracer("tests")
    redis_store.create_session("secret-session")
    EXPORTER.clear()
    with tracer.start_as_current_span("work"):
        redis_store.put("secret-session", "secret-key", "secret-value")
        redis_store.get_all("secret-session")
    (put,) = spans("put")
    redis_spans = [span for span in spans() if span.attributes.get("db.system") == "redis"]
    assert [span.name for span in redis_spans] == ["put", "get_all"]
    first = redis_spans[0]
    assert first.kind == SpanKind.CLIENT
    assert first.parent.span_id == put.context.span_id
    assert first.attributes["db.system.name"] == "redis"
    assert first.attributes["db.operation.name"] == "put"
    assert first.attributes["server.port"] == int(redis_url.rsplit(":", 1)[1].split("/")[0])
    assert "secret" not in json.dumps([dict(span.attributes) for span in redis_spans])

    # Outside any span (a background thread's poll of the mirror's backlog): measured, not traced.
    EXPORTER.clear()
    redis_store.backend.unsummarized_count()
    assert spans() == []
    calls = _metrics()["db.client.operation.duration"]
    assert any(p.attributes["db.operation.name"] == "get_all" for p in calls)
    assert len({p.attributes["db.operation.name"] for p in calls}) >= 3


@pytest.mark.django_db
def test_background_work_is_counted(spans: Any, settings: Any) -> None:
    from persistent_memory.memories.extraction.worker import Batch, ExtractionWorker
    from persistent_memory.store import get_store

    settings.PERSISTENT_MEMORY = memory_settings_for("memory")
    worker = ExtractionWorker(get_store())
    message = {"id": "m1", "role": "user", "content": "I live in Lyon", "created_at": 1.0}
    worker.extract([Batch("", "s1", "default", [message], 1)])
    points = _metrics()
    (items,) = [
        p
        for p in points["persistent_memory.task.items"]
        if p.attributes["persistent_memory.task"] == "extraction"
    ]
    assert items.value >= 1
    (lag,) = [
        p
        for p in points["persistent_memory.task.lag"]
        if p.attributes["persistent_memory.task"] == "extraction"
    ]
    assert lag.max > 1_000_000  # seconds since 1970: the message's created_at
    assert [span.name for span in spans() if span.name == "extraction"] == ["extraction"]


def _of_task(point: Any, task: str) -> bool:
    return point.attributes["persistent_memory.task"] == task


def _task_total(metric: str, task: str) -> float:
    """A task counter's value, or a task histogram's count, for ``task`` (0 before any)."""
    found = [p for p in _metrics().get(f"persistent_memory.task.{metric}", []) if _of_task(p, task)]
    return sum(getattr(p, "value", None) if hasattr(p, "value") else p.count for p in found)


@pytest.mark.django_db
def test_an_embedding_try_that_fails_is_counted(spans: Any, settings: Any) -> None:
    from persistent_memory.memories import embedders
    from persistent_memory.memories.embedding_worker import EmbeddingWorker

    settings.PERSISTENT_MEMORY = memory_settings_for("memory")
    memory = memories_for("user:a").add("Lives in Lyon.")  # no embedder set: stored without a vector

    def refuse(texts: list[str]) -> list[list[float]]:
        raise ConnectionError("the embedder is down")

    worker = EmbeddingWorker(
        embedder=embedders.Embedder(function=refuse, model="m"), gate=embedders.Circuit(threshold=99)
    )
    before = _task_total("failures", "embedding")
    assert worker._embed([("memory", memory["id"])]) is False  # to be tried again
    assert worker.failed == 1 and worker.embedded == 0
    assert _task_total("failures", "embedding") == before + 1


@pytest.mark.django_db(transaction=True)
def test_the_app_tasks_lag_and_failures_are_measured_where_they_run(
    spans: Any, configure: Any, server: Any, settings: Any
) -> None:
    from tests.chat_server import Reply
    from tests.test_tasks import HOME, IMMEDIATE, answer, extraction

    settings.TASKS = IMMEDIATE
    store = configure(**extraction(server))
    lags, failures = _task_total("lag", "extraction"), _task_total("failures", "extraction")
    server.replies = [Reply(status=500)]
    store.for_owner("u").add_messages("s", [{"role": "user", "content": "I live in Lyon.", "id": "m1"}])
    assert _task_total("failures", "extraction") == failures + 1  # the task failed, the write did not
    assert _task_total("lag", "extraction") == lags + 1
    server.replies = [answer(HOME)]
    store.for_owner("u").add_messages("s", [{"role": "user", "content": "Lyon!", "id": "m2"}])
    assert _task_total("failures", "extraction") == failures + 1
    assert _task_total("lag", "extraction") == lags + 2


@pytest.mark.django_db
def test_backlogs_are_observed_from_the_process_store(spans: Any, settings: Any) -> None:
    from persistent_memory.store import get_store

    settings.PERSISTENT_MEMORY = memory_settings_for("memory")
    store = get_store()
    store.add_messages("s1", [{"role": "user", "content": "hello"}])
    points = _metrics()
    assert [p.value for p in points["persistent_memory.summary.backlog"]] == [
        store.backend.unsummarized_count()
    ]
    assert "persistent_memory.mirror.backlog" not in points  # the mirror is off


def test_without_opentelemetry_nothing_imports_it_and_nothing_is_wrapped() -> None:
    # opentelemetry made unimportable in a fresh interpreter, as where it is not installed.
    script = """
import sys
sys.modules["opentelemetry"] = None
import django, os
os.environ["DJANGO_SETTINGS_MODULE"] = "memory_site.settings"
django.setup()
from persistent_memory import telemetry
from persistent_memory.store import MemoryStore
from persistent_memory.memories.service import MemoryService
from persistent_memory.backends.redis import RedisBackend
assert telemetry.ENABLED is False
assert not hasattr(MemoryStore.put, "__wrapped__") and not hasattr(MemoryService.add, "__wrapped__")
assert not hasattr(RedisBackend._call, "__wrapped__")
loaded = [name for name in sys.modules if name.startswith("opentelemetry") and sys.modules[name] is not None]
assert loaded == [], loaded
assert "persistent_memory.telemetry.otel" not in sys.modules
print("clean")
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.stdout.strip() == "clean", done.stderr
    assert telemetry.ENABLED  # and here, where it is installed, it is on


@pytest.mark.django_db
@pytest.mark.parametrize("backend_name", ["memory", "redis"])
def test_an_integration_call_is_the_parent_of_the_store_spans_it_makes(
    spans: Any, store: Any, backend_name: str
) -> None:
    agents = pytest.importorskip("persistent_memory.integrations.openai_agents")
    session = agents.PersistentMemorySession("s1")

    async def turn() -> list[Any]:
        await session.add_items([{"role": "user", "content": "hi"}])
        return await session.get_items()

    assert len(asyncio.run(turn())) == 1
    (add,) = spans("add_items")
    assert add.attributes["gen_ai.operation.name"] == "create_memory"
    assert add.attributes["gen_ai.memory.store.id"] == "conversations"
    below = [span for span in spans() if span.parent and span.parent.span_id == add.context.span_id]
    assert below and all(span.attributes["gen_ai.memory.store.id"] == "conversations" for span in below)
    if backend_name == "redis":  # the round trips under the store's spans, on the event loop's bridge
        store_spans = {span.context.span_id for span in below}
        assert any(span.parent.span_id in store_spans for span in spans() if span.kind == SpanKind.CLIENT)
    (get,) = spans("get_items")
    assert get.attributes["gen_ai.memory.record.count"] == 1


def test_with_the_api_and_no_sdk_the_wrappers_call_straight_through() -> None:
    script = """
import os, django
os.environ["DJANGO_SETTINGS_MODULE"] = "memory_site.settings"
django.setup()
from django.conf import settings
from persistent_memory.telemetry import ENABLED, otel
from persistent_memory.store import MemoryStore, get_store
settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "MIRROR_MODE": "off"}
assert ENABLED and MemoryStore.put.__wrapped__
assert otel._configured() is False
store = get_store()
store.create_session("s1")
store.put("s1", "k", 1)
print(store.get("s1", "k"))
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.stdout.strip() == "1", done.stderr
