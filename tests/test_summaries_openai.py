"""The OpenAI-compatible summarizer with the real ``openai`` client against a local server
that speaks the chat-completions protocol (tests/chat_server.py stands in for the
provider): what it sends, what it takes back, timeouts, 429 and 500 answers (never
retried by the client: the summarizers' health decides), empty answers, the API key
kept out of logs and records, and the README's settings example."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from persistent_memory.conversations.chat_completions import DEFAULT_PROMPT, ChatCompletionsSummarizer
from persistent_memory.conversations.summarizers import SummarizerFailed
from tests import readme_blocks
from tests.chat import assistant, calling, result, user
from tests.chat_server import HANG, Reply, chat_server

SECRET = "sk-test-not-a-real-key-7f3a"
PATH = "persistent_memory.conversations.chat_completions.ChatCompletionsSummarizer"


@pytest.fixture
def api_key(monkeypatch):
    monkeypatch.setenv("PM_TEST_LLM_KEY", SECRET)
    return "PM_TEST_LLM_KEY"


def summarizer(server, api_key, **options: Any) -> ChatCompletionsSummarizer:
    return ChatCompletionsSummarizer(
        **{"base_url": server.url, "model": "small-model", "api_key_env": api_key, "timeout": 10} | options
    )


MESSAGES = [
    user("Weather in Paris?"),
    calling("c1")
    | {
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
            }
        ]
    },
    result("c1", "18 C, sunny"),
    assistant("Sunny, 18 C."),
]


def test_it_sends_the_prompt_the_previous_summary_and_a_transcript(server, api_key):
    server.replies = [Reply("The user asked about the weather in Paris: sunny, 18 C.\n")]
    text = summarizer(server, api_key).summarize("The user is planning a trip.", MESSAGES)
    assert text == "The user asked about the weather in Paris: sunny, 18 C."
    [request] = server.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["authorization"] == f"Bearer {SECRET}"
    body = request["body"]
    assert body["model"] == "small-model"
    system, prompt = body["messages"]
    assert system == {"role": "system", "content": DEFAULT_PROMPT.replace("{max_tokens}", "1000")}
    assert prompt["role"] == "user"
    assert prompt["content"] == (
        "Summary so far:\nThe user is planning a trip.\n\nTurns that follow it:\n"
        "user: Weather in Paris?\n"
        'assistant called weather({"city": "Paris"})\n'
        "tool weather: 18 C, sunny\n"
        "assistant: Sunny, 18 C."
    )
    assert "max_tokens" not in body and "temperature" not in body


def test_options_prompt_output_tokens_and_temperature(server, api_key, settings):
    settings.PERSISTENT_MEMORY = {"SUMMARY_MAX_TOKENS": 321}
    custom = summarizer(
        server, api_key, prompt="Summarize in {max_tokens} tokens.", max_output_tokens=50, temperature=0
    )
    custom.summarize(None, [user("Hi")])
    body = server.requests[0]["body"]
    assert body["messages"][0]["content"] == "Summarize in 321 tokens."
    assert "Summary so far:\n(none yet)" in body["messages"][1]["content"]
    assert (body["max_tokens"], body["temperature"]) == (50, 0)


def test_a_timeout_fails_at_once_without_a_retry(server, api_key):
    server.replies = [Reply(delay=HANG)]
    with pytest.raises(SummarizerFailed, match="APITimeoutError"):  # not waiting for the reply
        summarizer(server, api_key, timeout=0.3).summarize(None, MESSAGES)
    assert len(server.requests) == 1  # and not asking again


@pytest.mark.parametrize(
    ("status", "error"), [(429, "RateLimitError"), (500, "InternalServerError"), (503, "InternalServerError")]
)
def test_error_answers_fail_without_a_retry(server, api_key, status, error):
    server.replies = [Reply(status=status)]
    with pytest.raises(SummarizerFailed, match=error) as failed:
        summarizer(server, api_key).summarize(None, MESSAGES)
    assert str(status) in str(failed.value)
    assert len(server.requests) == 1  # max_retries=0: backoff is the health's job


@pytest.mark.parametrize("reply", [Reply(""), Reply("  \n "), Reply(None), Reply(no_choices=True)])
def test_an_empty_answer_is_a_failure(server, api_key, reply):
    server.replies = [reply]
    with pytest.raises(SummarizerFailed, match="no summary"):
        summarizer(server, api_key).summarize(None, MESSAGES)


def test_an_unreachable_endpoint_is_a_failure(api_key):
    with chat_server() as gone:
        url = gone.url
    with pytest.raises(SummarizerFailed, match="APIConnectionError"):
        ChatCompletionsSummarizer(base_url=url, model="m", api_key_env=api_key, timeout=1).summarize(
            None, MESSAGES
        )


def test_the_key_comes_from_the_environment_only(server, monkeypatch):
    monkeypatch.delenv("PM_TEST_MISSING_KEY", raising=False)
    with pytest.raises(ImproperlyConfigured, match="PM_TEST_MISSING_KEY"):
        ChatCompletionsSummarizer(base_url=server.url, model="m", api_key_env="PM_TEST_MISSING_KEY")
    with pytest.raises(ImproperlyConfigured, match="model"):
        ChatCompletionsSummarizer(base_url=server.url, model="", api_key_env=None)
    # A local endpoint that wants no key.
    keyless = ChatCompletionsSummarizer(base_url=server.url, model="m", api_key_env=None)
    assert keyless.summarize(None, [user("Hi")]) == "A summary."


def rolling_settings(server, api_key, **extra: Any) -> dict[str, Any]:
    return {
        "CONTEXT_STRATEGY": "rolling_summary",
        "SUMMARIZER_WORKER": False,
        "SUMMARIZE_AFTER_TOKENS": 60,
        "SUMMARIZER": PATH,
        "SUMMARIZER_OPTIONS": {
            "base_url": server.url,
            "model": "small-model",
            "api_key_env": api_key,
            "timeout": 3,  # a success within it on any machine; a timeout test waits for it
        },
        **extra,
    }


def chat(store, turns: int) -> None:
    for turn in range(turns):
        store.add_messages("s", [user(f"Question {turn}. More."), assistant(f"Answer {turn}. Yes.")])


def test_through_the_worker_failures_walk_the_health_and_the_key_never_shows(
    configure, server, api_key, caplog
):
    store = configure(**rolling_settings(server, api_key, SUMMARIZER_BACKOFF_SECONDS=0.05))
    chat(store, 6)
    worker = store.summarizer_worker
    server.replies = [
        Reply(status=429),
        Reply(status=500),
        Reply(delay=HANG),
        Reply("They talked about six things."),
    ]
    states = []
    with caplog.at_level(logging.DEBUG):
        for _ in range(3):
            time.sleep(max(0.0, worker.health.wait_seconds()))  # the backoff: 0.05 s, then 0.1 s
            assert worker.run_once().failed == 1
            states.append(worker.health.state)
    assert states == ["retry", "retry", "degraded"]
    assert worker.health.wait_seconds() > 200  # SUMMARIZER_DEGRADED_SECONDS: 300 by default
    assert len(server.requests) == 3  # one each: the client never retries
    record = worker.health.record()
    assert "APITimeoutError" in record["last_error"]
    assert SECRET not in caplog.text and SECRET not in repr(record) and SECRET not in repr(worker.summarizer)
    # After the degraded wait the endpoint answers: the summary is the model's text.
    worker.health.reset()
    worker.run_once()
    context = store.get_context("s")
    assert context["summary"] == "They talked about six things." and context["summary_state"] == "healthy"


def readme_settings() -> str:
    """The docs' settings block ``<!-- example: summarizer-settings -->``."""
    return readme_blocks.example("summarizer-settings")


