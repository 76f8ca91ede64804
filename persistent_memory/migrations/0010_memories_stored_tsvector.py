"""PostgreSQL: the memories' ``to_tsvector('english', content)`` stored in a generated
column, ``content_tsv``, with the GIN index on it instead of on the expression.

The keyword search ranks every match with ``ts_rank``; on the expression index that
parsed the content of each match again (at 100,000 memories, a question matching
13,000 of them took 140 ms, and 11 ms reading the stored vector). PostgreSQL keeps
the column itself, so every write path (the ORM, ``bulk_create``, raw SQL) fills it.
The model does not declare it: only the search reads it. Other databases: nothing.
"""

from django.db import migrations

TABLE = "persistent_memory_longtermmemory"

FORWARD = [
    f"ALTER TABLE {TABLE} ADD COLUMN IF NOT EXISTS content_tsv tsvector "
    "GENERATED ALWAYS AS (to_tsvector('english', content)) STORED",
    f"CREATE INDEX IF NOT EXISTS pm_memory_content_tsv ON {TABLE} USING GIN (content_tsv)",
    "DROP INDEX IF EXISTS pm_memory_content_fts",
]
BACKWARD = [
    f"CREATE INDEX IF NOT EXISTS pm_memory_content_fts ON {TABLE} "
    "USING GIN (to_tsvector('english', content))",
    "DROP INDEX IF EXISTS pm_memory_content_tsv",
    f"ALTER TABLE {TABLE} DROP COLUMN IF EXISTS content_tsv",
]


def _on_postgresql(statements):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            for statement in statements:
                schema_editor.execute(statement)

    return run


class Migration(migrations.Migration):
    dependencies = [
        ("persistent_memory", "0009_memories_fulltext"),
    ]

    operations = [
        migrations.RunPython(_on_postgresql(FORWARD), _on_postgresql(BACKWARD), elidable=False),
    ]
