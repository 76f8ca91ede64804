"""The chat-completions extractor with the real ``openai`` client against the local
chat-completions server (tests/chat_server.py stands in for the provider): what it
sends, the strict checks of what comes back (garbage dropped and logged, never raised
past ``extract_messages``), a 500 and a timeout as logged failures, the settings it
shares with the summarizer, and the background worker on both store backends."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from persistent_memory.memories import memories_for
from persistent_memory.memories.extraction import ExtractionReport, extract_messages
from persistent_memory.memories.extraction.candidates import Candidate, ExtractionFailed
from persistent_memory.memories.extraction.chat_completions import (
    ChatCompletionsExtractor,
    extractor_from_settings,
)
from tests import readme_blocks
from tests.chat import assistant, user
from tests.chat_server import HANG, Reply

SECRET = "sk-test-not-a-real-key-91c2"
PATH = "persistent_memory.memories.extraction.chat_completions.extract"

MESSAGES = [
    user("I moved to Lyon last spring and I always cycle to work.", id="m1"),
    assistant("Lyon is lovely. Do you want bike routes?", id="m2"),
    {"id": "t1", "role": "tool", "tool_call_id": "c1", "content": "ignored"},
    user("Yes please. My partner is called Sam.", id="m3"),
]


@pytest.fixture
def api_key(monkeypatch):
    monkeypatch.setenv("PM_TEST_EXTRACT_KEY", SECRET)
    return "PM_TEST_EXTRACT_KEY"


def extractor(server, api_key, **options: Any) -> ChatCompletionsExtractor:
    base = {"base_url": server.url, "model": "small-model", "api_key_env": api_key, "timeout": 10}
    return ChatCompletionsExtractor(**(base | options))


def answer(*items: Any) -> Reply:
    return Reply(json.dumps(list(items)))


GOOD = [
    {
        "type": "factual",
        "key": "fact.home-city",
        "content": "Lives in Lyon since last spring.",
        "messages": ["m1"],
    },
    {"type": "procedural", "key": "Habit.Commute", "content": "Cycles to work.", "messages": ["m1", "zz"]},
    {"type": "factual", "key": "fact.partner", "content": "Partner is called Sam."},
]


def test_it_sends_a_transcript_and_returns_candidates_with_their_messages(server, api_key):
    server.replies = [answer(*GOOD)]
    found = extractor(server, api_key)(MESSAGES)
    assert found == [
        Candidate("fact.home-city", "factual", "Lives in Lyon since last spring.", ["m1"]),
        Candidate("habit.commute", "procedural", "Cycles to work.", ["m1"]),  # key case-folded, "zz" not sent
        Candidate("fact.partner", "factual", "Partner is called Sam.", ["m1", "m2", "m3"]),  # none: every one
    ]
    [request] = server.requests
    assert request["headers"]["authorization"] == f"Bearer {SECRET}"
    system, transcript = request["body"]["messages"]
    assert request["body"]["model"] == "small-model"
    assert (
        "factual, episodic, procedural, semantic" in system["content"] and "JSON array" in system["content"]
    )
    assert transcript == {
        "role": "user",
        "content": "[m1] user: I moved to Lyon last spring and I always cycle to work.\n"
        "[m2] assistant: Lyon is lovely. Do you want bike routes?\n"
        "[m3] user: Yes please. My partner is called Sam.",
    }


def test_no_call_without_user_or_assistant_text(server, api_key):
    assert (
        extractor(server, api_key)([{"id": "t", "role": "tool", "content": "x"}, assistant(None, id="a")])
        == []
    )
    assert server.requests == []


@pytest.mark.parametrize(
    "reply",
    [
        Reply("Sure! Here are the memories: none."),
        Reply('{"facts": []}'),
        Reply('"just a string"'),
        Reply("[{]"),
        Reply(""),
        Reply(None),
        Reply(no_choices=True),
    ],
    ids=["prose", "wrong-object", "string", "broken-json", "empty", "null", "no-choices"],
)
def test_an_answer_that_is_not_a_list_of_memories_is_a_failure(server, api_key, reply):
    server.replies = [reply]
    with pytest.raises(ExtractionFailed, match="small-model"):
        extractor(server, api_key)(MESSAGES)


def test_a_fenced_answer_and_an_object_of_memories_are_taken(server, api_key):
    server.replies = [
        Reply("```json\n" + json.dumps(GOOD[:1]) + "\n```"),
        Reply(json.dumps({"memories": GOOD[2:]})),
    ]
    assert [c.key for c in extractor(server, api_key)(MESSAGES)] == ["fact.home-city"]
    assert [c.key for c in extractor(server, api_key)(MESSAGES)] == ["fact.partner"]


def test_bad_items_are_dropped_and_logged_one_by_one(server, api_key, caplog):
    good = {"type": "episodic", "key": "decision.bikes", "content": "Wants bike routes.", "messages": ["m3"]}
    bad = [
        "a string",
        {"type": "opinion", "key": "x.y", "content": "Unknown type."},
        {"type": "factual", "key": "x.y", "content": "An extra field.", "confidence": 0.9},
        {"type": "factual", "key": "x.y"},
        {"type": "factual", "key": "has spaces", "content": "A key outside the rules."},
        {"type": "factual", "key": "user/theme", "content": "A key with a slash."},
        {"type": "factual", "key": "k" * 121, "content": "A key too long."},
        {"type": "factual", "key": 7, "content": "A key not a string."},
        {"type": "factual", "key": "x.y", "content": "x" * 501},
        {"type": "factual", "key": "x.y", "content": "   "},
        {"type": "factual", "key": "x.y", "content": ["not", "text"]},
        {"type": "factual", "key": "x.y", "content": "Messages not a list.", "messages": "m1"},
        {"type": "factual", "key": "x.y", "content": "Ids not strings.", "messages": [1]},
    ]
    server.replies = [answer(*bad, good)]
    with caplog.at_level(logging.WARNING, logger="persistent_memory"):
        found = extractor(server, api_key)(MESSAGES)
    assert found == [Candidate("decision.bikes", "episodic", "Wants bike routes.", ["m3"])]
    assert caplog.text.count("dropped item") == len(bad)
    assert "unknown type 'opinion'" in caplog.text and "'confidence'" in caplog.text
    assert "Unknown type." not in caplog.text  # the messages' and memories' text is not logged


def test_at_most_max_memories_and_the_last_of_a_key_wins(server, api_key, caplog):
    items = [{"type": "factual", "key": f"fact.n{i}", "content": f"Fact {i}."} for i in range(5)]
    items.append({"type": "factual", "key": "fact.n0", "content": "Fact zero, again."})
    server.replies = [answer(*items)]
    with caplog.at_level(logging.WARNING, logger="persistent_memory"):
        found = extractor(server, api_key, max_memories=3)(MESSAGES)
    assert [(c.key, c.content) for c in found] == [
        ("fact.n0", "Fact 0."),
        ("fact.n1", "Fact 1."),
        ("fact.n2", "Fact 2."),
    ]
    assert "3 items beyond max_memories (3)" in caplog.text
    server.replies = [answer(*items)]
    assert [c.content for c in extractor(server, api_key)(MESSAGES)][-1] == "Fact zero, again."


@pytest.mark.parametrize(
    ("reply", "error"), [(Reply(status=500), "InternalServerError"), (Reply(delay=HANG), "APITimeoutError")]
)
def test_an_error_or_a_timeout_is_a_failure_without_a_retry(server, api_key, reply, error):
    server.replies = [reply]
    with pytest.raises(ExtractionFailed, match=error):
        extractor(server, api_key, timeout=0.3)(MESSAGES)
    assert len(server.requests) == 1


def test_it_shares_the_summarizers_client_and_its_errors(server, monkeypatch):
    monkeypatch.delenv("PM_TEST_ABSENT_KEY", raising=False)
    with pytest.raises(ImproperlyConfigured, match="PM_TEST_ABSENT_KEY.*MEMORY_EXTRACTOR_OPTIONS"):
        ChatCompletionsExtractor(base_url=server.url, model="m", api_key_env="PM_TEST_ABSENT_KEY")
    with pytest.raises(ImproperlyConfigured, match=r"MEMORY_EXTRACTOR_OPTIONS\['model'\]"):
        ChatCompletionsExtractor(base_url=server.url, model="", api_key_env=None)
    keyless = ChatCompletionsExtractor(base_url=server.url, model="m", api_key_env=None)
    assert repr(keyless) == f"<ChatCompletionsExtractor model='m' base_url={server.url!r}>"
    server.replies = [Reply("[]")]
    assert keyless([user("Hi", id="m1")]) == []
    assert "authorization" in server.requests[0]["headers"]  # the client's placeholder, not a key


def extraction_settings(server, api_key, **extra: Any) -> dict[str, Any]:
    """The summarizer's endpoint, and the extractor's own model over it."""
    return {
        "MEMORY_EXTRACTORS": [PATH],
        "SUMMARIZER_OPTIONS": {
            "base_url": server.url,
            "model": "summary-model",
            "api_key_env": api_key,
            "timeout": 3,  # a success within it on any machine; a timeout test waits for it
            "prompt": "The summarizer's prompt, not the extractor's.",
        },
        "MEMORY_EXTRACTOR_OPTIONS": {"model": "extraction-model"},
        **extra,
    }


@pytest.mark.django_db
def test_from_settings_it_upserts_memories_and_failures_never_raise(server, api_key, settings, caplog):
    settings.PERSISTENT_MEMORY = extraction_settings(server, api_key)
    built = extractor_from_settings()
    assert (built.model, built.chat.base_url, built.chat.timeout) == ("extraction-model", server.url, 3)
    assert extractor_from_settings() is built  # one client per options and key
    server.replies = [answer(*GOOD)]
    extract_messages("user:alice", MESSAGES)
    assert server.requests[0]["body"]["model"] == "extraction-model"
    assert "summarizer's prompt" not in server.requests[0]["body"]["messages"][0]["content"]
    memories = {m["key"]: m for m in memories_for("user:alice").list()[1]}
    assert set(memories) == {"fact.home-city", "habit.commute", "fact.partner"}
    assert memories["fact.home-city"]["source"] == "extraction"
    assert memories["fact.home-city"]["source_messages"] == ["m1"]
    # Garbage, a 500 and a timeout: counted and logged, nothing raised, nothing written.
    for reply in (Reply("not json"), Reply(status=500), Reply(delay=HANG)):
        server.replies = [reply]
        report = ExtractionReport()
        with caplog.at_level(logging.WARNING, logger="persistent_memory"):
            assert extract_messages("user:bob", MESSAGES, report=report) == []
        assert report.failed == 1 and "extraction-model" in report.last_error
    assert memories_for("user:bob").list()[0] == 0
    assert SECRET not in caplog.text


@pytest.mark.django_db
def test_a_missing_model_is_a_counted_failure(settings):
    settings.PERSISTENT_MEMORY = {
        "MEMORY_EXTRACTORS": [PATH],
        "MEMORY_EXTRACTOR_OPTIONS": {"api_key_env": None},
    }
    with pytest.raises(ImproperlyConfigured, match="model"):
        extractor_from_settings()
    report = ExtractionReport()
    extract_messages("user:alice", MESSAGES, report=report)
    assert report.failed == 1 and "ImproperlyConfigured" in report.last_error


@pytest.mark.django_db(transaction=True)
def test_through_the_worker_a_timeout_is_logged_and_the_next_write_is_extracted(
    configure, server, api_key, caplog
):
    store = configure(MEMORY_EXTRACTION_WORKER=True, **extraction_settings(server, api_key))
    alice, worker = store.for_owner("user:alice"), store.extraction_worker
    server.replies = [Reply(delay=HANG), answer(GOOD[0])]
    with caplog.at_level(logging.WARNING, logger="persistent_memory"):
        alice.add_messages("chat", [user("I moved to Lyon last spring.", id="m1")])
        assert worker.wait_idle(timeout=30)
        assert worker.failures == 1 and "APITimeoutError" in worker.last_error
        alice.add_messages("chat", [user("Really, Lyon.", id="m2")])
        assert worker.wait_idle(timeout=30)
    assert worker.running and worker.failures == 1
    [memory] = memories_for("user:alice").list()[1]
    # The answer cites m1, which this call did not send: the message sent is the source.
    assert (memory["key"], memory["source_messages"]) == ("fact.home-city", ["m2"])
    assert SECRET not in caplog.text and SECRET not in (worker.last_error or "")


def readme_settings() -> str:
    """The docs' settings block ``<!-- example: extractor-settings -->``."""
    return readme_blocks.example("extractor-settings")


