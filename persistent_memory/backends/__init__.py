"""Storage backends, chosen by ``PERSISTENT_MEMORY["BACKEND"]``."""

from __future__ import annotations

from django.utils.module_loading import import_string

from persistent_memory.backends.base import BaseBackend

#: Short names; anything else is an import string to a BaseBackend subclass.
BACKENDS = {
    "memory": "persistent_memory.backends.memory.MemoryBackend",
    "redis": "persistent_memory.backends.redis.RedisBackend",
}


def backend_class(name: str) -> type[BaseBackend]:
    """The class for a short name or import string; ImportError/TypeError if it is not one."""
    cls = import_string(BACKENDS.get(name, name))
    if not (isinstance(cls, type) and issubclass(cls, BaseBackend)):
        raise TypeError(f"{name!r} is not a persistent_memory BaseBackend subclass.")
    return cls


__all__ = ["BACKENDS", "BaseBackend", "backend_class"]
