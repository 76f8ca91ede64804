"""The demo site's settings with the app's background work on django-tasks-db, as
docs/background-work.md sets it up (its ``tasks-settings`` example, run here), for the web
process and ``db_worker`` of tests/test_tasks.py, run as processes of their own: Redis from
``REDIS_URL``, the chat-completions extractor at ``EXTRACTOR_BASE_URL``."""

import os

from memory_site.settings import *  # noqa: F403
from memory_site.settings import INSTALLED_APPS, PERSISTENT_MEMORY
from tests import readme_blocks

_namespace = {"INSTALLED_APPS": list(INSTALLED_APPS), "PERSISTENT_MEMORY": PERSISTENT_MEMORY}
exec(readme_blocks.example("tasks-settings"), _namespace)  # noqa: S102 (the docs' own settings)
INSTALLED_APPS = _namespace["INSTALLED_APPS"]
TASKS = _namespace["TASKS"]
PERSISTENT_MEMORY = {
    **_namespace["PERSISTENT_MEMORY"],
    "MIRROR_MODE": "off",
    "TASK_DEBOUNCE_SECONDS": float(os.environ.get("TASK_DEBOUNCE_SECONDS", "2")),
    "MEMORY_EXTRACTORS": ["persistent_memory.memories.extraction.chat_completions.extract"],
    "MEMORY_EXTRACTOR_OPTIONS": {
        "base_url": os.environ.get("EXTRACTOR_BASE_URL", "http://127.0.0.1:9/v1"),
        "model": "extraction-model",
        "api_key_env": None,
        "timeout": 30,
    },
}
