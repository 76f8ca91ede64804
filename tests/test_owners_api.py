"""Owners through the REST API: each caller reaches only its own namespace.

Two ordinary users with tokens probe every endpoint against each other's sessions;
the owner resolvers (the default per user, a refusing one, the shared one, the
tenant one wired through a middleware), the closed-by-default permissions of a
project with DRF's defaults, the deployment checks, the per-owner quotas and the
per-owner throttle. The tests run on both backends through conftest's ``configure``
(but one about the memory backend's default cap), and the state is checked through
the store scoped to each owner, never only through the API that is under test.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlencode

import pytest
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.core.checks import run_checks
from rest_framework.authtoken.models import Token
from rest_framework.permissions import AllowAny
from rest_framework.settings import api_settings
from rest_framework.test import APIClient
from rest_framework.views import APIView

from persistent_memory import get_store
from persistent_memory.store import MemoryStore
from tests.timing import LIVE_TTL, wait_past

API = "/api/memory/"

#: Every endpoint but health/, with a body each would accept (ids the caller need not own).
MEMORY_ENDPOINTS: list[tuple[str, str, Any]] = [
    ("post", "enrich/", {"question": {"text": "q", "metadata": {"session_id": "s1"}}, "run_id": "r1"}),
    ("post", "store/", {"answer": {"text": "a", "metadata": {"session_id": "s1"}}}),
    ("post", "store/", {"answer": {"text": "a"}, "run_id": "r1"}),
    (
        "post",
        "process/",
        {
            "entries": [
                {"lane": "questions", "entry": {"text": "q", "metadata": {"session_id": "s1"}}},
                {"lane": "answers", "entry": {"text": "a"}},
            ]
        },
    ),
    ("get", "sessions/", None),
    ("post", "sessions/", {"session_id": "s2", "ttl_hours": 1}),
    ("get", "sessions/s1/", None),
    ("delete", "sessions/s1/", None),
    ("get", "sessions/s1/memory/", None),
    ("delete", "sessions/s1/memory/", None),
    ("get", "sessions/s1/memory/k/", None),
    ("put", "sessions/s1/memory/k/", {"value": 1}),
    ("delete", "sessions/s1/memory/k/", None),
    ("post", "sessions/s1/memory/k/increment/", {"amount": 1}),
    ("get", "sessions/s1/history/", None),
    ("post", "sessions/s1/summarize/", {}),
    ("post", "sessions/s1/messages/", {"messages": [{"role": "user", "content": "q"}]}),
    ("get", "sessions/s1/messages/", None),
    ("delete", "sessions/s1/messages/", None),
    ("get", "sessions/s1/context/", None),
    ("get", "sessions/s1/conversations/", None),
    ("put", "sessions/s1/head/", {"message_id": "m1"}),
]


# Resolvers and middleware that OWNER_RESOLVER and MIDDLEWARE name by import string.


def no_owner(request: Any) -> None:
    """A resolver that never finds an owner: every memory call must be refused."""
    return None


def bad_owner(request: Any) -> str:
    """A resolver that returns an owner the store cannot use (a space in it)."""
    return "has space"


class TenantFromHeader:
    """What a tenancy middleware does: put the request's tenant on ``request.tenant``.

    ``X-Tenant`` gives a plain string; ``X-Tenant-Schema`` an object with a
    ``schema_name``, as django-tenants sets.
    """

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        if "X-Tenant" in request.headers:
            request.tenant = request.headers["X-Tenant"]
        if "X-Tenant-Schema" in request.headers:
            request.tenant = SimpleNamespace(schema_name=request.headers["X-Tenant-Schema"], pk=999)
        return self.get_response(request)


# Helpers ---------------------------------------------------------------------


def error_of(response: Any) -> tuple[int, str]:
    """(status, code) of a JSON error answer."""
    assert response["Content-Type"] == "application/json", response.content
    body = response.json()
    assert set(body) >= {"detail", "code"}, body
    return response.status_code, body["code"]


def call(client: APIClient, method: str, path: str, body: Any = None) -> Any:
    return getattr(client, method)(API + path, body, format="json")


def question(session_id: str, text: str = "q") -> dict[str, Any]:
    return {"text": text, "metadata": {"session_id": session_id}}


def owner_of(user: Any) -> str:
    return f"user:{user.pk}"


def scoped(owner: str) -> MemoryStore:
    """The store as the API sees it for ``owner`` (fetched anew: settings rebuild it)."""
    return get_store().for_owner(owner)


def snapshot(owner: str) -> dict[str, Any]:
    """Everything ``owner`` holds: info (TTL, counts), values and whole history per session."""
    store = scoped(owner)
    return {
        sid: {
            "info": store.session_info(sid),
            "values": store.get_all(sid),
            "history": store.get_history(sid, 0),
        }
        for sid in store.list_sessions()
    }


def make_user(username: str, **extra: Any) -> tuple[Any, APIClient]:
    """An ordinary user and an API client that authenticates with its token."""
    user = get_user_model().objects.create_user(username, password="pw-for-tests", **extra)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return user, client


@pytest.fixture
def people(db, configure):
    """Alice and Bob, each with a token client, on the parametrized backend."""
    configure(AUTO_SUMMARIZE=False)
    alice, alice_api = make_user("alice")
    bob, bob_api = make_user("bob")
    return SimpleNamespace(alice=alice, alice_api=alice_api, bob=bob, bob_api=bob_api)


#: Alice's sessions and what Bob must never see of them.
A_CHAT, A_NOTE = "a-chat", "a-note"
#: Ids Alice never created, of the same length as hers (error details name the id).
UNKNOWN = {A_CHAT: "q-chat", A_NOTE: "q-note"}
SECRETS = ("alice-answer", "alice-pin-1234", "alice-topic")


@pytest.fixture
def alice_data(people):
    """Alice's sessions, written through the API: both lanes with a run id, values, a summary."""
    api = people.alice_api
    assert call(api, "post", "enrich/", {"question": question(A_CHAT), "run_id": "run-a"}).status_code == 200
    body = call(api, "post", "store/", {"answer": {"text": "alice-answer"}, "run_id": "run-a"}).json()
    assert body["memory"] == {"status": "stored", "session_id": A_CHAT, "answer_count": 1}
    assert call(api, "post", "sessions/", {"session_id": A_NOTE, "ttl_hours": 2}).status_code == 201
    for key, value in [("pin", "alice-pin-1234"), ("topic", {"name": "alice-topic"}), ("n", 5)]:
        assert call(api, "put", f"sessions/{A_NOTE}/memory/{key}/", {"value": value}).status_code == 200
    assert call(api, "post", f"sessions/{A_NOTE}/memory/n/increment/", {"amount": 2}).json() == {"value": 7}
    body = call(api, "post", f"sessions/{A_NOTE}/summarize/", {"max_history": 2}).json()
    assert body == {"session_id": A_NOTE, "summarized": True}
    state = snapshot(owner_of(people.alice))
    assert set(state) == {A_CHAT, A_NOTE}
    assert state[A_CHAT]["values"] == {"answer_count": 1, "last_answer": "alice-answer"}
    assert state[A_NOTE]["info"]["ttl_seconds"] == 7200 and state[A_NOTE]["info"]["history_length"] == 2
    return state


