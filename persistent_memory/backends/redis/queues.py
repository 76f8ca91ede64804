"""The queues the Redis backend keeps in every bucket: the mirror's dirty set and the
summarizers' marked conversations (``KEYS`` places in :mod:`.layout`)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import redis
from redis.cluster import RedisCluster

from persistent_memory.backends.redis.layout import Layout


class BucketQueues:
    """Sets kept in every bucket of ``layout``, read and written in one pipelined step.

    ``batch`` pipelines plain commands to their keys' primaries; ``checked`` raises the
    first error of its replies as the store's; ``errors`` turns redis-py's errors into the
    store's around a call of ``client``."""

    def __init__(
        self,
        *,
        layout: Layout,
        client: redis.Redis | RedisCluster,
        batch: Callable[[list[tuple[Any, ...]]], list[Any]],
        checked: Callable[[list[Any]], list[Any]],
        errors: Callable[[], AbstractContextManager[None]],
    ) -> None:
        self._layout = layout
        self._client = client
        self._batch = batch
        self._checked = checked
        self._errors = errors

    def keys(self, place: int) -> list[str]:
        """KEYS[place] (1-based, see redis.lua) of every bucket."""
        return [self._layout.bucket_keys(root, "")[place - 1] for root in self._layout.roots()]

    def pop(self, place: int, count: int) -> list[bytes]:
        """Take up to ``count`` members of a queue kept in every bucket: the sizes first
        (one pipelined step), then from the buckets that hold some."""
        keys = self.keys(place)
        if len(keys) == 1:
            with self._errors():
                return self._client.spop(keys[0], count) or []
        sizes = self._checked(self._batch([("SCARD", key) for key in keys]))
        pops, left = [], count
        for key, size in zip(keys, sizes, strict=True):
            if size and left > 0:
                pops.append(("SPOP", key, min(size, left)))
                left -= size
        return [item for items in self._checked(self._batch(pops)) for item in items or ()]

    def count(self, place: int) -> int:
        return sum(self._checked(self._batch([("SCARD", key) for key in self.keys(place)])))

    def add(self, place: int, members: list[tuple[str, str]]) -> None:
        """Add ``(storage id, member)`` pairs, each to its session's bucket."""
        if not members:
            return
        self._checked(
            self._batch([("SADD", self._layout.session_keys(sid)[place - 1], m) for sid, m in members])
        )
