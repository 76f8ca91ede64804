"""Each memory's vector is stored with the model that made it and its length, and as
float32 bytes (and a memory keeps what a merge replaced). Vectors stored before are taken as the configured
EMBEDDER's, which made them (its model name as it would store it now).

SQLite adds these columns by copying the table into a new one, which drops the triggers
that keep the full-text table of 0011 up to date: they are made again, and the
full-text table rebuilt, exactly as 0011 made them.
"""

from importlib import import_module

from django.db import migrations, models

_search_key = import_module("persistent_memory.migrations.0011_memories_search_key")


def _name_existing_vectors(apps, schema_editor):
    from persistent_memory.conf import memory_settings
    from persistent_memory.memories.embedders import model_name
    from persistent_memory.memories.records import vector_fields

    if not memory_settings.EMBEDDER:
        return
    name = model_name(memory_settings.EMBEDDER, dict(memory_settings.EMBEDDER_OPTIONS or {}))
    memories = apps.get_model("persistent_memory", "LongTermMemory").objects.using(
        schema_editor.connection.alias
    )
    for row in (
        memories.filter(embedding__isnull=False, embedding_model="").only("id", "embedding").iterator()
    ):
        if isinstance(row.embedding, list) and row.embedding:
            memories.filter(pk=row.pk).update(**vector_fields(row.embedding, name))


class Migration(migrations.Migration):
    dependencies = [
        ("persistent_memory", "0012_checkpoints"),
    ]

    operations = [
        migrations.AddField(
            model_name="longtermmemory",
            name="embedding_dimensions",
            field=models.PositiveIntegerField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="longtermmemory",
            name="embedding_model",
            field=models.CharField(blank=True, default="", editable=False, max_length=200),
        ),
        migrations.AddField(
            model_name="longtermmemory",
            name="embedding_f32",
            field=models.BinaryField(blank=True, editable=False, null=True),
        ),
        migrations.AddField(
            model_name="longtermmemory",
            name="history",
            field=models.JSONField(blank=True, default=list, editable=False),
        ),
        migrations.RunPython(_name_existing_vectors, migrations.RunPython.noop, elidable=True),
        migrations.RunPython(
            _search_key._run({"sqlite": _search_key.SQLITE_FORWARD}),
            _search_key._run({"sqlite": _search_key.SQLITE_FORWARD}),
            elidable=False,
        ),
    ]
