"""Where the Redis backend keeps each key: the node's layout, or the cluster layout.

Every script call declares its keys (see the KEYS list at the top of ``redis.lua``);
this module names them.

* **node** (the default on one server): the RocketRide node's layout, byte for byte.
  Every key starts with the prefix; the indexes and queues are one per deployment.
* **cluster** (required on Redis Cluster, allowed anywhere): the sessions are spread over
  :data:`BUCKETS` buckets by a hash of their storage id, and every key of a bucket, its
  sessions' keys and the bucket's own listing indexes, node and owned sets, mirror and
  summarizer queues, idempotency records and run bindings, starts with
  ``{prefix}:{<bucket tag>}``. The hash tag puts all of them in one hash slot, so every
  operation on a session is still one atomic script call: a write and the index entries
  it updates are in the same slot. A bucket per session would shard as well, but then no
  index could be updated in the same step; a bucket per owner would put a deployment whose
  API has one user on one primary. What walks every session (listing, the sweep, the
  queues) reads each bucket in turn: 64 calls, pipelined per primary.

The tags are chosen so that bucket ``b`` hashes near the middle of slots
``[256 b, 256 b + 256)``: with a cluster's slots split evenly, as ``redis-cli --cluster
create`` splits them, each primary holds the same number of buckets (21 or 22 of 64 on
three primaries). The tags and the bucket of an id are part of the stored layout: never
change them (``memory_relayout`` moves data between the two layouts, not between tags).

A run binding (``answer`` given only a run id) cannot be found from the run id alone in
the cluster layout: the binding lives in its session's bucket, and a pointer
``{prefix}:{run reference}`` (its own slot) names the session. The enrich lane writes the
pointer beside its script call, on the pointer's primary, in the same round trip; an
answer by run id reads it first (two round trips, the documented exception).
"""

from __future__ import annotations

import re
import zlib
from functools import lru_cache

from redis.crc import key_slot

from persistent_memory.owners import namespace_of

#: Buckets of the cluster layout.
BUCKETS = 64
_SLOTS = 16384
_WIDTH = _SLOTS // BUCKETS


def _tag(bucket: int) -> str:
    """The first ``b{bucket}.{n}`` whose slot is within 16 of the middle of the bucket's slots."""
    middle = bucket * _WIDTH + _WIDTH // 2
    n = 0
    while abs(key_slot(f"b{bucket}.{n}".encode()) - middle) > 16:
        n += 1
    return f"b{bucket}.{n}"


TAGS: tuple[str, ...] = tuple(_tag(bucket) for bucket in range(BUCKETS))

#: Conversation key suffixes, in the order of KEYS 19-27 (see conversations.lua).
_CONVERSATION_SUFFIXES = ("", ":m", ":l", ":t", ":s", ":k", ":o", ":y", ":x")
#: A session's checkpoints, KEYS 17-18 (see checkpoints.lua).
_CHECKPOINT_SUFFIXES = ("~cp", "~cpi")

# Where the keys that vary with a call go in the list (KEYS[13], KEYS[14], KEYS[15] in Lua).
IDEMPOTENCY, RUN, VALUE = 12, 13, 14

#: KEYS places (1-based, as in redis.lua) of a bucket's queues: the mirror's dirty set, the
#: summarizers' marks and their health.
DIRTY, SUMMARIZE, SUMMARIZER = 10, 11, 12


# What the sweep may remove, by the name below the root (see maintenance.lua's sweep_keys).
# Lua's %w is ASCII: so are these classes.
_RUN_BINDING = re.compile(r"~run:[A-Za-z0-9_-]+|~o:[^~]+~:run:[A-Za-z0-9_-]+")
_IDEMPOTENCY_RECORD = re.compile(r"~idem:|~o:[^~]+~:idem:")
_CONVERSATION_KEY = re.compile(r"(~o:[^~]+~[A-Za-z0-9_-]+|[A-Za-z0-9_-]+):~c")
_SESSION_KEY = re.compile(r"(.+):([A-Za-z0-9_.-]+|~runs|~cpi?)")
_SESSION_ID = re.compile(r"[A-Za-z0-9_-]+|~o:[^~]+~[A-Za-z0-9_-]+")


def swept(rest: str) -> tuple[str, str | None]:
    """What the sweep makes of a key whose name below its root is ``rest``: ``("b", None)``
    a run binding (its session is what it holds), ``("i", id)`` session ``id``'s run index,
    ``("k", id)`` another key of session ``id`` (a value, the fixed keys, a conversation's,
    the checkpoints), ``("", None)`` none of a session's: the indexes and queues, the
    idempotency records (they belong to no session and expire on their own), and anything
    else, such as another deployment's key whose prefix starts with ours (not ours to touch)."""
    if _RUN_BINDING.fullmatch(rest):
        return "b", None
    if _IDEMPOTENCY_RECORD.match(rest):
        return "", None
    conversation = _CONVERSATION_KEY.match(rest)
    if conversation:
        session, name = conversation.group(1), ""
    else:
        parts = _SESSION_KEY.fullmatch(rest)
        session, name = parts.groups() if parts else ("", "")
    if name == "__sessions__" or not _SESSION_ID.fullmatch(session):
        return "", None
    return ("i" if name == "~runs" else "k"), session