# 1. Another owner's sessions ------------------------------------------------------


class TestAnotherOwnersSessions:
    READS = [
        ("get", "sessions/{id}/", None),
        ("get", "sessions/{id}/memory/", None),
        ("get", "sessions/{id}/memory/pin/", None),
        ("get", "sessions/{id}/memory/last_answer/", None),
        ("get", "sessions/{id}/history/", None),
        ("get", "sessions/{id}/history/?limit=1", None),
        ("get", "sessions/{id}/messages/", None),
        ("get", "sessions/{id}/context/", None),
        ("get", "sessions/{id}/conversations/", None),
    ]
    WRITES = [
        ("put", "sessions/{id}/memory/pin/", {"value": "bob-was-here"}),
        ("put", "sessions/{id}/memory/new/", {"value": 1}),
        ("delete", "sessions/{id}/memory/pin/", None),
        ("delete", "sessions/{id}/memory/", None),
        ("post", "sessions/{id}/memory/n/increment/", {"amount": 100}),
        ("post", "sessions/{id}/memory/answer_count/increment/", {"amount": 100}),
        ("post", "sessions/{id}/summarize/", {"max_history": 1}),
        ("put", "sessions/{id}/head/", {"message_id": "m1"}),
        ("delete", "sessions/{id}/messages/", None),
        ("delete", "sessions/{id}/", None),
    ]

    def assert_as_unknown(self, client: APIClient, method: str, path: str, body: Any, sid: str) -> None:
        """The answer on ``sid`` equals the one on a never-created id of the same length."""
        unknown = UNKNOWN[sid]
        theirs = call(client, method, path.format(id=sid), body)
        nobodys = call(client, method, path.format(id=unknown), body)
        assert error_of(theirs) == error_of(nobodys) == (404, "session_not_found"), (method, path)
        assert theirs.json() == json.loads(json.dumps(nobodys.json()).replace(unknown, sid))
        assert "~" not in theirs.json()["detail"]  # no storage id, hence no owner, in the message
        for secret in SECRETS:
            assert secret.encode() not in theirs.content

    def test_reads_answer_as_for_a_session_that_does_not_exist(self, people, alice_data):
        for sid in (A_CHAT, A_NOTE):
            for method, path, body in self.READS:
                self.assert_as_unknown(people.bob_api, method, path, body, sid)
        assert scoped(owner_of(people.bob)).list_sessions() == []
        assert snapshot(owner_of(people.alice)) == alice_data

    def test_writes_answer_404_and_change_nothing(self, people, alice_data, backend_name, request):
        for sid in (A_CHAT, A_NOTE):
            for method, path, body in self.WRITES:
                self.assert_as_unknown(people.bob_api, method, path, body, sid)
        # Values, history, TTL and expiry of Alice's sessions are exactly as before.
        assert snapshot(owner_of(people.alice)) == alice_data
        assert scoped(owner_of(people.bob)).list_sessions() == []
        infos = get_store().list_session_infos(all_owners=True)
        assert {i["owner"] for i in infos} == {owner_of(people.alice)}
        if backend_name == "redis":
            # Not even a half-written key (a history list, a value) of Bob's was left behind.
            keys = request.getfixturevalue("redis_client").keys("*")
            assert not [k for k in keys if f"~o:{owner_of(people.bob)}~".encode() in k], keys
        # And Alice still reaches them through the API.
        assert (
            call(people.alice_api, "get", f"sessions/{A_NOTE}/memory/pin/").json()["value"]
            == "alice-pin-1234"
        )

    def test_lanes_with_her_ids_write_bobs_own_sessions(self, people, alice_data):
        bob = people.bob_api
        body = call(bob, "post", "enrich/", {"question": question(A_CHAT)}).json()
        # Bob's a-chat is new and empty: Alice's answer is not attached to his question.
        assert body["memory"] == {"status": "unchanged", "session_id": A_CHAT, "keys": []}
        assert "memory_context" not in body["question"]["metadata"]
        body = call(
            bob, "post", "store/", {"answer": {"text": "bob-answer", "metadata": {"session_id": A_CHAT}}}
        )
        assert body.json()["memory"] == {"status": "stored", "session_id": A_CHAT, "answer_count": 1}
        # POST sessions/ on her id is Bob's own 201, not a 409 that would tell him it exists.
        response = call(bob, "post", "sessions/", {"session_id": A_NOTE, "ttl_hours": 1})
        assert response.status_code == 201 and response.json()["owner"] == owner_of(people.bob)
        entries = [
            {"lane": "questions", "entry": question(A_NOTE)},
            {"lane": "answers", "entry": {"text": "bob-note-answer"}},
        ]
        outcomes = [
            e["memory"] for e in call(bob, "post", "process/", {"entries": entries}).json()["entries"]
        ]
        assert outcomes == [
            {"status": "unchanged", "session_id": A_NOTE, "keys": []},
            {"status": "stored", "session_id": A_NOTE, "answer_count": 1},
        ]
        assert snapshot(owner_of(people.alice)) == alice_data
        bobs = snapshot(owner_of(people.bob))
        assert bobs[A_CHAT]["values"] == {"answer_count": 1, "last_answer": "bob-answer"}
        assert bobs[A_NOTE]["values"] == {"answer_count": 1, "last_answer": "bob-note-answer"}
        assert bobs[A_NOTE]["info"]["ttl_seconds"] == 3600
        # The operator sees each id twice, once per owner.
        infos = get_store().list_session_infos(all_owners=True)
        assert sorted((i["owner"], i["session_id"]) for i in infos) == sorted(
            (owner_of(user), sid) for user in (people.alice, people.bob) for sid in (A_CHAT, A_NOTE)
        )

    def test_an_owner_named_in_the_request_is_ignored(self, people, alice_data):
        """Only the resolver decides the owner: not a body field, a query parameter or metadata."""
        bob, hers = people.bob_api, owner_of(people.alice)
        response = call(bob, "post", "sessions/", {"session_id": "b-1", "owner": hers})
        assert response.status_code == 201 and response.json()["owner"] == owner_of(people.bob)
        body = call(bob, "get", f"sessions/?owner={hers}&search=a-").json()
        assert body["count"] == 0
        assert error_of(call(bob, "get", f"sessions/{A_NOTE}/memory/?owner={hers}")) == (
            404,
            "session_not_found",
        )
        entry = {"text": "q", "metadata": {"session_id": A_CHAT, "owner": hers}}
        body = call(bob, "post", "enrich/", {"question": entry, "owner": hers}).json()
        assert body["memory"] == {"status": "unchanged", "session_id": A_CHAT, "keys": []}
        assert snapshot(hers) == alice_data
        assert scoped(owner_of(people.bob)).list_sessions() == [A_CHAT, "b-1"]

    def test_session_list_never_shows_hers(self, people, alice_data):
        bob, alice = people.bob_api, people.alice_api
        # Searches that look like storage ids or SCAN patterns must not leave his namespace.
        her_namespace = f"~o:{owner_of(people.alice)}~"
        searches = ["a-", A_CHAT, "*", "a*", "?-chat", "[a]-chat", "~o:", her_namespace, her_namespace + "a"]
        for query in ["", "?page_size=500", *(f"?{urlencode({'search': s})}" for s in searches)]:
            response = call(bob, "get", "sessions/" + query)
            assert response.status_code in (200, 400), (query, response.content)
            if response.status_code == 200:
                assert response.json()["count"] == 0 and response.json()["results"] == [], query
            assert b"alice" not in response.content and b"a-note" not in response.content
        call(bob, "post", "sessions/", {"session_id": "b-own"})
        call(bob, "post", "enrich/", {"question": question(A_CHAT)})
        body = call(bob, "get", "sessions/").json()
        assert body["count"] == 2
        assert {(s["owner"], s["session_id"]) for s in body["results"]} == {
            (owner_of(people.bob), "b-own"),
            (owner_of(people.bob), A_CHAT),
        }
        # Bob's a-chat is his: no key of Alice's counted in it.
        assert {s["session_id"]: s["key_count"] for s in body["results"]} == {"b-own": 0, A_CHAT: 0}
        body = call(alice, "get", "sessions/").json()
        assert {(s["owner"], s["session_id"]) for s in body["results"]} == {
            (owner_of(people.alice), A_CHAT),
            (owner_of(people.alice), A_NOTE),
        }

    def test_store_with_her_run_id_is_skipped_and_writes_nothing(self, people, alice_data):
        bob, alice = people.bob_api, people.alice_api
        body = call(bob, "post", "store/", {"answer": {"text": "bob-answer"}, "run_id": "run-a"}).json()
        assert body["memory"]["status"] == "skipped" and body["memory"]["session_id"] is None
        assert "run-a" in body["memory"]["reason"]
        assert scoped(owner_of(people.bob)).list_sessions() == []
        assert snapshot(owner_of(people.alice)) == alice_data
        # Run ids are per owner too: Bob binding run-a to his own session leaves hers alone.
        call(bob, "post", "enrich/", {"question": question("b-chat"), "run_id": "run-a"})
        body = call(alice, "post", "store/", {"answer": {"text": "alice-again"}, "run_id": "run-a"}).json()
        assert body["memory"] == {"status": "stored", "session_id": A_CHAT, "answer_count": 2}
        body = call(bob, "post", "store/", {"answer": {"text": "bob-answer"}, "run_id": "run-a"}).json()
        assert body["memory"] == {"status": "stored", "session_id": "b-chat", "answer_count": 1}
        assert scoped(owner_of(people.alice)).get(A_CHAT, "last_answer") == "alice-again"
        assert scoped(owner_of(people.bob)).get_all("b-chat") == {
            "answer_count": 1,
            "last_answer": "bob-answer",
        }

    def test_same_session_id_keeps_separate_values_history_and_ttl(self, people):
        alice, bob = people.alice_api, people.bob_api
        assert call(alice, "post", "sessions/", {"session_id": "chat-1", "ttl_hours": 1}).status_code == 201
        assert call(bob, "post", "sessions/", {"session_id": "chat-1", "ttl_hours": 3}).status_code == 201
        call(alice, "put", "sessions/chat-1/memory/topic/", {"value": "alice-topic"})
        call(bob, "put", "sessions/chat-1/memory/topic/", {"value": "bob-topic"})
        call(bob, "put", "sessions/chat-1/memory/extra/", {"value": [1, 2]})
        call(bob, "post", "sessions/chat-1/memory/n/increment/", {"amount": 3})
        call(bob, "post", "sessions/chat-1/memory/n/increment/", {"amount": 0})
        call(
            alice,
            "post",
            "store/",
            {"answer": {"text": "alice-answer", "metadata": {"session_id": "chat-1"}}},
        )
        assert call(alice, "get", "sessions/chat-1/memory/").json()["values"] == {
            "answer_count": 1,
            "last_answer": "alice-answer",
            "topic": "alice-topic",
        }
        assert call(bob, "get", "sessions/chat-1/memory/").json()["values"] == {
            "extra": [1, 2],
            "n": 3,
            "topic": "bob-topic",
        }
        # Her put and answer (last_answer, answer_count); his two puts and two increments.
        assert len(call(alice, "get", "sessions/chat-1/history/").json()["entries"]) == 3
        assert len(call(bob, "get", "sessions/chat-1/history/").json()["entries"]) == 4
        a_info = call(alice, "get", "sessions/chat-1/").json()
        b_info = call(bob, "get", "sessions/chat-1/").json()
        assert (a_info["owner"], a_info["ttl_seconds"]) == (owner_of(people.alice), 3600)
        assert (b_info["owner"], b_info["ttl_seconds"]) == (owner_of(people.bob), 3 * 3600)
        assert 3590 < a_info["ttl_remaining_seconds"] <= 3600
        assert 3 * 3600 - 10 < b_info["ttl_remaining_seconds"] <= 3 * 3600
        # Deleting Alice's leaves Bob's whole.
        assert call(alice, "delete", "sessions/chat-1/").json()["cleared"] == [
            "answer_count",
            "last_answer",
            "topic",
        ]
        assert scoped(owner_of(people.alice)).list_sessions() == []
        assert scoped(owner_of(people.bob)).get_all("chat-1") == {
            "extra": [1, 2],
            "n": 3,
            "topic": "bob-topic",
        }
        assert scoped(owner_of(people.bob)).session_info("chat-1")["history_length"] == 4


