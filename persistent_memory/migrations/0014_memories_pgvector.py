"""PostgreSQL with the pgvector extension: each memory's vector as a ``vector`` too, in
a column PostgreSQL generates from ``embedding`` (so every write path fills it and it
can never disagree with the JSON), for ``<=>`` (cosine distance) in the database.

The extension is created when the server has it and the migrating role may create it;
otherwise (or on another database) nothing happens and semantic search compares vectors
in Python, as ``manage.py check`` says; ``memory_embed`` adds the column later, once
pgvector is installed. The HNSW indexes depend on the
vectors' length, which only the embedder knows: :mod:`persistent_memory.memories.vectors`
creates one per length (``memory_embed`` does before it embeds). The model does not
declare the column: only the search reads it.
"""

from django.db import migrations

TABLE = "persistent_memory_longtermmemory"


def _forward(apps, schema_editor):
    from persistent_memory.memories.vectors import add_vector_column

    add_vector_column(schema_editor.connection)


def _backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"ALTER TABLE {TABLE} DROP COLUMN IF EXISTS embedding_vector")


class Migration(migrations.Migration):
    dependencies = [
        ("persistent_memory", "0013_memories_embedding_model"),
    ]

    operations = [
        migrations.RunPython(_forward, _backward, elidable=False),
    ]
