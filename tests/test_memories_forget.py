"""``memory_forget --owner``: afterwards nothing of the owner is left in the store (Redis
keys scanned, the memory backend's records), the database (mirror rows, memories) or
the memory backend's journal files; other owners keep everything."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command, load_command_class
from django.core.management.base import CommandError

from persistent_memory.idempotency import Idempotency
from persistent_memory.memories import memories_for
from persistent_memory.models import LongTermMemory, MemorySession
from persistent_memory.operations.forget import forget_owner
from persistent_memory.store import MemoryStore

GONE, KEPT = "user:gone", "user:kept"


def fill(store: MemoryStore, owner: str) -> None:
    """Sessions with values, history, a conversation, an idempotency record, a run
    binding, and long-term memories."""
    scoped = store.for_owner(owner)
    scoped.create_session("s1")
    scoped.put("s1", "name", f"secret of {owner}", idempotency=Idempotency.of("idem-1", "PUT", owner))
    scoped.enrich("s2", run_id="run-1")
    scoped.add_messages("s1", [{"role": "user", "content": f"I love tea, says {owner}"}])
    memories_for(owner).add(f"{owner} loves tea", key="tea")


def forget(owner: str) -> dict[str, Any]:
    out = StringIO()
    call_command("memory_forget", "--owner", owner, "--yes", "--json", stdout=out, stderr=StringIO())
    return json.loads(out.getvalue())


def backend_keys(store: MemoryStore, request: pytest.FixtureRequest) -> list[str]:
    """Every key (Redis) or record reference (memory backend) the store holds."""
    backend = store.backend
    if backend.name == "redis":
        client = request.getfixturevalue("redis_client")
        return [key.decode() for key in client.scan_iter(match="*")]
    return [*backend._sessions, *backend._records, *backend._runs]


@pytest.mark.django_db
def test_forget_leaves_nothing_of_the_owner_and_everything_of_others(
    configure: Any, request: pytest.FixtureRequest
) -> None:
    store = configure()
    fill(store, GONE)
    fill(store, KEPT)
    assert any(GONE in key for key in backend_keys(store, request))
    counts = forget(GONE)
    assert (
        counts["sessions"] == 2 and counts["memories"] == 1 and counts["records"] >= 1
    )  # the idempotency record (run bindings go with their session)
    assert [key for key in backend_keys(store, request) if GONE in key] == []
    assert not LongTermMemory.objects.filter(owner=GONE).exists()
    assert store.for_owner(GONE).list_sessions() == []
    # The other owner keeps all of it.
    kept = store.for_owner(KEPT)
    assert kept.list_sessions() == ["s1", "s2"] and kept.get("s1", "name") == f"secret of {KEPT}"
    assert memories_for(KEPT).list()[0] == 1
    again = kept.put("s1", "name", "other", idempotency=Idempotency.of("idem-1", "PUT", KEPT))
    assert again is None and kept.get("s1", "name") == f"secret of {KEPT}"  # its record answered
    assert forget(GONE)["sessions"] == 0


@pytest.mark.django_db
def test_forget_needs_an_owner(configure: Any) -> None:
    configure()
    with pytest.raises(CommandError):
        call_command("memory_forget", "--yes", stdout=StringIO(), stderr=StringIO())
    with pytest.raises(CommandError):
        call_command("memory_forget", "--owner", "", "--yes", stdout=StringIO(), stderr=StringIO())


@pytest.mark.django_db(transaction=True)
def test_forget_on_the_memory_backend_clears_mirror_rows_and_journal(settings: Any, tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    settings.PERSISTENT_MEMORY = {
        "BACKEND": "memory",
        "MIRROR_MODE": "immediate",
        "JOURNAL_DIR": str(journal),
    }
    store = MemoryStore.from_settings()
    store.mirror.stop()  # the test decides when the mirror syncs
    try:
        fill(store, GONE)
        fill(store, KEPT)
        store.mirror.sync_dirty()
        assert MemorySession.objects.filter(owner=GONE).count() == 2
        assert any(GONE in path.read_text() for path in journal.glob("*") if path.is_file())
        counts = forget_owner(GONE, store=store)
        assert counts["mirror_rows"] == 2 and counts["journal_checkpointed"] is True
        assert not MemorySession.objects.filter(owner=GONE).exists()
        assert MemorySession.objects.filter(owner=KEPT).count() == 2
        leftovers = [
            p.name for p in journal.glob("*") if p.is_file() and GONE in p.read_text(errors="replace")
        ]
        assert leftovers == []
    finally:
        store.close()


def database_rows_of(owner: str) -> list[tuple[str, int]]:
    """Every row of the app's models with ``owner`` in a text field or a JSON value."""
    from django.apps import apps
    from django.db import models
    from django.db.models import Q

    found = []
    for model in apps.get_app_config("persistent_memory").get_models():
        fields = model._meta.concrete_fields
        texts = [f.name for f in fields if isinstance(f, models.CharField | models.TextField)]
        jsons = [f.name for f in fields if isinstance(f, models.JSONField)]
        query = Q(pk__in=[])
        for name in texts:
            query |= Q(**{f"{name}__contains": owner})
        found += [(model.__name__, pk) for pk in model.objects.filter(query).values_list("pk", flat=True)]
        for pk, *values in model.objects.values_list("pk", *jsons) if jsons else []:
            if owner in json.dumps(values):
                found.append((model.__name__, pk))
    return found


