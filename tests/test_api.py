"""The REST API through DRF's test client, on both backends, with the demo site's token auth."""

from __future__ import annotations

import json
import time

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from persistent_memory.backends.redis.functions import library_calls

API = "/api/memory/"
#: The API's user has this primary key, so its sessions are this owner's.
USER_PK = 4242
OWNER = f"user:{USER_PK}"


@pytest.fixture(params=["memory", "redis", "redis-cluster"])
def backend_name(request: pytest.FixtureRequest) -> str:
    """The API on both backends, and on a real Redis Cluster."""
    return request.param


@pytest.fixture
def configure(configure):
    """conftest's, returning the store scoped to the API user's owner."""
    return lambda **extra: configure(**extra).for_owner(OWNER)


@pytest.fixture
def store(configure):
    """The API user's sessions (the API scopes every call to the caller's owner)."""
    return configure()


@pytest.fixture
def api(db, store):
    user = get_user_model().objects.create_user("pipeline", password="pw-for-tests", pk=USER_PK)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


def error_of(response):
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert set(body) >= {"detail", "code"}
    return response.status_code, body["code"]


def question(session_id=None, text="q", **metadata):
    if session_id is not None:
        metadata["session_id"] = session_id
    return {"text": text, "metadata": metadata}


class TestAuth:
    def test_anonymous_is_refused_everywhere_but_health(self, db, store):
        client = APIClient()
        for method, path in [
            ("post", "enrich/"),
            ("post", "store/"),
            ("post", "process/"),
            ("get", "sessions/"),
            ("get", "sessions/s1/"),
            ("get", "sessions/s1/memory/"),
            ("get", "sessions/s1/history/"),
        ]:
            response = getattr(client, method)(API + path, {}, format="json")
            assert error_of(response) == (401, "not_authenticated")
        assert store.list_sessions() == []
        assert client.get(API + "health/").status_code == 200

    def test_wrong_token(self, db, store):
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")
        assert error_of(client.get(API + "sessions/")) == (401, "authentication_failed")

    def test_session_login_works_too(self, db, store):
        user = get_user_model().objects.create_user("staff", password="pw-for-tests")
        client = APIClient()
        client.force_login(user)
        assert client.get(API + "sessions/").status_code == 200

    def test_settings_override_the_project_defaults(self, db, configure):
        configure(
            API_PERMISSION_CLASSES=["rest_framework.permissions.AllowAny"],
            API_AUTHENTICATION_CLASSES=[],
        )
        # Let in, but an anonymous caller has no owner: refused all the same.
        assert error_of(APIClient().get(API + "sessions/")) == (403, "owner_required")
        configure(
            API_PERMISSION_CLASSES=["rest_framework.permissions.AllowAny"],
            API_AUTHENTICATION_CLASSES=[],
            OWNER_RESOLVER="persistent_memory.owners.resolvers.shared_owner",
        )
        assert APIClient().get(API + "sessions/").status_code == 200
        configure(API_PERMISSION_CLASSES=["rest_framework.permissions.IsAdminUser"])
        user = get_user_model().objects.create_user("plain", password="pw-for-tests")
        client = APIClient()
        client.force_login(user)
        assert error_of(client.get(API + "sessions/")) == (403, "permission_denied")


