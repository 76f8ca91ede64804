"""The Redis backend: ``RedisBackend`` (``backend``) and the parts it is made of.

Minimal package entry for the move; see the later commits for the full docstring.
"""

from __future__ import annotations

from persistent_memory.backends.redis.backend import RedisBackend

__all__ = ["RedisBackend"]
