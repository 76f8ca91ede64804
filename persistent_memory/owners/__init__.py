"""Owners: the namespace every session lives in, and how it becomes backend ids.

An owner is a string such as ``user:42`` or ``tenant:acme/user:42``; ``""`` is the
unowned namespace, the one the original node and unscoped Python code write to.
Backends never see owners: the store hands them a *storage id* per session,

* unowned: the session id itself (the node's layout, byte for byte);
* owned: ``~o:{owner}~{session_id}``.

Session ids are ``[A-Za-z0-9_-]`` and owners never hold ``~``, so the first ``~``
after ``~o:`` ends the owner, a storage id names exactly one (owner, session id),
and no owned key can equal or prefix a key of another owner or of the node's layout
(node keys never start with ``~``). Per-owner keys that are not a session's start
with ``~o:{owner}~:``, which no session's can (a session id never starts with ``:``).

The package holds the owners' names here and the resolvers that decide a request's owner
(:mod:`persistent_memory.owners.resolvers`). May import: ``exceptions`` and ``conf``
(the resolvers read the settings); everything else may import it.
"""

from __future__ import annotations

import re
from typing import Any

from persistent_memory.exceptions import InvalidOwner

#: The unowned namespace (the node's sessions, and the shared-namespace resolver's).
UNOWNED = ""

# Letters, digits and _ - . : / @ + =. Not allowed, and why: '~' delimits the owner in
# Redis keys; '*', '?', '[', ']' and '\' are SCAN MATCH pattern syntax; '{' and '}'
# are Redis Cluster hash tags; spaces and control characters end up in logs and
# headers. 200 characters leave room for tenant and user parts.
OWNER_PATTERN = re.compile(r"[A-Za-z0-9_.:/@+=-]{1,200}")
OWNED_MARK = "~o:"


def validate_owner(owner: Any) -> str:
    """Return ``owner`` if valid (``""`` is the unowned namespace), else raise :class:`InvalidOwner`."""
    if owner == UNOWNED:
        return owner
    if not isinstance(owner, str) or not OWNER_PATTERN.fullmatch(owner):
        raise InvalidOwner(
            f"Invalid owner {owner!r}: use 1-200 characters of letters, digits and _ - . : / @ + =."
        )
    return owner


def owner_namespace(owner: str) -> str:
    """What every storage id of ``owner`` starts with (``""`` for the unowned namespace)."""
    return f"{OWNED_MARK}{owner}~" if owner else ""


def namespace_of(sid: str) -> str:
    """The owner namespace a storage id (or a prefix of one) starts with; ``""`` for none."""
    if sid.startswith(OWNED_MARK) and "~" in sid[len(OWNED_MARK) :]:
        return sid[: sid.index("~", len(OWNED_MARK)) + 1]
    return ""


def storage_id(owner: str, session_id: str) -> str:
    """The backend's id of ``session_id`` in ``owner``'s namespace (both already valid)."""
    return f"{OWNED_MARK}{owner}~{session_id}" if owner else session_id


def split_storage_id(sid: str) -> tuple[str, str]:
    """``(owner, session_id)`` of a storage id (``owner`` is ``""`` when unowned)."""
    if sid.startswith(OWNED_MARK):
        owner, _, session_id = sid[len(OWNED_MARK) :].partition("~")
        return owner, session_id
    return UNOWNED, sid


def run_ref(owner: str, run_id: str) -> str:
    """Where a run binding lives below the key prefix: per owner, so run ids never cross owners."""
    return f"{OWNED_MARK}{owner}~:run:{run_id}" if owner else f"~run:{run_id}"


def idempotency_ref(owner: str, key: str) -> str:
    """Where an idempotency record lives below the key prefix: per owner, so one owner's
    key never answers another's request."""
    return f"{OWNED_MARK}{owner}~:idem:{key}" if owner else f"~idem:{key}"


def owner_prefix(owner: str | None) -> str:
    """The storage id prefix of ``owner``'s sessions ("" for every owner's, with None);
    ``InvalidOwner`` for ``""`` or an invalid owner."""
    if owner is None:
        return ""
    if not owner:
        raise InvalidOwner("Name an owner, such as user:42 (the unowned sessions have none).")
    return owner_namespace(validate_owner(owner))
