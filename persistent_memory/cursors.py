"""Listing cursors: where the next page of a session listing starts, as an opaque token.

A cursor holds the position of the last session of a page (its creation time and id)
and is signed with Django's ``SECRET_KEY`` (:mod:`django.core.signing`), salted with the
owner's namespace and the search, so that a cursor only ever reads on in the listing
that gave it: one that was altered, forged, or given to another owner or another
search is refused (:class:`InvalidCursor`) rather than read. A position needs no page
of its own to stay valid: a page starts after it even when its session has gone since.
"""

from __future__ import annotations

from django.core import signing

from persistent_memory.exceptions import InvalidCursor

#: Longer than any cursor this module writes (a 128-character id, a time, a signature).
MAX_CURSOR_LENGTH = 512

_SALT = "persistent_memory.cursors"


def _salt(namespace: str, prefix: str) -> str:
    return f"{_SALT}:{namespace}:{prefix}"


def encode_cursor(namespace: str, prefix: str, position: tuple[float, str]) -> str:
    """The cursor of ``position`` in the listing of ``namespace`` searched for ``prefix``."""
    return signing.dumps([position[0], position[1]], salt=_salt(namespace, prefix), compress=False)


def decode_cursor(namespace: str, prefix: str, cursor: str) -> tuple[float, str]:
    """The position ``cursor`` holds; :class:`InvalidCursor` unless this listing gave it."""
    refused = InvalidCursor("Invalid cursor: give the 'next' cursor of the page before, unchanged.")
    if not isinstance(cursor, str) or not cursor or len(cursor) > MAX_CURSOR_LENGTH:
        raise refused
    try:
        created_at, session_id = signing.loads(cursor, salt=_salt(namespace, prefix))
    except (signing.BadSignature, ValueError, TypeError):
        raise refused from None
    if (
        not isinstance(created_at, float | int)
        or isinstance(created_at, bool)
        or not isinstance(session_id, str)
    ):
        raise refused
    return float(created_at), session_id