# 2. A resolver without an owner -----------------------------------------------------


@pytest.mark.parametrize("resolver", ["tests.test_owners_api.no_owner", "tests.test_owners_api.bad_owner"])
def test_no_usable_owner_refuses_every_memory_endpoint(db, configure, resolver):
    """No owner (None, or one the store cannot use): 403 owner_required, nothing written."""
    configure(OWNER_RESOLVER=resolver)
    _, client = make_user("alice")
    for method, path, body in MEMORY_ENDPOINTS:
        response = call(client, method, path, body)
        assert error_of(response) == (403, "owner_required"), (method, path, response.content)
    assert get_store().list_session_infos(all_owners=True) == []
    # The health check needs no owner.
    assert call(client, "get", "health/").json() == {"status": "ok"}


# 3. A project with DRF's defaults, and the deployment checks -------------------------


def use_rest_framework(settings: Any, monkeypatch: pytest.MonkeyPatch, conf: dict[str, Any]) -> None:
    """Make the project's REST_FRAMEWORK ``conf``, as if the project had started with it.

    DRF reloads ``api_settings`` on ``setting_changed``, but APIView's class attributes
    were read from the demo's settings at import time: set them from ``conf`` too.
    """
    settings.REST_FRAMEWORK = conf
    for name in ("authentication_classes", "permission_classes", "throttle_classes"):
        monkeypatch.setattr(APIView, name, getattr(api_settings, f"DEFAULT_{name.upper()}"))


