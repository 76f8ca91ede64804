"""The extractive summarizer: no model, deterministic, the default with ``rolling_summary``.

A summary is lines, oldest first. Folding messages into it keeps:

* every line of the previous summary, as it was;
* one line per message, in order: ``User: <first sentence>`` and ``Assistant: <first
  sentence>`` (of the message's text: content parts' texts joined, other parts as
  ``[image_url]``...), ``Assistant called <function>(<arguments>)`` for each tool call,
  and ``<function> returned: <first sentence>`` for each tool result (``A tool`` when
  its call is not among the messages); a message without text gives no line, and
  ``system`` messages none (they are pinned in every window, never summarized);
* a first sentence is the text up to the first ``.``, ``!`` or ``?`` followed by a space,
  or its first line, whitespace collapsed, at most ``sentence_chars`` characters (then
  cut with "…"); arguments at most ``arguments_chars``.

Then, while the summary costs more than ``max_tokens`` (``SUMMARY_MAX_TOKENS``, as
:func:`~persistent_memory.conversations.summaries.summary_tokens` counts), its oldest
line goes: the newest turns are what the messages after the summary continue from. A
single line still over budget is shortened by the summarizing step's ``fit_summary``.
The same previous summary and messages always give the same summary.
"""

from __future__ import annotations

import re
from typing import Any

from persistent_memory.chat.tokens import text_counter
from persistent_memory.conversations.summaries import summary_tokens
from persistent_memory.conversations.summarizers import text_of

_SENTENCE_END = re.compile(r"[.!?](?=\s|$)")
_SPACES = re.compile(r"\s+")


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(1, limit - 1)].rstrip() + "…"


def first_sentence(text: str, limit: int = 200) -> str:
    """The first sentence of ``text`` (see the module's docstring), "" for no text."""
    line = next((line for line in text.strip().splitlines() if line.strip()), "")
    line = _SPACES.sub(" ", line).strip()
    end = _SENTENCE_END.search(line)
    return _shorten(line[: end.end()] if end else line, limit)


class ExtractiveSummarizer:
    """Keeps the first sentence of each turn, the tool calls and their results' first
    sentences, and drops the oldest lines beyond the budget (see the module's docstring)."""

    def __init__(
        self,
        *,
        max_tokens: int | None = None,
        tokenizer: str | None = None,
        sentence_chars: int = 200,
        arguments_chars: int = 100,
    ) -> None:
        from persistent_memory.conf import memory_settings

        self.max_tokens = memory_settings.SUMMARY_MAX_TOKENS if max_tokens is None else max_tokens
        self.tokenizer = memory_settings.TOKENIZER if tokenizer is None else tokenizer
        self.sentence_chars = sentence_chars
        self.arguments_chars = arguments_chars

    def lines(self, messages: list[dict[str, Any]]) -> list[str]:
        """The lines ``messages`` add to a summary."""
        lines: list[str] = []
        functions: dict[str, str] = {}  # tool call id -> function name
        for message in messages:
            role = message.get("role")
            sentence = first_sentence(text_of(message.get("content")), self.sentence_chars)
            if role == "user" and sentence:
                lines.append(f"User: {sentence}")
            elif role == "assistant":
                if sentence:
                    lines.append(f"Assistant: {sentence}")
                for call in message.get("tool_calls") or ():
                    function = call["function"]
                    functions[call["id"]] = function["name"]
                    arguments = _SPACES.sub(" ", function["arguments"]).strip()
                    arguments = _shorten(arguments, self.arguments_chars)
                    lines.append(f"Assistant called {function['name']}({arguments})")
            elif role == "tool" and sentence:
                name = functions.get(message.get("tool_call_id") or "", "A tool")
                lines.append(f"{name} returned: {sentence}")
        return lines

    def summarize(self, previous_summary: str | None, messages: list[dict[str, Any]]) -> str:
        """The previous summary's lines and the messages' lines, the oldest dropped to fit."""
        old = [line for line in (previous_summary or "").splitlines() if line.strip()]
        lines = old + self.lines(messages)
        if not lines:  # messages with no text to keep (blank ones): still a summary of them
            lines = [f"{len(messages)} message{'s' if len(messages) != 1 else ''} without text."]
        return "\n".join(self._fit(lines))

    def _fit(self, lines: list[str]) -> list[str]:
        """The newest ``lines`` whose summary fits ``max_tokens`` (at least one line)."""
        if not lines or summary_tokens("\n".join(lines), self.tokenizer) <= self.max_tokens:
            return lines
        count = text_counter(self.tokenizer)
        # Estimate with each line's own count plus one for its line break, then correct
        # with the exact count of the joined text (tokens can merge across a break).
        room = self.max_tokens - summary_tokens("", self.tokenizer)
        start, used = len(lines), 0
        while start > 0 and used + count(lines[start - 1]) + 1 <= room:
            start -= 1
            used += count(lines[start]) + 1
        start = min(start, len(lines) - 1)
        while start < len(lines) - 1 and not self._fits(lines[start:]):
            start += 1
        while start > 0 and self._fits(lines[start - 1 :]):
            start -= 1
        return lines[start:]

    def _fits(self, lines: list[str]) -> bool:
        return summary_tokens("\n".join(lines), self.tokenizer) <= self.max_tokens
