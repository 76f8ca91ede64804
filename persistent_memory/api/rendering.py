"""The lanes' answers as JSON bytes, written once.

Rendered as DRF's ``JSONRenderer`` writes them (the project's ``UNICODE_JSON``,
``COMPACT_JSON`` and ``STRICT_JSON``, U+2028 and U+2029 escaped), with one difference
that saves the work of a window: chat messages that reach the answer as
:class:`~persistent_memory.conversations.store.ChatJSON` (the stored texts' own JSON, cut
out of what the backend answered) are written as they are, never parsed and encoded
again. They are valid JSON of the same messages, written with ``", "`` and ``": "``
between items and non-ASCII characters escaped, as the store keeps them.
"""

from __future__ import annotations

import json
import secrets
from typing import Any

from rest_framework.compat import LONG_SEPARATORS, SHORT_SEPARATORS
from rest_framework.renderers import JSONRenderer
from rest_framework.utils.encoders import JSONEncoder

from persistent_memory.conversations.store import ChatJSON

_RENDERER = JSONRenderer()
_ENCODER = JSONEncoder()
_SEPARATORS = SHORT_SEPARATORS if _RENDERER.compact else LONG_SEPARATORS
#: What stands for a fragment while the rest is encoded: a random prefix no answer holds
#: (one that did would be found twice, and the answer rendered the slow way instead).
_MARK = "pm-fragment-" + secrets.token_hex(16) + "-"
MEDIA_TYPE = _RENDERER.media_type


def _dumps(body: Any, default: Any) -> bytes:
    text = json.dumps(
        body,
        default=default,
        ensure_ascii=_RENDERER.ensure_ascii,
        allow_nan=not _RENDERER.strict,
        separators=_SEPARATORS,
    )
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029").encode()


def _parsed(value: Any) -> Any:
    return json.loads(value) if isinstance(value, ChatJSON) else _ENCODER.default(value)


def render_json(body: Any) -> bytes:
    """``body`` as JSON bytes, :class:`ChatJSON` fragments written as they are."""
    fragments: list[bytes] = []

    def mark(value: Any) -> Any:
        if isinstance(value, ChatJSON):
            fragments.append(value)
            return f"{_MARK}{len(fragments) - 1}"
        return _ENCODER.default(value)

    rendered = _dumps(body, mark)
    if not fragments:
        return rendered
    parts = rendered.split(b'"' + _MARK.encode())
    if len(parts) != len(fragments) + 1:  # the mark in the body itself: never in practice
        return _dumps(body, _parsed)
    pieces = [parts[0]]
    for index, part in enumerate(parts[1:]):
        number, _, rest = part.partition(b'"')
        if number != str(index).encode():
            return _dumps(body, _parsed)
        pieces += (fragments[index], rest)
    return b"".join(pieces)


def parsed(value: Any) -> Any:
    """``value`` with its :class:`ChatJSON` fragments parsed, for another renderer."""
    return json.loads(render_json(value))