class TestLanes:
    def test_enrich_then_store_round_trip(self, api, store):
        response = api.post(API + "enrich/", {"question": question("s1", "hi", lang="en")}, format="json")
        assert response.status_code == 200
        first = question("s1", "hi", lang="en")
        first["metadata"]["conversation"] = {"messages": [], "tokens": 0, "truncated": False}
        assert response.json() == {
            "question": first,
            "memory": {"status": "unchanged", "session_id": "s1", "keys": []},
        }
        response = api.post(
            API + "store/", {"answer": {"text": "hello", "metadata": {"session_id": "s1"}}}, format="json"
        )
        assert response.json()["memory"] == {"status": "stored", "session_id": "s1", "answer_count": 1}
        body = api.post(
            API + "enrich/", {"question": question("s1", "again", extra=[1])}, format="json"
        ).json()
        window = body["question"]["metadata"].pop("conversation")
        assert body["question"]["metadata"] == {
            "session_id": "s1",
            "extra": [1],
            "memory_context": {"answer_count": 1, "last_answer": "hello"},
        }
        # The conversation so far, before this question (recorded after it is read).
        said = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
        assert window["messages"] == said
        assert window["tokens"] > 0 and window["truncated"] is False
        assert body["question"]["text"] == "again"
        assert body["memory"] == {
            "status": "enriched",
            "session_id": "s1",
            "keys": ["answer_count", "last_answer"],
        }

    def test_every_caller_field_comes_back(self, api):
        entry = {
            "text": "q",
            "id": 9,
            "nested": {"a": [1, {"b": None}]},
            "metadata": {"session_id": "s1", "x": 1.5},
        }
        body = api.post(API + "enrich/", {"question": entry}, format="json").json()
        assert body["question"]["metadata"].pop("conversation")["messages"] == []
        assert body["question"] == entry

    def test_store_falls_back_through_run_id(self, api, store):
        api.post(API + "enrich/", {"question": question("s1"), "run_id": "run-1"}, format="json")
        body = api.post(API + "store/", {"answer": {"text": "a1"}, "run_id": "run-1"}, format="json").json()
        assert body["memory"] == {"status": "stored", "session_id": "s1", "answer_count": 1}
        assert store.get("s1", "last_answer") == "a1"
        body = api.post(API + "store/", {"answer": {"text": "a2"}, "run_id": "run-2"}, format="json").json()
        assert body["memory"]["status"] == "skipped" and "run-2" in body["memory"]["reason"]
        body = api.post(API + "store/", {"answer": {"text": "a3"}}, format="json").json()
        assert body["memory"]["status"] == "skipped"
        assert store.get("s1", "answer_count") == 1

    def test_a_deleted_session_is_not_reached_through_its_run_id(self, api, store):
        api.post(API + "enrich/", {"question": question("s1"), "run_id": "run-1"}, format="json")
        assert api.delete(API + "sessions/s1/").status_code == 200
        assert api.post(API + "sessions/", {"session_id": "s1"}, format="json").status_code == 201
        body = api.post(API + "store/", {"answer": {"text": "late"}, "run_id": "run-1"}, format="json").json()
        assert body["memory"]["status"] == "skipped"
        assert store.get_all("s1") == {}  # the new session under the same id is not reached
        # Deleted and not created again: the answer does not recreate it.
        api.post(API + "enrich/", {"question": question("s2"), "run_id": "run-2"}, format="json")
        assert api.delete(API + "sessions/s2/").status_code == 200
        body = api.post(API + "store/", {"answer": {"text": "late"}, "run_id": "run-2"}, format="json").json()
        assert body["memory"]["status"] == "skipped"
        assert store.list_sessions() == ["s1"]

    @pytest.mark.parametrize("bad", ["bad id", "a:b", "x" * 129, 7, None, ""])
    def test_bad_session_id_is_skipped_not_an_error(self, api, store, bad):
        entry = question(bad)
        body = api.post(API + "enrich/", {"question": entry}, format="json").json()
        assert (
            body["question"] == entry and body["memory"]["status"] == "skipped" and body["memory"]["reason"]
        )
        body = api.post(
            API + "store/", {"answer": {"text": "t", "metadata": {"session_id": bad}}}, format="json"
        ).json()
        assert body["memory"]["status"] == "skipped"
        assert store.list_sessions() == []

    @pytest.mark.parametrize(
        ("path", "body"),
        [
            ("enrich/", {}),
            ("enrich/", {"question": "text"}),
            ("enrich/", {"question": {"text": "q", "metadata": [1]}}),
            ("enrich/", {"question": {"text": "q", "metadata": None}}),
            ("store/", {"answer": {"metadata": {"session_id": "s1"}}}),
            ("store/", {"answer": {"text": 5, "metadata": {"session_id": "s1"}}}),
            ("store/", {"answer": {"text": "t", "metadata": "s1"}}),
            ("process/", {"entries": {"lane": "questions"}}),
            ("process/", {"entries": [{"lane": "sideways", "entry": {}}]}),
            ("process/", {"entries": [{"lane": "answers", "entry": {"metadata": {"session_id": "s1"}}}]}),
            ("process/", {}),
        ],
    )
    def test_wrong_shapes_are_400_and_change_nothing(self, api, store, path, body):
        assert error_of(api.post(API + path, body, format="json")) == (400, "invalid")
        assert store.list_sessions() == []

    def test_malformed_run_id_is_400(self, api, store):
        for path, body in [
            ("enrich/", {"question": question("s1"), "run_id": "run 1"}),
            ("store/", {"answer": {"text": "t"}, "run_id": "a:b"}),
        ]:
            assert error_of(api.post(API + path, body, format="json")) == (400, "invalid_run_id")
        assert store.list_sessions() == []

    def test_malformed_json_is_400(self, api):
        response = api.generic("POST", API + "enrich/", "{not json", content_type="application/json")
        assert error_of(response) == (400, "parse_error")
        response = api.generic("POST", API + "enrich/", '{"question": NaN}', content_type="application/json")
        assert error_of(response)[0] == 400

    def test_process_batch_with_fallback(self, api, store):
        entries = [
            {"lane": "questions", "entry": question("s1")},
            {"lane": "answers", "entry": {"text": "first"}},
            {"lane": "questions", "entry": question("s2")},
            {"lane": "answers", "entry": {"text": "second"}},
            {"lane": "answers", "entry": {"text": "explicit", "metadata": {"session_id": "s1"}}},
            {"lane": "questions", "entry": question("s1")},
        ]
        body = api.post(API + "process/", {"entries": entries}, format="json").json()
        outcomes = [item["memory"] for item in body["entries"]]
        assert [o["status"] for o in outcomes] == [
            "unchanged",
            "stored",
            "unchanged",
            "stored",
            "stored",
            "enriched",
        ]
        assert [o["session_id"] for o in outcomes] == ["s1", "s1", "s2", "s2", "s1", "s1"]
        assert outcomes[4]["answer_count"] == 2
        assert body["entries"][5]["entry"]["metadata"]["memory_context"] == {
            "answer_count": 2,
            "last_answer": "explicit",
        }
        assert [item["lane"] for item in body["entries"]] == [e["lane"] for e in entries]

    def test_process_batch_limit(self, api, configure):
        store = configure(MAX_BATCH=3)
        entries = [{"lane": "questions", "entry": question(f"s{i}")} for i in range(4)]
        response = api.post(API + "process/", {"entries": entries}, format="json")
        assert error_of(response) == (400, "invalid")
        assert "At most 3 entries" in json.dumps(response.json()["errors"])
        assert store.list_sessions() == []
        assert api.post(API + "process/", {"entries": entries[:3]}, format="json").status_code == 200
        assert store.list_sessions() == ["s0", "s1", "s2"]

    def test_process_reports_what_completed_before_an_error(self, api, store):
        store.create_session("s2")
        store.put("s2", "answer_count", "not a number")
        entries = [
            {"lane": "answers", "entry": {"text": "ok", "metadata": {"session_id": "s1"}}},
            {"lane": "answers", "entry": {"text": "bad", "metadata": {"session_id": "s2"}}},
            {"lane": "answers", "entry": {"text": "never", "metadata": {"session_id": "s3"}}},
        ]
        response = api.post(API + "process/", {"entries": entries}, format="json")
        assert error_of(response) == (400, "not_a_number")
        assert [item["memory"]["session_id"] for item in response.json()["completed"]] == ["s1"]
        assert store.get("s1", "last_answer") == "ok"
        assert store.get_all("s2") == {"answer_count": "not a number"}
        assert "s3" not in store.list_sessions()


