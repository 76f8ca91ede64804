"""The first call of a fresh process from async code works on the embedded default.

The memory backend restores its sessions from the database when the store is first
used. From inside an event loop (an async view; an Agents SDK session, a Pydantic AI
store or the LangGraph saver's async methods under ``asyncio.run``) Django refuses that
query, and the first call failed with ``BackendUnavailable`` until the mirror's worker
retried the restore. Each read here runs in a fresh process (tests/first_call.py) whose
very first store use is async, on an SQLite file and on a PostgreSQL database, and must
see what an earlier process wrote, restored before that first call answers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from tests.servers import ROOT, demo_env
from tests.test_crash import database  # noqa: F401 - the fixture: an SQLite file, a PostgreSQL database

pytest.importorskip("agents")
pytest.importorskip("pydantic_ai")
pytest.importorskip("langgraph")

EXPECTED = {
    "agents_session": [{"role": "user", "content": "hello"}],
    "pydantic_ai_store": "first | second",
    "langgraph_saver": {"answer": 42},
}


def run_phase(env: dict[str, str], phase: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tests.first_call", phase],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def written(database: Any) -> dict[str, str]:  # noqa: F811 - the imported fixture
    """The demo's environment on ``database``, after a process wrote through each integration."""
    env = demo_env(DATABASE_URL=database.url, MEMORY_BACKEND="memory", MEMORY_LOG_LEVEL="INFO")
    done = run_phase(env, "write")
    assert done.returncode == 0, done.stderr
    return env


def test_the_first_call_of_a_fresh_process_from_async_code_sees_the_restored_sessions(written):
    """One fresh process per integration (the pydantic_ai one writes a second turn after
    its read, which the processes after it restore in turn)."""
    for phase in EXPECTED:
        done = run_phase(written, phase)
        assert done.returncode == 0, f"{phase}: {done.stderr}"  # not BackendUnavailable
        assert json.loads(done.stdout.splitlines()[-1]) == EXPECTED[phase], phase
        # Restored once, before that call: no failed attempt for the worker to retry.
        assert done.stderr.count("restored 3 sessions from the mirror") == 1, done.stderr
        assert "could not restore" not in done.stderr, done.stderr
