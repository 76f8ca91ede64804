from typing import Any

from django.apps import AppConfig
from django.core.signals import setting_changed


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

        load_tasks_if_used(memory_settings.TASK_BACKEND, memory_settings.SUMMARIZER_TASKS)
        setting_changed.connect(_settings_changed, dispatch_uid="persistent_memory.apps.tasks")


def load_tasks_if_used(task_backend: Any, summarizer_tasks: Any) -> None:
    """Load :mod:`persistent_memory.tasks` (whose receivers enqueue the work the store, the
    embedding worker and the summarizer thread announce) when the work goes to Django's
    task framework; a project that uses neither setting never loads the framework."""
    if task_backend or summarizer_tasks:
        from persistent_memory import tasks  # noqa: F401


def _settings_changed(*, setting: str, value: Any, **kwargs: Any) -> None:
    # Settings that change after start-up (override_settings, a test's settings fixture)
    # rebuild the store; the tasks' receivers must be there before its first append.
    if setting == "PERSISTENT_MEMORY" and isinstance(value, dict):
        load_tasks_if_used(value.get("TASK_BACKEND"), value.get("SUMMARIZER_TASKS"))
