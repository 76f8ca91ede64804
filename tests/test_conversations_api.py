"""Conversations through the REST API (DRF's test client), on both backends.

Every endpoint, its errors with their codes, retries (a message re-sent with its id,
an ``Idempotency-Key``), and owners: another owner's session answers as one that does
not exist. What was written is checked through the store scoped to the caller's owner,
not only through the API under test.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from persistent_memory import get_store
from persistent_memory.store import MemoryStore

API = "/api/memory/"
SID = "chat-1"
MESSAGES = f"{API}sessions/{SID}/messages/"
CONTEXT = f"{API}sessions/{SID}/context/"
CONVERSATIONS = f"{API}sessions/{SID}/conversations/"
HEAD = f"{API}sessions/{SID}/head/"

CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
SYSTEM = {"id": "sys", "role": "system", "content": "You answer about the weather."}
QUESTION = {"id": "q1", "role": "user", "content": "Weather in Paris?"}
TOOL_CALL = {"id": "c1", "role": "assistant", "content": None, "tool_calls": [CALL]}
TOOL_RESULT = {"id": "r1", "role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}
ANSWER = {"id": "a1", "role": "assistant", "content": "18 C and sunny.", "metadata": {"model": "m-1"}}
STORE_FIELDS = {"id", "parent_id", "seq", "tokens", "tokenizer", "created_at"}


@pytest.fixture(params=["memory", "redis", "redis-cluster"])
def backend_name(request: pytest.FixtureRequest) -> str:
    """The API on both backends, and on a real Redis Cluster."""
    return request.param


def make_user(username: str) -> tuple[Any, APIClient]:
    """An ordinary user and an API client that authenticates with its token."""
    user = get_user_model().objects.create_user(username, password="pw-for-tests")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return user, client


def owned(user: Any) -> MemoryStore:
    """The store as the API sees it for ``user`` (fetched anew: settings rebuild it)."""
    return get_store().for_owner(f"user:{user.pk}")


def error_of(response: Any) -> tuple[int, str]:
    """(status, code) of a JSON error answer."""
    assert response["Content-Type"] == "application/json", response.content
    body = response.json()
    assert set(body) >= {"detail", "code"}, body
    return response.status_code, body["code"]


def ids(messages: list[dict[str, Any]]) -> list[str]:
    return [message["id"] for message in messages]


@pytest.fixture
def alice(db, configure):
    configure()
    return make_user("alice")


@pytest.fixture
def api(alice) -> APIClient:
    return alice[1]


@pytest.fixture
def store(alice) -> MemoryStore:
    """Alice's sessions, as the API reaches them."""
    return owned(alice[0])


def post(api: APIClient, messages: list[dict[str, Any]], **body: Any) -> Any:
    return api.post(MESSAGES, {"messages": messages, **body}, format="json")


def chat(api: APIClient) -> None:
    """A turn with a tool call: system, question, call, result, answer."""
    response = post(api, [SYSTEM, QUESTION, TOOL_CALL, TOOL_RESULT, ANSWER])
    assert response.status_code == 201, response.content