@pytest.fixture
def drf_defaults(settings, monkeypatch):
    """A project whose REST_FRAMEWORK is empty: DRF's defaults, AllowAny among them."""
    use_rest_framework(settings, monkeypatch, {})
    assert APIView.permission_classes == [AllowAny]


def warning_ids() -> set[str]:
    return {
        m.id
        for m in run_checks(include_deployment_checks=True, databases=[])
        if m.id.startswith("persistent_memory.")
    }


class TestClosedByDefault:
    def test_anonymous_callers_are_refused_although_drf_allows_any(self, db, configure, drf_defaults):
        configure()
        client = APIClient()
        for method, path, body in MEMORY_ENDPOINTS:
            response = call(client, method, path, body)
            # DRF's first default authenticator (session) has no challenge to send: 403.
            assert error_of(response) == (403, "not_authenticated"), (method, path, response.content)
        assert get_store().list_session_infos(all_owners=True) == []
        response = call(client, "get", "health/")
        assert response.status_code == 200 and response.json() == {"status": "ok"}

    def test_token_project_allowing_any_answers_401_with_a_challenge(
        self, db, configure, settings, monkeypatch
    ):
        conf = {
            "DEFAULT_AUTHENTICATION_CLASSES": ["rest_framework.authentication.TokenAuthentication"],
            "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.AllowAny"],
        }
        use_rest_framework(settings, monkeypatch, conf)
        configure()
        for method, path, body in MEMORY_ENDPOINTS:
            response = call(APIClient(), method, path, body)
            assert error_of(response) == (401, "not_authenticated"), (method, path, response.content)
            assert response["WWW-Authenticate"] == "Token"
        assert get_store().list_session_infos(all_owners=True) == []

    def test_opened_api_still_needs_an_owner(self, db, configure, drf_defaults):
        configure(API_PERMISSION_CLASSES=["rest_framework.permissions.AllowAny"])
        for method, path, body in MEMORY_ENDPOINTS:
            assert error_of(call(APIClient(), method, path, body)) == (403, "owner_required"), (method, path)
        assert get_store().list_session_infos(all_owners=True) == []

    def test_deploy_checks_warn_about_open_api_and_shared_namespace(self, db, configure, drf_defaults):
        configure()
        ids = warning_ids()
        assert "persistent_memory.W002" not in ids and "persistent_memory.W003" not in ids
        configure(API_PERMISSION_CLASSES=["rest_framework.permissions.AllowAny"])
        assert "persistent_memory.W002" in warning_ids()
        configure(API_PERMISSION_CLASSES=["rest_framework.permissions.IsAuthenticated"])
        assert "persistent_memory.W002" not in warning_ids()
        configure(OWNER_RESOLVER="persistent_memory.owners.resolvers.shared_owner")
        ids = warning_ids()
        assert "persistent_memory.W003" in ids and "persistent_memory.W002" not in ids


