"""The admin's conversations through Django's test client, on both backends (mirror in
deferred mode: the page loads sync it): transcripts on the session page, a page per
conversation with its threads, and the messages list."""

from __future__ import annotations

import re
from html import unescape
from html.parser import HTMLParser
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from persistent_memory.models import MemoryConversation, MemoryMessage, MemorySession
from tests.test_conversations_mirror import chat

SESSIONS = "/admin/persistent_memory/memorysession/"
CONVERSATIONS = "/admin/persistent_memory/memoryconversation/"
MESSAGES = "/admin/persistent_memory/memorymessage/"


class Transcript(HTMLParser):
    """What a page's transcripts show: the messages (in order, each with the tool call it
    is folded under), the thread links and the version links."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.messages: list[dict[str, Any]] = []
        self.threads: list[dict[str, Any]] = []
        self.versions: list[str] = []
        self.calls: list[str] = []
        self._stack: list[dict[str, str]] = []
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = {name: value or "" for name, value in attrs}
        classes = attributes.get("class", "").split()
        if tag in ("div", "details"):
            self._stack.append(attributes)
        if tag == "details" and "pm-call" in classes:
            self.calls.append(attributes["data-call"])
        if tag == "div" and "pm-msg" in classes:
            folded = next((a["data-call"] for a in reversed(self._stack) if "data-call" in a), None)
            self.messages.append(
                {"id": attributes["data-id"], "role": attributes["data-role"], "under": folded}
            )
        if tag == "a" and "pm-thread" in classes:
            self.threads.append({"leaf": attributes["data-leaf"], "shown": "pm-shown" in classes})
        if tag == "a" and "data-leaf" in attributes and "pm-thread" not in classes:
            self.versions.append(attributes["data-leaf"])

    def handle_endtag(self, tag: str) -> None:
        if tag in ("div", "details"):
            self._stack.pop()

    @property
    def ids(self) -> list[str]:
        return [message["id"] for message in self.messages]


@pytest.fixture
def store(db, configure):
    return configure(MIRROR_MODE="deferred")


@pytest.fixture
def admin_client(db):
    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw-for-tests")
    client = Client()
    client.force_login(user)
    return client


def page(client: Client, url: str) -> str:
    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code)
    return response.content.decode()


def session_page(client: Client, session_id: str) -> str:
    page(client, SESSIONS)  # the changelist syncs the mirror
    row = MemorySession.objects.get(owner="", session_id=session_id)
    return page(client, f"{SESSIONS}{row.pk}/change/")


def conversation_pk(name: str = "default") -> int:
    return MemoryConversation.objects.get(name=name).pk


def test_the_session_page_shows_the_current_thread_as_a_transcript(admin_client, store):
    chat(store, "s1")
    html = session_page(admin_client, "s1")
    shown = Transcript(html)
    # The current thread: the regenerated answer, not the first one; the tool result
    # folded under the call that produced it.
    assert shown.messages == [
        {"id": "sys", "role": "system", "under": None},
        {"id": "u1", "role": "user", "under": None},
        {"id": "a1", "role": "assistant", "under": None},
        {"id": "t1", "role": "tool", "under": "call_1"},
        {"id": "a2b", "role": "assistant", "under": None},
    ]
    assert shown.calls == ["call_1"]
    assert "pinned system message" in html
    assert '<div class="pm-text">It is 21 °C in Paris.</div>' in html
    assert '<div class="pm-text">21 degrees.</div>' not in html  # only named in the thread links
    assert "version 2 of 2" in html
    assert shown.versions == ["a2"]  # the other version, read in its own thread
    assert sorted((t["leaf"], t["shown"]) for t in shown.threads) == [("a2", False), ("a2b", True)]
    assert "Conversations (1)" in html and "6 messages · " in html and "2 branches" in html


def test_another_thread_is_shown_with_leaf(admin_client, store):
    chat(store, "s1")
    session_page(admin_client, "s1")
    html = page(admin_client, f"{CONVERSATIONS}{conversation_pk()}/change/?leaf=a2")
    shown = Transcript(html)
    assert shown.ids == ["sys", "u1", "a1", "t1", "a2"]
    assert "Thread ending at a2" in html
    assert [(t["leaf"], t["shown"]) for t in shown.threads if t["shown"]] == [("a2", True)]
    # The head moved to that answer: the session page follows it.
    store.set_head("s1", "a2")
    assert Transcript(session_page(admin_client, "s1")).ids == ["sys", "u1", "a1", "t1", "a2"]
    assert "Current thread" in page(admin_client, f"{CONVERSATIONS}{conversation_pk()}/change/")


def test_an_unknown_leaf_shows_the_current_thread_with_a_warning(admin_client, store):
    chat(store, "s1")
    session_page(admin_client, "s1")
    html = page(admin_client, f"{CONVERSATIONS}{conversation_pk()}/change/?leaf=%3Cnope%3E")
    assert "This conversation has no message &#x27;&lt;nope&gt;&#x27;" in html
    assert Transcript(html).ids[-1] == "a2b"


def test_the_session_page_shows_the_newest_messages_of_a_long_thread(admin_client, store):
    store.add_messages(
        "long",
        [
            {"id": f"m{i:02}", "role": "user" if i % 2 else "assistant", "content": f"turn {i}"}
            for i in range(60)
        ],
    )
    html = session_page(admin_client, "long")
    assert Transcript(html).ids == [f"m{i:02}" for i in range(10, 60)]
    assert "10 earlier messages of this thread not shown" in html
    assert Transcript(page(admin_client, f"{CONVERSATIONS}{conversation_pk()}/change/")).ids == [
        f"m{i:02}" for i in range(60)
    ]


def test_a_trimmed_thread_keeps_its_system_message_first(admin_client, db, configure):
    store = configure(MIRROR_MODE="deferred", MAX_MESSAGES=5)
    store.add_messages("s1", [{"id": "sys", "role": "system", "content": "Be brief."}])
    for turn in range(6):
        store.add_messages("s1", [{"id": f"u{turn}", "role": "user", "content": f"turn {turn}"}])
    html = session_page(admin_client, "s1")
    assert Transcript(html).ids == ["sys", "u2", "u3", "u4", "u5"]  # as get_messages reads it
    assert [m["id"] for m in store.get_messages("s1")["messages"]] == Transcript(html).ids
    assert "Older messages of this thread were trimmed" in html and "2 trimmed" in html


def test_content_is_escaped_and_sessions_without_conversations_show_none(admin_client, store):
    store.add_messages("s1", [{"role": "user", "content": "<script>alert(1)</script>"}])
    store.create_session("plain")
    html = session_page(admin_client, "s1")
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    plain = session_page(admin_client, "plain")
    assert "Conversations (" not in plain and Transcript(plain).messages == []


def test_every_conversation_of_a_session_is_shown(admin_client, store):
    chat(store, "s1")
    chat(store, "s1", "node-b")
    store.for_owner("user:7").add_messages("s1", [{"id": "mine", "role": "user", "content": "owned"}])
    html = session_page(admin_client, "s1")
    assert "Conversations (2)" in html
    assert Transcript(html).ids.count("a2b") == 2 and "mine" not in Transcript(html).ids
    owned = MemorySession.objects.get(owner="user:7")
    assert Transcript(page(admin_client, f"{SESSIONS}{owned.pk}/change/")).ids == ["mine"]


def test_the_messages_list_searches_content_and_filters_by_role_and_conversation(admin_client, store):
    chat(store, "s1")
    chat(store, "s1", "other")
    store.add_messages("s2", [{"id": "far", "role": "user", "content": "Nothing about the weather"}])
    page(admin_client, MESSAGES)  # syncs

    def listed(query: str) -> list[str]:
        html = page(admin_client, f"{MESSAGES}?{query}")
        return sorted(
            MemoryMessage.objects.get(pk=int(pk)).message_id
            for pk in re.findall(r'href="/admin/persistent_memory/memorymessage/(\d+)/change/', html)
        )

    assert listed("q=PARIS") == ["a2b", "a2b", "u1", "u1"]
    assert listed("q=paris+celsius") == []  # every word, in one message
    assert listed("role=tool") == ["t1", "t1"]
    assert listed(f"role=assistant&conversation={conversation_pk('other')}") == ["a1", "a2", "a2b"]
    s2 = MemorySession.objects.get(session_id="s2").pk
    assert listed(f"session={s2}") == ["far"]
    # Values no filter offers give no rows or are ignored, never an error.
    assert listed("conversation=abc") == []
    assert len(listed("role=wizard")) == 13


def test_message_pages_are_read_only(admin_client, store):
    chat(store, "s1")
    page(admin_client, MESSAGES)
    message = MemoryMessage.objects.get(message_id="a1")
    html = unescape(page(admin_client, f"{MESSAGES}{message.pk}/change/"))
    assert "weather" in html and "call_1" in html and '"parent_id": "u1"' in html
    assert admin_client.post(f"{MESSAGES}{message.pk}/change/", {"role": "user"}).status_code == 403
    assert admin_client.get(f"{MESSAGES}add/").status_code == 403
    assert admin_client.post(f"{CONVERSATIONS}{message.conversation_id}/delete/").status_code == 403
    assert MemoryMessage.objects.get(pk=message.pk).role == "assistant"


def test_the_transcript_shows_the_summary_and_what_it_covers(admin_client, store):
    from persistent_memory.backends.conversations import Summary

    chat(store, "s1")
    text = "The user asked the weather in Paris."
    assert store.backend.commit_summary("s1", "default", None, Summary(text, "t1", 4, 12, 30))
    html = session_page(admin_client, "s1")
    assert "rolling summary" in html and text in html
    assert 'data-anchor="t1"' in html and "covers this thread up to #4" in html
    # Covered: the thread up to the anchor; the answer after it is not.
    assert html.count(">summarized</span>") == 4
    assert 'pm-assistant" id="message-a2b"' in html
    conversation = page(admin_client, f"{CONVERSATIONS}{conversation_pk()}/change/?leaf=a2")
    assert "rolling summary" in conversation  # a2 answers t1 too: the summary covers its thread


def test_each_thread_shows_the_summary_of_its_own_branch(admin_client, store):
    from persistent_memory.backends.conversations import Summary

    chat(store, "s1")
    first = "The user asked the weather in Paris."
    assert store.backend.commit_summary("s1", "default", None, Summary(first, "t1", 4, 12, 30))
    other = store.add_messages(
        "s1",
        [
            {"id": "a1x", "role": "assistant", "content": "Sunny."},
            {"id": "u2x", "role": "user", "content": "Lyon?"},
        ],
        parent_id="u1",
    )["messages"]
    second = "Paris is sunny."
    assert store.backend.commit_summary("s1", "default", None, Summary(second, "a1x", other[0]["seq"], 8, 0))
    page(admin_client, SESSIONS)  # the changelist syncs the mirror
    for leaf, shown, hidden, covered in (("a2b", first, second, 4), ("u2x", second, first, 3)):
        html = unescape(page(admin_client, f"{CONVERSATIONS}{conversation_pk()}/change/?leaf={leaf}"))
        assert shown in html and hidden not in html, leaf
        assert html.count(">summarized</span>") == covered, leaf


def test_an_action_summarizes_the_conversations_of_sessions_now(admin_client, db, configure):
    store = configure(MIRROR_MODE="deferred", CONTEXT_STRATEGY="rolling_summary", SUMMARIZE_AFTER_TOKENS=40)
    store.summarizer_worker.stop()  # the action does the work here, not the background thread
    for turn in range(8):
        store.add_messages(
            "s1",
            [
                {"role": "user", "content": f"Question {turn}: what about the weather in city {turn}?"},
                {"role": "assistant", "content": f"Answer {turn}: sunny and warm in city {turn}."},
            ],
        )
    page(admin_client, SESSIONS)  # the changelist syncs the mirror
    pk = MemorySession.objects.get(session_id="s1").pk
    response = admin_client.post(
        SESSIONS, {"action": "summarize_conversations_now", "_selected_action": [pk]}, follow=True
    )
    assert "Summarized 1 of 1 conversations (summarizers: healthy)." in response.content.decode()
    window = store.get_context("s1")
    assert window["summary"] and window["summary"].startswith("User: Question 0")
    html = session_page(admin_client, "s1")
    assert "rolling summary" in html and ">summarized</span>" in html
