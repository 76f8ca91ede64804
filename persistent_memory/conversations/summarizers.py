"""Summarizers: what turns a conversation's older turns into its rolling summary.

A summarizer is any object with ``summarize(previous_summary, messages) -> str``:
``previous_summary`` is the conversation's summary so far (None: none yet) and
``messages`` the turns to fold into it, in OpenAI's chat format, oldest first (the
pinned ``system`` messages are left out: every window sends them anyway). It returns
the new summary, which stands for everything the previous one did and for these
messages. It may take its time and may raise: the summarizing step calls it outside
any lock, in a thread of its own with ``SUMMARIZER_TIMEOUT_SECONDS``, and counts an
exception, a timeout or an empty answer as a failure (see :mod:`.health`).

``SUMMARIZER`` (an import string of a class or factory; None: the extractive one) is
built with ``SUMMARIZER_OPTIONS`` as keyword arguments:

* :class:`~persistent_memory.conversations.extractive.ExtractiveSummarizer`: no model,
  deterministic;
* :class:`~persistent_memory.conversations.chat_completions.ChatCompletionsSummarizer`:
  any OpenAI-compatible chat-completions endpoint.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

if TYPE_CHECKING:
    from persistent_memory.conf import MemorySettings

#: What ``SUMMARIZER = None`` builds.
DEFAULT_SUMMARIZER = "persistent_memory.conversations.extractive.ExtractiveSummarizer"


@runtime_checkable
class Summarizer(Protocol):
    """The one method a summarizer has."""

    def summarize(self, previous_summary: str | None, messages: list[dict[str, Any]]) -> str:
        """The new rolling summary: ``previous_summary`` with ``messages`` folded in."""
        ...


class SummarizerFailed(Exception):
    """A summarizer raised, timed out or answered something that is not a summary."""


def text_of(content: Any) -> str:
    """A chat message's content as plain text (text parts joined; other parts named)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    pieces = []
    for part in content:
        kind = part.get("type")
        pieces.append(part.get("text", "") if kind == "text" else f"[{kind}]")
    return " ".join(piece for piece in pieces if piece)


def build_summarizer(path: str | None, options: dict[str, Any] | None = None) -> Summarizer:
    """The summarizer ``path`` names (None: the extractive one), built with ``options``."""
    path = path or DEFAULT_SUMMARIZER
    try:
        factory = import_string(path)
    except ImportError as exc:
        message = f"PERSISTENT_MEMORY: SUMMARIZER {path!r} cannot be imported: {exc}"
        raise ImproperlyConfigured(message) from exc
    if not isinstance(options or {}, dict):
        raise ImproperlyConfigured("PERSISTENT_MEMORY: SUMMARIZER_OPTIONS must be a dict.")
    try:
        summarizer = factory(**(options or {}))
    except TypeError as exc:  # an option it does not take
        raise ImproperlyConfigured(
            f"PERSISTENT_MEMORY: SUMMARIZER {path!r} refuses SUMMARIZER_OPTIONS: {exc}"
        ) from exc
    if not callable(getattr(summarizer, "summarize", None)):
        raise ImproperlyConfigured(
            f"PERSISTENT_MEMORY: SUMMARIZER {path!r} built {summarizer!r}, which has no summarize() method."
        )
    return summarizer


def summarizer_from_settings(conf: MemorySettings) -> Summarizer:
    """The summarizer ``SUMMARIZER`` and ``SUMMARIZER_OPTIONS`` describe."""
    return build_summarizer(conf.SUMMARIZER, conf.SUMMARIZER_OPTIONS)
