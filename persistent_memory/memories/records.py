"""What a memory may hold, checked before anything is written, and its dict form."""

from __future__ import annotations

import hashlib
import re
from array import array
from datetime import UTC, datetime
from typing import Any

from django.utils import timezone

from persistent_memory.conf import memory_settings
from persistent_memory.exceptions import InvalidMemory, InvalidSessionId, InvalidValue
from persistent_memory.models import LongTermMemory
from persistent_memory.validation import NUL_ESCAPE, encode_value, validate_session_id

TYPES = tuple(LongTermMemory.Type.values)
SOURCES = tuple(LongTermMemory.Source.values)

#: The fields of a memory's dict, in order.
FIELDS = (
    "id",
    "owner",
    "session_id",
    "type",
    "key",
    "content",
    "metadata",
    "source",
    "source_messages",
    "said_at",
    "happened_at",
    "created_at",
    "updated_at",
    "expires_at",
    "access_count",
    "last_accessed_at",
    "tokens",
    "history",
    "valid_until",
    "superseded_by",
)
#: The most entries a memory's history keeps (the oldest go first).
MAX_HISTORY = 10

_SPACES = re.compile(r"\s+")
#: A memory's key: the store's key characters and ``:``, which namespaces keys
#: ("user:prefs.theme"). Memory keys live only in the database, so the Redis layout's
#: reasons to refuse ``:`` (it separates the parts of a key name) do not apply.
KEY_PATTERN = re.compile(r"[A-Za-z0-9_.:-]{1,256}")
_KEY_UNSAFE = re.compile(r"[^a-z0-9]+")
_MAX_SOURCE_MESSAGES = 100


def normalize_content(content: str) -> str:
    """Whitespace collapsed, ends trimmed: what is stored and compared."""
    return _SPACES.sub(" ", content).strip()


def derive_key(type_: str, content: str) -> str:
    """A stable key for content without one: its type, a readable slug and a digest of
    the case-folded text, so the same statement written twice is one memory."""
    folded = normalize_content(content).casefold().rstrip(".!")
    slug = _KEY_UNSAFE.sub("-", folded).strip("-")[:40].strip("-") or "memory"
    digest = hashlib.sha256(folded.encode()).hexdigest()[:12]
    return f"{type_}.{slug}.{digest}"


def validate_content(content: Any) -> str:
    """Non-empty text within MEMORY_MAX_CONTENT_CHARS, no NUL (PostgreSQL text refuses it)
    and no lone surrogate."""
    if not isinstance(content, str):
        raise InvalidMemory("Invalid content: must be a string.")
    content = normalize_content(content)
    if not content:
        raise InvalidMemory("Invalid content: must not be empty.")
    limit = memory_settings.MEMORY_MAX_CONTENT_CHARS
    if len(content) > limit:
        raise InvalidMemory(
            f"Invalid content: {len(content)} characters is over MEMORY_MAX_CONTENT_CHARS ({limit})."
        )
    if "\x00" in content:
        raise InvalidMemory("Invalid content: U+0000 cannot be stored.")
    try:
        content.encode()
    except UnicodeEncodeError:
        raise InvalidMemory("Invalid content: holds a lone surrogate (not a character).") from None
    return content


def validate_choice(value: Any, *, name: str, choices: tuple[str, ...]) -> str:
    """One of ``choices``; :class:`InvalidMemory` otherwise."""
    if value not in choices:
        raise InvalidMemory(f"Invalid {name} {value!r}: use one of {', '.join(choices)}.")
    return value


def validate_metadata(metadata: Any) -> dict[str, Any]:
    """A JSON object within MEMORY_MAX_METADATA_BYTES and MAX_JSON_DEPTH (the store's rules),
    without U+0000 (PostgreSQL's jsonb refuses it)."""
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise InvalidMemory("Invalid metadata: must be a JSON object.")
    try:
        text = encode_value(
            metadata,
            max_bytes=memory_settings.MEMORY_MAX_METADATA_BYTES,
            max_depth=memory_settings.MAX_JSON_DEPTH,
        )
    except InvalidValue as exc:
        raise InvalidMemory(str(exc).replace("Invalid value", "Invalid metadata")) from None
    if NUL_ESCAPE.search(text):
        raise InvalidMemory("Invalid metadata: U+0000 cannot be stored.")
    return metadata


def validate_source_messages(ids: Any) -> list[str]:
    """At most 100 message ids (strings of at most 128 characters)."""
    ids = list(ids or ())
    if len(ids) > _MAX_SOURCE_MESSAGES or not all(
        isinstance(item, str) and 0 < len(item) <= 128 for item in ids
    ):
        raise InvalidMemory("Invalid source_messages: at most 100 message ids of 1-128 characters.")
    return ids


def validate_memory_key(key: Any) -> str:
    """``key`` if it is 1-256 of ``[A-Za-z0-9_.:-]``, else :class:`InvalidMemory`."""
    if not isinstance(key, str) or not KEY_PATTERN.fullmatch(key):
        raise InvalidMemory(
            f"Invalid key {key!r}: use 1-256 characters of letters, digits, '-', '_', '.' or ':'."
        )
    return key


def validate_memory_session(session_id: Any) -> str:
    """``""`` for none, else the store's session id rules."""
    if session_id in (None, ""):
        return ""
    try:
        return validate_session_id(session_id)
    except InvalidSessionId as exc:
        raise InvalidMemory(str(exc)) from None


def validate_moment(value: Any, *, name: str) -> datetime | None:
    """An aware datetime (naive ones are taken as UTC) or None."""
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise InvalidMemory(f"Invalid {name}: must be a datetime.")
    return value.replace(tzinfo=UTC) if timezone.is_naive(value) else value


def validate_expires_at(expires_at: Any) -> datetime | None:
    """An aware datetime (naive ones are taken as UTC) or None."""
    return validate_moment(expires_at, name="expires_at")


def validate_said_at(said_at: Any) -> datetime | None:
    """When what a memory says was said: an aware datetime (naive: UTC) or None."""
    return validate_moment(said_at, name="said_at")


def validate_happened_at(happened_at: Any) -> datetime | None:
    """When what a memory describes happened: an aware datetime (naive: UTC) or None."""
    return validate_moment(happened_at, name="happened_at")


def as_dict(memory: LongTermMemory) -> dict[str, Any]:
    """A memory's public form: times are aware datetimes (the API writes ISO 8601);
    ``superseded_by`` is the id of the current memory (None: this one is current)."""
    return {name: memory.serializable_value(name) for name in FIELDS}


def with_history(history: list[dict[str, Any]], memory: LongTermMemory, reason: str) -> list[dict[str, Any]]:
    """``history`` with what ``memory`` says now appended (``reason``: what replaced it)."""
    entry = {"content": memory.content, "key": memory.key, "at": timezone.now().isoformat(), "reason": reason}
    return [*(history or []), entry][-MAX_HISTORY:]


def vector_fields(vector: list[float] | None, model: str) -> dict[str, Any]:
    """A memory's vector fields for ``vector`` made by ``model`` (None: no vector)."""
    if not vector:
        return {"embedding": None, "embedding_f32": None, "embedding_model": "", "embedding_dimensions": None}
    return {
        "embedding": vector,
        "embedding_f32": array("f", vector).tobytes(),
        "embedding_model": model,
        "embedding_dimensions": len(vector),
    }
