"""The app's background work on Django's task framework (``TASK_BACKEND``): the in-process
default left as it was, the ImmediateBackend (inline), the DummyBackend (what is enqueued,
debounced), and django-tasks-db's ``db_worker`` as a process of its own on SQLite and
PostgreSQL, killed with -9 with tasks queued. Extraction is real: the chat-completions
extractor against the local stand-in provider (tests/chat_server.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.core.checks import run_checks
from django.test import override_settings

from persistent_memory import tasks
from persistent_memory.health import tasks_health
from persistent_memory.memories import memories_for
from persistent_memory.models import BackgroundWork
from persistent_memory.tasks import task_framework
from tests.chat import assistant, user
from tests.chat_server import Reply
from tests.readme_blocks import example, run_example
from tests.servers import ROOT, demo_env

FRAMEWORK = task_framework()
IMMEDIATE = {"default": {"BACKEND": f"{FRAMEWORK.__name__}.backends.immediate.ImmediateBackend"}}
DUMMY = {"default": {"BACKEND": f"{FRAMEWORK.__name__}.backends.dummy.DummyBackend"}}
EXTRACTOR = "persistent_memory.memories.extraction.chat_completions.extract"
HOME = {"type": "factual", "key": "fact.home-city", "content": "Lives in Lyon.", "messages": []}


def extraction(server: Any, **extra: Any) -> dict[str, Any]:
    """Extraction by the chat-completions extractor at the stand-in provider, as tasks."""
    return {
        "TASK_BACKEND": "default",
        "MEMORY_EXTRACTION_WORKER": True,
        "MEMORY_EXTRACTORS": [EXTRACTOR],
        "MEMORY_EXTRACTOR_OPTIONS": {
            "base_url": server.url,
            "model": "m",
            "api_key_env": None,
            "timeout": 10,
        },
        **extra,
    }


def sent_ids(server: Any) -> list[str]:
    """The message ids of every transcript the provider was sent, in order."""
    return [
        found
        for request in server.requests
        for found in re.findall(r"^\[([^\]]+)\]", request["body"]["messages"][-1]["content"], re.M)
    ]


def answer(*items: Any) -> Reply:
    return Reply(json.dumps(list(items)))


def run_async(coroutine: Any) -> None:
    """Run ``coroutine`` as an async view would, closing the connection the async ORM opened
    (the thread it ran in is asgiref's, which outlives the test)."""
    from asgiref.sync import sync_to_async
    from django.db import connections

    async def closing() -> None:
        try:
            await coroutine
        finally:
            await sync_to_async(connections.close_all)()

    asyncio.run(closing())


def dummy_results() -> list[Any]:
    return FRAMEWORK.task_backends["default"].results


def run_dummy() -> list[Any]:
    """Run what the DummyBackend holds, as a worker would; the return values."""
    results, dummy_results()[:] = list(dummy_results()), []
    return [result.task.call(*result.args, **result.kwargs) for result in results]


@pytest.mark.django_db(transaction=True)
class TestDefault:
    def test_without_a_task_backend_the_threads_run_as_before(self, configure, server):
        conf = extraction(server)
        conf.pop("TASK_BACKEND")
        store = configure(**conf)
        assert store.extraction_worker.running
        server.replies = [answer(HOME)]
        store.for_owner("u").add_messages("s", [user("I live in Lyon.", id="m1")])
        assert store.extraction_worker.wait_idle(timeout=30)
        assert sent_ids(server) == ["m1"]
        assert tasks_health() == {"status": "ok", "runner": "threads"}


@pytest.mark.django_db(transaction=True)
class TestImmediate:
    def test_each_message_is_extracted_once_and_a_rerun_changes_nothing(self, configure, server, settings):
        settings.TASKS = IMMEDIATE
        store = configure(**extraction(server))
        assert not store.extraction_worker.running and not store.summarizer_worker.running
        server.replies = [answer(HOME)]
        alice = store.for_owner("user:alice")
        alice.add_messages("s", [user("I live in Lyon.", id="m1"), assistant("Nice.", id="m2")])
        alice.add_messages("s", [user("Really, Lyon.", id="m3")])
        assert sent_ids(server) == ["m1", "m2", "m3"]  # the cursor: m1 and m2 not sent again
        [memory] = memories_for("user:alice").list()[1]
        assert memory["key"] == "fact.home-city"
        # Run again (a redelivery), and after memory_extract did the work: nothing changes.
        assert tasks.extract_conversation.call("user:alice", "s", "default") == {"messages": 0, "written": 0}
        from persistent_memory.memories.extraction import extract_sessions

        extract_sessions(store)  # its candidate cites every message it sent: it may rewrite
        [memory] = memories_for("user:alice").list()[1]
        requests = len(server.requests)
        assert tasks.extract_conversation.call("user:alice", "s", "default") == {"messages": 0, "written": 0}
        assert len(server.requests) == requests
        [again] = memories_for("user:alice").list()[1]
        assert (again["id"], again["updated_at"]) == (memory["id"], memory["updated_at"])

    def test_a_failed_extractor_keeps_the_messages_for_the_next_run(self, configure, server, settings):
        settings.TASKS = IMMEDIATE
        store = configure(**extraction(server))
        server.replies = [Reply(status=500)]
        alice = store.for_owner("user:alice")
        alice.add_messages("s", [user("I live in Lyon.", id="m1")])  # the task failed, the write did not
        server.replies = [answer(HOME)]
        alice.add_messages("s", [user("Lyon!", id="m2")])
        assert sent_ids(server) == ["m1", "m1", "m2"]  # m1 again after its failure
        assert memories_for("user:alice").list()[0] == 1

    def test_a_forgotten_session_leaves_nothing_to_extract(self, configure, server, settings):
        settings.TASKS = IMMEDIATE
        store = configure(**extraction(server))
        server.replies = [answer(HOME)]
        alice = store.for_owner("user:alice")
        alice.add_messages("s", [user("I live in Lyon.", id="m1")])
        alice.delete_session("s")
        assert tasks.extract_conversation.call("user:alice", "s", "default") == {"messages": 0, "written": 0}
        assert not BackgroundWork.objects.filter(kind="extract", session_id="s").exists()
        alice.add_messages("t", [user("I live in Lyon.", id="m2")])
        assert BackgroundWork.objects.filter(owner="user:alice").exists()
        from persistent_memory.operations.forget import forget_owner

        forget_owner("user:alice", store=store)
        assert not BackgroundWork.objects.filter(owner="user:alice").exists()

    def test_summaries_are_made_by_the_task(self, configure, settings):
        settings.TASKS = IMMEDIATE
        store = configure(
            TASK_BACKEND="default",
            CONTEXT_STRATEGY="rolling_summary",
            SUMMARIZER_WORKER=True,
            SUMMARIZE_AFTER_TOKENS=60,
        )
        for turn in range(6):
            store.add_messages("s", [user(f"Question {turn}. More."), assistant(f"Answer {turn}. Yes.")])
        assert store.get_context("s", strategy="rolling_summary")["summary"]
        assert store.backend.unsummarized_count() == 0


@pytest.mark.django_db(transaction=True)
class TestDebounced:
    def test_a_burst_enqueues_one_extraction_and_one_summary_delayed(self, configure, server, settings):
        settings.TASKS = DUMMY
        dummy_results().clear()
        store = configure(
            **extraction(server),
            CONTEXT_STRATEGY="rolling_summary",
            SUMMARIZER_WORKER=True,
            SUMMARIZE_AFTER_TOKENS=60,
        )
        alice = store.for_owner("user:alice")
        for turn in range(6):
            alice.add_messages(
                "s", [user(f"I live in Lyon {turn}.", id=f"u{turn}"), assistant("Ok.", id=f"a{turn}")]
            )
        alice.add_messages("t", [user("Other.", id="o1")])
        queued = Counter((r.task.name, tuple(r.args)) for r in dummy_results())
        assert queued == {
            ("extract_conversation", ("user:alice", "s", "default")): 1,
            ("extract_conversation", ("user:alice", "t", "default")): 1,
            ("summarize_conversations", ()): 1,
        }
        assert all(result.task.run_after is not None for result in dummy_results())  # debounced
        assert tasks_health() | {"class": None} == {
            "status": "ok",
            "runner": "tasks",
            "backend": "default",
            "class": None,
            "backlog": 3,
        }
        server.replies = [answer(HOME)]
        run_dummy()
        assert sorted(sent_ids(server)) == sorted(
            [*(f"u{t}" for t in range(6)), *(f"a{t}" for t in range(6)), "o1"]
        )
        assert store.for_owner("user:alice").get_context("s", strategy="rolling_summary")["summary"]
        # The leases were given back: the next write enqueues again.
        alice.add_messages("s", [user("More.", id="u9")])
        assert [r.task.name for r in dummy_results()] == ["extract_conversation", "summarize_conversations"]

    def test_async_code_enqueues_with_aenqueue(self, configure, server, settings):
        settings.TASKS = DUMMY
        dummy_results().clear()
        configure(**extraction(server))

        async def twice() -> None:
            await tasks.aconversation_changed("user:alice", "s", "default")
            await tasks.aconversation_changed("user:alice", "s", "default")  # leased: not again

        run_async(twice())
        assert [(r.task.name, list(r.args)) for r in dummy_results()] == [
            ("extract_conversation", ["user:alice", "s", "default"])
        ]


@pytest.mark.django_db(transaction=True)
def test_a_memory_written_without_a_vector_is_embedded_by_a_task_once(settings):
    from persistent_memory.models import LongTermMemory
    from tests.embeddings_server import embed_text, embeddings_server

    def vector_of(memory_id: int) -> list[float] | None:
        return LongTermMemory.objects.get(pk=memory_id).embedding

    settings.TASKS = DUMMY
    dummy_results().clear()
    with embeddings_server() as server:
        settings.PERSISTENT_MEMORY = {
            "TASK_BACKEND": "default",
            "EMBEDDER": "openai",
            "EMBEDDER_OPTIONS": {"base_url": server.url, "model": "stand-in", "api_key_env": None},
            "EMBEDDER_REQUEST_TIMEOUT": 0.2,
        }
        server.hang()  # the write gets no vector in its time
        memory = memories_for("user:a").add("Drinks espresso daily.")
        server.recover()
        assert [(r.task.name, list(r.args)) for r in dummy_results()] == [
            ("embed", ["memory", [memory["id"]]])
        ]
        assert run_dummy() == [{"embedded": 1}]
        assert vector_of(memory["id"]) == pytest.approx(embed_text("Drinks espresso daily."))
        requests = len(server.requests)
        assert tasks.embed.call("memory", [memory["id"]]) == {"embedded": 0}  # run again: nothing to do
        assert len(server.requests) == requests


@pytest.mark.django_db(transaction=True)
class TestDocs:
    def test_the_run_example_on_the_immediate_backend(self, configure, settings):
        settings.TASKS = IMMEDIATE
        configure(TASK_BACKEND="default", MEMORY_EXTRACTION_WORKER=True)
        run_example("tasks-run", {})

    def test_the_async_example_enqueues_once(self, configure, settings):
        settings.TASKS = DUMMY
        dummy_results().clear()
        configure(TASK_BACKEND="default", MEMORY_EXTRACTION_WORKER=True)
        namespace: dict[str, Any] = {}
        exec(example("tasks-async"), namespace)  # noqa: S102 (the docs' own example)
        run_async(namespace["on_new_messages"]("user:alice", "chat", "default"))
        run_async(namespace["on_new_messages"]("user:alice", "chat", "default"))
        assert [r.task.name for r in dummy_results()] == ["extract_conversation"]


class TestChecks:
    def test_the_immediate_backend_in_production_is_a_warning(self, settings):
        settings.TASKS = IMMEDIATE
        settings.PERSISTENT_MEMORY = {"TASK_BACKEND": "default"}
        with override_settings(DEBUG=False):
            assert "persistent_memory.W010" in {m.id for m in run_checks()}
        with override_settings(DEBUG=True):
            assert "persistent_memory.W010" not in {m.id for m in run_checks()}
        settings.TASKS = DUMMY
        assert "persistent_memory.W010" not in {m.id for m in run_checks()}

    @pytest.mark.parametrize("alias", ["nowhere", 3, ""])
    def test_a_task_backend_not_in_tasks_is_an_error(self, settings, alias):
        settings.TASKS = DUMMY
        settings.PERSISTENT_MEMORY = {"TASK_BACKEND": alias}
        assert "persistent_memory.E018" in {m.id for m in run_checks()}


# A real worker: db_worker and the web process, each a process of its own ---------------

POSTGRES = os.environ.get("DATABASE_URL", "")
if not POSTGRES.startswith("postgres"):
    POSTGRES = "postgres://postgres@127.0.0.1:5432/postgres"

WEB = """
import sys, django
django.setup()
from persistent_memory import get_store
store = get_store()
for conversation in range(int(sys.argv[1])):
    scoped = store.for_owner(f"user:{conversation}")
    for turn in range(int(sys.argv[2])):
        message = {"role": "user", "content": "Lyon", "id": f"{sys.argv[3]}-{conversation}-{turn}"}
        scoped.add_messages("s", [message])
print("queued", flush=True)
sys.stdin.read()
"""

HEALTH = """
import json, django
django.setup()
from persistent_memory.health import tasks_health
print(json.dumps(tasks_health()))
"""

COUNT = """
import django
django.setup()
from django_tasks_db.models import DBTaskResult
from persistent_memory.models import LongTermMemory
results = DBTaskResult.objects
ready, failed = results.filter(status="READY").count(), results.filter(status="FAILED").count()
print(ready, failed, LongTermMemory.objects.count())
"""


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'db.sqlite3'}"
        return
    psycopg = pytest.importorskip("psycopg")
    name = f"pm_tasks_{uuid.uuid4().hex[:12]}"
    try:
        admin = psycopg.connect(POSTGRES, autocommit=True, connect_timeout=60)
    except psycopg.OperationalError as exc:
        pytest.skip(f"no PostgreSQL: {exc}")
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlsplit(POSTGRES)._replace(path=f"/{name}").geturl()
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def python(env: dict[str, str], code: str, *args: str) -> str:
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    ).stdout


