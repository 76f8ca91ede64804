"""Memories keep their superseded versions (issue 41): ``superseded_by`` and ``valid_until``
on an older version, ``happened_at`` on any, and one *current* memory per owner and key
(the unique constraint holds where ``superseded_by`` is null: a partial unique index on
SQLite and PostgreSQL).

SQLite cannot drop a table constraint: Django rebuilds the table to change it (either way),
which drops the triggers that keep the full-text table of 0009 and 0011 in step. They are
made again, and the full-text table rebuilt, after each rebuild (0011's own statements).
Undone, the migration deletes the superseded versions (the constraint would refuse them).
"""

from importlib import import_module

import django.db.models.deletion
from django.db import migrations, models

_search_key = import_module("persistent_memory.migrations.0011_memories_search_key")
_fulltext_again = _search_key._run({"sqlite": _search_key.SQLITE_FORWARD})


def _nothing(apps, schema_editor):
    pass


def _drop_versions(apps, schema_editor):
    # Undoing: the superseded versions would break the unconditional constraint again.
    apps.get_model("persistent_memory", "LongTermMemory").objects.filter(superseded_by__isnull=False).delete()
    if schema_editor.connection.vendor == "postgresql":
        # The deletes' deferred foreign key checks now: PostgreSQL alters no table that
        # has pending trigger events.
        schema_editor.execute("SET CONSTRAINTS ALL IMMEDIATE")


class Migration(migrations.Migration):
    dependencies = [
        ("persistent_memory", "0016_message_search"),
    ]

    operations = [
        # Undone last: after the unconditional constraint's rebuild of the table.
        migrations.RunPython(_nothing, _fulltext_again, elidable=False),
        migrations.RemoveConstraint(
            model_name="longtermmemory",
            name="pm_unique_owner_memory_key",
        ),
        migrations.AddField(
            model_name="longtermmemory",
            name="happened_at",
            field=models.DateTimeField(
                blank=True,
                help_text="When what it describes happened. Empty: unknown (or not an event).",
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="longtermmemory",
            name="superseded_by",
            field=models.ForeignKey(
                blank=True,
                editable=False,
                help_text="The current memory this is an older version of. Empty: current.",
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="superseded",
                to="persistent_memory.longtermmemory",
            ),
        ),
        migrations.AddField(
            model_name="longtermmemory",
            name="valid_until",
            field=models.DateTimeField(
                blank=True,
                editable=False,
                help_text="When it stopped being true (the new version's said_at, else the time of the "
                "write). Empty: current.",
                null=True,
            ),
        ),
        migrations.AddConstraint(
            model_name="longtermmemory",
            constraint=models.UniqueConstraint(
                condition=models.Q(("superseded_by__isnull", True)),
                fields=("owner", "key"),
                name="pm_unique_owner_memory_key",
            ),
        ),
        migrations.RunPython(_nothing, _drop_versions, elidable=False),
        migrations.RunPython(_fulltext_again, _nothing, elidable=False),
    ]
