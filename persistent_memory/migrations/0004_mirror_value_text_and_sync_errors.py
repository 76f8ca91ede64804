# Values become the store's JSON text (PostgreSQL's jsonb cannot hold \u0000), and a
# session the mirror cannot write says why.
#
# On PostgreSQL the column changes type with USING value::text (jsonb's own text, its
# keys in jsonb's order); JSON null was stored as SQL NULL, and Django fills the
# default 'null' into those rows before the column becomes NOT NULL (on SQLite too,
# where the table is rebuilt). The next sync of each session writes the store's text.
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("persistent_memory", "0003_owners"),
    ]

    operations = [
        migrations.AddField(
            model_name="memorysession",
            name="sync_error",
            field=models.TextField(
                blank=True,
                default="",
                help_text="Why the mirror could not write this session (it retries); "
                "empty when the last sync did.",
            ),
        ),
        migrations.AddField(
            model_name="memorysession",
            name="sync_failed_at",
            field=models.DateTimeField(blank=True, help_text="When that sync failed.", null=True),
        ),
        migrations.AddIndex(
            model_name="memorysession",
            index=models.Index(
                condition=models.Q(("sync_failed_at__isnull", False)),
                fields=["sync_failed_at"],
                name="pm_session_sync_failed",
            ),
        ),
        migrations.AlterField(
            model_name="memoryvalue",
            name="value",
            field=models.TextField(default="null", help_text="JSON text, as the store holds it."),
        ),
    ]