# 4. Tenants --------------------------------------------------------------------------


def test_tenant_resolver_gives_each_tenant_its_own_namespace(db, configure, settings):
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "tests.test_owners_api.TenantFromHeader"]
    configure(OWNER_RESOLVER="persistent_memory.owners.resolvers.tenant_user_owner")
    user, plain = make_user("alice")
    token = f"Token {Token.objects.get(user=user).key}"
    clients = {}
    for tenant in ("acme", "globex"):
        clients[tenant] = APIClient()
        clients[tenant].credentials(HTTP_AUTHORIZATION=token, HTTP_X_TENANT=tenant)
    acme, globex = clients["acme"], clients["globex"]

    assert call(acme, "post", "sessions/", {"session_id": "chat-1", "ttl_hours": 1}).status_code == 201
    call(acme, "put", "sessions/chat-1/memory/topic/", {"value": "acme-topic"})
    assert error_of(call(globex, "get", "sessions/chat-1/")) == (404, "session_not_found")
    assert call(globex, "get", "sessions/").json()["count"] == 0
    assert call(globex, "post", "sessions/", {"session_id": "chat-1"}).status_code == 201
    call(globex, "put", "sessions/chat-1/memory/topic/", {"value": "globex-topic"})

    assert call(acme, "get", "sessions/chat-1/").json()["owner"] == f"tenant:acme/user:{user.pk}"
    assert call(globex, "get", "sessions/chat-1/").json()["owner"] == f"tenant:globex/user:{user.pk}"
    assert call(acme, "get", "sessions/chat-1/memory/topic/").json()["value"] == "acme-topic"
    assert call(globex, "get", "sessions/chat-1/memory/topic/").json()["value"] == "globex-topic"
    assert scoped(f"tenant:acme/user:{user.pk}").get("chat-1", "topic") == "acme-topic"
    # A tenant object (django-tenants' schema_name) names the same namespace as the string.
    schema = APIClient()
    schema.credentials(HTTP_AUTHORIZATION=token, HTTP_X_TENANT_SCHEMA="acme")
    assert call(schema, "get", "sessions/chat-1/memory/topic/").json()["value"] == "acme-topic"

    # No tenant, or a tenant that makes no valid owner: refused, nothing written.
    assert error_of(call(plain, "get", "sessions/")) == (403, "owner_required")
    assert error_of(call(plain, "post", "sessions/", {"session_id": "chat-2"})) == (403, "owner_required")
    bad = APIClient()
    bad.credentials(HTTP_AUTHORIZATION=token, HTTP_X_TENANT="bad tenant")
    assert error_of(call(bad, "post", "sessions/", {"session_id": "chat-3"})) == (403, "owner_required")
    # An anonymous caller with a tenant is still refused (closed by default).
    anonymous = APIClient()
    anonymous.credentials(HTTP_X_TENANT="acme")
    assert error_of(call(anonymous, "get", "sessions/"))[0] in (401, 403)
    infos = get_store().list_session_infos(all_owners=True)
    assert sorted((i["owner"], i["session_id"]) for i in infos) == [
        (f"tenant:acme/user:{user.pk}", "chat-1"),
        (f"tenant:globex/user:{user.pk}", "chat-1"),
    ]


