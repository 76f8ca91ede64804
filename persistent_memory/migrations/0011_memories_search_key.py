"""Keyword search reads a memory's key as well as its content: ``ui.theme`` is found by
"theme" (the key's parts, split on ``.``, ``_`` and ``-``), at half the weight of the
content's words (a derived key repeats the content's first words: at full weight those
memories would outrank others that say the same).

PostgreSQL: the stored vector of 0010 becomes ``search_tsv``, the content's lexemes
plus the key's, labelled ``C`` (the search ranks ``C`` at half of the content's ``D``).
A generated column's expression cannot be altered before PostgreSQL 17: the column is
dropped and added again, which rewrites the table once. SQLite: the FTS5 table of 0009
gets a ``key`` column.
Other databases: nothing (their ``icontains`` fallback reads the key in the search).
"""

from django.db import migrations

TABLE = "persistent_memory_longtermmemory"

POSTGRESQL_FORWARD = [
    "DROP INDEX IF EXISTS pm_memory_content_tsv",
    f"ALTER TABLE {TABLE} DROP COLUMN IF EXISTS content_tsv",
    f"ALTER TABLE {TABLE} ADD COLUMN IF NOT EXISTS search_tsv tsvector GENERATED ALWAYS AS ("
    "to_tsvector('english', content) || "
    "setweight(to_tsvector('english', translate(key, '._-', '   ')), 'C')) STORED",
    f"CREATE INDEX IF NOT EXISTS pm_memory_search_tsv ON {TABLE} USING GIN (search_tsv)",
]
POSTGRESQL_BACKWARD = [
    "DROP INDEX IF EXISTS pm_memory_search_tsv",
    f"ALTER TABLE {TABLE} DROP COLUMN IF EXISTS search_tsv",
    f"ALTER TABLE {TABLE} ADD COLUMN IF NOT EXISTS content_tsv tsvector "
    "GENERATED ALWAYS AS (to_tsvector('english', content)) STORED",
    f"CREATE INDEX IF NOT EXISTS pm_memory_content_tsv ON {TABLE} USING GIN (content_tsv)",
]


# FTS5 tables cannot be altered: dropped and created again, with their triggers, and
# rebuilt from the memories (unicode61 splits the key on . _ and -).
SQLITE_FORWARD = [
    "DROP TRIGGER IF EXISTS pm_memory_fts_insert",
    "DROP TRIGGER IF EXISTS pm_memory_fts_delete",
    "DROP TRIGGER IF EXISTS pm_memory_fts_update",
    "DROP TABLE IF EXISTS pm_memory_fts",
    "CREATE VIRTUAL TABLE pm_memory_fts USING fts5(content, key, "
    "content='persistent_memory_longtermmemory', content_rowid='id', tokenize='porter unicode61')",
    "CREATE TRIGGER pm_memory_fts_insert AFTER INSERT ON persistent_memory_longtermmemory BEGIN "
    "INSERT INTO pm_memory_fts(rowid, content, key) VALUES (new.id, new.content, new.key); END",
    "CREATE TRIGGER pm_memory_fts_delete AFTER DELETE ON persistent_memory_longtermmemory BEGIN "
    "INSERT INTO pm_memory_fts(pm_memory_fts, rowid, content, key) "
    "VALUES ('delete', old.id, old.content, old.key); END",
    "CREATE TRIGGER pm_memory_fts_update AFTER UPDATE OF content, key "
    "ON persistent_memory_longtermmemory BEGIN "
    "INSERT INTO pm_memory_fts(pm_memory_fts, rowid, content, key) "
    "VALUES ('delete', old.id, old.content, old.key); "
    "INSERT INTO pm_memory_fts(rowid, content, key) VALUES (new.id, new.content, new.key); END",
    "INSERT INTO pm_memory_fts(pm_memory_fts) VALUES ('rebuild')",
]
SQLITE_BACKWARD = [
    "DROP TRIGGER IF EXISTS pm_memory_fts_insert",
    "DROP TRIGGER IF EXISTS pm_memory_fts_delete",
    "DROP TRIGGER IF EXISTS pm_memory_fts_update",
    "DROP TABLE IF EXISTS pm_memory_fts",
    "CREATE VIRTUAL TABLE pm_memory_fts USING fts5(content, "
    "content='persistent_memory_longtermmemory', content_rowid='id', tokenize='porter unicode61')",
    "CREATE TRIGGER pm_memory_fts_insert AFTER INSERT ON persistent_memory_longtermmemory BEGIN "
    "INSERT INTO pm_memory_fts(rowid, content) VALUES (new.id, new.content); END",
    "CREATE TRIGGER pm_memory_fts_delete AFTER DELETE ON persistent_memory_longtermmemory BEGIN "
    "INSERT INTO pm_memory_fts(pm_memory_fts, rowid, content) "
    "VALUES ('delete', old.id, old.content); END",
    "CREATE TRIGGER pm_memory_fts_update AFTER UPDATE OF content "
    "ON persistent_memory_longtermmemory BEGIN "
    "INSERT INTO pm_memory_fts(pm_memory_fts, rowid, content) "
    "VALUES ('delete', old.id, old.content); "
    "INSERT INTO pm_memory_fts(rowid, content) VALUES (new.id, new.content); END",
    "INSERT INTO pm_memory_fts(pm_memory_fts) VALUES ('rebuild')",
]


def _run(statements_by_vendor):
    def run(apps, schema_editor):
        connection = schema_editor.connection
        if connection.vendor == "sqlite":
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'pm_memory_fts'")
                if cursor.fetchone() is None:
                    return  # an SQLite without FTS5 (0009 made no table): the search uses icontains
        for statement in statements_by_vendor.get(connection.vendor, []):
            schema_editor.execute(statement)

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("persistent_memory", "0010_memories_stored_tsvector"),
    ]

    operations = [
        migrations.RunPython(
            _run({"postgresql": POSTGRESQL_FORWARD, "sqlite": SQLITE_FORWARD}),
            _run({"postgresql": POSTGRESQL_BACKWARD, "sqlite": SQLITE_BACKWARD}),
            elidable=False,
        ),
    ]
