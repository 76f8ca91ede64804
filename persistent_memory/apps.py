from django.apps import AppConfig


class PersistentMemoryConfig(AppConfig):
    """Registers the system checks."""

    name = "persistent_memory"
    verbose_name = "Persistent memory"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from persistent_memory import checks  # noqa: F401 - registers the checks
        from persistent_memory.memories import embedding_worker  # noqa: F401 - receives the mirror's messages