# 5. The shared namespace -------------------------------------------------------------


def test_shared_resolver_puts_everyone_in_the_unowned_namespace(people, configure):
    """The old behaviour, kept as an opt-in: every caller sees every session, unowned."""
    operator = configure(OWNER_RESOLVER="persistent_memory.owners.resolvers.shared_owner")
    operator.create_session("node-1")  # a session the original node wrote (unowned)
    operator.put("node-1", "from", "node")
    alice, bob = people.alice_api, people.bob_api
    assert call(alice, "post", "sessions/", {"session_id": "shared-1"}).status_code == 201
    call(alice, "put", "sessions/shared-1/memory/note/", {"value": "from alice"})
    assert call(bob, "get", "sessions/shared-1/memory/note/").json()["value"] == "from alice"
    call(bob, "put", "sessions/shared-1/memory/reply/", {"value": "from bob"})
    assert call(alice, "get", "sessions/shared-1/memory/").json()["values"] == {
        "note": "from alice",
        "reply": "from bob",
    }
    listed = call(bob, "get", "sessions/").json()["results"]
    assert {(s["owner"], s["session_id"]) for s in listed} == {("", "shared-1"), ("", "node-1")}
    assert call(alice, "get", "sessions/node-1/memory/from/").json()["value"] == "node"
    assert operator.session_info("shared-1")["owner"] == ""
    assert operator.get_all("shared-1") == {"note": "from alice", "reply": "from bob"}
    assert {i["owner"] for i in operator.list_session_infos(all_owners=True)} == {""}
    for user in (people.alice, people.bob):
        assert scoped(owner_of(user)).list_sessions() == []


# 6. Quotas ---------------------------------------------------------------------------


