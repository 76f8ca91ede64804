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


def say(chat: Any, user: Any, message: str) -> Any:
    request = RequestFactory().post("/chat/", {"message": message})
    request.user = user
    return chat(request)


@pytest.mark.django_db
def test_the_langgraph_store_view():
    """The page's view: each user's city is remembered in their own memories, and only
    theirs; a caller without an owner is refused."""
    namespace: dict[str, Any] = {"__name__": "views"}
    exec(readme_blocks.example("langgraph-store-view"), namespace)  # noqa: S102 (the page's own example)
    chat = namespace["chat"]
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
    namespace: dict[str, Any] = {"__name__": "views"}
    # Compiled as a module of its own would be: without this file's postponed annotations.
    code = compile(readme_blocks.example("langgraph-agent-view"), "views", "exec", dont_inherit=True)
    exec(code, namespace)  # noqa: S102 (the page's own example)
    talk = namespace["talk"]
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
    # Bob's t1 is not Ada's, and her facts are hers.
    assert len(said(bob, "t1", "Hi", "Hello Bob.")) == 2
    assert sent()[0]["content"] == "What you know about the user: nothing yet."
    request = RequestFactory().post("/talk/t1/", {"message": "x"})
    request.user = AnonymousUser()
    assert talk(request, "t1").status_code == 403
