"""How :class:`~persistent_memory.integrations.langgraph_saver.PersistentMemorySaver` stores
channel values, so that a turn of a long thread costs about what a turn of a short one does.

LangGraph hands a checkpointer each new version of a channel whole: a ``messages`` list of
10,000 items is 10,000 items again at every step. Stored whole, a thread's bytes grow
with the square of its length and every turn encodes and decodes all of it. Here a list
that extends the channel's previous version is stored as that version's *delta*: the
items after it, and a reference to it (``d``); the whole list (``f``) once the deltas
since the last whole one hold as many items as it did (see :data:`SNAPSHOT_ITEMS`), and
whenever a list does not extend the previous one. Each value has
a *content id* (a digest of the whole list, chained through the deltas), so a process
keeps the newest list of each channel it has read or written (:data:`LATEST`, at most
:data:`CACHED_ITEMS` items in all) and a turn decodes only the new items. A process that
lacks the base of a delta reads the chain down to the last whole list in one call.

Texts: ``f\\x1d{id}\\x1d{value}``, ``d\\x1d{id}\\x1d{base ref}\\x1d{base id}\\x1d{since}\\x1d{items}``
(the backend contract's delta form, see :mod:`persistent_memory.backends.checkpoints`),
``empty:`` (the channel has no value), or ``{type}:{base64}`` (any other value, whole).
Values are read-only to the cache: LangGraph gets a copy of each list, and a list put
is copied before it is kept.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple

from persistent_memory.backends.checkpoints import DELTA_SEP

#: A whole list again once the deltas since the last one hold as many items as it did (at
#: least this many): each item is then stored about twice in all, and a cold read decodes
#: about twice the list.
SNAPSHOT_ITEMS = 64
#: Items of the lists kept in the process in all (the newest of each channel of a thread).
CACHED_ITEMS = 2_000_000
EMPTY = "empty:"


class Latest(NamedTuple):
    """The newest list of a channel this process has seen: its reference, content id, the
    items its deltas added since the last whole list, and the list (never handed out)."""

    ref: str
    cid: str
    since: int
    items: list[Any]


class _Cache:
    """The newest list of each (owner, session, namespace, channel), least recently used first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, ...], Latest] = OrderedDict()
        self._items = 0

    def get(self, key: tuple[str, ...]) -> Latest | None:
        with self._lock:
            latest = self._entries.get(key)
            if latest is not None:
                self._entries.move_to_end(key)
            return latest

    def put(self, key: tuple[str, ...], latest: Latest) -> None:
        with self._lock:
            old = self._entries.pop(key, None)
            self._items += len(latest.items) - (len(old.items) if old else 0)
            self._entries[key] = latest
            while self._items > CACHED_ITEMS and self._entries:
                _, evicted = self._entries.popitem(last=False)
                self._items -= len(evicted.items)

    def forget(self, prefix: tuple[str, ...]) -> None:
        with self._lock:
            for key in [key for key in self._entries if key[: len(prefix)] == prefix]:
                self._items -= len(self._entries.pop(key).items)


LATEST = _Cache()


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x1d".join(parts).encode()).hexdigest()[:32]


class Values:
    """Encodes and decodes one checkpointer's channel values (``dump``/``load``: its serde's
    typed form as text)."""

    def __init__(self, dump: Callable[[Any], str], load: Callable[[str], Any]) -> None:
        self.dump = dump
        self.load = load

    def encode(self, key: tuple[str, ...], ref: str, value: Any) -> tuple[str, Latest | None]:
        """The text of ``value``, the new version ``ref`` of channel ``key``, and what the
        cache keeps once it is stored (None: not a list)."""
        if type(value) is not list or DELTA_SEP in ref:
            return self.dump(value), None
        latest = LATEST.get(key)
        if latest is not None and latest.ref != ref:
            known = len(latest.items)
            since = latest.since + len(value) - known
            whole_was = known - latest.since  # the length of the last whole list
            if (
                since < max(SNAPSHOT_ITEMS, whole_was)
                and len(value) >= known
                and value[:known] == latest.items
            ):
                items = self.dump(value[known:])
                cid = _digest(latest.cid, items)
                text = DELTA_SEP.join(("d", cid, latest.ref, latest.cid, str(since), items))
                return text, Latest(ref, cid, since, list(value))
        whole = self.dump(value)
        cid = _digest(whole)
        return DELTA_SEP.join(("f", cid, whole)), Latest(ref, cid, 0, list(value))

    def decode(
        self, key: tuple[str, ...], ref: str, text: str, chain: Callable[[str], list[str]]
    ) -> tuple[Any, bool]:
        """The value of ``text`` (version ``ref`` of channel ``key``), and whether the
        channel has one; ``chain(base ref)`` reads a delta's bases when the cache lacks them."""
        if text == EMPTY:
            return None, False
        kind = text[:2]
        if kind == "f" + DELTA_SEP:
            _, cid, whole = text.split(DELTA_SEP, 2)
            cached = LATEST.get(key)
            items = cached.items if cached is not None and cached.cid == cid else self.load(whole)
            LATEST.put(
                key, Latest(ref, cid, 0, list(items)) if cached is None or cached.cid != cid else cached
            )
            return list(items), True
        if kind == "d" + DELTA_SEP:
            items, latest = self._delta(key, ref, text, chain)
            LATEST.put(key, latest)
            return list(items), True
        return self.load(text), True

    def _delta(
        self, key: tuple[str, ...], ref: str, text: str, chain: Callable[[str], list[str]]
    ) -> tuple[list[Any], Latest]:
        _, cid, base_ref, base_cid, since, items = text.split(DELTA_SEP, 5)
        cached = LATEST.get(key)
        if cached is not None and cached.cid == cid:
            return cached.items, cached
        if cached is not None and cached.cid == base_cid:
            whole = cached.items + self.load(items)
        else:  # the chain down to a whole list, oldest applied first
            texts = [text, *chain(base_ref)]
            if not texts[-1].startswith("f" + DELTA_SEP):
                raise ValueError(f"The value of {ref!r} lost the base it extends.")
            whole = list(self.load(texts[-1].split(DELTA_SEP, 2)[2]))
            for step in reversed(texts[:-1]):
                whole.extend(self.load(step.split(DELTA_SEP, 5)[5]))
        return whole, Latest(ref, cid, int(since), whole)
