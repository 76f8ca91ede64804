"""Full-text search of long-term memories, per database vendor.

PostgreSQL: a GIN index on ``to_tsvector('english', content)`` (the expression the
keyword search uses, so the planner picks the index). SQLite: an FTS5 table over the
memories (external content, kept in sync by triggers). Other databases get nothing:
the search falls back to ``icontains`` there.
"""

from django.db import migrations

POSTGRESQL_FORWARD = [
    "CREATE INDEX IF NOT EXISTS pm_memory_content_fts ON persistent_memory_longtermmemory "
    "USING GIN (to_tsvector('english', content))",
]
POSTGRESQL_BACKWARD = ["DROP INDEX IF EXISTS pm_memory_content_fts"]

SQLITE_FORWARD = [
    "CREATE VIRTUAL TABLE IF NOT EXISTS pm_memory_fts USING fts5("
    "content, content='persistent_memory_longtermmemory', content_rowid='id', tokenize='porter unicode61')",
    "CREATE TRIGGER IF NOT EXISTS pm_memory_fts_insert AFTER INSERT "
    "ON persistent_memory_longtermmemory BEGIN "
    "INSERT INTO pm_memory_fts(rowid, content) VALUES (new.id, new.content); END",
    "CREATE TRIGGER IF NOT EXISTS pm_memory_fts_delete AFTER DELETE "
    "ON persistent_memory_longtermmemory BEGIN "
    "INSERT INTO pm_memory_fts(pm_memory_fts, rowid, content) VALUES ('delete', old.id, old.content); END",
    "CREATE TRIGGER IF NOT EXISTS pm_memory_fts_update AFTER UPDATE OF content "
    "ON persistent_memory_longtermmemory BEGIN "
    "INSERT INTO pm_memory_fts(pm_memory_fts, rowid, content) VALUES ('delete', old.id, old.content); "
    "INSERT INTO pm_memory_fts(rowid, content) VALUES (new.id, new.content); END",
    # Rows written before this migration (none on a fresh database).
    "INSERT INTO pm_memory_fts(pm_memory_fts) VALUES ('rebuild')",
]
SQLITE_BACKWARD = [
    "DROP TRIGGER IF EXISTS pm_memory_fts_insert",
    "DROP TRIGGER IF EXISTS pm_memory_fts_delete",
    "DROP TRIGGER IF EXISTS pm_memory_fts_update",
    "DROP TABLE IF EXISTS pm_memory_fts",
]


def _sqlite_has_fts5(connection) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA compile_options")
        return any(row[0] == "ENABLE_FTS5" for row in cursor.fetchall())


def _run(statements_by_vendor):
    def run(apps, schema_editor):
        connection = schema_editor.connection
        statements = statements_by_vendor.get(connection.vendor, [])
        if connection.vendor == "sqlite" and not _sqlite_has_fts5(connection):
            return  # an SQLite built without FTS5: the search falls back to icontains
        for statement in statements:
            schema_editor.execute(statement)

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("persistent_memory", "0008_memories"),
    ]

    operations = [
        migrations.RunPython(
            _run({"postgresql": POSTGRESQL_FORWARD, "sqlite": SQLITE_FORWARD}),
            _run({"postgresql": POSTGRESQL_BACKWARD, "sqlite": SQLITE_BACKWARD}),
            elidable=False,
        ),
    ]
