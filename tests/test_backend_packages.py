"""The backends' packages: the import paths users write keep working, a part never
imports its backend, and the modules of ``backends/`` import one another without a
circle (read from their source, as Python runs it: imports under ``TYPE_CHECKING`` are
for type checkers only)."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import pytest
from django.utils.module_loading import import_string

from persistent_memory.backends import BACKENDS, backend_class

BACKENDS_DIR = Path(__file__).resolve().parent.parent / "persistent_memory" / "backends"


def _module_name(path: Path) -> str:
    parts = path.relative_to(BACKENDS_DIR.parent.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, *, type_checking: bool) -> set[str]:
    """The modules ``path`` imports at run time (and with ``type_checking``, for type checkers too)."""
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    if not type_checking:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
                skipped.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    names = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


MODULES = {_module_name(path): path for path in BACKENDS_DIR.rglob("*.py")}


def test_the_import_paths_users_write_still_work():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert import_string("persistent_memory.backends.redis.RedisBackend") is backend_class("redis")
        assert import_string("persistent_memory.backends.memory.MemoryBackend") is backend_class("memory")
        assert {name: backend_class(path) for name, path in BACKENDS.items()} == {
            name: backend_class(name) for name in BACKENDS
        }


def test_another_name_at_a_packages_old_path_is_deprecated():
    from persistent_memory.backends.redis.backend import ANSWER_KEYS

    with pytest.warns(DeprecationWarning, match="persistent_memory.backends.redis.backend"):
        from persistent_memory.backends.redis import ANSWER_KEYS as old
    assert old is ANSWER_KEYS
    with pytest.raises(ImportError):
        from persistent_memory.backends.memory import NoSuchName  # noqa: F401


@pytest.mark.parametrize("package", ["redis", "memory"])
def test_no_part_imports_its_backend(package):
    backend = f"persistent_memory.backends.{package}.backend"
    for name, path in MODULES.items():
        if name.startswith(f"persistent_memory.backends.{package}.") and name != backend:
            assert not {i for i in _imports(path, type_checking=True) if i.startswith(backend)}, name


def test_the_backends_modules_import_one_another_without_a_circle():
    graph = {
        name: {other for other in MODULES if other != name and other in _imports(path, type_checking=False)}
        for name, path in MODULES.items()
    }
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, " -> ".join((*path, name))
        if name not in done:
            for other in graph[name]:
                visit(other, (*path, name))
            done.add(name)

    for name in graph:
        visit(name, ())
