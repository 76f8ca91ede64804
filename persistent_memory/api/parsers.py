"""The API's JSON parser: a body the store could not hold exactly is refused whole.

Every field of a body may end up stored (a value, an answer's text) or echoed back (the
lanes return the whole entry), so the whole body is checked here, before any view
or store call: afterwards nothing can fail on what came in. Refused, each with its
``code`` (400): text that is not JSON (``parse_error``, as DRF says), bytes that are
not the charset's or strings with a lone surrogate (``invalid_unicode``), numbers
that are not finite (``NaN``, ``Infinity``, and ``1e400``, which Python reads as
infinity: ``invalid_json``) and nesting deeper than ``MAX_JSON_DEPTH``
(``json_too_deep``). U+0000 is a character like any other and is accepted.
"""

from __future__ import annotations

import codecs
import functools
import json
import math
import re
from typing import IO, Any

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from persistent_memory.conf import memory_settings

# What a lone surrogate escape is told apart from, read left to right as JSON does: an
# escaped backslash (so "\\ud800" is text, not an escape) and a high-low escape pair.
_HARMLESS_ESCAPES = re.compile(r"\\\\|\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
# A tuple, not ``dict | list``: that would build a union object at every check.
_CONTAINERS = (dict, list)
# UTF-8 decoding never yields a surrogate; some codecs (UTF-7) do.
_SURROGATE = re.compile("[\ud800-\udfff]")


class NonFinite(ValueError):
    """A number JSON cannot carry back: NaN, an infinity, or one too large for a float."""


def _constant(name: str) -> Any:
    raise NonFinite(name)


def _finite_float(text: str) -> float:
    number = float(text)
    if math.isinf(number):
        raise NonFinite(text)
    return number


def _refuse(detail: str, code: str) -> ParseError:
    return ParseError(detail, code=code)


def _too_deep(max_depth: int) -> ParseError:
    return _refuse(f"The JSON is nested more than {max_depth} levels deep.", "json_too_deep")


def _more_brackets_than(text: str, limit: int) -> bool:
    """Whether ``text`` holds more than ``limit`` of ``[`` and ``{``: a find per bracket,
    stopping at ``limit + 1`` (``str.count`` would read a large body at a third the speed)."""
    found = 0
    for bracket in "[{":
        at = text.find(bracket)
        while at != -1:
            found += 1
            if found > limit:
                return True
            at = text.find(bracket, at + 1)
    return False


def _deeper_than(data: Any, max_depth: int) -> bool:
    """Whether parsed JSON nests more than ``max_depth`` objects and arrays, one level at a
    time (no recursion; scalars are only looked at, never visited)."""
    level = [data] if isinstance(data, _CONTAINERS) else []
    for _ in range(max_depth):
        if not level:
            return False
        level = [
            child
            for node in level
            for child in (node.values() if isinstance(node, dict) else node)
            if isinstance(child, _CONTAINERS)
        ]
    return bool(level)


def _has_lone_surrogate_escape(text: str) -> bool:
    """Whether JSON ``text`` escapes a surrogate that is not half of a pair (two C passes)."""
    return bool(_SURROGATE_ESCAPE.search(_HARMLESS_ESCAPES.sub("", text)))


def parse_json(text: str, *, max_depth: int) -> Any:
    """The JSON document ``text``, or a :class:`ParseError` with the code saying why not."""
    try:
        data = json.loads(text, parse_constant=_constant, parse_float=_finite_float)
    except NonFinite as exc:
        raise _refuse(f"JSON numbers must be finite: {str(exc)[:40]} is not.", "invalid_json") from None
    except RecursionError:
        raise _too_deep(max_depth) from None
    except ValueError as exc:
        raise _refuse(f"JSON parse error - {exc}", "parse_error") from None
    # A document cannot nest deeper than it has brackets: most bodies skip the walk.
    if _more_brackets_than(text, max_depth) and _deeper_than(data, max_depth):
        raise _too_deep(max_depth)
    # A single character is found at memchr speed; longer needles cost more.
    if "\\" in text and ("\\ud" in text or "\\uD" in text) and _has_lone_surrogate_escape(text):
        raise _refuse(
            "A JSON string holds a lone surrogate (\\ud800-\\udfff), which is no character.",
            "invalid_unicode",
        )
    return data


@functools.lru_cache(maxsize=64)
def _text_codec(encoding: str) -> str | None:
    """The codec's name for a text ``encoding``, None for an unknown one or a
    bytes-to-bytes codec (bz2_codec would inflate a small body); once per charset."""
    try:
        "".encode(encoding)
    except (LookupError, UnicodeError):
        return None
    return codecs.lookup(encoding).name


class MemoryJSONParser(JSONParser):
    """DRF's ``JSONParser`` that refuses what the store could not hold (see the module)."""

    def parse(
        self, stream: IO[bytes] | None, media_type: str | None = None, parser_context: Any = None
    ) -> Any:
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        codec = _text_codec(encoding)
        if codec is None:
            raise ParseError(f'Unsupported charset "{encoding}" in request Content-Type header.')
        raw = stream.read() if stream is not None else b""
        try:
            text = raw.decode(encoding)
        except UnicodeDecodeError as exc:
            raise _refuse(f"The body is not valid {encoding}: {exc.reason}.", "invalid_unicode") from None
        if codec != "utf-8" and _SURROGATE.search(text):
            raise _refuse(f"The body decodes ({encoding}) to a lone surrogate.", "invalid_unicode")
        return parse_json(text, max_depth=memory_settings.MAX_JSON_DEPTH)
