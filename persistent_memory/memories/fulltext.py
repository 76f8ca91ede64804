"""What both keyword searches (the memories' and the messages') need to know of the
database's full-text search: whether SQLite's FTS5 table is there (:func:`fts_ready`; an
SQLite built without FTS5 has none, and the searches fall back to ``icontains``)."""

from __future__ import annotations

from functools import lru_cache

from django.db import connection


@lru_cache(maxsize=8)
def _fts_table(alias: str, table: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = %s", [table])
        return cursor.fetchone() is not None


def fts_ready(table: str = "pm_memory_fts") -> bool:
    """Whether SQLite's FTS5 table ``table`` exists (an SQLite without FTS5 has none)."""
    return _fts_table(connection.alias, table)
