"""Cross-session memory for LLM pipelines, keyed by ``session_id``.

``get_store()`` returns the process's :class:`MemoryStore`, built from the
``PERSISTENT_MEMORY`` setting.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from persistent_memory.store import MemoryStore, get_store, reset_store

__all__ = ["MemoryStore", "get_store", "reset_store"]


def __getattr__(name: str) -> Any:
    # Lazy (PEP 562): importing a submodule (a backend, the settings) must not import the
    # store and, through it, every service; the import graph reads top to bottom.
    if name in __all__:
        from persistent_memory import store

        return getattr(store, name)
    raise AttributeError(f"module 'persistent_memory' has no attribute {name!r}")


#: Modules that moved into packages, by their old import path: the old path still imports
#: (the same module object, so ``from persistent_memory.debug import X`` and settings that
#: name ``persistent_memory.resolvers.user_owner`` keep working) with a DeprecationWarning.
MOVED_MODULES = {
    "persistent_memory.admin_checkpoints": "persistent_memory.admin.checkpoints",
    "persistent_memory.admin_conversations": "persistent_memory.admin.conversations",
    "persistent_memory.admin_forget": "persistent_memory.admin.forget",
    "persistent_memory.admin_memories": "persistent_memory.admin.memories",
    "persistent_memory.transcript": "persistent_memory.admin.transcript",
    "persistent_memory.mirror_checkpoints": "persistent_memory.mirror.checkpoints",
    "persistent_memory.mirror_conversations": "persistent_memory.mirror.conversations",
    "persistent_memory.maintenance": "persistent_memory.operations.maintenance",
    "persistent_memory.relayout": "persistent_memory.operations.relayout",
    "persistent_memory.memories.forget": "persistent_memory.operations.forget",
    "persistent_memory.resolvers": "persistent_memory.owners.resolvers",
    "persistent_memory.debug": "persistent_memory.errors.debug",
    "persistent_memory.reporting": "persistent_memory.errors.reporting",
    "persistent_memory.database": "persistent_memory.errors.database",
    "persistent_memory.error_views": "persistent_memory.api.error_views",
    "persistent_memory.history": "persistent_memory.backends.memory.history",
    "persistent_memory.conversations.messages": "persistent_memory.chat.messages",
    "persistent_memory.conversations.records": "persistent_memory.chat.records",
    "persistent_memory.conversations.tokens": "persistent_memory.chat.tokens",
    "persistent_memory.conversations.window": "persistent_memory.chat.window",
    "persistent_memory.conversations.tasks": "persistent_memory.tasks",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old path of :data:`MOVED_MODULES` as the module at its new path.

    One finder rather than a stub file per old path: the package's top stays the map of
    its parts. The loader puts the real module in ``sys.modules`` under the old name,
    which the import system then returns (as it does for any module that replaces itself
    there), so the module keeps its own name and spec.
    """

    def find_spec(
        self, fullname: str, path: Any = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED_MODULES:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # the default module, replaced in exec_module

    def exec_module(self, module: ModuleType) -> None:
        new = MOVED_MODULES[module.__name__]
        warnings.warn(
            f"{module.__name__} moved to {new}: import it from there "
            "(the old path will be removed in a future release).",
            DeprecationWarning,
            stacklevel=2,
        )
        sys.modules[module.__name__] = importlib.import_module(new)


# First: an old path must never be found as a file (a stale copy, an editable install
# of an older checkout); the finder answers for the old paths only.
if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.insert(0, _MovedModules())