class TestSessions:
    def test_create_and_info(self, api, store):
        response = api.post(API + "sessions/", {"session_id": "s1", "ttl_hours": 2}, format="json")
        assert response.status_code == 201
        body = response.json()
        assert body["session_id"] == "s1" and body["ttl_seconds"] == 7200
        assert 7190 < body["ttl_remaining_seconds"] <= 7200
        assert body["expires_at"] == pytest.approx(body["created_at"] + 7200)
        info = api.get(API + "sessions/s1/").json()
        assert info["owner"] == OWNER
        assert set(info) == {
            "session_id",
            "owner",
            "created_at",
            "expires_at",
            "ttl_seconds",
            "ttl_remaining_seconds",
            "key_count",
            "history_length",
            "idle_ttl_seconds",
            "expires_by",
        }
        assert error_of(api.post(API + "sessions/", {"session_id": "s1"}, format="json")) == (
            409,
            "session_exists",
        )

    def test_create_without_ttl_uses_default(self, api, store):
        body = api.post(API + "sessions/", {"session_id": "s1"}, format="json").json()
        assert body["ttl_seconds"] is None
        if store.backend.name == "memory":  # the idle TTL of 30 days, from its creation
            assert body["idle_ttl_seconds"] == 30 * 24 * 3600 and body["expires_by"] == "idle"
            assert body["created_at"] + 30 * 24 * 3600 == pytest.approx(body["expires_at"], abs=60)
        else:
            assert body["expires_at"] is None and body["ttl_remaining_seconds"] is None
        body = api.post(API + "sessions/", {"session_id": "s2", "ttl_hours": 0}, format="json").json()
        assert body["ttl_seconds"] is None

    @pytest.mark.parametrize(
        ("body", "code"),
        [
            ({"session_id": "a b"}, "invalid_session_id"),
            ({"session_id": "__meta__"}, "invalid_session_id"),
            ({}, "invalid"),
            ({"session_id": "s1", "ttl_hours": -1}, "invalid"),
            ({"session_id": "s1", "ttl_hours": "soon"}, "invalid"),
        ],
    )
    def test_create_refusals(self, api, store, body, code):
        assert error_of(api.post(API + "sessions/", body, format="json")) == (400, code)
        assert store.list_sessions() == []

    def test_list_newest_first_paginated_and_searchable(self, api, store):
        for i in range(5):
            store.create_session(f"chat-{i}")
            time.sleep(0.002)
        store.create_session("other")
        body = api.get(API + "sessions/?page_size=2").json()
        assert body["count"] == 6
        assert [s["session_id"] for s in body["results"]] == ["other", "chat-4"]
        assert body["next"] and body["previous"] is None
        page3 = api.get(API + "sessions/?page_size=2&page=3").json()
        assert [s["session_id"] for s in page3["results"]] == ["chat-1", "chat-0"]
        found = api.get(API + "sessions/?search=chat-").json()
        assert found["count"] == 5
        assert error_of(api.get(API + "sessions/?page=99"))[0] == 404

    @pytest.fixture
    def pages_only(self, store, monkeypatch):
        """The backend refuses to list every session: the listing reads one page."""

        def everything(*args, **kwargs):
            raise AssertionError("the listing read every session")

        for name in ("list_session_infos", "list_sessions", "scan_sessions"):
            monkeypatch.setattr(store.backend, name, everything)

    def test_list_pages_are_read_one_at_a_time(self, api, store, backend_name, request, pages_only):
        for i in range(7):
            store.create_session(f"s{i}")
            time.sleep(0.002)
        store.create_session("other")
        redis_client = request.getfixturevalue("redis_client") if backend_name == "redis" else None
        url = "http://testserver" + API + "sessions/"

        def page(query):
            if redis_client is not None:
                redis_client.config_resetstat()
            body = api.get(API + "sessions/" + query).json()
            if redis_client is not None:  # one FCALL per page (its own commands are counted too)
                stats = redis_client.info("commandstats")
                assert library_calls(stats) == 1
                assert not {"cmdstat_scan", "cmdstat_sscan", "cmdstat_zscan", "cmdstat_smembers"} & set(stats)
            return body["count"], [s["session_id"] for s in body["results"]], body["next"], body["previous"]

        def cursor_of(link, rest):  # a cursor link: the page's query with the cursor
            assert link.startswith(url + "?cursor=") and link.endswith(rest), link
            return link[len(url) :]

        count, ids, following, previous = page("?page_size=3")
        assert (count, ids, previous) == (8, ["other", "s6", "s5"], None)
        count, ids, following, previous = page(cursor_of(following, "&page_size=3"))
        assert (count, ids, previous) == (8, ["s4", "s3", "s2"], None)  # a cursor reads forward only
        assert page(cursor_of(following, "&page_size=3")) == (8, ["s1", "s0"], None, None)
        count, ids, following, previous = page("?page_size=3&page=2")
        assert (count, ids, previous) == (8, ["s4", "s3", "s2"], url + "?page_size=3")
        last = (8, ["s1", "s0"], None, url + "?page=2&page_size=3")
        assert page(cursor_of(following, "&page_size=3")) == (*last[:2], None, None)
        assert page("?page_size=3&page=3") == last
        assert page("?search=s&page_size=3&page=3") == (
            7,
            ["s0"],
            None,
            url + "?page=2&page_size=3&search=s",
        )
        count, ids, following, _ = page("?search=s&page_size=6")
        assert (count, ids) == (7, ["s6", "s5", "s4", "s3", "s2", "s1"])
        assert page(cursor_of(following, "&page_size=6&search=s")) == (7, ["s0"], None, None)
        assert page("?search=s5") == (1, ["s5"], None, None)
        assert page("?search=nothing") == (0, [], None, None)
        for query in ("?page_size=3&page=4", "?page=0", "?page=two", "?page=1.0"):
            assert error_of(api.get(API + "sessions/" + query)) == (404, "not_found")
        body = api.get(API + "sessions/?page_size=3&page=last").json()
        assert (body["count"], [s["session_id"] for s in body["results"]]) == last[:2]

    def test_list_cursor_and_page_refusals(self, api, store, configure, pages_only):
        for i in range(4):
            store.create_session(f"s{i}")
        following = api.get(API + "sessions/?page_size=1").json()["next"]
        cursor = following.split("cursor=")[1].split("&")[0]
        other = configure().for_owner("user:9")  # another owner's cursor
        other.create_session("x1")
        other.create_session("x2")
        theirs = other.session_page(limit=1).next_cursor
        for query in (
            "?cursor=",
            "?cursor=garbage",
            f"?cursor={cursor[:-2]}",
            f"?cursor={cursor}&search=s",  # another search's
            f"?cursor={theirs}",
            "?cursor=" + "A" * 5000,
        ):
            response = api.get(API + "sessions/" + query)
            assert error_of(response) == (400, "invalid_cursor"), query
            assert "x1" not in response.content.decode() and "x2" not in response.content.decode()
        # Past the last page is DRF's 404 however deep; a page that exists past the first
        # 1,000 sessions is refused with the way to reach it.
        assert error_of(api.get(API + "sessions/?page_size=500&page=4")) == (404, "not_found")  # 1,500 in
        deep = configure(MAX_SESSIONS=5_000)  # the memory backend's default holds 1,000
        for i in range(1_600):
            deep.create_session(f"d{i}")
        status, code = error_of(api.get(API + "sessions/?page_size=500&page=4"))
        assert (status, code) == (400, "page_too_deep")
        assert "cursor" in api.get(API + "sessions/?page_size=500&page=4").json()["detail"]
        assert error_of(api.get(API + "sessions/?page_size=500&page=5")) == (404, "not_found")  # 2,000 in
        assert len(api.get(API + "sessions/?page_size=500&page=3").json()["results"]) == 500  # 1,000 in

    def test_list_leaves_out_expired_sessions(self, api, store, pages_only):
        for i in range(4):
            store.create_session(f"s{i}", ttl_seconds=0.2 if i % 2 else None)
        time.sleep(0.3)
        body = api.get(API + "sessions/?page_size=2").json()
        assert (body["count"], body["next"]) == (2, None)
        assert [s["session_id"] for s in body["results"]] == ["s2", "s0"]

    def test_delete(self, api, store):
        store.create_session("s1")
        store.put("s1", "b", 1)
        store.put("s1", "a", 2)
        assert api.delete(API + "sessions/s1/").json() == {"session_id": "s1", "cleared": ["a", "b"]}
        assert store.list_sessions() == []
        assert error_of(api.delete(API + "sessions/s1/")) == (404, "session_not_found")

    def test_expired_session_is_410(self, api, store):
        store.create_session("s1", ttl_seconds=0.1)
        time.sleep(0.2)
        assert error_of(api.get(API + "sessions/s1/memory/")) == (410, "session_expired")

    def test_unknown_and_malformed_ids(self, api, store):
        assert error_of(api.get(API + "sessions/nope/")) == (404, "session_not_found")
        assert error_of(api.get(API + "sessions/bad%20id/")) == (400, "invalid_session_id")
        assert error_of(api.get(API + "sessions/s1/memory/bad%3Akey/")) == (400, "invalid_key")