class TestAppend:
    def test_answers_the_stored_messages_and_the_head(self, api, store):
        response = post(api, [QUESTION])
        assert response.status_code == 201
        body = response.json()
        assert (body["conversation"], body["head"]) == ("default", "q1")
        [stored] = body["messages"]
        assert set(stored) == {"role", "content"} | STORE_FIELDS
        assert (stored["id"], stored["parent_id"], stored["seq"]) == ("q1", None, 1)
        assert stored["tokens"] > 0 and stored["tokenizer"] == "o200k_base"
        assert store.get_messages(SID)["messages"] == [stored]
        assert store.session_info(SID)["session_id"] == SID  # the append created the session

    def test_a_tool_call_turn_is_one_chain(self, api, store):
        body = post(api, [SYSTEM, QUESTION]).json()
        assert body["head"] == "q1"
        body = post(api, [TOOL_CALL, TOOL_RESULT]).json()
        assert [(m["id"], m["parent_id"], m["seq"]) for m in body["messages"]] == [
            ("c1", "q1", 3),
            ("r1", "c1", 4),
        ]
        assert body["messages"][0]["tool_calls"] == [CALL] and body["messages"][0]["content"] is None
        assert body["messages"][1]["tool_call_id"] == "call_1"
        body = post(api, [ANSWER]).json()
        assert body["messages"][0]["metadata"] == {"model": "m-1"}
        thread = store.get_messages(SID)
        assert ids(thread["messages"]) == ["sys", "q1", "c1", "r1", "a1"] and thread["head"] == "a1"

    def test_ids_are_made_when_not_given(self, api, store):
        pair = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
        body = post(api, pair).json()
        first, second = body["messages"]
        assert first["id"] != second["id"] and second["parent_id"] == first["id"]
        assert body["head"] == second["id"]
        assert ids(store.get_messages(SID)["messages"]) == [first["id"], second["id"]]

    def test_conversations_are_apart(self, api, store):
        post(api, [QUESTION])
        body = post(api, [{"id": "q1", "role": "user", "content": "Other"}], conversation="support").json()
        assert (body["conversation"], body["head"], body["messages"][0]["seq"]) == ("support", "q1", 1)
        assert store.get_messages(SID)["messages"][0]["content"] == "Weather in Paris?"
        assert store.get_messages(SID, conversation="support")["messages"][0]["content"] == "Other"

    def test_a_message_sent_again_with_its_id_is_answered_as_stored(self, api, store):
        first = post(api, [QUESTION, TOOL_CALL]).json()
        again = post(api, [QUESTION, TOOL_CALL])
        assert again.status_code == 201
        assert again.json() == first  # same seq, same created_at: nothing appended
        assert ids(store.get_messages(SID)["messages"]) == ["q1", "c1"]
        assert store.list_conversations(SID)[0]["message_count"] == 2

    def test_the_same_id_with_other_content_is_409(self, api, store):
        post(api, [QUESTION])
        response = post(api, [{**QUESTION, "content": "Weather in Rome?"}])
        assert error_of(response) == (409, "message_conflict")
        assert "q1" in response.json()["detail"]
        assert store.get_messages(SID)["messages"][0]["content"] == "Weather in Paris?"

    def test_a_tool_result_without_its_call_is_400(self, api, store):
        assert error_of(post(api, [QUESTION, TOOL_RESULT])) == (400, "orphan_tool_result")
        assert store.list_sessions() == []
        post(api, [QUESTION])
        # The call is on another branch: not open on the thread the result joins.
        post(api, [TOOL_CALL, TOOL_RESULT, ANSWER])
        response = post(api, [{**TOOL_RESULT, "id": "r2"}], parent_id="q1")
        assert error_of(response) == (400, "orphan_tool_result")
        assert store.list_conversations(SID)[0]["message_count"] == 4

    def test_an_unknown_parent_is_404(self, api, store):
        post(api, [QUESTION])
        response = post(api, [ANSWER], parent_id="nope")
        assert error_of(response) == (404, "message_not_found")
        assert ids(store.get_messages(SID)["messages"]) == ["q1"]

    @pytest.mark.parametrize(
        "messages",
        [
            [],
            "hello",
            {"role": "user", "content": "hi"},
            [{"role": "robot", "content": "hi"}],
            [{"role": "user"}],
            [{"role": "user", "content": 5}],
            [{"role": "user", "content": "hi", "colour": "red"}],
            [{"role": "user", "content": "hi", "tool_calls": [CALL]}],
            [{"role": "assistant", "content": None, "tool_calls": [{"id": "x"}]}],
            [{"role": "tool", "content": "18 C"}],
            [{"role": "user", "content": "hi", "id": "a b"}],
            [{"role": "user", "content": "hi", "metadata": [1]}],
            [{"role": "user", "content": "hi", "name": "not a name"}],
            [{**QUESTION}, {**QUESTION, "content": "again"}],
        ],
    )
    def test_messages_the_rules_refuse_are_400_and_write_nothing(self, api, store, messages):
        assert error_of(post(api, messages)) == (400, "invalid_message")
        assert store.list_sessions() == []

    @pytest.mark.parametrize(
        ("body", "code"),
        [
            ({}, "invalid"),
            ({"messages": [QUESTION], "conversation": "a b"}, "invalid_message"),
            ({"messages": [QUESTION], "conversation": "__meta__"}, "invalid_message"),
            ({"messages": [QUESTION], "conversation": ""}, "invalid"),
            ({"messages": [QUESTION], "parent_id": "a b"}, "invalid_message"),
            ({"messages": [QUESTION], "parent_id": ["q"]}, "invalid"),
        ],
    )
    def test_bodies_of_the_wrong_shape_are_400(self, api, store, body, code):
        assert error_of(api.post(MESSAGES, body, format="json")) == (400, code)
        assert store.list_sessions() == []

    def test_a_bad_session_id_is_400(self, api, store):
        response = api.post(f"{API}sessions/a%20b/messages/", {"messages": [QUESTION]}, format="json")
        assert error_of(response) == (400, "invalid_session_id")

    def test_at_most_max_batch_messages(self, api, configure, alice):
        configure(MAX_BATCH=2)
        three = [{"role": "user", "content": str(n)} for n in range(3)]
        response = post(api, three)
        assert error_of(response) == (400, "invalid_message") and "At most 2" in response.json()["detail"]
        assert owned(alice[0]).list_sessions() == []
        assert post(api, three[:2]).status_code == 201

    def test_over_the_session_byte_cap_is_507(self, api, configure, alice):
        configure(MAX_SESSION_BYTES=2000)
        assert post(api, [QUESTION]).status_code == 201
        response = post(api, [{"role": "assistant", "content": "x" * 3000}])
        assert error_of(response) == (507, "capacity_exceeded")
        assert ids(owned(alice[0]).get_messages(SID)["messages"]) == ["q1"]

    def test_max_messages_trims_the_oldest(self, api, configure, alice):
        configure(MAX_MESSAGES=3)
        for n in range(5):
            post(api, [{"id": f"m{n}", "role": "user", "content": f"message {n}"}])
        [info] = api.get(CONVERSATIONS).json()["conversations"]
        assert (info["message_count"], info["trimmed"], info["head"]) == (3, 2, "m4")
        assert ids(api.get(MESSAGES).json()["messages"]) == ["m2", "m3", "m4"]
        assert api.get(CONTEXT).json()["truncated"] is True
        assert ids(owned(alice[0]).get_messages(SID)["messages"]) == ["m2", "m3", "m4"]

    def test_idempotency_key_answers_a_retry_with_the_first_answer(self, api, store):
        body = {"messages": [{"role": "user", "content": "no id of mine"}]}
        first = api.post(MESSAGES, body, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
        again = api.post(MESSAGES, body, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
        assert first.status_code == again.status_code == 201
        assert again.json() == first.json()  # the same made id: appended once
        assert len(store.get_messages(SID)["messages"]) == 1
        other = {"messages": [{"role": "user", "content": "another"}]}
        response = api.post(MESSAGES, other, format="json", HTTP_IDEMPOTENCY_KEY="k-1")
        assert error_of(response) == (422, "idempotency_key_reused")
        response = api.post(MESSAGES, body, format="json", HTTP_IDEMPOTENCY_KEY="bad key")
        assert error_of(response) == (400, "invalid_idempotency_key")
        assert len(store.get_messages(SID)["messages"]) == 1


class TestBranches:
    def test_a_regenerated_answer_replaces_the_old_one_in_reads(self, api, store):
        post(api, [QUESTION, {"id": "a1", "role": "assistant", "content": "Rain."}])
        body = post(api, [{"id": "a2", "role": "assistant", "content": "Sun."}], parent_id="q1").json()
        assert body["head"] == "a2" and body["messages"][0]["parent_id"] == "q1"
        thread = api.get(MESSAGES).json()
        assert (thread["head"], ids(thread["messages"])) == ("a2", ["q1", "a2"])
        assert [m["content"] for m in api.get(CONTEXT).json()["messages"]] == ["Weather in Paris?", "Sun."]
        # The old answer is kept, on its own branch.
        assert ids(api.get(MESSAGES, {"leaf": "a1"}).json()["messages"]) == ["q1", "a1"]
        [info] = api.get(CONVERSATIONS).json()["conversations"]
        assert (info["message_count"], info["branch_count"], info["head"]) == (3, 2, "a2")
        assert ids(store.get_messages(SID)["messages"]) == ["q1", "a2"]

    def test_the_head_moves_back(self, api, store):
        post(api, [QUESTION, {"id": "a1", "role": "assistant", "content": "Rain."}])
        post(api, [{"id": "a2", "role": "assistant", "content": "Sun."}], parent_id="q1")
        response = api.put(HEAD, {"message_id": "a1"}, format="json")
        assert response.status_code == 200
        assert response.json() == {"conversation": "default", "head": "a1"}
        assert ids(api.get(MESSAGES).json()["messages"]) == ["q1", "a1"]
        assert api.get(CONTEXT).json()["messages"][-1]["content"] == "Rain."
        assert store.get_messages(SID)["head"] == "a1"
        # Appending now continues the branch the head is on.
        assert (
            post(api, [{"id": "q2", "role": "user", "content": "Sure?"}]).json()["messages"][0]["parent_id"]
            == "a1"
        )

    def test_head_errors(self, api, store):
        post(api, [QUESTION])
        post(api, [{"id": "q1", "role": "user", "content": "x"}], conversation="other")
        assert error_of(api.put(HEAD, {"message_id": "nope"}, format="json")) == (404, "message_not_found")
        response = api.put(HEAD, {"message_id": "q1", "conversation": "empty"}, format="json")
        assert error_of(response) == (404, "message_not_found")
        assert error_of(api.put(HEAD, {}, format="json")) == (400, "invalid")
        assert error_of(api.put(HEAD, {"message_id": "a b"}, format="json")) == (400, "invalid_message")
        response = api.put(HEAD, {"message_id": "q1", "conversation": "a b"}, format="json")
        assert error_of(response) == (400, "invalid_message")
        response = api.put(f"{API}sessions/nobody/head/", {"message_id": "q1"}, format="json")
        assert error_of(response) == (404, "session_not_found")
        assert store.get_messages(SID)["head"] == "q1"
        assert store.list_sessions() == [SID]

    def test_head_move_takes_an_idempotency_key(self, api, store):
        post(api, [QUESTION, {"id": "a1", "role": "assistant", "content": "Rain."}])
        body = {"message_id": "q1"}
        for _ in range(2):
            response = api.put(HEAD, body, format="json", HTTP_IDEMPOTENCY_KEY="head-1")
            assert response.json() == {"conversation": "default", "head": "q1"}
        response = api.put(HEAD, {"message_id": "a1"}, format="json", HTTP_IDEMPOTENCY_KEY="head-1")
        assert error_of(response) == (422, "idempotency_key_reused")
        assert store.get_messages(SID)["head"] == "q1"


class TestReads:
    def test_the_thread_with_a_limit(self, api, store):
        chat(api)
        body = api.get(MESSAGES).json()
        assert (body["conversation"], body["head"]) == ("default", "a1")
        assert ids(body["messages"]) == ["sys", "q1", "c1", "r1", "a1"]
        assert [m["seq"] for m in body["messages"]] == [1, 2, 3, 4, 5]
        assert body == store.get_messages(SID)
        assert ids(api.get(MESSAGES, {"limit": 2}).json()["messages"]) == ["r1", "a1"]
        assert ids(api.get(MESSAGES, {"leaf": "c1", "limit": 1}).json()["messages"]) == ["c1"]

    def test_an_unknown_conversation_is_empty_and_an_unknown_leaf_404(self, api):
        chat(api)
        body = api.get(MESSAGES, {"conversation": "other"}).json()
        assert body == {"conversation": "other", "head": None, "messages": []}
        assert error_of(api.get(MESSAGES, {"leaf": "nope"})) == (404, "message_not_found")
        assert error_of(api.get(MESSAGES, {"leaf": "q1", "conversation": "other"})) == (
            404,
            "message_not_found",
        )
        body = api.get(CONTEXT, {"conversation": "other"}).json()
        assert body == {"conversation": "other", "messages": [], "tokens": 0, "truncated": False}

    def test_the_context_is_the_chat_format_within_the_budget(self, api, store):
        chat(api)
        body = api.get(CONTEXT).json()
        assert body["truncated"] is False and body["conversation"] == "default"
        assert body["messages"] == [
            {key: value for key, value in message.items() if key not in ("id", "metadata")}
            for message in (SYSTEM, QUESTION, TOOL_CALL, TOOL_RESULT, ANSWER)
        ]
        thread = store.get_messages(SID)["messages"]
        assert body["tokens"] == sum(m["tokens"] for m in thread)
        assert body == store.get_context(SID)
        # Two messages: the system message stays, then the newest whole group that fits (the
        # answer); the call is never sent without its result, nor a result without its call.
        body = api.get(CONTEXT, {"max_messages": 2}).json()
        assert [m["role"] for m in body["messages"]] == ["system", "assistant"]
        assert body["messages"][1]["content"] == "18 C and sunny." and body["truncated"] is True
        body = api.get(CONTEXT, {"max_messages": 4}).json()
        assert [m["role"] for m in body["messages"]] == ["system", "assistant", "tool", "assistant"]
        by_id = {m["id"]: m["tokens"] for m in thread}
        budget = by_id["sys"] + by_id["a1"] + by_id["r1"]  # not enough for the call too
        body = api.get(CONTEXT, {"max_tokens": budget}).json()
        assert [m["role"] for m in body["messages"]] == ["system", "assistant"]
        assert body["tokens"] == by_id["sys"] + by_id["a1"] <= budget

    def test_the_conversations_of_a_session(self, api, store):
        chat(api)
        post(api, [{"id": "x", "role": "user", "content": "hello"}], conversation="b-side")
        body = api.get(CONVERSATIONS).json()
        assert [c["conversation"] for c in body["conversations"]] == ["b-side", "default"]
        default = body["conversations"][1]
        thread = store.get_messages(SID)["messages"]
        assert default == {
            "conversation": "default",
            "head": "a1",
            "message_count": 5,
            "tokens": sum(m["tokens"] for m in thread),
            "branch_count": 1,
            "trimmed": 0,
        }
        assert body == {"conversations": store.list_conversations(SID)}
        store.create_session("empty")
        assert api.get(f"{API}sessions/empty/conversations/").json() == {"conversations": []}

    @pytest.mark.parametrize(
        ("path", "query"),
        [
            (MESSAGES, "limit=abc"),
            (MESSAGES, "limit=0"),
            (MESSAGES, "limit=-1"),
            (MESSAGES, "limit=1.5"),
            (MESSAGES, "limit=99999999999999999999"),
            (CONTEXT, "max_tokens=0"),
            (CONTEXT, "max_tokens=abc"),
            (CONTEXT, "max_messages=0"),
            (CONTEXT, "max_messages=1e3"),
        ],
    )
    def test_bad_query_parameters_are_400(self, api, path, query):
        chat(api)
        response = api.get(f"{path}?{query}")
        assert error_of(response) == (400, "invalid")
        assert set(response.json()["errors"]) == {query.split("=")[0]}

    def test_empty_query_parameters_are_not_given(self, api):
        chat(api)
        body = api.get(f"{MESSAGES}?limit=&conversation=&leaf=").json()
        assert (body["conversation"], len(body["messages"])) == ("default", 5)
        body = api.get(f"{CONTEXT}?max_tokens=&max_messages=&conversation=").json()
        assert (body["conversation"], len(body["messages"])) == ("default", 5)

    @pytest.mark.parametrize(
        ("path", "query"),
        [(MESSAGES, "leaf=a%20b"), (MESSAGES, "conversation=a%20b"), (CONTEXT, "conversation=__x__")],
    )
    def test_bad_names_are_400_invalid_message(self, api, path, query):
        chat(api)
        assert error_of(api.get(f"{path}?{query}")) == (400, "invalid_message")

    def test_an_unknown_session_is_404(self, api, store):
        chat(api)
        for path in ("messages/", "context/", "conversations/"):
            assert error_of(api.get(f"{API}sessions/nobody/{path}")) == (404, "session_not_found"), path
        assert error_of(api.delete(f"{API}sessions/nobody/messages/")) == (404, "session_not_found")
        assert error_of(api.get(f"{API}sessions/a%20b/context/")) == (400, "invalid_session_id")
        assert store.list_sessions() == [SID]


class TestClear:
    def test_removes_one_conversation(self, api, store):
        chat(api)
        post(api, [QUESTION], conversation="other")
        response = api.delete(MESSAGES)
        assert response.status_code == 200
        assert response.json() == {"conversation": "default", "removed": 5}
        assert store.get_messages(SID) == {"conversation": "default", "head": None, "messages": []}
        assert [c["conversation"] for c in store.list_conversations(SID)] == ["other"]
        assert api.delete(MESSAGES).json() == {"conversation": "default", "removed": 0}
        assert api.delete(f"{MESSAGES}?conversation=other").json() == {"conversation": "other", "removed": 1}
        assert store.list_conversations(SID) == []
        assert store.list_sessions() == [SID]  # the session and its values stay

    def test_a_bad_conversation_name_is_400(self, api, store):
        chat(api)
        assert error_of(api.delete(f"{MESSAGES}?conversation=a%20b")) == (400, "invalid_message")
        assert store.list_conversations(SID)[0]["message_count"] == 5

    def test_the_idempotency_key_stands_for_the_conversation_too(self, api, store):
        chat(api)
        post(api, [QUESTION], conversation="other")
        first = api.delete(MESSAGES, HTTP_IDEMPOTENCY_KEY="clear-1")
        again = api.delete(f"{MESSAGES}?conversation=default", HTTP_IDEMPOTENCY_KEY="clear-1")
        assert first.json() == again.json() == {"conversation": "default", "removed": 5}
        response = api.delete(f"{MESSAGES}?conversation=other", HTTP_IDEMPOTENCY_KEY="clear-1")
        assert error_of(response) == (422, "idempotency_key_reused")
        assert [c["conversation"] for c in store.list_conversations(SID)] == ["other"]


class TestOwners:
    """Bob probes Alice's conversation: every answer is the one for a session that does not exist."""

    @pytest.fixture
    def bob(self, alice):
        chat(alice[1])
        post(alice[1], [QUESTION], conversation="other")
        return make_user("bob")

    def state(self, user: Any) -> Any:
        store = owned(user)
        return {
            sid: {
                "conversations": store.list_conversations(sid),
                "threads": {
                    c["conversation"]: store.get_messages(sid, conversation=c["conversation"])
                    for c in store.list_conversations(sid)
                },
            }
            for sid in store.list_sessions()
        }

    CALLS = [
        ("get", "messages/", None),
        ("get", "messages/?leaf=q1", None),
        ("get", "context/", None),
        ("get", "context/?conversation=other&max_tokens=5", None),
        ("get", "conversations/", None),
        ("put", "head/", {"message_id": "q1"}),
        ("put", "head/", {"message_id": "q1", "conversation": "other"}),
        ("delete", "messages/", None),
        ("delete", "messages/?conversation=other", None),
    ]

    def test_her_session_answers_as_one_that_does_not_exist(self, alice, bob):
        before = self.state(alice[0])
        client = bob[1]
        for method, path, body in self.CALLS:
            hers = getattr(client, method)(f"{API}sessions/{SID}/{path}", body, format="json")
            nobodys = getattr(client, method)(f"{API}sessions/chat-0/{path}", body, format="json")
            assert error_of(hers) == error_of(nobodys) == (404, "session_not_found"), (method, path)
            assert hers.json() == json.loads(json.dumps(nobodys.json()).replace("chat-0", SID))
            assert b"Paris" not in hers.content and b"~" not in hers.content
        assert self.state(alice[0]) == before
        assert owned(bob[0]).list_sessions() == []

    def test_appends_under_her_ids_write_his_own_conversation(self, alice, bob):
        before = self.state(alice[0])
        client = bob[1]
        # Her message id with other content: no conflict, his session is another one.
        response = client.post(
            MESSAGES, {"messages": [{"id": "q1", "role": "user", "content": "Bob's"}]}, format="json"
        )
        assert response.status_code == 201 and response.json()["messages"][0]["seq"] == 1
        assert ids(client.get(MESSAGES).json()["messages"]) == ["q1"]
        assert [c["conversation"] for c in client.get(CONVERSATIONS).json()["conversations"]] == ["default"]
        assert client.get(CONTEXT).json()["messages"] == [{"role": "user", "content": "Bob's"}]
        assert client.put(HEAD, {"message_id": "q1"}, format="json").status_code == 200
        assert client.delete(MESSAGES).json() == {"conversation": "default", "removed": 1}
        assert self.state(alice[0]) == before
        assert owned(bob[0]).list_sessions() == [SID]

    def test_idempotency_keys_are_per_owner(self, alice, bob):
        body = {"messages": [{"role": "user", "content": "same body"}]}
        hers = alice[1].post(MESSAGES, body, format="json", HTTP_IDEMPOTENCY_KEY="shared")
        his = bob[1].post(MESSAGES, body, format="json", HTTP_IDEMPOTENCY_KEY="shared")
        assert hers.status_code == his.status_code == 201
        assert his.json()["messages"][0]["seq"] == 1 and hers.json()["messages"][0]["seq"] == 6
        assert his.json()["messages"][0]["id"] != hers.json()["messages"][0]["id"]

    def test_anonymous_callers_are_refused(self, alice):
        client = APIClient()
        for method, path, body in [*self.CALLS, ("post", "messages/", {"messages": [QUESTION]})]:
            response = getattr(client, method)(f"{API}sessions/{SID}/{path}", body, format="json")
            assert error_of(response) == (401, "not_authenticated"), (method, path)


def test_the_schema_examples_work_as_they_are(api, store):
    """The request examples, pasted in order into the docs page, are each answered 2xx."""
    schema = api.get("/api/schema/?format=json").json()
    path = "/api/memory/sessions/{session_id}/"
    sent = []
    for route, method in [("messages/", "post"), ("head/", "put")]:
        operation = schema["paths"][path + route][method]
        examples = operation["requestBody"]["content"]["application/json"]["examples"]
        for name, example in examples.items():
            response = getattr(api, method)(f"{API}sessions/docs/{route}", example["value"], format="json")
            assert 200 <= response.status_code < 300, (name, response.content)
            sent.append(name)
    assert len(sent) == 5
    assert store.get_messages("docs")["head"] == "msg-1"
    threads = {c["conversation"]: c["message_count"] for c in store.list_conversations("docs")}
    assert threads == {"default": 4, "support": 2}


class TestRollingContext:
    def summarize_first_turn(self, store: MemoryStore) -> None:
        """A summary of the first turn (the question and what follows up to the answer)."""
        from persistent_memory.backends.conversations import Summary
        from persistent_memory.conversations.summaries import summary_tokens
        from persistent_memory.owners import storage_id

        text = "The user asked about the weather in Paris; it was 18 C and sunny."
        summary = Summary(text, "a1", 5, summary_tokens(text, "o200k_base"), 40)
        assert store.backend.commit_summary(storage_id(store.owner, SID), "default", None, summary)

    def test_the_summary_comes_first_and_the_messages_after_it(self, api, store):
        chat(api)
        post(api, [{"id": "q2", "role": "user", "content": "And tomorrow?"}])
        self.summarize_first_turn(store)
        body = api.get(CONTEXT, {"strategy": "rolling_summary"}).json()
        assert body["summary"].startswith("The user asked about the weather in Paris")
        assert body["summary_state"] == "healthy"
        # The pinned system message, then what the summary does not cover.
        assert [m["content"] for m in body["messages"]] == [SYSTEM["content"], "And tomorrow?"]
        assert body["truncated"] is False
        plain = api.get(CONTEXT).json()  # CONTEXT_STRATEGY is truncation: no summary
        assert "summary" not in plain and len(plain["messages"]) == 6

    def test_an_overflow_policy_of_error_answers_422(self, api, store):
        chat(api)
        post(api, [{"id": "q2", "role": "user", "content": "And tomorrow, and the day after, please?"}])
        self.summarize_first_turn(store)
        query = {"strategy": "rolling_summary", "overflow": "error", "max_tokens": 20}
        assert error_of(api.get(CONTEXT, query)) == (422, "context_overflow")
        query["overflow"] = "truncate_summary"
        body = api.get(CONTEXT, query).json()
        assert body["tokens"] <= 20 and body["truncated"] is True
        assert error_of(api.get(CONTEXT, {"strategy": "sometimes"}))[0] == 400
