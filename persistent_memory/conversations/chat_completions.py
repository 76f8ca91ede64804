"""A summarizer for any OpenAI-compatible chat-completions endpoint (OpenAI, Azure's
compatible endpoint, vLLM, Ollama, LiteLLM...), through the official ``openai`` client
(``pip install "openai>=1.40,<4"``), and that client (:class:`ChatCompletionsClient`),
which the memories' chat-completions extractor shares.

It sends two messages: ``prompt`` as the system message, and one user message holding
the previous summary and a transcript of the turns to fold in (``user: ...``,
``assistant: ...``, ``assistant called f(args)``, ``tool f: ...``), so any endpoint
takes it whatever it thinks of tool messages. The answer's text is the new summary.

The client is built with ``max_retries=0``: a failure comes back at once, and the
summarizers' health (exponential backoff, then degraded) decides when to try again.
The API key is read from the environment variable named by ``api_key_env``, never
from settings, and is never logged nor shown in the summarizer's ``repr``.
"""

from __future__ import annotations

import os
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from persistent_memory.conversations.summarizers import SummarizerFailed, text_of

#: The options that say which endpoint and model to call (``SUMMARIZER_OPTIONS``' keys).
CONNECTION_OPTIONS = ("model", "base_url", "api_key_env", "timeout")

DEFAULT_PROMPT = (
    "You maintain the rolling summary of a conversation between a user and an assistant. "
    "You get the summary so far (it may be empty) and the turns that follow it. Answer with the "
    "new summary only: concise, in plain sentences, covering the earlier summary and the new "
    "turns. Keep facts, names and numbers, decisions made, the user's preferences and "
    "constraints, tool results that matter, and questions still open; drop small talk and "
    "repetition. Stay within about {max_tokens} tokens."
)


class CompletionFailed(Exception):
    """The endpoint answered an error, timed out or could not be reached."""


class ChatCompletionsClient:
    """One endpoint and model, through the ``openai`` client (see the module's docstring).

    ``model`` (required), ``base_url`` (None: the client's default, ``OPENAI_BASE_URL``
    or OpenAI's), ``api_key_env`` (the *name* of the environment variable holding the
    key; None for endpoints that want none), ``timeout`` (seconds per request; None:
    ``SUMMARIZER_TIMEOUT_SECONDS``). ``setting`` names the options in error messages.
    """

    def __init__(
        self,
        *,
        model: str,
        base_url: str | None = None,
        api_key_env: str | None = "OPENAI_API_KEY",
        timeout: float | None = None,
        setting: str = "SUMMARIZER_OPTIONS",
    ) -> None:
        try:
            import openai
        except ImportError as exc:
            raise ImproperlyConfigured(
                f"PERSISTENT_MEMORY: the chat-completions endpoint of {setting} needs the openai "
                'package: pip install "openai>=1.40,<4"'
            ) from exc
        from persistent_memory.conf import memory_settings

        if not isinstance(model, str) or not model:
            raise ImproperlyConfigured(f"PERSISTENT_MEMORY: {setting}['model'] must name a model.")
        if api_key_env is None:
            api_key = "unused"  # the client insists on one; a local endpoint ignores it
        else:
            api_key = os.environ.get(api_key_env, "")
            if not api_key:
                raise ImproperlyConfigured(
                    f"PERSISTENT_MEMORY: the environment variable {api_key_env!r} ({setting}"
                    "['api_key_env']) holds no API key."
                )
        self.model = model
        self.base_url = base_url
        self.api_key_env = api_key_env
        self.timeout = float(memory_settings.SUMMARIZER_TIMEOUT_SECONDS if timeout is None else timeout)
        self._errors: tuple[type[Exception], ...] = (openai.OpenAIError,)
        self.client = openai.OpenAI(base_url=base_url, api_key=api_key, timeout=self.timeout, max_retries=0)

    def __repr__(self) -> str:
        return f"<ChatCompletionsClient model={self.model!r} base_url={self.base_url!r}>"

    def complete(
        self,
        messages: list[dict[str, str]],
        *,
        max_output_tokens: int | None = None,
        temperature: float | None = None,
    ) -> str | None:
        """The text of the endpoint's first choice (None: no text); :class:`CompletionFailed`
        for an error, a timeout or an unreachable endpoint (never retried here)."""
        extra: dict[str, Any] = {}
        if max_output_tokens is not None:
            extra["max_tokens"] = max_output_tokens
        if temperature is not None:
            extra["temperature"] = temperature
        try:
            completion = self.client.chat.completions.create(model=self.model, messages=messages, **extra)
        except self._errors as exc:
            raise CompletionFailed(f"{type(exc).__name__}: {exc}") from exc
        choices = getattr(completion, "choices", None) or []
        text = choices[0].message.content if choices and choices[0].message else None
        return text if isinstance(text, str) else None