# The admin action -------------------------------------------------------------------

SESSIONS = "/admin/persistent_memory/memorysession/"
MEMORIES = "/admin/persistent_memory/longtermmemory/"


@pytest.fixture
def admin_client(db: Any) -> Any:
    from django.contrib.auth import get_user_model
    from django.test import Client

    client = Client()
    client.force_login(get_user_model().objects.create_superuser("root", "root@example.com", "pw-for-tests"))
    return client


def messages_of(client: Any, url: str) -> list[str]:
    return [m.message for m in client.get(url).context["messages"]]


@pytest.mark.django_db
def test_admin_forgets_the_owners_of_the_selected_sessions_after_confirming(
    configure: Any, request: pytest.FixtureRequest, admin_client: Any
) -> None:
    store = configure(MIRROR_MODE="deferred")
    fill(store, GONE)
    fill(store, KEPT)
    store.create_session("shared")  # the unowned namespace's
    admin_client.get(SESSIONS)  # the page load syncs the mirror
    assert database_rows_of(GONE) != []
    selected = list(MemorySession.objects.filter(session_id="s1", owner=GONE).values_list("pk", flat=True))
    selected.append(MemorySession.objects.get(owner="", session_id="shared").pk)
    form = {"action": "forget_owners", "_selected_action": selected}
    page = admin_client.post(SESSIONS, form)
    html = page.content.decode()
    assert page.status_code == 200 and "are you sure" in html
    # Each owner with what will go; the unowned session is named as left alone.
    assert f"<strong>{GONE}</strong>: 2 sessions in the store, 2 in the mirror, 1 long-term memory" in html
    assert KEPT not in html
    assert "1 selected row belongs to the unowned namespace" in html
    assert store.for_owner(GONE).list_sessions() == ["s1", "s2"]  # nothing yet
    response = admin_client.post(SESSIONS, {**form, "confirmed": "yes"})
    assert response.status_code == 302
    assert [key for key in backend_keys(store, request) if GONE in key] == []
    assert database_rows_of(GONE) == []
    assert store.for_owner(KEPT).list_sessions() == ["s1", "s2"] and store.list_sessions() == ["shared"]
    assert memories_for(KEPT).list()[0] == 1
    assert MemorySession.objects.filter(owner=KEPT).count() == 2
    assert f"Forgot 1 owner ({GONE}): 2 sessions" in messages_of(admin_client, SESSIONS)[0]


