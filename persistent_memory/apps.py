from django.apps import AppConfig


class PersistentMemoryConfig(AppConfig):
    """Registers the system checks and connects the receivers of the layers above to the
    signals of the layers below (which never import them)."""

    name = "persistent_memory"
    verbose_name = "Persistent memory"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from persistent_memory import (
            checks,  # noqa: F401 - registers the checks
            store,  # noqa: F401 - syncs the mirror before a message search
        )
        from persistent_memory.conf import memory_settings
        from persistent_memory.memories import embedding_worker  # noqa: F401 - embeds mirrored messages

        if memory_settings.TASK_BACKEND or memory_settings.SUMMARIZER_TASKS:
            # Enqueues the work the store, the embedding worker and the summarizer thread
            # announce; a project without either never loads the task framework.
            from persistent_memory import tasks  # noqa: F401