def start(env: dict[str, str], *command: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, *command],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def kill(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        os.kill(process.pid, signal.SIGKILL)
    process.wait()


def test_db_worker_killed_with_tasks_queued_loses_none_and_extracts_each_message_once(
    database_url, redis_url, redis_client, server
):
    env = demo_env(
        DJANGO_SETTINGS_MODULE="tests.settings_tasks",
        DATABASE_URL=database_url,
        REDIS_URL=redis_url,
        MEMORY_BACKEND="redis",
        EXTRACTOR_BASE_URL=server.url,
        # Long enough that the kill always comes before the tasks are due, on a loaded machine.
        TASK_DEBOUNCE_SECONDS="30",
    )
    migrate, run_worker = (shlex.split(line)[1:] for line in example("tasks-worker").splitlines())
    subprocess.run([sys.executable, *migrate, "-v0"], cwd=ROOT, env=env, check=True)
    server.replies = [answer(HOME)]
    worker = start(env, *run_worker, "--interval", "0.2", "--no-startup-delay")
    web = start(env, "-c", WEB, "4", "5", "a")
    try:
        assert web.stdout.readline().strip() == "queued", web.stdout.read()
    finally:
        kill(web)
        kill(worker)
    ready, failed, memories = map(int, python(env, COUNT).split())
    assert (ready, failed, memories) == (4, 0, 0)  # one extraction per conversation, waiting
    assert server.requests == []
    # Started again: a web process writes more, the worker runs what the killed ones left.
    web = start(env, "-c", WEB, "4", "1", "b")
    worker = start(env, *run_worker, "--interval", "0.2", "--no-startup-delay")
    try:
        assert web.stdout.readline().strip() == "queued"
        deadline = time.monotonic() + 300
        while True:
            ready, failed, memories = map(int, python(env, COUNT).split())
            if ready == 0 and memories == 4:
                break
            assert time.monotonic() < deadline, (ready, failed, memories)
            time.sleep(1)
    finally:
        kill(web)
        kill(worker)
    assert failed == 0
    assert json.loads(python(env, HEALTH)) == json.loads(example("tasks-health"))  # as the docs show
    expected = [
        f"{batch}-{c}-{t}" for c in range(4) for batch, turns in (("a", 5), ("b", 1)) for t in range(turns)
    ]
    assert Counter(sent_ids(server)) == Counter(expected)  # each message once


@pytest.mark.django_db(transaction=True)
def test_without_the_tasks_loaded_a_vector_is_made_here_not_lost(settings, caplog):
    """The embedding worker announces vectors_wanted for the tasks to enqueue; should
    nothing receive it (the tasks module not loaded), this process's worker embeds the
    memory, and the log says why."""
    from persistent_memory.memories import embedding_worker
    from persistent_memory.memories.signals import vectors_wanted
    from persistent_memory.models import LongTermMemory
    from tests.embeddings_server import embed_text, embeddings_server

    settings.TASKS = DUMMY
    dummy_results().clear()
    uid = "persistent_memory.tasks.vectors_wanted"
    with embeddings_server() as server:
        settings.PERSISTENT_MEMORY = {
            "TASK_BACKEND": "default",
            "EMBEDDER": "openai",
            "EMBEDDER_OPTIONS": {"base_url": server.url, "model": "stand-in", "api_key_env": None},
            "EMBEDDER_REQUEST_TIMEOUT": 0.2,
        }
        assert vectors_wanted.disconnect(dispatch_uid=uid)
        try:
            server.hang()  # the write gets no vector in its time
            with caplog.at_level(logging.WARNING, logger="persistent_memory"):
                memory = memories_for("user:a").add("Drinks espresso daily.")
            server.recover()
            worker = embedding_worker.worker()
            assert worker is not None and worker.wait_idle(timeout=60)
        finally:
            vectors_wanted.connect(tasks._on_vectors_wanted, dispatch_uid=uid)
    assert dummy_results() == []  # no task was enqueued
    assert "persistent_memory.tasks is not loaded" in caplog.text
    embedding = LongTermMemory.objects.get(pk=memory["id"]).embedding
    assert embedding == pytest.approx(embed_text("Drinks espresso daily."))