class TestValues:
    def test_put_get_all_clear(self, api, store):
        store.create_session("s1")
        for key, value in [("topic", {"city": "Paris"}), ("n", 3), ("none", None), ("list", [1, "a"])]:
            response = api.put(API + f"sessions/s1/memory/{key}/", {"value": value}, format="json")
            assert response.json() == {"session_id": "s1", "key": key, "value": value}
        assert api.get(API + "sessions/s1/memory/topic/").json()["value"] == {"city": "Paris"}
        assert api.get(API + "sessions/s1/memory/none/").json()["value"] is None
        values = api.get(API + "sessions/s1/memory/").json()["values"]
        assert (
            values
            == store.get_all("s1")
            == {"topic": {"city": "Paris"}, "n": 3, "none": None, "list": [1, "a"]}
        )
        assert api.delete(API + "sessions/s1/memory/n/").json()["cleared"] == ["n"]
        assert api.delete(API + "sessions/s1/memory/n/").json()["cleared"] == []
        assert error_of(api.get(API + "sessions/s1/memory/n/")) == (404, "key_not_found")
        assert api.delete(API + "sessions/s1/memory/").json()["cleared"] == ["list", "none", "topic"]
        assert store.get_all("s1") == {}

    def test_put_refusals_store_nothing(self, api, configure):
        store = configure(MAX_VALUE_BYTES=50)
        store.create_session("s1")
        url = API + "sessions/s1/memory/k/"
        assert error_of(api.put(url, {}, format="json")) == (400, "invalid")
        assert error_of(api.put(url, {"value": "x" * 60}, format="json")) == (413, "value_too_large")
        assert error_of(api.put(API + "sessions/s1/memory/__keys__/", {"value": 1}, format="json")) == (
            400,
            "invalid_key",
        )
        assert error_of(api.put(API + "sessions/s9/memory/k/", {"value": 1}, format="json")) == (
            404,
            "session_not_found",
        )
        assert store.get_all("s1") == {}
        assert store.get_history("s1", 0) == []

    def test_increment(self, api, store):
        store.create_session("s1")
        url = API + "sessions/s1/memory/n/increment/"
        assert api.post(url, {}, format="json").json() == {"value": 1}
        assert api.post(url, {"amount": 41}, format="json").json() == {"value": 42}
        assert api.post(url, {"amount": -2}, format="json").json() == {"value": 40}
        assert error_of(api.post(url, {"amount": "lots"}, format="json")) == (400, "invalid")
        assert error_of(api.post(url, {"amount": 2**64}, format="json")) == (400, "invalid")
        store.put("s1", "text", "abc")
        assert error_of(api.post(API + "sessions/s1/memory/text/increment/", {}, format="json")) == (
            400,
            "not_a_number",
        )
        assert store.get("s1", "n") == 40 and store.get("s1", "text") == "abc"

    def test_request_over_max_bytes_is_413(self, api, configure):
        store = configure(MAX_REQUEST_BYTES=200)
        store.create_session("s1")
        response = api.put(API + "sessions/s1/memory/k/", {"value": "x" * 300}, format="json")
        assert error_of(response) == (413, "payload_too_large")
        assert store.list_keys("s1") == []

    def test_capacity_is_507(self, api, settings, db):
        from persistent_memory import get_store

        settings.PERSISTENT_MEMORY = {
            "BACKEND": "memory",
            "MAX_SESSIONS": 1,
            "MAX_SESSIONS_PER_OWNER": 1,
            "MIRROR_MODE": "off",
        }
        get_store().create_session("only")
        assert error_of(api.post(API + "sessions/", {"session_id": "s2"}, format="json")) == (
            507,
            "capacity_exceeded",
        )
        assert error_of(api.post(API + "enrich/", {"question": question("s3")}, format="json")) == (
            507,
            "capacity_exceeded",
        )
        assert get_store().list_sessions() == ["only"]


