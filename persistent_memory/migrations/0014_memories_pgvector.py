"""PostgreSQL with the pgvector extension: each memory's vector as a ``vector`` too, in a
table of its own (``pm_memory_vector``) that triggers on the memories keep equal to
their ``embedding`` (so every write path fills it and it can never disagree), for
``<=>`` (cosine distance) and HNSW indexes in the database. Apart from the memories:
a memory's row is rewritten whenever its access count moves, and each rewrite would
insert its vector into the HNSW index again.

The extension is created when the server has it and the migrating role may create it;
otherwise (or on another database) nothing happens and semantic search compares vectors
in Python, as ``manage.py check --database default`` says; ``memory_embed`` adds the
table later, once pgvector is installed. The HNSW indexes depend on the vectors' length,
which only the embedder knows: :mod:`persistent_memory.memories.vectors` creates one per
length when a vector of that length is first written (``memory_embed`` before it
embeds). The models do not declare the table: only the search reads it.
"""

from django.db import migrations

TABLE = "persistent_memory_longtermmemory"


def _forward(apps, schema_editor):
    from persistent_memory.memories.vectors import add_vector_table

    add_vector_table(schema_editor.connection)


def _backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        for name in ("insert", "update", "delete", "truncate"):
            schema_editor.execute(f"DROP TRIGGER IF EXISTS pm_memory_vector_{name} ON {TABLE}")
        schema_editor.execute("DROP TABLE IF EXISTS pm_memory_vector")
        schema_editor.execute("DROP FUNCTION IF EXISTS pm_memory_vector_write(), pm_memory_vector_truncate()")


class Migration(migrations.Migration):
    dependencies = [
        ("persistent_memory", "0013_memories_embedding_model"),
    ]

    operations = [
        migrations.RunPython(_forward, _backward, elidable=False),
    ]
