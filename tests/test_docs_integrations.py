"""The integrations pages' examples, run as written (docs/integrations/)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser
from django.test import RequestFactory

from persistent_memory.memories import memories_for
from tests import readme_blocks

pytest.importorskip("langgraph")


def example_module(name: str) -> dict[str, Any]:
    """The page's example ``name``, run as a module of its own (without this file's
    postponed annotations)."""
    namespace: dict[str, Any] = {"__name__": "views"}
    exec(compile(readme_blocks.example(name), "views", "exec", dont_inherit=True), namespace)  # noqa: S102
    return namespace


def say(chat: Any, user: Any, message: str) -> Any:
    request = RequestFactory().post("/chat/", {"message": message})
    request.user = user
    return chat(request)


@pytest.mark.django_db
def test_the_langgraph_store_view():
    """The page's view: each user's city is remembered in their own memories, and only
    theirs; a caller without an owner is refused."""
    chat = example_module("langgraph-store-view")["chat"]
    ada, bob = (get_user_model().objects.create_user(name) for name in ("ada", "bob"))

    def reply(user: Any, message: str) -> str:
        response = say(chat, user, message)
        assert response.status_code == 200
        return json.loads(response.content)["reply"]

    assert reply(ada, "Hello") == "Where do you live?"
    assert reply(ada, "I live in Lyon.") == "You live in Lyon."
    assert reply(ada, "Where do I live?") == "You live in Lyon."
    assert reply(bob, "Where do I live?") == "Where do you live?"  # Ada's city is hers
    count, (memory,) = memories_for(f"user:{ada.pk}").list()
    shown = (count, memory["key"], memory["type"], memory["content"])
    assert shown == (1, "lg.profile.city", "semantic", "Lyon")
    assert memories_for(f"user:{bob.pk}").list() == (0, [])
    assert say(chat, AnonymousUser(), "Hello").status_code == 403


@pytest.mark.django_db
def test_the_langgraph_agent_view(store, server, monkeypatch):
    """The page's agent against a local chat-completions server (tests/chat_server.py):
    threads go on across requests, facts cross the caller's threads, owners stay apart."""
    from tests.chat_server import Reply

    monkeypatch.setenv("OPENAI_BASE_URL", server.url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local-test")
    talk = example_module("langgraph-agent-view")["talk"]
    ada, bob = (get_user_model().objects.create_user(name) for name in ("ada", "bob"))

    def said(user: Any, thread: str, message: str, answer: str) -> list[dict[str, str]]:
        server.replies = [Reply(answer)]
        request = RequestFactory().post(f"/talk/{thread}/", {"message": message})
        request.user = user
        response = talk(request, thread)
        assert response.status_code == 200
        return json.loads(response.content)["messages"]

    def sent() -> list[dict[str, Any]]:
        return server.requests[-1]["body"]["messages"]

    assert said(ada, "t1", "Hi", "Hello Ada.") == [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello Ada."},
    ]
    assert sent()[0] == {"role": "system", "content": "What you know about the user: nothing yet."}
    thread = said(ada, "t1", "Remember: I drink tea", "Noted.")
    assert [m["content"] for m in thread] == ["Hi", "Hello Ada.", "Remember: I drink tea", "Noted."]
    assert [m["content"] for m in sent()[1:]] == ["Hi", "Hello Ada.", "Remember: I drink tea"]
    # Another thread of Ada's: a new conversation, the same facts.
    assert said(ada, "t2", "What do I drink?", "Tea.")[0]["content"] == "What do I drink?"
    assert sent()[0]["content"] == "What you know about the user: I drink tea."
    # A fact told in t2, at the same place in its thread as the first in t1: both are kept.
    said(ada, "t2", "Remember: I live in Paris", "Noted.")
    said(ada, "t3", "Where do I live?", "Paris.")
    assert sent()[0]["content"] == "What you know about the user: I live in Paris; I drink tea."
    # Bob's t1 is not Ada's, and her facts are hers.
    assert len(said(bob, "t1", "Hi", "Hello Bob.")) == 2
    assert sent()[0]["content"] == "What you know about the user: nothing yet."
    request = RequestFactory().post("/talk/t1/", {"message": "x"})
    request.user = AnonymousUser()
    assert talk(request, "t1").status_code == 403


@pytest.mark.django_db
def test_the_openai_agents_view(store, monkeypatch):
    """The page's agent against a local Responses API server (tests/responses_server.py):
    a chat goes on across requests with its tool calls, owners stay apart."""
    from tests.responses_server import call, responses_server, text

    def history(body: dict[str, Any]) -> list[dict[str, Any]]:
        return [text(f"{len(body['input'])} items so far.")]

    script = [
        [call("opening_hours", {"day": "Sunday"})],
        [text("We are closed on Sunday.")],
        history,
        history,
    ]
    with responses_server(*script) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-local-test")
        monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
        chat = example_module("openai-agents-view")["chat"]
        ada, bob = (get_user_model().objects.create_user(name) for name in ("ada", "bob"))

        def reply(user: Any, message: str) -> str:
            request = RequestFactory().post("/chat/c1/", {"message": message})
            request.user = user
            response = chat(request, "c1")
            assert response.status_code == 200
            return json.loads(response.content)["reply"]

        assert reply(ada, "Are you open on Sunday?") == "We are closed on Sunday."
        # Ada's second turn is sent her first turn: question, call, output, answer, then this.
        assert reply(ada, "And on Monday?") == "5 items so far."
        assert reply(bob, "Hello") == "1 items so far."  # Bob's c1 is not Ada's
        request = RequestFactory().post("/chat/c1/", {"message": "x"})
        request.user = AnonymousUser()
        assert chat(request, "c1").status_code == 403
    sent = server.requests[2]["input"]
    assert [item.get("type", "message") for item in sent] == [
        "message",
        "function_call",
        "function_call_output",
        "message",
        "message",
    ]
    assert sent[2]["output"] == "closed"
    roles = [m["role"] for m in store.for_owner(f"user:{ada.pk}").get_messages("c1")["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant", "user", "assistant"]


@pytest.mark.django_db
def test_the_pydantic_ai_view(store, monkeypatch):
    """The page's agent, its model replaced as Pydantic AI's testing guide says
    (``agent.override`` with a ``FunctionModel``): a chat goes on across requests with its
    tool calls, owners stay apart."""
    from asgiref.sync import async_to_sync
    from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
    from pydantic_ai.models.function import FunctionModel

    monkeypatch.setenv("OPENAI_API_KEY", "sk-local-test")
    page = example_module("pydantic-ai-view")
    chat, agent = page["chat"], page["agent"]
    sent: list[Any] = []

    def model(messages: list[Any], info: Any) -> ModelResponse:
        sent.append(messages)
        last = messages[-1].parts[-1]
        if isinstance(last, ToolReturnPart):
            return ModelResponse(parts=[TextPart(f"We are {last.content} on Sunday.")])
        if "Sunday" in str(last.content):
            return ModelResponse(parts=[ToolCallPart("opening_hours", {"day": "Sunday"})])
        return ModelResponse(parts=[TextPart(f"{len(messages)} messages so far.")])

    ada, bob = (get_user_model().objects.create_user(name) for name in ("ada", "bob"))

    def reply(user: Any, message: str) -> str:
        request = RequestFactory().post("/chat/c1/", {"message": message})
        request.user = user
        response = async_to_sync(chat)(request, "c1")
        assert response.status_code == 200
        return json.loads(response.content)["reply"]

    with agent.override(model=FunctionModel(model)):
        assert reply(ada, "Are you open on Sunday?") == "We are closed on Sunday."
        # Ada's second turn is sent her first: question, call, result, answer, then this.
        assert reply(ada, "And on Monday?") == "5 messages so far."
        assert reply(bob, "Hello") == "1 messages so far."  # Bob's c1 is not Ada's
        request = RequestFactory().post("/chat/c1/", {"message": "x"})
        request.user = AnonymousUser()
        assert async_to_sync(chat)(request, "c1").status_code == 403
    thread = store.for_owner(f"user:{ada.pk}").get_messages("c1")["messages"]
    assert [m["role"] for m in thread] == ["user", "assistant", "tool", "assistant", "user", "assistant"]
    # The call and its result are stored as the chat format's tool_calls and tool message.
    assert thread[1]["tool_calls"][0]["function"]["name"] == "opening_hours"
    assert thread[2]["tool_call_id"] == thread[1]["tool_calls"][0]["id"]
    assert (thread[2]["name"], thread[2]["content"]) == ("opening_hours", "closed")


@pytest.mark.django_db
def test_the_langgraph_conversations_example(settings):
    """The page's node finds what the user said, in any of their sessions, and only theirs."""
    from persistent_memory.store import get_store

    settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "MIRROR_MODE": "deferred"}
    store = get_store()
    ada, bob = store.for_owner("user:ada"), store.for_owner("user:bob")
    ada.add_messages("monday", [{"role": "user", "content": "My sister lives in Porto."}])
    ada.add_messages(
        "friday",
        [
            {"role": "user", "content": "We might visit Porto in June."},
            {"role": "assistant", "content": "Porto in June is lovely."},
        ],
    )
    bob.add_messages("chat", [{"role": "user", "content": "Porto wine is my favourite."}])
    what_was_said = example_module("langgraph-conversations")["what_was_said"]

    said = what_was_said("user:ada", "Who lives in Porto?")
    assert [line.split(": ", 1)[1] for line in said] == [
        "My sister lives in Porto.",
        "We might visit Porto in June.",
    ]
    assert all(len(line.split(": ", 1)[0]) == 10 for line in said)  # the day it was said
    assert [line.split(": ", 1)[1] for line in what_was_said("user:bob", "Porto")] == [
        "Porto wine is my favourite."
    ]
    assert what_was_said("user:carol", "Porto") == []