class TestHistory:
    def test_history_limit_and_summarize(self, api, configure):
        store = configure(AUTO_SUMMARIZE=False)
        store.create_session("s1")
        for i in range(8):
            store.put("s1", f"k{i}", i)
        entries = api.get(API + "sessions/s1/history/?limit=3").json()["entries"]
        assert [e["key"] for e in entries] == ["k5", "k6", "k7"]
        assert len(api.get(API + "sessions/s1/history/?limit=0").json()["entries"]) == 8
        assert len(api.get(API + "sessions/s1/history/").json()["entries"]) == 8
        assert error_of(api.get(API + "sessions/s1/history/?limit=-1")) == (400, "invalid")
        assert error_of(api.get(API + "sessions/s1/history/?limit=x")) == (400, "invalid")
        body = api.post(API + "sessions/s1/summarize/", {"max_history": 4}, format="json").json()
        assert body == {"session_id": "s1", "summarized": True}
        entries = store.get_history("s1", 0)
        assert entries[0]["op"] == "summary" and entries[0]["summarized_count"] == 6 and len(entries) == 3
        assert api.post(API + "sessions/s1/summarize/", {}, format="json").json()["summarized"] is False
        assert error_of(api.post(API + "sessions/s1/summarize/", {"max_history": 0}, format="json")) == (
            400,
            "invalid",
        )


