"""The in-process backend: ``MemoryBackend`` (``backend``) and the parts it is made of.

Minimal package entry for the move; see the later commits for the full docstring.
"""

from __future__ import annotations

from typing import Any

__all__ = ["MemoryBackend"]


def __getattr__(name: str) -> Any:
    # Lazy, so that importing memory.tree (the transcript, the mirror) loads no backend.
    if name == "MemoryBackend":
        from persistent_memory.backends.memory.backend import MemoryBackend

        return MemoryBackend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
