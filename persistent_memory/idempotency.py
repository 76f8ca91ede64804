"""Idempotency keys: a write sent again under the same key is answered, not applied, again.

A client that got no answer to a write (a 503, a timeout, a dropped connection) cannot
tell whether it was applied. Sent with an :class:`Idempotency`, the backend checks the
key and records the write's result in the same atomic step as the write (on Redis, in
the same script), so a repeat of the key within ``IDEMPOTENCY_TTL_SECONDS`` gets the
first result back and writes nothing, even when the first answer was lost after the
write was made. A repeat that asks something else (another fingerprint) raises
:class:`~persistent_memory.exceptions.IdempotencyKeyReused`. A write that raised is
not recorded: it wrote nothing, so a retry runs again.

Keys are per owner: the store files each under its owner's namespace
(:func:`persistent_memory.owners.idempotency_ref`).
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, NamedTuple

from persistent_memory.exceptions import InvalidIdempotencyKey, InvalidValue

#: The HTTP header the REST API reads.
HEADER = "Idempotency-Key"

# What a client may send: enough for UUIDs, ULIDs and base64. Not allowed: '~' and
# '#' (the store's own delimiters), SCAN pattern characters, '{' '}' (Redis Cluster
# hash tags), spaces and control characters.
KEY_PATTERN = re.compile(r"[A-Za-z0-9_.:/@+=-]{1,255}")
# What the store accepts: a client's key, or the key of one entry of a batch made
# under it ("{key}#{index}"), which no client's key can equal.
STORED_KEY_PATTERN = re.compile(r"[A-Za-z0-9_.:/@+=-]{1,255}(?:#[0-9]{1,9})?")


class Idempotency(NamedTuple):
    """A write's idempotency key and the fingerprint of what the write asks.

    ``Idempotency.of(key, *request)`` builds one; the store methods that write take it
    as ``idempotency=``.
    """

    key: str
    fingerprint: str

    @classmethod
    def of(cls, key: Any, *request: Any) -> Idempotency:
        """``key`` (checked) with the fingerprint of ``request``: JSON-able parts that say
        what is asked (the REST API uses method, path and body)."""
        return cls(validate_idempotency_key(key), fingerprint(*request))

    def entry(self, index: int) -> Idempotency:
        """The key of entry ``index`` of a batch sent under this key (same fingerprint)."""
        return Idempotency(f"{self.key}#{index}", self.fingerprint)


def validate_idempotency_key(key: Any) -> str:
    """Return a client's ``key`` if valid, else raise :class:`InvalidIdempotencyKey`."""
    if not isinstance(key, str) or not KEY_PATTERN.fullmatch(key):
        raise InvalidIdempotencyKey(
            f"Invalid {HEADER} {str(key)[:80]!r}: "
            "use 1-255 characters of letters, digits and _ . : / @ + = -."
        )
    return key


def validate_idempotency(idempotency: Any) -> Idempotency:
    """Return ``idempotency`` if the store can record it, else raise :class:`InvalidValue`."""
    if not isinstance(idempotency, Idempotency):
        raise InvalidValue("idempotency must be an Idempotency (see Idempotency.of).")
    key, print_ = idempotency
    if not isinstance(key, str) or not STORED_KEY_PATTERN.fullmatch(key):
        validate_idempotency_key(key)  # raises, saying what a key may hold
    if not isinstance(print_, str) or not 1 <= len(print_) <= 128:
        raise InvalidValue("An idempotency fingerprint must be a string of 1-128 characters.")
    return idempotency


def fingerprint(*request: Any) -> str:
    """SHA-256 of ``request`` as canonical JSON (sorted keys, no spaces): equal requests,
    however their JSON was spaced or ordered, have equal fingerprints."""
    try:
        text = json.dumps(request, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidValue(f"An idempotency fingerprint needs JSON-able parts: {exc}") from None
    return hashlib.sha256(text.encode()).hexdigest()
