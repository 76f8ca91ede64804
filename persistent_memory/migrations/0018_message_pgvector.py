"""PostgreSQL with the pgvector extension: each message's vector as a ``vector`` too, in
``pm_message_vector`` (``message_row_id``, ``dimensions``, ``vector``), for ``<=>`` and
HNSW indexes in the database, as memories have theirs (migration 0014). The embedder's
writer fills it in the transaction that stores the message's float32 bytes (no trigger
can read those back into numbers); triggers empty it with the messages (deleted, or the
table truncated). The vectors stored before it are copied in.

Where the server has no pgvector (or the role may not create the extension), or on
another database, nothing happens; ``memory_embed`` adds the table later. The HNSW
indexes (one per vector length) are made when a vector of that length is first written.
"""

from django.db import migrations

TABLE = "persistent_memory_memorymessage"


def _forward(apps, schema_editor):
    from persistent_memory.memories.message_search import VECTORS
    from persistent_memory.memories.vectors import add_vector_table

    add_vector_table(schema_editor.connection, VECTORS)


def _backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for name in ("delete", "truncate"):
            schema_editor.execute(f"DROP TRIGGER IF EXISTS pm_message_vector_{name} ON {TABLE}")
        schema_editor.execute("DROP TABLE IF EXISTS pm_message_vector")
        schema_editor.execute(
            "DROP FUNCTION IF EXISTS pm_message_vector_forget(), pm_message_vector_truncate()"
        )


class Migration(migrations.Migration):
    dependencies = [
        ("persistent_memory", "0017_memories_supersession"),
    ]

    operations = [
        migrations.RunPython(_forward, _backward, elidable=False),
    ]
