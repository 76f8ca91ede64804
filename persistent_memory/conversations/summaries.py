"""Rolling summaries: what a window with a summary holds, and how a summary is fitted.

With ``strategy="rolling_summary"`` a window is the current thread's summary (of the
thread up to the summary's *anchor*; a conversation keeps one per branch, and the
thread's is the one whose anchor is deepest on it), then the pinned system messages and
the newest whole turn groups after the anchor that fit. A message is either covered by a
committed summary or still stored and eligible for the window: with a summarizer
configured, trimming removes only covered messages (the backends enforce it).

A summary is sent as one system message, so it costs what one costs (see
:mod:`.tokens`). When summary and messages do not fit ``max_tokens``, ``overflow``
decides: ``"truncate_oldest"`` drops the oldest pending groups first (the backend
reserves the summary's tokens) and shortens the summary only when it alone is over;
``"truncate_summary"`` keeps the messages and shortens the summary to what is left;
``"error"`` raises :class:`~persistent_memory.exceptions.ContextOverflow`.
"""

from __future__ import annotations

from typing import Any

from persistent_memory.backends.conversations import WindowTexts
from persistent_memory.chat.tokens import MESSAGE_OVERHEAD, text_counter
from persistent_memory.exceptions import ContextOverflow

TRUNCATION, ROLLING = "truncation", "rolling_summary"
STRATEGIES = (TRUNCATION, ROLLING)
OVERFLOWS = ("truncate_oldest", "truncate_summary", "error")
#: The summarizers' health (seed 003's states): see persistent_memory.conversations.health.
HEALTH_STATES = ("healthy", "retry", "degraded", "recovering")
#: What a shortened summary ends with.
ELLIPSIS = " …"


def summary_tokens(text: str, tokenizer: str) -> int:
    """What a summary costs in a window: one system message holding ``text``."""
    return MESSAGE_OVERHEAD + text_counter(tokenizer)(text)


def fit_summary(text: str, max_tokens: int, tokenizer: str) -> tuple[str | None, int]:
    """``text`` shortened (at a word, ending with an ellipsis) to cost at most ``max_tokens``;
    (None, 0) when not even a word fits. Keeps its start: a rolling summary reads oldest
    first, and its newest part is the most likely to be repeated by the messages after it."""
    tokens = summary_tokens(text, tokenizer)
    if tokens <= max_tokens:
        return text, tokens
    low, high = 0, len(text)  # the longest prefix that fits, by bisection on characters
    while low < high:
        middle = (low + high + 1) // 2
        if summary_tokens(_cut(text, middle), tokenizer) <= max_tokens:
            low = middle
        else:
            high = middle - 1
    if low == 0:
        return None, 0
    shortened = _cut(text, low)
    return shortened, summary_tokens(shortened, tokenizer)


def _cut(text: str, length: int) -> str:
    prefix = text[:length]
    space = prefix.rfind(" ")
    if 0 < space < length and length < len(text):
        prefix = prefix[:space]
    return prefix.rstrip() + ELLIPSIS


def rolling_context(
    conversation: str,
    window: WindowTexts,
    messages: list[dict[str, Any]],
    *,
    max_tokens: int | None,
    overflow: str,
    tokenizer: str,
) -> dict[str, Any]:
    """A rolling window as ``get_context`` answers it, the summary fitted to the budget."""
    summary, tokens, truncated = window.summary, window.summary_tokens, window.truncated
    if summary is not None and max_tokens is not None:
        room = max_tokens - window.tokens
        if tokens > room:
            if overflow == "error":
                raise ContextOverflow(
                    f"The summary ({tokens} tokens) and the messages after it ({window.tokens}) "
                    f"do not fit max_tokens={max_tokens} (CONTEXT_OVERFLOW is 'error')."
                )
            summary, tokens = fit_summary(summary, room, tokenizer)
            truncated = True
    if overflow == "error" and window.truncated:
        raise ContextOverflow(
            f"The messages after the summary do not fit max_tokens={max_tokens} and the message "
            "budget (CONTEXT_OVERFLOW is 'error'); a summarizer has not caught up with them yet."
        )
    if summary is None:
        tokens = 0
    return {
        "conversation": conversation,
        "summary": summary,
        "messages": messages,
        "tokens": window.tokens + tokens,
        "truncated": truncated,
        "summary_state": window.summary_state,
    }