class TestHealthAndPaths:
    def test_health_tells_anyone_the_status_and_staff_the_details(self, db, configure, backend_name):
        configure()
        assert APIClient().get(API + "health/").json() == {"status": "ok"}
        bad_token = APIClient()
        bad_token.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")
        assert bad_token.get(API + "health/").json() == {"status": "ok"}
        plain = APIClient()
        plain.force_login(get_user_model().objects.create_user("plain", password="pw-for-tests"))
        assert plain.get(API + "health/").json() == {"status": "ok"}
        staff = APIClient()
        staff.force_login(get_user_model().objects.create_user("ops", password="pw-for-tests", is_staff=True))
        body = staff.get(API + "health/").json()
        assert body["status"] == "ok" and body["backend"]["name"] == backend_name.partition("-")[0]
        assert body["backend"]["status"] == "ok" and body["backend"]["latency_ms"] >= 0
        assert body["database"]["status"] == "ok" and body["database"]["latency_ms"] >= 0
        assert body["database"]["alias"] == "default" and body["database"]["vendor"] == connection.vendor

    def test_health_503_when_redis_unreachable(self, db, settings):
        settings.PERSISTENT_MEMORY = {"BACKEND": "redis", "REDIS_URL": "redis://:hunter2@127.0.0.1:1/0"}
        response = APIClient().get(API + "health/")
        assert response.status_code == 503
        assert response["Retry-After"] == "5"
        assert response.json() == {"status": "unavailable"}
        staff = APIClient()
        staff.force_login(get_user_model().objects.create_user("ops", password="pw-for-tests", is_staff=True))
        body = staff.get(API + "health/").json()
        assert body["status"] == "unavailable" and body["backend"]["code"] == "backend_unavailable"
        assert body["backend"]["location"] == "redis://127.0.0.1:1/0" and body["database"]["status"] == "ok"
        assert "hunter2" not in json.dumps(body)

    def test_unknown_paths_are_json_404(self, api):
        assert error_of(api.get(API + "nowhere/")) == (404, "not_found")
        response = api.post(API + "enrich", {}, format="json")
        assert error_of(response) == (404, "not_found")
        assert "enrich/" in response.json()["detail"]

    def test_wrong_method_is_json_405(self, api):
        assert error_of(api.get(API + "enrich/")) == (405, "method_not_allowed")
        assert error_of(api.delete(API + "sessions/")) == (405, "method_not_allowed")

    def test_html_is_never_answered(self, api):
        response = api.get(API + "sessions/", HTTP_ACCEPT="text/html")
        assert response.status_code in (200, 406)
        assert response["Content-Type"] == "application/json"


