"""The summarizers' health on both backends: a summarizer that raises, hangs past its
timeout or answers garbage walks healthy -> retry -> degraded -> recovering -> healthy
with its backoff times, sending summarizer_health_changed at each change; windows keep
answering (with the state) meanwhile, also while the worker thread is stuck on a hung
summarizer; marks are kept; health/ shows it to staff; the worker stops cleanly.

Nothing here depends on how fast the machine is: the backoff and degraded waits are
read from a clock the test moves (``Clock``), a hung summarizer hangs until the test
releases it (so "it gave up" and "it did not wait" are states, not elapsed times), and a
summarizer expected to succeed has a timeout no loaded machine reaches."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.checks import run_checks
from rest_framework.test import APIClient

from persistent_memory.conversations.health import HealthPolicy, SummarizerHealth
from persistent_memory.conversations.signals import summarizer_health_changed
from persistent_memory.store import MemoryStore
from tests.chat import assistant, user


class Scripted:
    """A summarizer doing what ``mode`` says: "ok", "raise", "hang" or "garbage". "hang"
    waits until ``release`` is set (or ``hang_seconds``), then does what ``mode`` says by
    then; ``hanging`` counts the calls inside that wait."""

    def __init__(self, mode: str = "ok", hang_seconds: float = 60.0) -> None:
        self.mode = mode
        self.hang_seconds = hang_seconds
        self.calls = 0
        self.hanging = 0
        self.release = threading.Event()

    def summarize(self, previous_summary: str | None, messages: list[dict[str, Any]]) -> str:
        self.calls += 1
        if self.mode == "raise":
            raise RuntimeError("model overloaded")
        if self.mode == "hang":
            self.hanging += 1
            try:
                self.release.wait(self.hang_seconds)
            finally:
                self.hanging -= 1
        if self.mode == "garbage":
            return "  "
        return f"Summary {self.calls}: {len(messages)} messages."


SCRIPTED = "tests.test_summaries_health.Scripted"


def health_settings(mode: str, **extra: Any) -> dict[str, Any]:
    return {
        "CONTEXT_STRATEGY": "rolling_summary",
        "SUMMARIZER_WORKER": False,
        "SUMMARIZE_AFTER_TOKENS": 60,
        "SUMMARIZER": SCRIPTED,
        "SUMMARIZER_OPTIONS": {"mode": mode},
        "SUMMARIZER_RETRY_ATTEMPTS": 2,
        "SUMMARIZER_BACKOFF_SECONDS": 0.2,
        "SUMMARIZER_DEGRADED_SECONDS": 0.6,
        "SUMMARIZER_TIMEOUT_SECONDS": 0.3,
        **extra,
    }


def chat(store: MemoryStore, turns: int, start: int = 0, session: str = "s") -> None:
    for turn in range(start, start + turns):
        store.add_messages(session, [user(f"Question {turn}. More."), assistant(f"Answer {turn}. Yes.")])


@pytest.fixture
def changes():
    """The health changes summarizer_health_changed reported, as (previous, state)."""
    seen: list[tuple[str, str]] = []

    def on_change(sender, previous, state, health, **kwargs):
        assert health["state"] == state
        seen.append((previous, state))

    summarizer_health_changed.connect(on_change, weak=False)
    yield seen
    summarizer_health_changed.disconnect(on_change)


class Clock:
    """The health's clock, moved by the test: backoffs pass when the test says so."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> Clock:
    return Clock()


#: A timeout for a summarizer expected to succeed: never reached, however loaded the machine.
GENEROUS = 60.0


def patient(worker) -> None:
    """The worker's summarizer calls time out after GENEROUS seconds from now on."""
    worker.options = dataclasses.replace(worker.options, timeout_seconds=GENEROUS)


