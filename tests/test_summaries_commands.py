"""Where summaries are made besides the worker thread: ``memory_summarize --conversations``
(one pass, ``--watch`` as a process of its own until Ctrl-C, ``-n``, bad arguments, a
failing summarizer), and Django's task framework through the django-tasks package
(ImmediateBackend and DummyBackend), with ``SUMMARIZER_TASKS`` and without."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils.module_loading import import_string

from persistent_memory.store import MemoryStore
from persistent_memory.tasks import task_framework
from tests.chat import assistant, user

ROOT = Path(__file__).resolve().parent.parent
ROLLING = {"CONTEXT_STRATEGY": "rolling_summary", "SUMMARIZER_WORKER": False, "SUMMARIZE_AFTER_TOKENS": 60}
#: Django 6's django.tasks, else the django-tasks package (Django 5.2): their own backends.
FRAMEWORK = task_framework()
IMMEDIATE = {"default": {"BACKEND": f"{FRAMEWORK.__name__}.backends.immediate.ImmediateBackend"}}
DUMMY = {"default": {"BACKEND": f"{FRAMEWORK.__name__}.backends.dummy.DummyBackend"}}


def chat(store: MemoryStore, session: str, turns: int = 6, start: int = 0) -> None:
    for turn in range(start, start + turns):
        store.add_messages(session, [user(f"Question {turn}. More."), assistant(f"Answer {turn}. Yes.")])


def run(*args: str) -> str:
    out = StringIO()
    call_command("memory_summarize", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def run_json(*args: str) -> dict[str, Any]:
    return json.loads(run(*args, "--json"))


def summary_of(store: MemoryStore, session: str) -> str | None:
    return store.get_context(session, strategy="rolling_summary")["summary"]


class TestCommand:
    def test_one_pass_summarizes_every_marked_conversation(self, configure):
        store = configure(**ROLLING)
        chat(store, "a")
        chat(store, "b")
        chat(store, "c", turns=1)  # too short to be marked
        assert run_json("--conversations", "-n") == {
            "passes": 0,
            "taken": 0,
            "summarized": 0,
            "skipped": 0,
            "failed": 0,
            "waiting": False,
            "pending": 2,
            "state": "healthy",
        }
        counts = run_json("--conversations")
        assert (counts["passes"], counts["taken"], counts["summarized"], counts["pending"]) == (1, 2, 2, 0)
        assert summary_of(store, "a").startswith("User: Question 0.")
        assert summary_of(store, "b") and summary_of(store, "c") is None
        assert run("--conversations", "--limit", "5").strip() == (
            "Summarized 0 conversations in 1 passes (0 taken, 0 with nothing to do, 0 failed); "
            "0 still marked; summarizers: healthy."
        )

    def test_limit_takes_at_most_that_many(self, configure):
        store = configure(**ROLLING)
        for session in ("a", "b", "c"):
            chat(store, session)
        counts = run_json("--conversations", "--limit", "2")
        assert (counts["taken"], counts["summarized"], counts["pending"]) == (2, 2, 1)

    def test_off_and_bad_arguments(self, configure):
        configure()
        assert "Rolling summaries are off" in run("--conversations")
        assert run_json("--conversations")["summarized"] == 0
        configure(**ROLLING)
        for args in (
            ["--conversations", "--all"],
            ["--conversations", "--session", "a"],
            ["--conversations", "--max-history", "5"],
            ["--conversations", "--watch", "0"],
            ["--conversations", "--limit", "0"],
            ["--conversations", "-n", "--watch", "1"],
            ["--watch", "1"],
            ["--limit", "3"],
        ):
            with pytest.raises(CommandError):
                run(*args)

    def test_a_failing_summarizer_exits_non_zero_and_keeps_the_mark(self, configure):
        store = configure(
            **ROLLING, SUMMARIZER="tests.test_summaries_health.Scripted", SUMMARIZER_OPTIONS={"mode": "raise"}
        )
        chat(store, "a")
        with pytest.raises(CommandError, match="1 summaries failed"):
            run("--conversations")
        assert store.backend.unsummarized_count() == 1
        assert store.summarizer_worker.health.state == "retry"

    def test_the_command_stops_this_process_worker_thread_and_does_the_work(self, configure):
        store = configure(**{**ROLLING, "SUMMARIZER_WORKER": True})
        assert store.summarizer_worker.running
        run("--conversations")
        assert not store.summarizer_worker.running

    def test_watch_until_ctrl_c(self, redis_store, redis_url, settings, tmp_path):
        settings.PERSISTENT_MEMORY = {
            "BACKEND": "redis",
            "REDIS_URL": redis_url,
            "MIRROR_MODE": "off",
            **ROLLING,
        }
        from persistent_memory import get_store

        store = get_store()
        chat(store, "a")
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings_rolling",
            "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
            "MEMORY_BACKEND": "redis",
            "REDIS_URL": redis_url,
            "PYTHONUNBUFFERED": "1",
        }
        process = subprocess.Popen(
            [sys.executable, "manage.py", "memory_summarize", "--conversations", "--watch", "0.1", "-v", "2"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 120  # a loaded machine gets there later, not never
            while summary_of(store, "a") is None:
                assert time.monotonic() < deadline and process.poll() is None
                time.sleep(0.05)
            chat(store, "b")  # marked while the command watches: summarized by a later pass
            while summary_of(store, "b") is None:
                assert time.monotonic() < deadline and process.poll() is None
                time.sleep(0.05)
        finally:
            process.send_signal(signal.SIGINT)
            out, err = process.communicate(timeout=30)
        assert process.returncode == 0, err
        assert "Interrupted" in out and "Traceback" not in err
        # -v 2: a line for each pass that took something ("b" may be taken by the pass that
        # summarized "a", if it was marked before that pass looked again: timing, not a rule).
        passes = [line for line in out.splitlines() if line.startswith("pass ")]
        assert sum(int(line.split("summarized ")[1].split(",")[0]) for line in passes) == 2, out
        last = out.strip().splitlines()[-1]
        assert last.startswith("Summarized 2 conversations in ")
        assert int(last.split(" in ")[1].split(" passes")[0]) >= 2


class TestTasks:
    def test_the_task_summarizes_on_the_immediate_backend(self, configure, settings):
        settings.TASKS = IMMEDIATE
        from persistent_memory.tasks import summarize_conversations_task

        store = configure(**ROLLING)
        chat(store, "a")
        chat(store, "b")
        result = summarize_conversations_task.enqueue(limit=1)
        assert result.status == "SUCCESSFUL"
        assert result.return_value == {
            "taken": 1,
            "summarized": 1,
            "skipped": 0,
            "failed": 0,
            "waiting": False,
        }
        result = summarize_conversations_task.enqueue()
        assert result.return_value["summarized"] == 1
        assert summary_of(store, "a") and summary_of(store, "b")
        assert (
            summarize_conversations_task.module_path == "persistent_memory.tasks.summarize_conversations_task"
        )
        # A task enqueued before the move is found by its old path (and says it moved).
        with pytest.warns(DeprecationWarning, match="persistent_memory.conversations.tasks moved"):
            sys.modules.pop("persistent_memory.conversations.tasks", None)
            old = import_string("persistent_memory.conversations.tasks.summarize_conversations_task")
        assert old is summarize_conversations_task

    @pytest.mark.django_db  # Django 6's task backends may record results in the database
    def test_with_summarizer_tasks_the_worker_enqueues_instead_of_summarizing(self, configure, settings):
        settings.TASKS = DUMMY
        default_task_backend = FRAMEWORK.default_task_backend
        store = configure(**ROLLING, SUMMARIZER_TASKS=True)
        worker = store.summarizer_worker
        assert not worker.enqueue_if_marked()  # nothing marked
        chat(store, "a")
        assert worker.enqueue_if_marked()
        assert not worker.enqueue_if_marked()  # one is waiting: not another
        [result] = default_task_backend.results
        assert result.status == "READY" and summary_of(store, "a") is None  # enqueued, not run
        assert result.task.call(*result.args, **result.kwargs)["summarized"] == 1  # a task worker runs it
        assert summary_of(store, "a")
        assert not [m for m in run_checks() if m.id == "persistent_memory.E014"]  # TASKS is configured

    def test_the_worker_thread_enqueues_on_the_immediate_backend(self, configure, settings):
        settings.TASKS = IMMEDIATE
        store = configure(**{**ROLLING, "SUMMARIZER_WORKER": True, "SUMMARIZER_TASKS": True})
        worker = store.summarizer_worker
        worker.interval = 0.05
        assert worker.running and worker.use_tasks
        chat(store, "a")
        deadline = time.monotonic() + 60
        while summary_of(store, "a") is None:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # The summary is the task's doing: the worker only enqueued it (on Django 6 the task
        # runs inline, outside the worker's own passes, so their report says nothing of it).