@pytest.mark.django_db
def test_admin_forgets_the_owners_of_the_selected_memories(
    configure: Any, request: pytest.FixtureRequest, admin_client: Any
) -> None:
    store = configure()
    third = "user:third"
    for owner in (GONE, KEPT, third):
        fill(store, owner)
    memories_for(GONE).add("Another fact", key="fact")
    selected = list(LongTermMemory.objects.filter(owner__in=[GONE, third]).values_list("pk", flat=True))
    form = {"action": "forget_owners", "_selected_action": selected}
    html = admin_client.post(MEMORIES, form).content.decode()
    assert f"<strong>{GONE}</strong>: 2 sessions in the store, 0 in the mirror, 2 long-term memories" in html
    assert f"<strong>{third}</strong>: 2 sessions" in html
    assert LongTermMemory.objects.count() == 4  # nothing yet
    assert admin_client.post(MEMORIES, {**form, "confirmed": "yes"}).status_code == 302
    for owner in (GONE, third):
        assert [key for key in backend_keys(store, request) if owner in key] == []
        assert database_rows_of(owner) == []
    assert store.for_owner(KEPT).list_sessions() == ["s1", "s2"]
    assert list(LongTermMemory.objects.values_list("owner", flat=True)) == [KEPT]
    [message] = messages_of(admin_client, MEMORIES)
    assert message.startswith(f"Forgot 2 owners ({GONE}, {third}): 4 sessions,")
    assert message.endswith("3 long-term memories.")


@pytest.mark.django_db
def test_admin_forgetting_takes_both_delete_permissions(configure: Any) -> None:
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Permission
    from django.test import Client

    store = configure()
    fill(store, GONE)
    staff = get_user_model().objects.create_user("staff", password="pw-for-tests", is_staff=True)
    staff.user_permissions.add(
        *Permission.objects.filter(codename__in=["view_longtermmemory", "delete_longtermmemory"])
    )
    client = Client()
    client.force_login(staff)
    offered = client.get(MEMORIES).context["action_form"].fields["action"].choices
    assert "forget_owners" not in [name for name, _ in offered]
    pks = list(LongTermMemory.objects.values_list("pk", flat=True))
    client.post(MEMORIES, {"action": "forget_owners", "_selected_action": pks, "confirmed": "yes"})
    assert store.for_owner(GONE).list_sessions() == ["s1", "s2"]
    assert LongTermMemory.objects.filter(owner=GONE).count() == 1
    # With the sessions' delete permission too, it is offered.
    staff.user_permissions.add(Permission.objects.get(codename="delete_memorysession"))
    client.force_login(get_user_model().objects.get(pk=staff.pk))
    offered = client.get(MEMORIES).context["action_form"].fields["action"].choices
    assert (
        "forget_owners",
        "Forget everything about the owners of the selected long-term memories",
    ) in offered


# The API: DELETE owner/ --------------------------------------------------------------

OWNER_URL = "/api/memory/owner/"


def api_client(user: Any) -> Any:
    from rest_framework.authtoken.models import Token
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    return client


def two_callers() -> tuple[Any, str, Any, str]:
    """Two users' API clients and their owners."""
    from django.contrib.auth import get_user_model

    users = [get_user_model().objects.create_user(name, password="pw-for-tests") for name in ("ada", "bob")]
    owners = [f"user:{user.pk}" for user in users]
    assert owners[0] not in owners[1] and owners[1] not in owners[0]  # the scans look for substrings
    return api_client(users[0]), owners[0], api_client(users[1]), owners[1]


@pytest.mark.django_db
def test_api_forgets_the_callers_owner_after_confirming(
    configure: Any, request: pytest.FixtureRequest
) -> None:
    store = configure(MIRROR_MODE="deferred")
    ada, gone, bob, kept = two_callers()
    fill(store, gone)
    fill(store, kept)
    store.mirror.sync_dirty()
    held = {model for model, _ in database_rows_of(gone)}
    assert held >= {"MemorySession", "MemoryValue", "MemoryMessage", "LongTermMemory"}, held
    assert ada.get(OWNER_URL).json() == {"owner": gone, "sessions": 2, "mirror_rows": 2, "memories": 1}
    # Not confirmed: refused, nothing deleted.
    for headers in ({}, {"HTTP_CONFIRM_FORGET": "no"}, {"HTTP_CONFIRM_FORGET": "YES "}):
        refused = ada.delete(OWNER_URL, **headers)
        assert refused.status_code == 400, headers
        assert refused.json()["code"] == "confirmation_required"
    assert store.for_owner(gone).list_sessions() == ["s1", "s2"]
    # Nothing the caller sends names the owner: the query and body naming Bob change nothing.
    response = ada.delete(
        f"{OWNER_URL}?owner={kept}", {"owner": kept}, format="json", HTTP_CONFIRM_FORGET="yes"
    )
    assert response.status_code == 200
    counts = response.json()
    assert (counts["owner"], counts["sessions"], counts["mirror_rows"], counts["memories"]) == (gone, 2, 2, 1)
    assert counts["records"] >= 1  # the idempotency record
    assert [key for key in backend_keys(store, request) if gone in key] == []
    assert database_rows_of(gone) == []
    assert ada.get(OWNER_URL).json() == {"owner": gone, "sessions": 0, "mirror_rows": 0, "memories": 0}
    # Bob keeps everything, and sees it.
    assert bob.get(OWNER_URL).json() == {"owner": kept, "sessions": 2, "mirror_rows": 2, "memories": 1}
    assert store.for_owner(kept).get("s1", "name") == f"secret of {kept}"
    assert bob.get("/api/memory/memories/").json()["count"] == 1
    # Again: nothing left to delete.
    again = ada.delete(OWNER_URL, HTTP_CONFIRM_FORGET="yes").json()
    assert (again["sessions"], again["mirror_rows"], again["memories"], again["records"]) == (0, 0, 0, 0)