class ChatCompletionsSummarizer:
    """Summarizes through ``POST {base_url}/chat/completions`` (see the module's docstring).

    Options (``SUMMARIZER_OPTIONS``): ``model`` (required), ``base_url`` (None: the
    client's default, ``OPENAI_BASE_URL`` or OpenAI's), ``api_key_env`` (the *name* of
    the environment variable holding the key; None for endpoints that want none),
    ``timeout`` (seconds per request; None: ``SUMMARIZER_TIMEOUT_SECONDS``), ``prompt``
    (the system message; ``{max_tokens}`` in it becomes ``SUMMARY_MAX_TOKENS``),
    ``max_output_tokens`` (sent as ``max_tokens``; None: not sent) and ``temperature``
    (None: not sent).
    """

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
    ) -> None:
        from persistent_memory.conf import memory_settings

        self.chat = ChatCompletionsClient(
            model=model, base_url=base_url, api_key_env=api_key_env, timeout=timeout
        )
        self.model, self.base_url, self.api_key_env = model, base_url, api_key_env
        self.timeout = self.chat.timeout
        self.prompt = prompt.replace("{max_tokens}", str(memory_settings.SUMMARY_MAX_TOKENS))
        self.max_output_tokens = max_output_tokens
        self.temperature = temperature

    def __repr__(self) -> str:
        return f"<ChatCompletionsSummarizer model={self.model!r} base_url={self.base_url!r}>"

    @staticmethod
    def transcript(messages: list[dict[str, Any]]) -> str:
        """The turns as lines of text, one or more per message."""
        lines: list[str] = []
        functions: dict[str, str] = {}
        for message in messages:
            role, text = message.get("role", ""), text_of(message.get("content")).strip()
            if role == "tool":
                name = functions.get(message.get("tool_call_id") or "", "a tool")
                lines.append(f"tool {name}: {text}")
                continue
            if text:
                lines.append(f"{role}: {text}")
            for call in message.get("tool_calls") or ():
                functions[call["id"]] = call["function"]["name"]
                lines.append(f"{role} called {call['function']['name']}({call['function']['arguments']})")
        return "\n".join(lines)

    def request(self, previous_summary: str | None, messages: list[dict[str, Any]]) -> list[dict[str, str]]:
        """The chat messages sent to the endpoint."""
        content = (
            f"Summary so far:\n{previous_summary or '(none yet)'}\n\n"
            f"Turns that follow it:\n{self.transcript(messages)}"
        )
        return [{"role": "system", "content": self.prompt}, {"role": "user", "content": content}]

    def summarize(self, previous_summary: str | None, messages: list[dict[str, Any]]) -> str:
        """The endpoint's answer; :class:`SummarizerFailed` for an error or an empty answer."""
        try:
            text = self.chat.complete(
                self.request(previous_summary, messages),
                max_output_tokens=self.max_output_tokens,
                temperature=self.temperature,
            )
        except CompletionFailed as exc:
            raise SummarizerFailed(str(exc)) from exc
        if text is None or not text.strip():
            raise SummarizerFailed(f"The endpoint answered no summary (model {self.model!r}).")
        return text.strip()