@pytest.mark.django_db(transaction=True)
def test_the_readme_settings_extract_in_the_background(configure, server, monkeypatch):
    namespace: dict[str, Any] = {}
    exec(readme_settings(), namespace)  # noqa: S102 (the README's own settings example)
    conf = namespace["PERSISTENT_MEMORY"]
    options = conf["SUMMARIZER_OPTIONS"]
    assert options["base_url"] == "https://api.openai.com/v1" and options["api_key_env"] == "OPENAI_API_KEY"
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    conf["SUMMARIZER_OPTIONS"] = {**options, "base_url": server.url}  # the provider, stood in for
    server.replies = [answer(GOOD[0])]
    # The suite turns the worker off by default (conftest.py); the README relies on its default, True.
    store = configure(MEMORY_EXTRACTION_WORKER=True, **conf)
    assert store.extraction_worker.running and not store.summarizer_worker.running  # no summaries asked for
    store.for_owner("user:alice").add_messages("chat", [user("I love jazz. I moved to Lyon.", id="m1")])
    assert store.extraction_worker.wait_idle(timeout=30)
    memories = {m["key"]: m for m in memories_for("user:alice").list()[1]}
    assert set(memories) == {"preference.jazz", "fact.home-city"}  # the rules and the model
    assert server.requests[0]["body"]["model"] == "gpt-4o-mini"
    assert server.requests[0]["headers"]["authorization"] == f"Bearer {SECRET}"


def test_the_transcript_gives_each_line_its_time_and_speaker_and_the_prompt_asks_for_both(server, api_key):
    server.replies = [answer()]
    said = 1_683_554_580.0  # 2023-05-08 14:03 UTC
    extractor(server, api_key)(
        [
            {
                "id": "c1",
                "role": "user",
                "name": "Caroline",
                "content": "I went hiking last week.",
                "created_at": said,
            },
            {
                "id": "m1",
                "role": "assistant",
                "name": "Melanie",
                "content": "Where?",
                "created_at": said + 60,
            },
            {"id": "u1", "role": "user", "content": "No name, no time."},
        ]
    )
    system, transcript = server.requests[0]["body"]["messages"]
    assert transcript["content"] == (
        "[c1] 2023-05-08 14:03 Caroline (user): I went hiking last week.\n"
        "[m1] 2023-05-08 14:04 Melanie (assistant): Where?\n"
        "[u1] user: No name, no time."
    )
    assert "names who it is about" in system["content"] and "message's date" in system["content"]