def resolve_no_owner(request: Any) -> None:
    """An OWNER_RESOLVER that resolves no owner."""
    return None


@pytest.mark.django_db
def test_api_refuses_callers_without_an_owner_of_their_own(configure: Any) -> None:
    from rest_framework.test import APIClient

    store = configure()
    ada, gone, _, _ = two_callers()
    fill(store, gone)
    store.create_session("shared")
    anonymous = APIClient().delete(OWNER_URL, HTTP_CONFIRM_FORGET="yes")
    assert (anonymous.status_code, anonymous.json()["code"]) == (401, "not_authenticated")
    assert APIClient().get(OWNER_URL).status_code == 401
    for resolver, owner_left in (
        ("tests.test_memories_forget.resolve_no_owner", gone),
        # One namespace for every caller: it is no one's to forget.
        ("persistent_memory.owners.resolvers.shared_owner", ""),
    ):
        configure(OWNER_RESOLVER=resolver)
        for method in ("get", "delete"):
            refused = getattr(ada, method)(OWNER_URL, HTTP_CONFIRM_FORGET="yes")
            answered = (refused.status_code, refused.json()["code"])
            assert answered == (403, "owner_required"), (resolver, method)
        assert store.for_owner(owner_left).list_sessions() != []
    assert store.for_owner(gone).list_sessions() == ["s1", "s2"] and store.list_sessions() == ["shared"]
    assert LongTermMemory.objects.filter(owner=gone).count() == 1


@pytest.mark.django_db(transaction=True)
def test_api_forget_on_the_memory_backend_clears_the_journal(settings: Any, tmp_path: Path) -> None:
    from persistent_memory import get_store

    journal = tmp_path / "journal"
    settings.PERSISTENT_MEMORY = {
        "BACKEND": "memory",
        "MIRROR_MODE": "immediate",
        "JOURNAL_DIR": str(journal),
    }
    store = get_store()
    store.mirror.stop()  # the test decides when the mirror syncs
    ada, gone, _, kept = two_callers()
    fill(store, gone)
    fill(store, kept)
    store.mirror.sync_dirty()
    assert any(gone in path.read_text() for path in journal.glob("*") if path.is_file())
    counts = ada.delete(OWNER_URL, HTTP_CONFIRM_FORGET="yes").json()
    assert counts["journal_checkpointed"] is True and counts["mirror_rows"] == 2
    assert [p.name for p in journal.glob("*") if p.is_file() and gone in p.read_text(errors="replace")] == []
    assert database_rows_of(gone) == []
    assert any(kept in path.read_text(errors="replace") for path in journal.glob("*") if path.is_file())
    assert MemorySession.objects.filter(owner=kept).count() == 2


def test_forget_help_says_the_owner_is_required() -> None:
    """The base commands' --owner is a filter whose default is every owner; forget's is
    whom to forget, and it has no default."""
    command = load_command_class("persistent_memory", "memory_forget")
    parser = command.create_parser("manage.py", "memory_forget")
    text = " ".join(parser.format_help().split())
    assert "every owner" not in text
    assert "--owner OWNER The owner to forget (e.g. user:42); required." in text
    assert " --owner OWNER " in parser.format_usage() and "[--owner" not in parser.format_usage()
