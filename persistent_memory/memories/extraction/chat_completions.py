"""An extractor for any OpenAI-compatible chat-completions endpoint, through the
summarizer's client (:class:`~persistent_memory.conversations.chat_completions.ChatCompletionsClient`).

Put ``"persistent_memory.memories.extraction.chat_completions.extract"`` in
``MEMORY_EXTRACTORS``. It calls the endpoint and model of ``SUMMARIZER_OPTIONS``
(``model``, ``base_url``, ``api_key_env``, ``timeout``), with ``MEMORY_EXTRACTOR_OPTIONS``
over them (any of those, and ``prompt``, ``max_output_tokens``, ``temperature``,
``max_memories``, ``max_content_chars``), so one endpoint serves both or each has its own.

It sends the user and assistant messages as a transcript (``[id] date time name (role):
text``, the date, time and speaker's name where the message has them) and asks
for a JSON array of memories, each ``{"type", "key", "content", "messages"}``. The
answer is checked strictly before anything is proposed:

* an answer that is not a JSON array (or ``{"memories": [...]}``), one fenced code block
  around it allowed, is a failure (:class:`ExtractionFailed`: logged and counted, and
  ``memory_extract`` can try again), as is an endpoint's error, timeout or absence;
* an item that is not an object of exactly those fields, with a ``type`` among the
  memory types, a ``key`` within the memory key rules (at most :data:`MAX_KEY_CHARS`,
  case-folded), a ``content`` of at most ``max_content_chars`` (never cut: dropped) and
  ``messages`` a list of strings, is dropped and logged; ids that were not sent are left
  out (none left: every message sent is the source); beyond ``max_memories`` items the
  rest are dropped. Of items with the same key the last wins.

What is logged names the model and the reason, never the API key nor the messages.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
from datetime import UTC, datetime
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from persistent_memory.conf import memory_settings
from persistent_memory.conversations.chat_completions import (
    CONNECTION_OPTIONS,
    ChatCompletionsClient,
    CompletionFailed,
)
from persistent_memory.conversations.summarizers import text_of
from persistent_memory.exceptions import InvalidMemory
from persistent_memory.memories import records
from persistent_memory.memories.extraction.candidates import Candidate, ExtractionFailed

logger = logging.getLogger(__name__)

#: The longest key taken from an answer.
MAX_KEY_CHARS = 120
#: The most source message ids a memory keeps (the service's limit): the newest.
MAX_SOURCES = 100
#: The fields of an item of the answer (``messages`` may be left out).
ITEM_FIELDS = frozenset(("type", "key", "content", "messages"))
SETTING = "MEMORY_EXTRACTOR_OPTIONS"

DEFAULT_PROMPT = (
    "You extract long-term memories about the user from a conversation between a user and an "
    "assistant (or between two people): lasting facts about them, their preferences, habits, "
    "decisions and what happened to them, worth knowing in later conversations. Each message is "
    'shown as "[id] date time name (role): text", the date, time and name where known. Answer '
    "with a JSON array only, no other text: one object per memory with exactly these fields:\n"
    '- "type": one of {types} (factual: a fact or preference; episodic: an event or decision; '
    "procedural: a habit or how the user wants things done; semantic: general knowledge);\n"
    '- "key": a short stable identifier of lowercase words joined by dots or hyphens, the '
    "category, the person's name where the transcript gives one, then the subject (e.g. "
    '"preference.tea", "fact.caroline.home-city"), the same for the same '
    "subject so that a later statement replaces an earlier one;\n"
    '- "content": the memory in one short self-contained sentence of at most {max_chars} '
    "characters that names who it is about (by name where the transcript gives one) and, for "
    'an event, when it happened as a date worked out from the message\'s date ("last year" '
    "said on 2023-05-08 is 2022);\n"
    '- "messages": the ids of the messages it comes from.\n'
    "Keep only what a person states as true about themselves: leave out questions, "
    "hypotheticals, unclear negations, and what an AI assistant says unless the user confirms it. "
    "Answer [] when there is nothing to remember."
)


def _said(message: dict[str, Any]) -> str:
    """``2023-05-08 14:03 Caroline (user)``: when and by whom, as far as the message says."""
    role, name, at = message["role"], message.get("name"), message.get("created_at")
    who = f"{name} ({role})" if isinstance(name, str) and name.strip() else role
    if isinstance(at, int | float) and not isinstance(at, bool):
        return f"{datetime.fromtimestamp(at, tz=UTC):%Y-%m-%d %H:%M} {who}"
    return who


_FENCE = re.compile(r"^```[A-Za-z]*\s*\n(?P<body>.*)\n\s*```$", re.DOTALL)


class ChatCompletionsExtractor:
    """Finds memories through a chat-completions endpoint (see the module's docstring)."""

    def __init__(
        self,
        *,
        model: str,
        base_url: str | None = None,
        api_key_env: str | None = "OPENAI_API_KEY",
        timeout: float | None = None,
        prompt: str = DEFAULT_PROMPT,
        max_output_tokens: int | None = None,
        temperature: float | None = None,
        max_memories: int = 20,
        max_content_chars: int = 500,
    ) -> None:
        self.chat = ChatCompletionsClient(
            model=model, base_url=base_url, api_key_env=api_key_env, timeout=timeout, setting=SETTING
        )
        self.model = model
        self.max_memories = max_memories
        self.max_content_chars = min(max_content_chars, memory_settings.MEMORY_MAX_CONTENT_CHARS)
        self.prompt = prompt.replace("{types}", ", ".join(records.TYPES)).replace(
            "{max_chars}", str(self.max_content_chars)
        )
        self.max_output_tokens = max_output_tokens
        self.temperature = temperature

    def __repr__(self) -> str:
        return f"<ChatCompletionsExtractor model={self.model!r} base_url={self.chat.base_url!r}>"

    @staticmethod
    def transcript(messages: list[dict[str, Any]]) -> tuple[str, list[str]]:
        """The user and assistant messages with text, one line each (with its time and its
        speaker's name where the message has them), and their ids."""
        lines, ids = [], []
        for message in messages:
            if message.get("role") not in ("user", "assistant"):
                continue
            text = " ".join(text_of(message.get("content")).split())
            if not text:
                continue
            message_id = message.get("id")
            if isinstance(message_id, str) and message_id:
                ids.append(message_id)
            lines.append(f"[{message_id or '-'}] {_said(message)}: {text}")
        return "\n".join(lines), ids

    def request(self, transcript: str) -> list[dict[str, str]]:
        """The chat messages sent to the endpoint."""
        return [{"role": "system", "content": self.prompt}, {"role": "user", "content": transcript}]

    def __call__(self, messages: list[dict[str, Any]]) -> list[Candidate]:
        """The memories the endpoint finds in ``messages``; :class:`ExtractionFailed` when it
        answers an error or something that is not a list of memories."""
        transcript, ids = self.transcript(messages)
        if not transcript:
            return []  # nothing to ask about: no call
        try:
            text = self.chat.complete(
                self.request(transcript),
                max_output_tokens=self.max_output_tokens,
                temperature=self.temperature,
            )
        except CompletionFailed as exc:
            raise ExtractionFailed(f"model {self.model!r}: {exc}") from exc
        return self.parse(text, ids)

    def parse(self, text: str | None, ids: list[str]) -> list[Candidate]:
        """The candidates in the answer ``text`` (see the module's docstring for the rules)."""
        items = self._items(text)
        if len(items) > self.max_memories:
            self._drop(f"{len(items) - self.max_memories} items beyond max_memories ({self.max_memories})")
            items = items[: self.max_memories]
        by_key: dict[str, Candidate] = {}
        for index, item in enumerate(items):
            try:
                candidate = self._candidate(item, ids)
            except ValueError as exc:
                self._drop(f"item {index}: {exc}")
                continue
            by_key.pop(candidate.key, None)
            by_key[candidate.key] = candidate
        return list(by_key.values())

    def _items(self, text: str | None) -> list[Any]:
        if text is None or not text.strip():
            raise ExtractionFailed(f"model {self.model!r} answered nothing")
        text = text.strip()
        fenced = _FENCE.match(text)
        if fenced:
            text = fenced.group("body")
        try:
            value = json.loads(text)
        except ValueError:
            raise ExtractionFailed(f"model {self.model!r} answered no JSON") from None
        if isinstance(value, dict) and set(value) == {"memories"}:
            value = value["memories"]
        if not isinstance(value, list):
            raise ExtractionFailed(f"model {self.model!r} answered JSON that is not a list of memories")
        return value

    def _candidate(self, item: Any, ids: list[str]) -> Candidate:
        """The candidate ``item`` describes; ValueError saying why not."""
        if not isinstance(item, dict):
            raise ValueError(f"not an object but {type(item).__name__}")
        unknown = sorted(set(item) - ITEM_FIELDS)
        missing = sorted({"type", "key", "content"} - set(item))
        if unknown or missing:
            raise ValueError(f"fields unknown {unknown}, missing {missing}")
        type_ = item["type"]
        if type_ not in records.TYPES:
            raise ValueError(f"unknown type {type_!r:.40}")
        key = item["key"]
        if not isinstance(key, str) or len(key) > MAX_KEY_CHARS:
            raise ValueError(f"key not a string of at most {MAX_KEY_CHARS} characters")
        try:
            key = records.validate_memory_key(key.casefold())
        except InvalidMemory:
            raise ValueError("key outside the memory key rules") from None
        content = item["content"]
        if not isinstance(content, str):
            raise ValueError("content not a string")
        content = records.normalize_content(content)
        if not content or len(content) > self.max_content_chars or "\x00" in content:
            raise ValueError(f"content empty or longer than {self.max_content_chars} characters")
        sources = item.get("messages", [])
        if not isinstance(sources, list) or not all(isinstance(i, str) for i in sources):
            raise ValueError("messages not a list of ids")
        sent = [i for i in dict.fromkeys(sources) if i in ids]
        return Candidate(key=key, type=type_, content=content, source_messages=(sent or ids)[-MAX_SOURCES:])

    def _drop(self, reason: str) -> None:
        logger.warning(
            "persistent_memory: the chat-completions extractor (model %r) dropped %s", self.model, reason
        )


def options_from_settings() -> dict[str, Any]:
    """``SUMMARIZER_OPTIONS``' endpoint and model, with ``MEMORY_EXTRACTOR_OPTIONS`` over them."""
    summarizer = memory_settings.SUMMARIZER_OPTIONS or {}
    own = memory_settings.MEMORY_EXTRACTOR_OPTIONS or {}
    if not isinstance(summarizer, dict) or not isinstance(own, dict):
        raise ImproperlyConfigured(f"PERSISTENT_MEMORY: SUMMARIZER_OPTIONS and {SETTING} must be dicts.")
    return {name: summarizer[name] for name in CONNECTION_OPTIONS if name in summarizer} | own


@functools.lru_cache(maxsize=8)
def _built(options_json: str, api_key: str | None) -> ChatCompletionsExtractor:
    # ``api_key`` is in the cache key only, so that a changed key builds a new client.
    try:
        return ChatCompletionsExtractor(**json.loads(options_json))
    except TypeError as exc:  # an option it does not take
        raise ImproperlyConfigured(f"PERSISTENT_MEMORY: {SETTING}: {exc}") from exc


def extractor_from_settings() -> ChatCompletionsExtractor:
    """The extractor the settings describe (built once per options and API key)."""
    options = options_from_settings()
    key_env = options.get("api_key_env", "OPENAI_API_KEY")
    api_key = os.environ.get(key_env) if isinstance(key_env, str) else None
    try:
        options_json = json.dumps(options, sort_keys=True)
    except TypeError as exc:
        raise ImproperlyConfigured(f"PERSISTENT_MEMORY: {SETTING} must hold JSON values: {exc}") from exc
    return _built(options_json, api_key)


def extract(messages: list[dict[str, Any]]) -> list[Candidate]:
    """A ``MEMORY_EXTRACTORS`` entry: the memories the configured endpoint finds in
    ``messages`` (see the module's docstring)."""
    return extractor_from_settings()(messages)