class TestQuotas:
    def test_sessions_per_owner(self, people, configure):
        configure(MAX_SESSIONS_PER_OWNER=2)
        alice, bob = people.alice_api, people.bob_api
        assert call(alice, "post", "sessions/", {"session_id": "s1"}).status_code == 201
        assert call(alice, "post", "enrich/", {"question": question("s2")}).status_code == 200
        refused = call(alice, "post", "sessions/", {"session_id": "s3"})
        assert error_of(refused) == (507, "capacity_exceeded")
        # On every backend the caller is told which setting holds it back.
        told = "This owner holds its maximum of 2 sessions (MAX_SESSIONS_PER_OWNER)."
        assert refused.json()["detail"] == told
        assert error_of(call(alice, "post", "enrich/", {"question": question("s4")})) == (
            507,
            "capacity_exceeded",
        )
        answer = {"answer": {"text": "a", "metadata": {"session_id": "s5"}}}
        assert error_of(call(alice, "post", "store/", answer)) == (507, "capacity_exceeded")
        # Her existing sessions still work.
        assert call(alice, "post", "enrich/", {"question": question("s1")}).status_code == 200
        assert scoped(owner_of(people.alice)).list_sessions() == ["s1", "s2"]
        # Bob has his own allowance.
        assert call(bob, "post", "sessions/", {"session_id": "s3"}).status_code == 201
        assert call(bob, "post", "enrich/", {"question": question("s4")}).status_code == 200
        assert scoped(owner_of(people.bob)).list_sessions() == ["s3", "s4"]
        # Deleting one of hers makes room again.
        assert call(alice, "delete", "sessions/s1/").status_code == 200
        assert call(alice, "post", "sessions/", {"session_id": "s3"}).status_code == 201

    def test_expired_sessions_do_not_count(self, people, configure):
        configure(MAX_SESSIONS_PER_OWNER=2)
        store = scoped(owner_of(people.alice))
        store.create_session("old-1", ttl_seconds=LIVE_TTL)
        old = store.create_session("old-2", ttl_seconds=LIVE_TTL)
        assert error_of(call(people.alice_api, "post", "sessions/", {"session_id": "s1"}))[0] == 507
        wait_past(old["expires_at"])  # the later of the two
        assert call(people.alice_api, "post", "sessions/", {"session_id": "s1"}).status_code == 201
        assert call(people.alice_api, "post", "enrich/", {"question": question("s2")}).status_code == 200
        assert scoped(owner_of(people.alice)).list_sessions() == ["s1", "s2"]

    def test_process_stops_at_the_quota_and_reports_what_completed(self, people, configure):
        configure(MAX_SESSIONS_PER_OWNER=1)
        entries = [
            {"lane": "questions", "entry": question("s1")},
            {"lane": "answers", "entry": {"text": "one"}},
            {"lane": "questions", "entry": question("s2")},
            {"lane": "answers", "entry": {"text": "two"}},
        ]
        response = call(people.alice_api, "post", "process/", {"entries": entries})
        assert error_of(response) == (507, "capacity_exceeded")
        assert [e["memory"]["session_id"] for e in response.json()["completed"]] == ["s1", "s1"]
        assert scoped(owner_of(people.alice)).get_all("s1") == {"answer_count": 1, "last_answer": "one"}
        assert scoped(owner_of(people.alice)).list_sessions() == ["s1"]

    def test_unset_cap_on_memory_backend_lets_one_user_use_every_place(self, db, settings):
        settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "MAX_SESSIONS": 20, "MIRROR_MODE": "off"}
        alice_user, alice = make_user("alice")
        _, bob = make_user("bob")
        sids = [f"s{i:02}" for i in range(20)]
        for sid in sids:
            assert call(alice, "post", "sessions/", {"session_id": sid}).status_code == 201
        refused = call(alice, "post", "sessions/", {"session_id": "s20"})
        assert error_of(refused) == (507, "capacity_exceeded")
        assert "raise MAX_SESSIONS" in refused.json()["detail"]
        assert call(bob, "post", "sessions/", {"session_id": "s1"}).status_code == 201
        assert scoped(owner_of(alice_user)).list_sessions() == sids

    def test_session_bytes(self, people, configure):
        configure(MAX_SESSION_BYTES=200, AUTO_SUMMARIZE=False)
        alice, bob = people.alice_api, people.bob_api
        for client in (alice, bob):
            call(client, "post", "sessions/", {"session_id": "s1"})
            # "k1" + '"xxx…"' (96 x and 2 quotes): 100 bytes.
            assert call(client, "put", "sessions/s1/memory/k1/", {"value": "x" * 96}).status_code == 200
        before = snapshot(owner_of(people.alice))
        # 2 + 102 more would make 204 bytes.
        response = call(alice, "put", "sessions/s1/memory/k2/", {"value": "y" * 100})
        assert error_of(response) == (507, "capacity_exceeded")
        assert snapshot(owner_of(people.alice)) == before  # not stored, no history entry
        assert error_of(call(alice, "get", "sessions/s1/memory/k2/")) == (404, "key_not_found")
        # The answers lane counts too.
        answer = {"answer": {"text": "z" * 150, "metadata": {"session_id": "s1"}}}
        assert error_of(call(alice, "post", "store/", answer)) == (507, "capacity_exceeded")
        assert snapshot(owner_of(people.alice)) == before
        # Exactly 200 bytes fits.
        assert call(alice, "put", "sessions/s1/memory/k2/", {"value": "y" * 96}).status_code == 200
        # Bob's session is counted on its own: he can still go to 200 bytes.
        assert call(bob, "put", "sessions/s1/memory/k2/", {"value": "y" * 96}).status_code == 200
        assert scoped(owner_of(people.bob)).get("s1", "k2") == "y" * 96
        assert scoped(owner_of(people.alice)).get_all("s1") == {"k1": "x" * 96, "k2": "y" * 96}
        # Her session is full: one more byte is refused, freed bytes can be used again.
        assert error_of(call(alice, "put", "sessions/s1/memory/k/", {"value": 1}))[0] == 507
        assert call(alice, "delete", "sessions/s1/memory/k2/").json()["cleared"] == ["k2"]
        assert call(alice, "put", "sessions/s1/memory/k3/", {"value": "w" * 96}).status_code == 200
        assert error_of(call(alice, "put", "sessions/s1/memory/k1/", {"value": "x" * 97}))[0] == 507
        assert call(alice, "put", "sessions/s1/memory/k1/", {"value": "v" * 96}).status_code == 200
        assert call(alice, "delete", "sessions/s1/memory/").json()["cleared"] == ["k1", "k3"]
        assert call(alice, "put", "sessions/s1/memory/big/", {"value": "b" * 195}).status_code == 200
        assert scoped(owner_of(people.alice)).get_all("s1") == {"big": "b" * 195}
        # An increment that would add a digit past the cap is refused too, and stores nothing.
        call(alice, "delete", "sessions/s1/memory/")
        # "big" + 195 bytes, then "n" + "9": 200 bytes; "n" + "10" would be 201.
        assert call(alice, "put", "sessions/s1/memory/big/", {"value": "b" * 193}).status_code == 200
        assert call(alice, "post", "sessions/s1/memory/n/increment/", {"amount": 9}).json() == {"value": 9}
        response = call(alice, "post", "sessions/s1/memory/n/increment/", {"amount": 1})
        assert error_of(response) == (507, "capacity_exceeded")
        assert scoped(owner_of(people.alice)).get("s1", "n") == 9

    def test_value_too_large(self, people, configure):
        configure(MAX_VALUE_BYTES=50)
        alice = people.alice_api
        call(alice, "post", "sessions/", {"session_id": "s1"})
        response = call(alice, "put", "sessions/s1/memory/k/", {"value": "x" * 60})
        assert error_of(response) == (413, "value_too_large")
        answer = {"answer": {"text": "x" * 60, "metadata": {"session_id": "s1"}}}
        assert error_of(call(alice, "post", "store/", answer)) == (413, "value_too_large")
        store = scoped(owner_of(people.alice))
        assert store.get_all("s1") == {} and store.get_history("s1", 0) == []
        assert call(alice, "put", "sessions/s1/memory/k/", {"value": "x" * 40}).status_code == 200


