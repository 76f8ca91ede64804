"""The package's layout in four figures, for a before/after of a change to it:

- modules at the top of ``persistent_memory/`` (``.py`` files, ``__init__`` included);
- import circles: strongly connected groups of modules, with and without the imports made
  for type checkers only (``if TYPE_CHECKING:``), and between the top-level parts;
- upward arrows: imports from a part to a part above it in the layers of
  ``[tool.importlinter]`` (pyproject.toml), all of them (the ones the contract ignores
  included), by module and by pair of parts;
- the largest module's lines.

Run it on another checkout with ``PYTHONPATH=path/to/checkout python bench/import_layout.py``:
the layers are this checkout's, and a module that moved is placed by its new name
(``persistent_memory.MOVED_MODULES``).
"""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "persistent_memory"


def moved_modules() -> dict[str, str]:
    """This checkout's ``persistent_memory.MOVED_MODULES`` (read, not imported: the
    package on the path may be another checkout's)."""
    tree = ast.parse((ROOT / PACKAGE / "__init__.py").read_text())
    (found,) = [
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "MOVED_MODULES" for t in node.targets)
    ]
    return ast.literal_eval(found)


# Names older than MOVED_MODULES knows (the modules that became a package's main module),
# then every path MOVED_MODULES aliases.
RENAMED = {
    "persistent_memory.admin": "persistent_memory.admin.sessions",
    "persistent_memory.mirror": "persistent_memory.mirror.sessions",
    **moved_modules(),
}


def layers() -> list[set[str]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (found,) = [contract["layers"] for contract in config["contracts"] if contract["id"] == "layers"]
    return [{name.strip() for name in layer.replace("|", ":").split(":")} for layer in found]


def part(module: str) -> str:
    """The top-level part a module belongs to, by its name in this checkout."""
    module = next(
        (
            new + module[len(old) :]
            for old, new in RENAMED.items()
            if module == old or module.startswith(old + ".")
        ),
        module,
    )
    return ".".join(module.split(".")[:2])


def circles(graph: grimp.ImportGraph, nodes: set[str], edges: dict[str, set[str]]) -> list[set[str]]:
    """Strongly connected groups of more than one node (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for start in sorted(nodes):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.add(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        found.append(group)
    return found


def module_edges(graph: grimp.ImportGraph) -> dict[str, set[str]]:
    return {module: set(graph.find_modules_directly_imported_by(module)) for module in graph.modules}


def main() -> None:
    import persistent_memory

    package_dir = Path(persistent_memory.__file__).parent
    print(f"checkout: {package_dir.parent}")
    top = sorted(path.name for path in package_dir.glob("*.py"))
    print(f"modules at the top: {len(top)}")
    full = grimp.build_graph(PACKAGE, cache_dir=None)
    runtime = grimp.build_graph(PACKAGE, cache_dir=None, exclude_type_checking_imports=True)
    for name, graph in (("with type-checking imports", full), ("run-time imports only", runtime)):
        edges = module_edges(graph)
        groups = circles(graph, set(graph.modules), edges)
        sizes = sorted((len(group) for group in groups), reverse=True)
        parts_edges: dict[str, set[str]] = {}
        for importer, imported in ((a, b) for a, bs in edges.items() for b in bs):
            if part(importer) != part(imported) and PACKAGE not in (part(importer), part(imported)):
                parts_edges.setdefault(part(importer), set()).add(part(imported))
        part_groups = circles(graph, set(parts_edges), parts_edges)
        print(f"import circles ({name}): {len(groups)} between modules (sizes {sizes}),")
        print(f"  {len(part_groups)} between top-level parts: {[sorted(g) for g in part_groups]}")
    rank = {name: position for position, layer in enumerate(layers()) for name in layer}
    edges = module_edges(runtime)
    upward = sorted(
        (importer, imported)
        for importer, imported_set in edges.items()
        for imported in imported_set
        if rank.get(part(importer), -1) > rank.get(part(imported), 10**6)
    )
    pairs = sorted({(part(a), part(b)) for a, b in upward})
    print(f"upward arrows (run-time imports): {len(upward)} by module, {len(pairs)} by part:")
    for a, b in pairs:
        print(f"  {a.removeprefix(PACKAGE + '.')} -> {b.removeprefix(PACKAGE + '.')}")
    sizes = {
        str(path.relative_to(package_dir.parent)): len(path.read_text().splitlines())
        for path in package_dir.rglob("*.py")
    }
    largest = max(sizes, key=sizes.__getitem__)
    print(f"largest module: {largest}, {sizes[largest]} lines")


if __name__ == "__main__":
    sys.exit(main())
