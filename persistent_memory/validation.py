"""Input rules, checked before anything touches a backend."""

from __future__ import annotations

import json
import math
import re
from typing import Any

from persistent_memory.exceptions import (
    InvalidKey,
    InvalidRunId,
    InvalidSessionId,
    InvalidUnicode,
    InvalidValue,
    ValueTooDeep,
    ValueTooLarge,
)

# fullmatch, never `$`: `$` also matches before a trailing newline.
SESSION_ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,128}")
KEY_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,256}")
# Dunder names are the store layout's own (__keys__, __meta__, __sessions__, ...).
RESERVED_PATTERN = re.compile(r"__.*__")
#: U+0000 as JSON escapes it (not preceded by an escaped backslash: the text "\\u0000"
#: is six characters any database keeps).
NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


def validate_session_id(session_id: Any) -> str:
    """Return ``session_id`` if valid, else raise :class:`InvalidSessionId`."""
    if not isinstance(session_id, str) or not SESSION_ID_PATTERN.fullmatch(session_id):
        raise InvalidSessionId(
            f"Invalid session_id {session_id!r}: use 1-128 characters of letters, digits, '-' or '_'."
        )
    if RESERVED_PATTERN.fullmatch(session_id):
        raise InvalidSessionId(f"Invalid session_id {session_id!r}: names like __name__ are reserved.")
    return session_id


def validate_run_id(run_id: Any) -> str:
    """A pipeline run id follows the session id rules; :class:`InvalidRunId` otherwise."""
    try:
        return validate_session_id(run_id)
    except InvalidSessionId as exc:
        raise InvalidRunId(str(exc).replace("session_id", "run_id")) from None


def validate_key(key: Any) -> str:
    """Return ``key`` if valid, else raise :class:`InvalidKey`."""
    if not isinstance(key, str) or not KEY_PATTERN.fullmatch(key):
        raise InvalidKey(f"Invalid key {key!r}: use 1-256 characters of letters, digits, '-', '_' or '.'.")
    if RESERVED_PATTERN.fullmatch(key):
        raise InvalidKey(f"Invalid key {key!r}: names like __name__ are reserved by the store layout.")
    return key


#: The deepest a value may nest when the store is built without settings (see MAX_JSON_DEPTH).
DEFAULT_MAX_DEPTH = 100


# A tuple, not ``list | tuple``: that would build a union object at every check.
_SEQUENCES = (list, tuple)


def _check_structure(value: Any, max_depth: int) -> None:
    """Refuse object keys that are not strings and nesting deeper than ``max_depth``.

    ``max_depth`` counts containers: ``[]`` is 1 deep, ``[[1]]`` 2. The walk stops at
    the first level too deep, so it never recurses further than ``max_depth``.
    """
    if isinstance(value, dict):
        if max_depth < 1:
            raise ValueTooDeep()
        for k, item in value.items():
            # json.dumps would silently turn {1: "a"} into {"1": "a"}: the value would
            # not come back as it was put, so refuse it instead.
            if not isinstance(k, str):
                raise InvalidValue(f"Invalid value: object keys must be strings, not {type(k).__name__}.")
            _check_structure(item, max_depth - 1)
    elif isinstance(value, _SEQUENCES):
        if max_depth < 1:
            raise ValueTooDeep()
        for item in value:
            _check_structure(item, max_depth - 1)


def _has_lone_surrogate(value: Any) -> bool:
    """Whether a string in ``value`` (a key too) holds a surrogate code point, which is no
    character: UTF-8 cannot carry it, so PostgreSQL, Redis clients and the API's answers
    would fail on it. ``value`` must be JSON-serialisable."""
    try:
        (value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)).encode()
    except UnicodeEncodeError:
        return True
    return False


def encode_value(value: Any, *, max_bytes: int, max_depth: int = DEFAULT_MAX_DEPTH) -> str:
    """Serialise ``value`` to JSON text, or raise :class:`InvalidValue` (nothing is written).

    What is accepted comes back exactly from every backend and the mirror: no NaN or
    infinities, no lone surrogates, at most ``max_depth`` levels deep. U+0000 is valid.
    """
    try:
        _check_structure(value, max_depth)
    except ValueTooDeep:
        raise ValueTooDeep(
            f"Invalid value: nested more than {max_depth} levels deep (MAX_JSON_DEPTH)."
        ) from None
    try:
        text = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidValue(f"Invalid value: not JSON-serialisable ({exc}).") from None
    # ensure_ascii (the default) writes every surrogate as an escape: only text with one
    # (a character beyond U+FFFF, or a lone surrogate) needs the precise check. A search
    # for one character runs at memchr speed, for three at a fraction of it.
    if "\\" in text and "\\ud" in text and _has_lone_surrogate(value):
        raise InvalidUnicode()
    # ensure_ascii also makes len(text) the size in bytes.
    if len(text) > max_bytes:
        raise ValueTooLarge(f"Invalid value: {len(text)} bytes of JSON is over the limit of {max_bytes}.")
    return text


def decode_value(text: str | bytes) -> Any:
    """Parse stored JSON text (counters are stored as bare integers, also JSON)."""
    return json.loads(text)


def validate_ttl(ttl_seconds: Any, *, name: str = "ttl_seconds") -> int | float | None:
    """A TTL in seconds: a positive finite number, or None/0 for no expiry."""
    if ttl_seconds is None:
        return None
    if (
        isinstance(ttl_seconds, bool)
        or not isinstance(ttl_seconds, int | float)
        or not math.isfinite(ttl_seconds)
    ):
        raise InvalidValue(f"Invalid {name} {ttl_seconds!r}: use a finite number of seconds.")
    if ttl_seconds < 0:
        raise InvalidValue(f"Invalid {name} {ttl_seconds!r}: must not be negative.")
    if ttl_seconds == 0:
        return None
    if ttl_seconds < 0.001:
        raise InvalidValue(f"Invalid {name} {ttl_seconds!r}: the smallest TTL is one millisecond.")
    # 86400.0 and 86400 are the same TTL; store and report them the same way.
    return int(ttl_seconds) if float(ttl_seconds).is_integer() else float(ttl_seconds)


def validate_int(value: Any, *, name: str, minimum: int | None = None) -> int:
    """A real ``int`` (not a bool) within the 64-bit range Redis counters use."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidValue(f"Invalid {name} {value!r}: must be an integer.")
    lower = INT64_MIN if minimum is None else minimum
    if not lower <= value <= INT64_MAX:
        raise InvalidValue(f"Invalid {name} {value!r}: must be between {lower} and {INT64_MAX}.")
    return value