def test_the_readme_settings_summarize_through_an_openai_compatible_endpoint(configure, server, monkeypatch):
    namespace: dict[str, Any] = {}
    exec(readme_settings(), namespace)  # noqa: S102 (the README's own settings example)
    conf = namespace["PERSISTENT_MEMORY"]
    options = conf["SUMMARIZER_OPTIONS"]
    assert options["base_url"] == "https://api.openai.com/v1" and options["api_key_env"] == "OPENAI_API_KEY"
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    conf["SUMMARIZER_OPTIONS"] = {**options, "base_url": server.url}  # the provider, stood in for
    server.replies = [Reply("The user compared twenty cities; Lyon was chosen.")]
    store = configure(**conf)
    worker = store.summarizer_worker
    assert worker.running  # the README's settings keep the worker thread
    worker.interval = 0.05
    words = " ".join(f"word{i}" for i in range(60))
    for turn in range(20):
        store.add_messages("s", [user(f"City {turn}? {words}"), assistant(f"City {turn} is fine. {words}")])
    deadline = time.monotonic() + 60
    while store.get_context("s")["summary"] is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    context = store.get_context("s")
    assert context["summary"] == "The user compared twenty cities; Lyon was chosen."
    assert server.requests[0]["body"]["model"] == "gpt-4o-mini"
    assert server.requests[0]["headers"]["authorization"] == f"Bearer {SECRET}"
    # The pending zone after the anchor: at least half of SUMMARIZE_AFTER_TOKENS.
    source = store.backend.summary_source("s", "default")
    assert sum(int(text.split('"tokens": ')[1].split(",")[0]) for text in source.messages) >= 1500