class TestRedisDown:
    """With Redis stopped every endpoint answers 503, and works again once it is back."""

    ENDPOINTS = [
        ("post", "enrich/", {"question": {"text": "q", "metadata": {"session_id": "s1"}}}),
        ("post", "store/", {"answer": {"text": "a", "metadata": {"session_id": "s1"}}}),
        (
            "post",
            "process/",
            {"entries": [{"lane": "questions", "entry": {"metadata": {"session_id": "s1"}}}]},
        ),
        ("get", "sessions/", None),
        ("post", "sessions/", {"session_id": "s2"}),
        ("get", "sessions/s1/", None),
        ("delete", "sessions/s1/", None),
        ("get", "sessions/s1/memory/", None),
        ("delete", "sessions/s1/memory/", None),
        ("get", "sessions/s1/memory/k/", None),
        ("put", "sessions/s1/memory/k/", {"value": 1}),
        ("delete", "sessions/s1/memory/k/", None),
        ("post", "sessions/s1/memory/n/increment/", {"amount": 1}),
        ("get", "sessions/s1/history/", None),
        ("post", "sessions/s1/summarize/", {}),
        ("get", "health/", None),
    ]

    def test_every_endpoint_503_then_recovers(self, db, redis_server, redis_store):
        if redis_server is None:
            pytest.skip("REDIS_URL given: the suite does not stop a server it does not own")
        redis_store = redis_store.for_owner(OWNER)
        user = get_user_model().objects.create_user("pipeline", password="pw-for-tests", pk=USER_PK)
        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
        redis_store.create_session("s1")
        redis_server.stop()
        try:
            for method, path, body in self.ENDPOINTS:
                response = getattr(api, method)(API + path, body, format="json")
                assert response.status_code == 503, (method, path, response.content)
                assert response["Retry-After"] == "5"
                if path == "health/":  # the details are for staff
                    assert response.json() == {"status": "unavailable"}
                else:
                    assert response.json()["code"] == "backend_unavailable"
        finally:
            redis_server.start()
        # The same process, no restart: the API works again (the data died with the server).
        response = api.post(API + "enrich/", self.ENDPOINTS[0][2], format="json")
        assert response.status_code == 200
        assert api.put(API + "sessions/s1/memory/k/", {"value": 1}, format="json").status_code == 200
        assert redis_store.get("s1", "k") == 1