def wait_until(condition, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def window(store: MemoryStore) -> dict[str, Any]:
    return store.get_context("s", max_tokens=10_000)


@pytest.mark.parametrize("mode", ["raise", "hang", "garbage"])
def test_a_failing_summarizer_walks_the_states_and_windows_keep_working(configure, changes, clock, mode):
    store = configure(**health_settings(mode))
    worker = store.summarizer_worker
    worker.health.clock = clock
    chat(store, 6)
    before = window(store)
    assert before["summary_state"] == "healthy" and before["summary"] is None

    report = worker.run_once()
    if mode == "hang":  # given up after SUMMARIZER_TIMEOUT_SECONDS, the summarizer still hung
        wait_until(lambda: worker.summarizer.hanging == 1)
    assert (report.taken, report.failed, report.waiting) == (1, 1, True)
    record = worker.health.record()
    assert record["state"] == "retry" and record["failures"] == 1
    assert record["retry_at"] - record["last_error_at"] == pytest.approx(0.2)
    expected_error = {"raise": "model overloaded", "hang": "TimeoutError", "garbage": "no summary"}[mode]
    assert expected_error in record["last_error"]
    assert store.backend.unsummarized_count() == 1  # still marked
    during = window(store)
    assert during["summary_state"] == "retry"
    assert during["messages"] == before["messages"]  # plain truncation meanwhile

    # Within the backoff nothing is tried; after it, a second failure degrades.
    calls = worker.summarizer.calls
    clock.advance(0.19)
    assert worker.run_once().waiting and worker.summarizer.calls == calls
    clock.advance(0.02)
    assert worker.run_once().failed == 1
    record = worker.health.record()
    assert record["state"] == "degraded" and record["failures"] == 2
    assert record["retry_at"] - record["last_error_at"] == pytest.approx(0.6)
    assert window(store)["summary_state"] == "degraded"
    assert worker.run_once().waiting

    # After the degraded wait the summarizer is tried again (recovering), and works.
    clock.advance(0.61)
    worker.summarizer.mode = "ok"
    worker.summarizer.release.set()  # the hung calls end (their answers long abandoned)
    patient(worker)
    report = worker.run_once()
    assert (report.summarized, report.failed) == (1, 0)
    record = worker.health.record()
    assert record["state"] == "healthy" and record["failures"] == 0 and record["retry_at"] is None
    assert record["last_success_at"] >= record["last_error_at"]
    assert expected_error in record["last_error"]  # the last error stays on the record
    after = window(store)
    assert after["summary_state"] == "healthy" and after["summary"].startswith("Summary")
    assert changes == [
        ("healthy", "retry"),
        ("retry", "degraded"),
        ("degraded", "recovering"),
        ("recovering", "healthy"),
    ]


def test_a_failure_while_recovering_degrades_again(configure, changes, clock):
    store = configure(**health_settings("raise", SUMMARIZER_RETRY_ATTEMPTS=1))
    worker = store.summarizer_worker
    worker.health.clock = clock
    chat(store, 6)
    worker.run_once()
    assert worker.health.state == "degraded"  # one attempt only: degraded at once
    clock.advance(0.61)
    worker.run_once()
    assert worker.health.state == "degraded"
    assert changes == [("healthy", "degraded"), ("degraded", "recovering"), ("recovering", "degraded")]
    assert store.backend.unsummarized_count() == 1


def test_the_backoff_doubles_up_to_the_degraded_wait():
    policy = HealthPolicy(retry_attempts=10, backoff_seconds=1.5, degraded_seconds=10)
    assert [policy.backoff(n) for n in range(1, 6)] == [1.5, 3, 6, 10, 10]


def test_the_record_is_shared_by_every_store_of_the_backend(configure, backend_name, clock):
    store = configure(**health_settings("raise"))
    store.summarizer_worker.health.clock = clock
    chat(store, 6)
    store.summarizer_worker.run_once()
    other = SummarizerHealth(store.backend, clock=clock)
    assert other.state == "retry" and other.wait_seconds() == pytest.approx(0.2)
    other.reset()
    assert store.summarizer_worker.health.state == "healthy"
    assert store.get_context("s")["summary_state"] == "healthy"


def test_the_worker_thread_summarizes_and_windows_never_wait_for_a_hung_summarizer(configure, changes):
    store = configure(
        **health_settings(
            "hang",
            SUMMARIZER_WORKER=True,
            SUMMARIZER_TIMEOUT_SECONDS=GENEROUS,
            SUMMARIZER_BACKOFF_SECONDS=0.1,
        )
    )
    worker = store.summarizer_worker
    worker.interval = 0.05
    assert worker.running
    chat(store, 6)
    wait_until(lambda: worker.summarizer.hanging == 1)
    # The worker is stuck in the summarizer; appends and windows go on meanwhile (each of
    # them returned while it is still stuck: none waited for it).
    for turn in range(10, 20):
        chat(store, 1, start=turn)
        assert window(store)["summary_state"] == "healthy"
    assert worker.summarizer.hanging == 1 and worker.health.state == "healthy"
    # Released with an empty answer: a failure, which the thread survives.
    worker.summarizer.mode = "garbage"
    worker.summarizer.release.set()
    wait_until(lambda: worker.health.state in ("retry", "degraded"))
    worker.summarizer.mode = "ok"
    wait_until(lambda: window(store)["summary"] is not None)
    # The state moves before the change is reported to listeners: wait for both.
    wait_until(lambda: worker.health.state == "healthy" and changes[-1][1] == "healthy")
    assert changes[0] == ("healthy", "retry") and changes[-1][1] == "healthy"
    assert window(store)["summary_state"] == "healthy"


def test_closing_the_store_abandons_a_hung_summary_and_keeps_its_mark(configure):
    store = configure(
        **health_settings(
            "hang",
            SUMMARIZER_WORKER=True,
            SUMMARIZER_TIMEOUT_SECONDS=30,
            SUMMARIZER_OPTIONS={"mode": "hang", "hang_seconds": 30},
        )
    )
    worker = store.summarizer_worker
    worker.interval = 0.05
    batch = [message for turn in range(6) for message in (user(f"Question {turn}."), assistant("Yes."))]
    store.add_messages("s", batch)  # marked once, in one append
    wait_until(lambda: worker.summarizer.hanging == 1)
    assert store.backend.unsummarized_count() == 0  # taken by the worker
    worker.stop()
    # The thread ended while the summarizer is still hung: the summary was abandoned.
    assert not worker.running and worker.summarizer.hanging == 1
    assert store.backend.unsummarized_count() == 1  # marked again, not lost
    assert worker.health.state == "healthy"  # stopping is not a failure
    worker.summarizer.release.set()


def test_no_worker_thread_unless_summaries_are_on_and_it_is_wanted(configure):
    assert not configure().summarizer_worker.running
    assert not configure(**health_settings("ok")).summarizer_worker.running  # SUMMARIZER_WORKER False
    store = configure(CONTEXT_STRATEGY="rolling_summary")
    assert store.summarizer_worker.running
    store.close()
    assert not store.summarizer_worker.running
    assert configure(SUMMARIZER=SCRIPTED).summarizer_worker.running  # a summarizer turns them on too


def test_health_shows_the_summarizer_to_staff(db, configure, backend_name):
    staff = APIClient()
    staff.force_login(get_user_model().objects.create_user("ops", password="pw-for-tests", is_staff=True))
    configure()
    assert staff.get("/api/memory/health/").json()["summarizer"] == {"status": "ok", "enabled": False}
    store = configure(**health_settings("raise"))
    chat(store, 6)
    chat(store, 6, session="t")
    store.summarizer_worker.run_once()
    response = staff.get("/api/memory/health/")
    assert response.status_code == 200  # windows work: a failing summarizer is not an outage
    part = response.json()["summarizer"]
    assert part["status"] == "ok" and part["enabled"] is True and part["worker"] == "off"
    assert part["state"] == "retry" and part["failures"] == 1 and part["pending"] == 2
    assert "model overloaded" in part["last_error"]
    assert part["last_error_at"] and part["retry_at"] and part["last_success_at"] is None
    assert APIClient().get("/api/memory/health/").json() == {"status": "ok"}


@pytest.mark.parametrize(
    ("changes", "code"),
    [
        ({"SUMMARIZER": "no.such.Summarizer"}, "persistent_memory.E013"),
        ({"SUMMARIZER_OPTIONS": ["model"]}, "persistent_memory.E002"),
        ({"SUMMARIZER_TIMEOUT_SECONDS": 0}, "persistent_memory.E002"),
        ({"SUMMARIZER_RETRY_ATTEMPTS": 0}, "persistent_memory.E002"),
        ({"SUMMARIZER_BACKOFF_SECONDS": -1}, "persistent_memory.E002"),
        ({"SUMMARIZER_DEGRADED_SECONDS": "5"}, "persistent_memory.E002"),
        ({"SUMMARIZER_WORKER": "yes"}, "persistent_memory.E002"),
        ({"SUMMARIZER_TASKS": True}, "persistent_memory.E014"),  # the tests have no TASKS
    ],
)
def test_checks_report_bad_summarizer_settings(settings, changes, code):
    settings.PERSISTENT_MEMORY = {"BACKEND": "memory", **changes}
    # No database checks (Django 6.1 runs them by default; this test has no database).
    assert code in [message.id for message in run_checks(databases=[])]
    settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "SUMMARIZER": SCRIPTED, "SUMMARIZER_TASKS": False}
    assert not [m for m in run_checks(databases=[]) if m.id.startswith("persistent_memory.E")]


