"""The mutation-testing configuration (bench/mutation.py, pyproject.toml) names what the
issue asks and stays runnable: every module and test exists, the data-keeping modules are
all in a group, each group's mutmut configuration names only its own modules, and every
explained survivor is a mutant of a configured module with a reason."""

import importlib.util
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("mutation", ROOT / "bench" / "mutation.py")
mutation = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mutation)

# The modules whose faults lose or misplace data: each must be mutated by some group.
GUARDED = {
    "persistent_memory/integrations/langgraph_values.py",
    "persistent_memory/journal.py",
    "persistent_memory/backends/redis/layout.py",
    "persistent_memory/idempotency.py",
    "persistent_memory/chat/window.py",
    "persistent_memory/backends/memory/tree.py",
    "persistent_memory/backends/memory/checkpoints.py",
    "persistent_memory/backends/memory/conversations.py",
    "persistent_memory/mirror/sessions.py",
    "persistent_memory/mirror/rows.py",
    "persistent_memory/mirror/conversations.py",
    "persistent_memory/mirror/checkpoints.py",
    "persistent_memory/memories/search.py",
}
CI = {
    "persistent_memory/integrations/langgraph_values.py",
    "persistent_memory/journal.py",
    "persistent_memory/backends/redis/layout.py",
    "persistent_memory/idempotency.py",
}


def test_every_group_names_existing_modules_and_tests():
    _, groups = mutation.groups()
    for name, group in groups.items():
        assert group["modules"] and group["tests"], name
        # ``tests`` holds pytest's arguments: test files and ids, and options such as -k.
        paths = [t.split("::")[0] for t in group["tests"] if t.startswith("tests/")]
        assert paths, name
        for path in group["modules"] + paths:
            assert (ROOT / path).is_file(), f"{name}: {path} does not exist"


def test_the_data_keeping_modules_are_mutated_and_the_fast_ones_in_ci():
    _, groups = mutation.groups()
    mutated = {m for group in groups.values() for m in group["modules"]}
    assert mutated >= GUARDED
    in_ci = {m for group in groups.values() if group.get("ci") for m in group["modules"]}
    assert in_ci >= CI


def test_a_groups_configuration_names_only_its_own_modules_and_tests():
    mutmut, groups = mutation.groups()
    group = groups["journal"]
    config = tomllib.loads(mutation.group_pyproject(group, mutmut))
    options = config["tool"]["mutmut"]
    assert options["only_mutate"] == group["modules"]
    assert options["pytest_add_cli_args_test_selection"] == group["tests"]
    assert options["source_paths"] == mutmut["source_paths"]
    # The group's own pytest options follow the shared ones, for every run of its tests.
    assert options["pytest_add_cli_args"] == mutmut["pytest_add_cli_args"] + group["pytest_args"]
    assert "--no-migrations" in group["pytest_args"]
    # The rest of the project's configuration (pytest's settings) is kept.
    assert config["tool"]["pytest"]["ini_options"]["DJANGO_SETTINGS_MODULE"] == "memory_site.settings"
    assert "persistent_memory" not in config["tool"]


def test_every_explained_survivor_is_a_mutant_of_a_configured_module_with_a_reason():
    _, groups = mutation.groups()
    modules = {m.removesuffix(".py").replace("/", ".") for g in groups.values() for m in g["modules"]}
    for mutant, why in tomllib.loads(mutation.SURVIVORS.read_text()).items():
        assert mutant.split(".x_")[0].split(".xǁ")[0] in modules, mutant
        assert "__mutmut_" in mutant, mutant
        assert len(why.split()) >= 4, f"{mutant}: say why it survives"
