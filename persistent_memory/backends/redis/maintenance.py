"""The Redis backend's upkeep: scanning, sweeping and forgetting, in batches.

What walks every session or every key of the deployment, never holding Redis long: the
scan of the sessions sets (one cursor over every bucket), the sweep of expired sessions'
ids, leftover keys and (in the cluster layout) run pointers whose binding has gone, and
the removal of every key of a namespace (forgetting an owner). SCAN, never KEYS.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import Any

import redis
from redis.cluster import RedisCluster

from persistent_memory.backends.redis.layout import Layout, swept
from persistent_memory.backends.redis.transport import RedisTransport, _bridged
from persistent_memory.owners import namespace_of

#: A run pointer's compare-and-delete (the sweep's): the key is declared.
_DELETE_IF_UNCHANGED = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
)


def _glob_escape(text: str) -> str:
    """``text`` as a literal in a SCAN/SSCAN MATCH pattern."""
    return re.sub(r"([\\*?\[\]])", r"\\\1", text)


class RedisMaintenance:
    """The contract's ``scan_sessions``, ``sweep`` and ``forget_namespace`` (and the
    deletion of a damaged session's keys), on the backend's ``client`` and ``transport``;
    ``run`` sends a call of the library (the sweep's scripts)."""

    #: The sweep leaves a run pointer younger than this alone (see _sweep_pointers).
    POINTER_GRACE_SECONDS = 60.0

    def __init__(
        self,
        *,
        layout: Layout,
        client: redis.Redis | RedisCluster,
        transport: RedisTransport,
        run: Callable[..., Any],
    ) -> None:
        self._layout = layout
        self._key_prefix = layout.prefix
        self._client = client
        self._transport = transport
        self._run = run

    def _session_sets(self, root: str, prefix: str) -> list[str]:
        """The sets ``prefix`` selects in the bucket ``root`` (the rule of redis.lua's
        ``sets_for``); an owner's is a sorted set."""
        namespace = namespace_of(prefix)
        if namespace:
            return [f"{root}:{namespace}:sessions"]
        node = f"{root}:__sessions__"
        return [node] if prefix else [node, f"{root}:~owned"]

    def scan_sessions(self, cursor: int, count: int, prefix: str = "") -> tuple[int, list[str]]:
        bridge = _bridged()
        if bridge is not None:
            return bridge.blocking(self.scan_sessions, cursor, count, prefix)
        # One cursor over every bucket and up to two sets in each: cursor = (position * 2
        # + set) * buckets + bucket, position being the set's SSCAN (ZSCAN) cursor.
        roots = self._layout.roots()
        cursor, bucket = divmod(cursor, len(roots))
        sets = self._session_sets(roots[bucket], prefix)
        phase, position = cursor % 2, cursor // 2
        owner_set = bool(namespace_of(prefix))
        following, ids = self._scan_set(sets[phase], position, count, prefix, sorted_set=owner_set)
        if following:
            following = following * 2 + phase
        elif phase + 1 < len(sets):
            following = 1  # the next set, from its start
        elif bucket + 1 < len(roots):
            return bucket + 1, ids  # the next bucket, from its start
        else:
            return 0, ids
        return following * len(roots) + bucket, ids

    def _scan_set(
        self, key: str, cursor: int, count: int, prefix: str, *, sorted_set: bool
    ) -> tuple[int, list[str]]:
        """One SSCAN (or ZSCAN) step of ``key``, ids starting with ``prefix``."""
        match = _glob_escape(prefix) + "*" if prefix else None
        with self._transport.errors():
            if sorted_set:
                following, pairs = self._client.zscan(key, cursor, match=match, count=count)
                return following, [member.decode() for member, _ in pairs]
            following, ids = self._client.sscan(key, cursor, match=match, count=count)
        return following, [item.decode() for item in ids]

    def unlink_matching(self, patterns: list[str], batch_size: int = 500) -> int:
        """UNLINK every key matching ``patterns`` (SCAN on every primary, never KEYS; the
        cluster client splits a batch by slot)."""
        deleted = 0
        with self._transport.errors():
            for pattern in patterns:
                batch: list[bytes] = []
                for key in self._client.scan_iter(match=pattern, count=batch_size):
                    batch.append(key)
                    if len(batch) >= batch_size:
                        deleted += self._client.unlink(*batch)
                        batch = []
                if batch:
                    deleted += self._client.unlink(*batch)
        return deleted

    def _key_patterns(self, below: str) -> list[str]:
        """SCAN patterns of this deployment's keys whose name below the root starts with
        ``below`` (a literal): one for the node layout, one for every bucket otherwise."""
        literal = _glob_escape(below) + "*"
        if not self._layout.cluster:
            return [_glob_escape(f"{self._key_prefix}:") + literal]
        return [_glob_escape(f"{self._key_prefix}:") + "{*}:" + literal]

    def forget_namespace(self, namespace: str) -> int:
        # Every per-owner key that is no session's starts with "{namespace}:" below its root
        # (a session id never starts with ':'); in the cluster layout, run pointers too.
        patterns = self._key_patterns(f"{namespace}:")
        if self._layout.cluster:
            patterns.append(_glob_escape(f"{self._key_prefix}:{namespace}:") + "*")
        return self.unlink_matching(patterns)

    def sweep(self, *, dry_run: bool, batch_size: int, prefix: str = "") -> dict[str, int]:
        dry = "1" if dry_run else "0"
        counts = {"expired_sessions": 0, "leftover_keys": 0, "run_bindings": 0}
        namespace = namespace_of(prefix)
        # Ids in the sessions sets (and the unowned listing) whose meta has expired: one SSCAN
        # (ZSCAN) step, then a script that checks and removes those ids, their metas and
        # listings declared, in every bucket.
        places = [6] if namespace else [8] if prefix else [8, 9]
        if not namespace:
            places.append(6)  # the unowned listing: ids the node's set no longer holds
        for root in self._layout.roots():
            for place in places:
                key = self._layout.keys("", root=root, namespace=namespace)[place - 1]
                cursor = 0
                while True:
                    cursor, ids = self._scan_set(key, cursor, batch_size, prefix, sorted_set=place == 6)
                    if ids:
                        declared = self._layout.index_keys(root, ids)
                        options = {"root": root, "namespace": namespace, "extra": declared}
                        counts["expired_sessions"] += self._run(
                            "sweep_ids", "", dry, str(place), *ids, **options
                        )
                    if not cursor:
                        break
        # Every key under the prefix, never KEYS: SCAN in batches, grouped by bucket.
        with self._transport.errors():
            for pattern in self._key_patterns(prefix):
                batches: dict[str, list[str]] = {}
                for raw in self._client.scan_iter(match=pattern, count=batch_size):
                    key = raw.decode()
                    root = self._root_of_key(key)
                    batch = batches.setdefault(root, [])
                    batch.append(key)
                    if len(batch) >= batch_size:
                        self._sweep_keys(root, batches.pop(root), dry, counts)
                for root, batch in batches.items():
                    self._sweep_keys(root, batch, dry, counts)
            if self._layout.cluster:
                self._sweep_pointers(prefix, dry_run, batch_size, counts)
        return counts

    def _sweep_pointers(self, prefix: str, dry_run: bool, batch_size: int, counts: dict[str, int]) -> None:
        """The cluster layout's run pointers (outside the buckets) whose binding in their
        session's bucket has gone: each deleted only if it still holds what was checked, and
        only once POINTER_GRACE_SECONDS old (its binding is set by a script sent beside it)."""
        namespace = namespace_of(prefix)
        patterns = [
            _glob_escape(f"{self._key_prefix}:{namespace}:run:" if namespace else f"{self._key_prefix}:~run:")
        ]
        if not prefix:
            patterns.append(_glob_escape(f"{self._key_prefix}:~o:") + "*~:run:")
        settled = time.time_ns() - int(self.POINTER_GRACE_SECONDS * 10**9)
        for pattern in patterns:
            with self._transport.errors():
                keys = [raw.decode() for raw in self._client.scan_iter(match=pattern + "*", count=batch_size)]
            for first in range(0, len(keys), batch_size):
                batch = keys[first : first + batch_size]
                values = self._transport.checked(self._transport.batch([("GET", key) for key in batch]))
                pointers = []
                for key, raw in zip(batch, values, strict=True):
                    session, _, set_at = (raw or b"").decode().partition(" ")
                    if raw and session.startswith(prefix) and int(set_at or 0) < settled:
                        binding = f"{self._layout.root_of(session)}:{key[len(self._key_prefix) + 1 :]}"
                        pointers.append((key, raw, binding))
                bound = self._transport.checked(
                    self._transport.batch([("EXISTS", binding) for _, _, binding in pointers])
                )
                stale = [(key, raw) for (key, raw, _), held in zip(pointers, bound, strict=True) if not held]
                counts["run_bindings"] += len(stale)
                if stale and not dry_run:
                    self._transport.checked(
                        self._transport.batch(
                            [("EVAL", _DELETE_IF_UNCHANGED, 1, k, v) for k, v in stale], key_at=3
                        )
                    )

    def _root_of_key(self, key: str) -> str:
        if not self._layout.cluster:
            return self._key_prefix
        return key[: key.index("}", len(self._key_prefix)) + 1]

    def _sweep_keys(self, root: str, keys: list[str], dry: str, counts: dict[str, int]) -> None:
        if keys:
            # Each key's kind, and its session's meta declared after the keys.
            parsed = [swept(key[len(root) + 1 :]) for key in keys]
            placeholder = self._layout.keys("", root=root)[7]
            metas = [f"{root}:{sid}:__meta__" if sid else placeholder for _, sid in parsed]
            kinds = [kind for kind, _ in parsed]
            declared = [*keys, *metas]
            leftovers, runs = self._run(
                "sweep_keys", "", dry, str(len(keys)), *kinds, root=root, extra=declared
            )
            counts["leftover_keys"] += leftovers
            counts["run_bindings"] += runs