def test_redis_out_of_memory_is_507_without_retry_after(db, redis_store, redis_client):
    """A Redis at its maxmemory (noeviction) refuses writes: 507, which a client must not
    retry as it would a 503."""
    owned = redis_store.for_owner(OWNER)
    owned.create_session("s1")
    user = get_user_model().objects.create_user("pipeline", password="pw-for-tests", pk=USER_PK)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    policy = redis_client.config_get("maxmemory-policy")["maxmemory-policy"]
    redis_client.config_set("maxmemory-policy", "noeviction")
    redis_client.config_set("maxmemory", 1)  # already over it: every write is refused
    try:
        response = api.put(API + "sessions/s1/memory/k/", {"value": "v"}, format="json")
        assert error_of(response) == (507, "capacity_exceeded")
        assert "Retry-After" not in response
        answer = {"answer": {"text": "a", "metadata": {"session_id": "s1"}}}
        assert error_of(api.post(API + "store/", answer, format="json")) == (507, "capacity_exceeded")
    finally:
        redis_client.config_set("maxmemory", 0)
        redis_client.config_set("maxmemory-policy", policy)
    assert api.put(API + "sessions/s1/memory/k/", {"value": "v"}, format="json").status_code == 200
    assert owned.get_all("s1") == {"k": "v"}