def bucket_of(storage_id: str) -> int:
    """The cluster layout's bucket of a session (CRC-32 of its storage id)."""
    return zlib.crc32(storage_id.encode()) % BUCKETS


class Layout:
    """Key names of one deployment (``prefix``) in the node or the cluster layout."""

    def __init__(self, prefix: str, *, cluster: bool) -> None:
        self.prefix = prefix
        self.cluster = cluster
        # Per-call names are built from cached tuples: a lane call must not pay for 24 f-strings.
        self.session_keys = lru_cache(maxsize=4096)(self._session_keys)
        self.bucket_keys = lru_cache(maxsize=BUCKETS * 4)(self._bucket_keys)

    @property
    def name(self) -> str:
        return "cluster" if self.cluster else "node"

    def roots(self) -> list[str]:
        """Every root a key of this deployment starts with (one per bucket)."""
        if not self.cluster:
            return [self.prefix]
        return [f"{self.prefix}:{{{tag}}}" for tag in TAGS]

    def root_of(self, storage_id: str) -> str:
        if not self.cluster:
            return self.prefix
        return f"{self.prefix}:{{{TAGS[bucket_of(storage_id)]}}}"

    def _shared(self, root: str, namespace: str) -> tuple[str, ...]:
        """KEYS 6-12 and 16: a namespace's listing, then the bucket's sets and queues."""
        listing = f"{root}:{namespace}:" if namespace else f"{root}:~"
        return (
            f"{listing}sessions",
            f"{listing}names",
            f"{root}:__sessions__",
            f"{root}:~owned",
            f"{root}:~dirty",
            f"{root}:~summarize",
            f"{root}:~summarizer",
            f"{root}:~search",
        )

    def _session_keys(self, storage_id: str) -> tuple[str, ...]:
        """KEYS 1-12, 16, 17-18 of a call on the session."""
        root = self.root_of(storage_id)
        base = f"{root}:{storage_id}:"
        shared = self._shared(root, namespace_of(storage_id))
        own = (f"{base}__meta__", f"{base}__keys__", f"{base}__history__", f"{base}~runs", f"{base}~convs")
        return own + shared + tuple(base + suffix for suffix in _CHECKPOINT_SUFFIXES)

    def _bucket_keys(self, root: str, namespace: str) -> tuple[str, ...]:
        shared = self._shared(root, namespace)
        # No session: its keys (1-5, 17-18) stand in as the node's set.
        return (shared[2],) * 5 + shared + (shared[2],) * len(_CHECKPOINT_SUFFIXES)

    def keys(
        self,
        storage_id: str,
        *,
        idempotency: str | None = None,
        run: str | None = None,
        key: str | None = None,
        conversation: str | None = None,
        root: str | None = None,
        namespace: str = "",
        extra: list[str] | tuple[str, ...] = (),
    ) -> list[str]:
        """KEYS of one call (see redis.lua). With no ``storage_id``, of the bucket ``root``
        (the first root when not given) and the listing of ``namespace``."""
        if storage_id:
            fixed = self.session_keys(storage_id)
            root = self.root_of(storage_id)
        else:
            root = root or self.roots()[0]
            fixed = self.bucket_keys(root, namespace)
        placeholder = fixed[7]
        keys = [*fixed[:12], placeholder, placeholder, placeholder, *fixed[12:]]
        if idempotency:
            keys[IDEMPOTENCY] = f"{root}:{idempotency}"
        if run:
            keys[RUN] = f"{root}:{run}"
        if key and storage_id:
            keys[VALUE] = self.value_key(storage_id, key)
        if conversation and storage_id:
            keys.extend(self.conversation_keys(storage_id, conversation))
        elif extra:
            keys.extend((placeholder,) * len(_CONVERSATION_SUFFIXES))
        keys.extend(extra)
        return keys

    def index_keys(self, root: str, storage_ids: list[str]) -> list[str]:
        """The meta of each session of ``storage_ids`` (of bucket ``root``) and its namespace's
        listing (by time, by name): what the sweep of those ids reads and writes."""
        keys: dict[str, None] = {}
        for storage_id in storage_ids:
            keys[f"{root}:{storage_id}:__meta__"] = None
            keys.update(dict.fromkeys(self._shared(root, namespace_of(storage_id))[:2]))
        return list(keys)

    def conversation_keys(self, storage_id: str, conversation: str) -> list[str]:
        """The keys of one conversation of a session (see conversations.lua)."""
        c = f"{self.root_of(storage_id)}:{storage_id}:~c:{conversation}"
        return [c + suffix for suffix in _CONVERSATION_SUFFIXES]

    def value_key(self, storage_id: str, key: str) -> str:
        return f"{self.root_of(storage_id)}:{storage_id}:{key}"

    def run_pointer(self, run_ref: str) -> str:
        """The cluster layout's pointer from a run reference to its session (its own slot)."""
        return f"{self.prefix}:{run_ref}"

    def slot(self, key: str) -> int:
        return key_slot(key.encode())
