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

import json
import math
import re
from typing import IO, Any

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser

from persistent_memory.conf import memory_settings
from persistent_memory.exceptions import ValueTooDeep
from persistent_memory.validation import check_structure, has_lone_surrogate

#: Where a lone surrogate could be: an escape of one, or (from an odd codec) the code point.
_MAYBE_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]|[\ud800-\udfff]")


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
    if text.count("[") + text.count("{") > max_depth:
        try:
            check_structure(data, max_depth)
        except ValueTooDeep:
            raise _too_deep(max_depth) from None
    if _MAYBE_SURROGATE.search(text) and has_lone_surrogate(data):
        raise _refuse(
            "A JSON string holds a lone surrogate (\\ud800-\\udfff), which is no character.",
            "invalid_unicode",
        )
    return data


class MemoryJSONParser(JSONParser):
    """DRF's ``JSONParser`` that refuses what the store could not hold (see the module)."""

    def parse(
        self, stream: IO[bytes] | None, media_type: str | None = None, parser_context: Any = None
    ) -> Any:
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        try:
            # Text codecs only: a bytes-to-bytes codec (bz2_codec) would inflate a small body.
            "".encode(encoding)
        except (LookupError, UnicodeError):
            raise ParseError(f'Unsupported charset "{encoding}" in request Content-Type header.') from None
        raw = stream.read() if stream is not None else b""
        try:
            text = raw.decode(encoding)
        except UnicodeDecodeError as exc:
            raise _refuse(f"The body is not valid {encoding}: {exc.reason}.", "invalid_unicode") from None
        return parse_json(text, max_depth=memory_settings.MAX_JSON_DEPTH)
