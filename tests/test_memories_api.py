"""Long-term memories through the REST API: every endpoint, its errors with their codes,
and owners (another owner's memory answers 404 and never turns up in a search)."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from persistent_memory.memories import memories_for
from persistent_memory.models import LongTermMemory

pytestmark = pytest.mark.django_db

API = "/api/memory/memories/"


def make_user(username: str) -> tuple[Any, APIClient]:
    user = get_user_model().objects.create_user(username, password="pw-for-tests")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return user, client


def code_of(response: Any) -> tuple[int, str]:
    assert response["Content-Type"] == "application/json", response.content
    return response.status_code, response.json()["code"]


def test_create_read_update_list_search_stats_delete() -> None:
    user, client = make_user("alice")
    created = client.post(API, {"content": "Prefers dark mode.", "key": "ui.theme"}, format="json")
    assert created.status_code == 201, created.content
    memory = created.json()
    assert memory["owner"] == f"user:{user.pk}" and memory["source"] == "api"
    assert memory["created_at"].endswith("Z") or "+" in memory["created_at"]
    again = client.post(API, {"content": "Prefers light mode.", "key": "ui.theme"}, format="json")
    assert again.status_code == 200 and again.json()["id"] == memory["id"]
    client.post(API, {"content": "Runs tests before commits", "type": "procedural"}, format="json")
    url = f"{API}{memory['id']}/"
    assert client.get(url).json()["content"] == "Prefers light mode."
    patched = client.patch(url, {"metadata": {"via": "test"}, "type": "semantic"}, format="json")
    assert patched.status_code == 200 and patched.json()["metadata"] == {"via": "test"}
    listing = client.get(API, {"type": "procedural"}).json()
    assert listing["count"] == 1 and listing["results"][0]["type"] == "procedural"
    assert client.get(API, {"limit": 1}).json()["count"] == 2
    found = client.post(f"{API}search/", {"query": "light mode", "strategy": "keyword"}, format="json")
    assert found.status_code == 200
    assert [r["id"] for r in found.json()["results"]] == [memory["id"]]
    assert found.json()["results"][0]["score"] > 0
    stats = client.get(f"{API}stats/").json()
    assert stats["count"] == 2 and stats["by_type"]["semantic"]["count"] == 1 and stats["tokens"] > 0
    assert client.delete(url).json()["id"] == memory["id"]
    assert code_of(client.get(url)) == (404, "memory_not_found")
    assert memories_for(f"user:{user.pk}").list()[0] == 1


@pytest.mark.parametrize(
    ("method", "path", "body", "expected"),
    [
        ("post", "", {"content": ""}, (400, "invalid")),
        ("post", "", {"content": "x", "type": "dream"}, (400, "invalid")),
        ("post", "", {"content": "x", "key": "a b"}, (400, "invalid_memory")),
        ("post", "", {"content": "x", "metadata": [1]}, (400, "invalid_memory")),
        ("post", "", {"content": "x" * 4001}, (400, "invalid_memory")),
        ("post", "", {"content": "a\u0000b"}, (400, "invalid")),
        ("post", "search/", {"query": "x", "strategy": "semantic"}, (400, "invalid_memory")),
        ("post", "search/", {"query": "x", "limit": 0}, (400, "invalid")),
        ("post", "search/", {}, (400, "invalid")),
        ("get", "12345/", None, (404, "memory_not_found")),
        ("get", "abc/", None, (404, "memory_not_found")),
        ("patch", "%0A/", None, (404, "memory_not_found")),
        ("delete", "99999999999999999999999/", None, (404, "memory_not_found")),
        ("get", "-1/", None, (404, "memory_not_found")),
    ],
)
def test_bad_requests_answer_json_errors(method: str, path: str, body: Any, expected: tuple) -> None:
    _user, client = make_user("bob")
    response = getattr(client, method)(f"{API}{path}", body, format="json")
    status, code = code_of(response)
    assert (status, code) == expected or (status == expected[0] and expected[1] == "invalid"), response.json()
    assert not LongTermMemory.objects.exists()


def test_key_conflict_answers_409() -> None:
    _user, client = make_user("carol")
    first = client.post(API, {"content": "One", "key": "one"}, format="json").json()
    client.post(API, {"content": "Two", "key": "two"}, format="json")
    assert code_of(client.patch(f"{API}{first['id']}/", {"key": "two"}, format="json")) == (
        409,
        "memory_key_exists",
    )


def test_another_owners_memory_answers_404_everywhere() -> None:
    alice, alice_client = make_user("alice")
    _bob, bob_client = make_user("bob")
    secret = alice_client.post(API, {"content": "Alice's PIN hint is teal", "key": "pin"}, format="json")
    url = f"{API}{secret.json()['id']}/"
    assert code_of(bob_client.get(url)) == (404, "memory_not_found")
    assert code_of(bob_client.patch(url, {"content": "mine now"}, format="json")) == (404, "memory_not_found")
    assert code_of(bob_client.delete(url)) == (404, "memory_not_found")
    for strategy in ("recent", "keyword", "hybrid"):
        body = {"query": "PIN teal", "strategy": strategy}
        assert bob_client.post(f"{API}search/", body, format="json").json()["results"] == []
    assert bob_client.get(API).json() == {"count": 0, "results": []}
    assert bob_client.get(f"{API}stats/").json()["count"] == 0
    # Bob's own memory with the same key is his, and Alice's is untouched.
    bob_client.post(API, {"content": "Bob's", "key": "pin"}, format="json")
    assert alice_client.get(url).json()["content"] == "Alice's PIN hint is teal"
    assert memories_for(f"user:{alice.pk}").list()[0] == 1


def test_anonymous_callers_are_refused() -> None:
    response = APIClient().get(API)
    assert response.status_code in (401, 403)


def test_a_key_with_colons_is_written_and_read_back_over_the_api() -> None:
    _, client = make_user("alice")
    created = client.post(API, {"content": "Prefers dark mode.", "key": "user:prefs.theme"}, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["key"] == "user:prefs.theme"
    again = client.post(API, {"content": "Prefers light mode.", "key": "user:prefs.theme"}, format="json")
    assert again.status_code == 200 and again.json()["id"] == created.json()["id"]
    assert code_of(client.post(API, {"content": "x", "key": "user/prefs"}, format="json")) == (
        400,
        "invalid_memory",
    )


def test_search_filters_by_when_things_were_said_and_said_at_is_settable() -> None:
    _, client = make_user("alice")
    old = {"content": "Went hiking in the Alps.", "key": "hike.alps", "said_at": "2023-05-08T14:03:00Z"}
    created = client.post(API, old, format="json")
    assert created.status_code == 201 and created.json()["said_at"] == "2023-05-08T14:03:00Z"
    client.post(API, {"content": "Went hiking in Norway.", "key": "hike.norway"}, format="json")

    def keys(**bounds: str) -> list[str]:
        answer = client.post(
            f"{API}search/", {"query": "hiking", "strategy": "keyword", **bounds}, format="json"
        )
        assert answer.status_code == 200, answer.content
        return sorted(m["key"] for m in answer.json()["results"])

    assert keys() == ["hike.alps", "hike.norway"]
    assert keys(said_before="2024-01-01T00:00:00Z") == ["hike.alps"]
    assert keys(said_after="2024-01-01T00:00:00Z") == ["hike.norway"]
    patched = client.patch(
        f"{API}{created.json()['id']}/", {"said_at": "2025-01-01T00:00:00Z"}, format="json"
    )
    assert patched.json()["said_at"] == "2025-01-01T00:00:00Z"
    assert keys(said_before="2024-01-01T00:00:00Z") == []
    bad = client.post(f"{API}search/", {"query": "hiking", "said_after": "last May"}, format="json")
    assert code_of(bad)[0] == 400