def test_a_summarizer_that_cannot_be_built_is_a_failure_shown_in_the_health(configure, monkeypatch, clock):
    monkeypatch.delenv("PM_TEST_ABSENT_KEY", raising=False)
    options = {"model": "m", "api_key_env": "PM_TEST_ABSENT_KEY", "base_url": "http://127.0.0.1:9/v1"}
    store = configure(
        **health_settings(
            "ok",
            SUMMARIZER="persistent_memory.conversations.chat_completions.ChatCompletionsSummarizer",
            SUMMARIZER_OPTIONS=options,
        )
    )
    chat(store, 6)
    worker = store.summarizer_worker
    worker.health.clock = clock
    assert worker.run_once().waiting
    record = worker.health.record()
    assert record["state"] == "retry" and "PM_TEST_ABSENT_KEY" in record["last_error"]
    assert (
        worker.run_once().waiting and worker.health.record()["failures"] == 1
    )  # not again within the backoff
    assert store.backend.unsummarized_count() == 1
    assert window(store)["summary_state"] == "retry"
    from django.core.management import call_command
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="PM_TEST_ABSENT_KEY"):
        call_command("memory_summarize", "--conversations")


def test_a_worker_of_a_store_built_by_hand_follows_the_backend_threshold(configure):
    from persistent_memory.conversations.worker import SummarizerWorker

    store = configure(CONTEXT_STRATEGY="rolling_summary", SUMMARIZER_WORKER=False, SUMMARIZE_AFTER_TOKENS=500)
    options = SummarizerWorker(store).options
    assert (options.keep_tokens, options.min_tokens) == (250, 500)
