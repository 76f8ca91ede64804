"""The import rules of docs/contributing.md hold: `lint-imports` (import-linter) keeps every
contract of pyproject.toml's [tool.importlinter], and every part of the package is in a
layer, so a new module cannot sit outside the rules."""

from __future__ import annotations

import os
import pkgutil
import subprocess
import sys
import tomllib
from pathlib import Path

import persistent_memory

ROOT = Path(__file__).resolve().parent.parent
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]


def test_lint_imports_keeps_every_contract():
    # This checkout's package, whatever an editable install elsewhere points at.
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    # `lint-imports --no-cache` with this Python (no cache files in the checkout).
    run = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
    result = subprocess.run(
        [sys.executable, "-c", run, "--no-cache"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    contracts = len(CONFIG["contracts"])
    assert f"Contracts: {contracts} kept, 0 broken." in result.stdout


def test_every_module_and_package_at_the_top_is_in_a_layer():
    # The package's own layers (the memories' modules have a contract of their own).
    (layers,) = [contract["layers"] for contract in CONFIG["contracts"] if contract["id"] == "layers"]
    layered = {
        name.strip()
        for layer in layers
        for part in layer.replace("|", ":").split(":")
        if (name := part.strip())
    }
    top = {f"persistent_memory.{module.name}" for module in pkgutil.iter_modules(persistent_memory.__path__)}
    assert top - layered == set()
    assert layered - top == set()


def test_at_most_fifteen_modules_sit_at_the_top():
    modules = [module for module in pkgutil.iter_modules(persistent_memory.__path__) if not module.ispkg]
    assert len(modules) + 1 <= 15, sorted(module.name for module in modules)  # and __init__


def test_no_contract_lets_an_import_or_a_package_through():
    # Every rule holds for every import that runs: none is excused (ignore_imports) and
    # no package's inside is left unchecked (skip_descendants). What a lower part needs
    # from above comes by a signal or is handed to it (docs/contributing.md).
    for contract in CONFIG["contracts"]:
        assert not contract.get("ignore_imports"), contract["id"]
        assert not contract.get("skip_descendants"), contract["id"]
    (layers,) = [contract["layers"] for contract in CONFIG["contracts"] if contract["id"] == "layers"]
    # The chat format's rules sit below the backends, so a backend never imports the
    # conversations service.
    assert layers.index("persistent_memory.chat") == layers.index("persistent_memory.backends") + 1
