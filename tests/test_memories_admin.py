"""The memories admin (editable, through the service) and JSON Lines export and import."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client

from persistent_memory.memories import memories_for
from persistent_memory.models import LongTermMemory

pytestmark = pytest.mark.django_db

ADMIN = "/admin/persistent_memory/longtermmemory/"


@pytest.fixture
def admin_client() -> Client:
    get_user_model().objects.create_superuser("root", "root@example.com", "pw-for-tests")
    client = Client()
    client.login(username="root", password="pw-for-tests")
    return client


def test_list_search_and_filters(admin_client: Client) -> None:
    memories_for("user:a").add("I prefer tea", key="tea", type="factual")
    memories_for("user:b").add("Deploy on Mondays", key="deploy", type="procedural", source="extraction")
    html = admin_client.get(ADMIN).content.decode()
    assert "I prefer tea" in html and "Deploy on Mondays" in html
    assert "Deploy on Mondays" not in admin_client.get(ADMIN, {"q": "tea"}).content.decode()
    assert "I prefer tea" not in admin_client.get(ADMIN, {"type__exact": "procedural"}).content.decode()
    assert "I prefer tea" not in admin_client.get(ADMIN, {"source__exact": "extraction"}).content.decode()
    assert "Deploy on Mondays" not in admin_client.get(ADMIN, {"owner": "user:a"}).content.decode()


def form(**fields: str) -> dict[str, str]:
    return {"owner": "", "session_id": "", "type": "factual", "key": "", "content": "", "metadata": "{}",
            "expires_at_0": "", "expires_at_1": "", **fields}  # fmt: skip


def test_add_and_edit_go_through_the_service(admin_client: Client) -> None:
    response = admin_client.post(f"{ADMIN}add/", form(owner="user:a", key="tea", content="  I   like tea "))
    assert response.status_code == 302, response.content.decode()[:2000]
    row = LongTermMemory.objects.get()
    assert (row.content, row.source, row.tokens > 0) == ("I like tea", "admin", True)
    extracted = memories_for("user:a").add("I love jazz", key="jazz", source="extraction")
    response = admin_client.post(
        f"{ADMIN}{extracted['id']}/change/", form(key="jazz", content="I love bebop")
    )
    assert response.status_code == 302
    edited = memories_for("user:a").get(extracted["id"])
    assert (edited["content"], edited["source"]) == ("I love bebop", "admin")
    # An extraction no longer changes what the admin wrote.
    memories_for("user:a").add("I love swing", key="jazz", source="extraction")
    assert memories_for("user:a").get(extracted["id"])["content"] == "I love bebop"
    # Refused on the form, not with a 500: a bad key, a taken key, metadata not an object.
    for bad in ({"key": "a b"}, {"key": "tea"}, {"metadata": "[1]"}):
        page = admin_client.post(
            f"{ADMIN}{extracted['id']}/change/", form(**{"key": "jazz", "content": "x", **bad})
        )
        assert page.status_code == 200 and "errorlist" in page.content.decode()
    assert memories_for("user:a").get(extracted["id"])["content"] == "I love bebop"


def test_export_action_and_commands_round_trip(admin_client: Client, tmp_path) -> None:
    memories_for("user:a").add("I prefer tea", key="tea", metadata={"n": 1})
    memories_for("user:b").add("My dog is Rex", key="dog")
    ids = list(LongTermMemory.objects.values_list("pk", flat=True))
    response = admin_client.post(ADMIN, {"action": "export_jsonl", "_selected_action": ids})
    lines = b"".join(response.streaming_content).decode().splitlines()
    assert [json.loads(line)["key"] for line in lines] == ["tea", "dog"]
    out = StringIO()
    call_command("memory_export_memories", "--owner", "user:a", stdout=out, stderr=StringIO())
    assert [json.loads(line)["content"] for line in out.getvalue().splitlines()] == ["I prefer tea"]
    path = tmp_path / "all.jsonl"
    call_command("memory_export_memories", "-o", str(path), stdout=StringIO(), stderr=StringIO())
    LongTermMemory.objects.all().delete()
    path.write_text(path.read_text() + 'not json\n{"content": ""}\n')
    out = StringIO()
    call_command("memory_import_memories", str(path), "--json", stdout=out, stderr=StringIO())
    assert json.loads(out.getvalue()) == {"imported": 2, "refused": 2}
    tea = memories_for("user:a").get_by_key("tea")
    assert tea["metadata"] == {"n": 1} and tea["source"] == "import"
    assert memories_for("user:b").get_by_key("dog")["content"] == "My dog is Rex"