# 7. Throttling -----------------------------------------------------------------------


@pytest.fixture
def empty_cache():
    """The throttle's counts live in Django's cache: start from none, leave none behind."""
    cache.clear()
    yield
    cache.clear()


def test_owner_throttle_gives_each_owner_its_own_budget(people, configure, empty_cache):
    configure(
        API_THROTTLE_CLASSES=["persistent_memory.api.throttling.OwnerRateThrottle"],
        API_THROTTLE_RATES={"persistent_memory": "3/min"},
    )
    alice, bob = people.alice_api, people.bob_api
    for _ in range(3):
        assert call(alice, "get", "sessions/").status_code == 200
    response = call(alice, "get", "sessions/")
    assert error_of(response) == (429, "throttled")
    retry_after = response["Retry-After"]
    assert retry_after.isdigit() and 0 < int(retry_after) <= 60
    # Every endpoint shares her budget, and nothing is written while she is throttled.
    assert error_of(call(alice, "post", "sessions/", {"session_id": "s1"})) == (429, "throttled")
    assert scoped(owner_of(people.alice)).list_sessions() == []
    # Bob's budget is his own; health is never throttled.
    for _ in range(3):
        assert call(bob, "get", "sessions/").status_code == 200
    assert error_of(call(bob, "get", "sessions/")) == (429, "throttled")
    assert call(alice, "get", "health/").json() == {"status": "ok"}


def test_owner_throttle_in_the_shared_namespace_is_per_user(people, configure, empty_cache):
    # Everyone's owner is "" there: one budget for all would let one caller starve the rest.
    configure(
        API_THROTTLE_CLASSES=["persistent_memory.api.throttling.OwnerRateThrottle"],
        API_THROTTLE_RATES={"persistent_memory": "2/min"},
        OWNER_RESOLVER="persistent_memory.owners.resolvers.shared_owner",
    )
    for _ in range(2):
        assert call(people.alice_api, "get", "sessions/").status_code == 200
    assert error_of(call(people.alice_api, "get", "sessions/")) == (429, "throttled")
    assert call(people.bob_api, "get", "sessions/").status_code == 200
