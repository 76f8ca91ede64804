"""The import graph reads top to bottom: a backend or the settings module imports no service."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.servers import ROOT, demo_env

ENV = demo_env(DJANGO_SETTINGS_MODULE="memory_site.settings")

#: Modules that make up the services: the store and what it brings in.
SERVICES = ("persistent_memory.store", "persistent_memory.conversations.store", "persistent_memory.mirror")


def imported_by(module: str) -> set[str]:
    """The persistent_memory modules a fresh interpreter has after importing ``module``."""
    # Without django.setup(): the admin's autodiscovery would load the store (the admin
    # uses it, as it should); what is loaded here is ``module``'s own doing.
    code = f"import json, sys; import {module}; print(json.dumps(sorted(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True, text=True, check=True
    )
    return {name for name in json.loads(result.stdout) if name.startswith("persistent_memory")}


@pytest.mark.parametrize(
    "module",
    [
        "persistent_memory.backends.redis.backend",
        "persistent_memory.backends.memory.tree",
        "persistent_memory.conf",
    ],
)
def test_a_backend_or_the_settings_import_no_service(module):
    loaded = imported_by(module)
    assert module in loaded
    assert not loaded & set(SERVICES), sorted(loaded & set(SERVICES))


def test_the_package_still_offers_the_store():
    loaded = imported_by("persistent_memory")
    assert not loaded & set(SERVICES)  # lazily: only when asked for
    code = "import django; django.setup(); import persistent_memory as pm; print(pm.get_store().backend.name)"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True, text=True)
    assert result.stdout.split()[-1] == "memory", result.stderr


def test_a_settings_change_rebuilds_the_store(settings):
    from persistent_memory import get_store

    settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "MIRROR_MODE": "off", "MAX_HISTORY": 7}
    first = get_store()
    assert first.backend.max_history == 7
    settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "MIRROR_MODE": "off", "MAX_HISTORY": 9}
    assert get_store() is not first and get_store().backend.max_history == 9


@pytest.mark.parametrize(
    ("setting", "loaded"),
    [(None, False), ('"TASK_BACKEND": "default"', True), ('"SUMMARIZER_TASKS": True', True)],
)
def test_the_app_loads_the_receivers_of_the_layers_above(tmp_path, setting, loaded):
    """The layers below announce work by signals; the app's ready loads the store (which
    syncs the mirror before a message search) and, when the work goes to Django's task
    framework, the tasks (which enqueue it). Without that setting no task module is loaded."""
    extra = f"PERSISTENT_MEMORY = {{**PERSISTENT_MEMORY, {setting}}}" if setting else ""
    (tmp_path / "ready_settings.py").write_text(f"from memory_site.settings import *\n{extra}\n")
    code = (
        "import json, sys, django; django.setup()\n"
        "from persistent_memory.conversations.signals import messages_added, summaries_due\n"
        "from persistent_memory.memories.signals import vectors_wanted\n"
        "from persistent_memory.mirror.signals import search_starting\n"
        "print(json.dumps({'modules': sorted(sys.modules), 'search': search_starting.has_listeners(),"
        " 'due': summaries_due.has_listeners(), 'vectors': vectors_wanted.has_listeners()}))"
    )
    env = {**ENV, "DJANGO_SETTINGS_MODULE": "ready_settings", "PYTHONPATH": f"{tmp_path}:{ROOT}"}
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout.splitlines()[-1])
    assert found["search"] is True
    assert ("persistent_memory.tasks" in found["modules"]) is loaded
    assert found["due"] is loaded and found["vectors"] is loaded


def test_turning_task_backend_on_after_start_up_loads_the_tasks():
    """A store rebuilt with TASK_BACKEND starts no worker threads: the tasks' receivers
    must be there even when the setting came after the app was ready."""
    code = (
        "import json, sys, django; django.setup()\n"
        "from django.conf import settings\n"
        "from django.test import override_settings\n"
        "from persistent_memory.memories.signals import vectors_wanted\n"
        "before = 'persistent_memory.tasks' in sys.modules\n"
        "on = {**settings.PERSISTENT_MEMORY, 'TASK_BACKEND': 'default'}\n"
        "with override_settings(PERSISTENT_MEMORY=on):\n"
        "    after = 'persistent_memory.tasks' in sys.modules\n"
        "print(json.dumps([before, after, vectors_wanted.has_listeners()]))"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == [False, True, True]
