"""Searchable conversations (issue 41): the mirror's message rows are the index.

PostgreSQL: ``search_tsv``, the text's lexemes plus the speaker's name labelled ``C``
(ranked at half of the text's, as a memory's key is), with a GIN index. SQLite: an FTS5
table over the rows (external content, kept by triggers), the name a column of its own.
Other databases (or SQLite without FTS5): the search falls back to ``icontains``.
Messages also get vector columns, filled where MESSAGE_EMBEDDINGS is on.
"""

# ruff: noqa: S608 - the statements name this app's own table, a constant

from django.db import migrations, models

TABLE = "persistent_memory_memorymessage"

POSTGRESQL_FORWARD = [
    f"ALTER TABLE {TABLE} ADD COLUMN IF NOT EXISTS search_tsv tsvector GENERATED ALWAYS AS ("
    "to_tsvector('english', content_text) || setweight(to_tsvector('english', name), 'C')) STORED",
    f"CREATE INDEX IF NOT EXISTS pm_message_search_tsv ON {TABLE} USING GIN (search_tsv)",
]
POSTGRESQL_BACKWARD = [
    "DROP INDEX IF EXISTS pm_message_search_tsv",
    f"ALTER TABLE {TABLE} DROP COLUMN IF EXISTS search_tsv",
]
SQLITE_FORWARD = [
    "CREATE VIRTUAL TABLE IF NOT EXISTS pm_message_fts USING fts5(content_text, name, "
    f"content='{TABLE}', content_rowid='id', tokenize='porter unicode61')",
    f"CREATE TRIGGER IF NOT EXISTS pm_message_fts_insert AFTER INSERT ON {TABLE} BEGIN "
    "INSERT INTO pm_message_fts(rowid, content_text, name) VALUES (new.id, new.content_text, new.name); END",
    f"CREATE TRIGGER IF NOT EXISTS pm_message_fts_delete AFTER DELETE ON {TABLE} BEGIN "
    "INSERT INTO pm_message_fts(pm_message_fts, rowid, content_text, name) "
    "VALUES ('delete', old.id, old.content_text, old.name); END",
    f"CREATE TRIGGER IF NOT EXISTS pm_message_fts_update AFTER UPDATE OF content_text, name ON {TABLE} BEGIN "
    "INSERT INTO pm_message_fts(pm_message_fts, rowid, content_text, name) "
    "VALUES ('delete', old.id, old.content_text, old.name); "
    "INSERT INTO pm_message_fts(rowid, content_text, name) VALUES (new.id, new.content_text, new.name); END",
    # The messages mirrored before this migration.
    "INSERT INTO pm_message_fts(pm_message_fts) VALUES ('rebuild')",
]
SQLITE_BACKWARD = [
    "DROP TRIGGER IF EXISTS pm_message_fts_insert",
    "DROP TRIGGER IF EXISTS pm_message_fts_delete",
    "DROP TRIGGER IF EXISTS pm_message_fts_update",
    "DROP TABLE IF EXISTS pm_message_fts",
]


def _sqlite_has_fts5(connection) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA compile_options")
        return any(row[0] == "ENABLE_FTS5" for row in cursor.fetchall())


def _run(statements_by_vendor):
    def run(apps, schema_editor):
        connection = schema_editor.connection
        if connection.vendor == "sqlite" and not _sqlite_has_fts5(connection):
            return  # the search falls back to icontains
        for statement in statements_by_vendor.get(connection.vendor, []):
            schema_editor.execute(statement)

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("persistent_memory", "0015_memories_said_at"),
    ]

    operations = [
        migrations.AddField(
            model_name="memorymessage",
            name="embedding_f32",
            field=models.BinaryField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="memorymessage",
            name="embedding_model",
            field=models.CharField(blank=True, db_default="", editable=False, max_length=200),
        ),
        migrations.AddField(
            model_name="memorymessage",
            name="embedding_dimensions",
            field=models.PositiveIntegerField(blank=True, editable=False, null=True),
        ),
        migrations.RunPython(
            _run({"postgresql": POSTGRESQL_FORWARD, "sqlite": SQLITE_FORWARD}),
            _run({"postgresql": POSTGRESQL_BACKWARD, "sqlite": SQLITE_BACKWARD}),
            elidable=False,
        ),
    ]
