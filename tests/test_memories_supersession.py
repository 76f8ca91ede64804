"""Memories keep their superseded versions (issue 41): a write that replaces a memory's
content keeps the memory's id and the old content as a version of its own, true until
``valid_until``; reads see current memories unless asked ``as_of`` a moment; the chain
goes with its memory (delete, expiry, forget), travels in JSON Lines, and shows in the
admin. Run on SQLite and, with DATABASE_URL, on PostgreSQL."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from io import StringIO
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from django.utils import timezone
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from persistent_memory.exceptions import InvalidMemory, MemoryNotFound
from persistent_memory.integrations.langgraph import PersistentMemoryStore
from persistent_memory.memories import memories_for
from persistent_memory.memories.injection import relevant_memories
from persistent_memory.memories.upkeep import forget_by_policy
from persistent_memory.models import LongTermMemory
from persistent_memory.operations.forget import forget_owner, owner_holdings
from persistent_memory.operations.maintenance import sweep_memories
from persistent_memory.store import get_store
from tests import readme_blocks
from tests.conftest import memory_settings_for

pytestmark = pytest.mark.django_db

OWNER = "user:a"
JAN, FEB, MAR, APR = (datetime(2025, month, 1, tzinfo=UTC) for month in (1, 2, 3, 4))
STRATEGIES = ("recent", "keyword", "hybrid", "semantic")


def dog_embedder(texts: list[str]) -> list[list[float]]:
    """Every text about the dog points one way, anything else another."""
    return [[1.0, 0.0] if "dog" in text.lower() else [0.0, 1.0] for text in texts]


@pytest.fixture
def embedder(settings: Any) -> None:
    settings.PERSISTENT_MEMORY = {
        **getattr(settings, "PERSISTENT_MEMORY", {}),
        "EMBEDDER": "tests.test_memories_supersession.dog_embedder",
    }


def versions(memory_id: int) -> list[LongTermMemory]:
    return list(LongTermMemory.objects.filter(superseded_by=memory_id).order_by("-valid_until"))


def test_the_guide_example_runs_as_shown() -> None:
    """docs/guide/memories.md's ``memories-supersession`` example, each ``# ->`` as shown."""
    readme_blocks.run_example("memories-supersession", {})
    assert LongTermMemory.objects.filter(owner="user:7").count() == 2


def test_a_same_key_rewrite_keeps_the_id_and_the_old_content_as_a_version() -> None:
    alice = memories_for(OWNER)
    first = alice.add("My dog is called Rex.", key="dog", said_at=JAN, metadata={"n": 1})
    second = alice.add("My dog is called Max.", key="dog", said_at=MAR)
    third = alice.add("My dog is called Bo.", key="dog")  # no said_at: superseded now
    assert first["id"] == second["id"] == third["id"] and third["content"] == "My dog is called Bo."
    newest, oldest = versions(first["id"])
    assert (oldest.content, oldest.said_at, oldest.valid_until) == ("My dog is called Rex.", JAN, MAR)
    assert (oldest.key, oldest.owner, oldest.type, oldest.metadata) == ("dog", OWNER, "factual", {"n": 1})
    assert oldest.created_at == first["created_at"] and oldest.expires_at is None
    assert newest.content == "My dog is called Max." and newest.said_at == MAR
    assert third["updated_at"] - timedelta(seconds=5) < newest.valid_until <= third["updated_at"]
    # Reads see the current memory only.
    assert alice.list()[0] == 1 and alice.stats()["count"] == 1
    assert alice.get_by_key("dog")["id"] == first["id"]
    assert [m["content"] for m in alice.versions(first["id"])] == [
        "My dog is called Max.",
        "My dog is called Rex.",
    ]
    # A version is the owner's to read (its dict says whose version it is), never to change.
    version = alice.get(oldest.pk)
    assert (version["superseded_by"], version["valid_until"], version["content"]) == (
        first["id"],
        MAR,
        "My dog is called Rex.",
    )
    assert alice.get(first["id"])["superseded_by"] is None and alice.get(first["id"])["valid_until"] is None
    for call in (
        lambda: alice.update(oldest.pk, content="x"),
        lambda: alice.delete(oldest.pk),
        lambda: alice.similar(oldest.pk),
        lambda: memories_for("user:b").get(oldest.pk),
    ):
        with pytest.raises(MemoryNotFound):
            call()


def test_nothing_is_kept_for_an_unchanged_write_a_refused_one_or_a_correction(settings: Any) -> None:
    alice = memories_for(OWNER)
    mine = alice.add("My editor is Emacs.", key="editor", metadata={"v": 1})
    alice.add("My editor is Emacs.", key="editor", metadata={"v": 1})  # the same again
    alice.add("My editor is Emacs.", key="editor", metadata={"v": 2})  # content unchanged
    alice.add("My editor is vim.", key="editor", source="extraction")  # _kept: an API memory stands
    alice.update(mine["id"], content="My editor is Emacs 29.")  # a correction, in place
    assert versions(mine["id"]) == [] and alice.get(mine["id"])["content"] == "My editor is Emacs 29."
    settings.PERSISTENT_MEMORY = {"MEMORY_KEEP_SUPERSEDED": False}
    assert alice.add("My editor is Helix.", key="editor")["content"] == "My editor is Helix."
    assert LongTermMemory.objects.count() == 1


def test_a_near_duplicate_merge_keeps_the_old_content(embedder: None) -> None:
    alice = memories_for(OWNER)
    first = alice.add("My dog is called Rex.", said_at=JAN)
    merged = alice.add("The dog's name is Rex, a beagle.", said_at=FEB)  # no key: merged by meaning
    assert merged["id"] == first["id"] and merged["content"] == "The dog's name is Rex, a beagle."
    [old] = versions(first["id"])
    assert (old.content, old.key, old.valid_until) == ("My dog is called Rex.", first["key"], FEB)
    assert old.embedding == [1.0, 0.0]  # its vector kept: found by meaning as of then
    assert merged["history"][-1]["content"] == "My dog is called Rex."  # kept for compatibility


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_as_of_answers_what_was_true_then(strategy: str, embedder: None) -> None:
    alice = memories_for(OWNER)
    dog = alice.add("My dog is called Rex.", key="dog", said_at=JAN)
    alice.add("My dog is called Max.", key="dog", said_at=MAR)
    alice.add("My dog sleeps all day.", key="dog.sleep", said_at=FEB)  # never changed
    memories_for("user:b").add("My dog is called Fido.", key="dog", said_at=JAN)

    def said(**bounds: Any) -> list[str]:
        return sorted(m["content"] for m in alice.search("dog", strategy=strategy, **bounds))

    assert said() == ["My dog is called Max.", "My dog sleeps all day."]
    assert said(as_of=JAN + timedelta(days=1)) == ["My dog is called Rex."]
    assert said(as_of=FEB) == ["My dog is called Rex.", "My dog sleeps all day."]
    assert said(as_of=MAR) == ["My dog is called Max.", "My dog sleeps all day."]  # valid_until is exclusive
    assert said(as_of=JAN - timedelta(days=1)) == []
    assert said(as_of=FEB, said_before=FEB) == ["My dog is called Rex."]  # the filters combine
    count, page = alice.list(as_of=FEB)
    assert count == 2 and {m["key"] for m in page} == {"dog", "dog.sleep"}
    found = alice.search("dog", strategy=strategy, as_of=FEB)
    assert {m["superseded_by"] for m in found} == {dog["id"], None}
    with pytest.raises(InvalidMemory, match="as_of"):
        alice.search("dog", as_of="February")  # type: ignore[arg-type]


def test_as_of_gives_one_version_a_memory_without_dates_or_with_dates_out_of_order() -> None:
    alice = memories_for(OWNER)
    # No said_at: each version counts from the memory's created_at, until it was replaced.
    city = alice.add("Lives in Paris.", key="city")
    alice.add("Lives in Lyon.", key="city")
    [paris] = versions(city["id"])
    assert [m["content"] for m in alice.search("Lives", strategy="keyword", as_of=city["created_at"])] == [
        "Lives in Paris."
    ]
    assert [m["content"] for m in alice.search("Lives", as_of=paris.valid_until)] == ["Lives in Lyon."]
    # Said in January, March, then February: as of mid-February, one version (the one
    # that was replaced first after it).
    alice.add("Works at Acme.", key="job", said_at=JAN)
    alice.add("Works at Bolt.", key="job", said_at=MAR)
    alice.add("Works at Corp.", key="job", said_at=FEB)
    mid_february = FEB + timedelta(days=14)
    assert [m["content"] for m in alice.search("Works", strategy="keyword", as_of=mid_february)] == [
        "Works at Acme."
    ]
    assert alice.list(as_of=APR)[1][0]["content"] == "Works at Corp."


def test_integrations_see_current_memories_only() -> None:
    lg = PersistentMemoryStore.for_owner(OWNER)
    lg.put(("prefs",), "theme", {"text": "dark mode"})
    lg.put(("prefs",), "theme", {"text": "light mode"})
    assert LongTermMemory.objects.filter(owner=OWNER).count() == 2  # the item and its old value
    assert lg.get(("prefs",), "theme").value == {"text": "light mode"}
    assert [item.value for item in lg.search(("prefs",))] == [{"text": "light mode"}]
    assert [item.value for item in lg.search(("prefs",), query="mode")] == [{"text": "light mode"}]
    assert lg.list_namespaces() == [("prefs",)]
    lg.delete(("prefs",), "theme")
    assert not LongTermMemory.objects.exists()  # its versions went with it


def test_injection_sees_current_memories_only(settings: Any) -> None:
    settings.PERSISTENT_MEMORY = {"INJECT_MEMORIES": True}
    alice = memories_for(OWNER)
    alice.add("Prefers window seats.", key="seat")
    alice.add("Prefers aisle seats.", key="seat")
    assert [m["content"] for m in relevant_memories(OWNER, "Which seats?")] == ["Prefers aisle seats."]


def chain(owner: str = OWNER, key: str = "dog") -> dict[str, Any]:
    """A memory replaced twice: two versions behind it."""
    service = memories_for(owner)
    service.add("My dog is called Rex.", key=key, said_at=JAN)
    service.add("My dog is called Max.", key=key, said_at=FEB)
    return service.add("My dog is called Bo.", key=key, said_at=MAR)


def test_deleting_a_memory_deletes_its_versions() -> None:
    memory, other = chain(), chain(key="cat")
    memories_for(OWNER).delete(memory["id"])
    assert set(LongTermMemory.objects.values_list("key", flat=True)) == {"cat"}
    assert len(versions(other["id"])) == 2


def test_expiry_and_the_forgetting_policies_treat_a_chain_as_its_memory(settings: Any) -> None:
    alice = memories_for(OWNER)
    memory, kept = chain(), chain(key="cat")
    settings.PERSISTENT_MEMORY = {"MEMORY_RETENTION_DAYS": 30}
    # Versions are never swept by their own (old) times...
    LongTermMemory.objects.filter(superseded_by__isnull=False).update(
        updated_at=timezone.now() - timedelta(days=60)
    )
    assert sweep_memories() == 0 and LongTermMemory.objects.count() == 6
    # ...but with their memory, counted as one.
    LongTermMemory.objects.filter(pk=memory["id"]).update(updated_at=timezone.now() - timedelta(days=60))
    assert [m["key"] for m in alice.search("dog", as_of=FEB)] == ["cat"]  # the expired one's are gone
    with pytest.raises(MemoryNotFound):  # an expired memory's versions are gone for reads too
        alice.get(versions(memory["id"])[0].pk)
    assert sweep_memories(dry_run=True) == 1 and sweep_memories() == 1
    assert LongTermMemory.objects.count() == 3 and len(versions(kept["id"])) == 2
    # MEMORY_MAX_PER_OWNER counts memories, not versions.
    alice.add("Lives in Lyon.", key="city")
    settings.PERSISTENT_MEMORY = {"MEMORY_MAX_PER_OWNER": 2}
    assert forget_by_policy().over_budget == 0
    settings.PERSISTENT_MEMORY = {"MEMORY_MAX_PER_OWNER": 1}
    assert forget_by_policy().over_budget == 1  # the cat, least recently used, with its versions
    assert list(LongTermMemory.objects.values_list("key", flat=True)) == ["city"]


def test_forgetting_an_owner_deletes_the_versions(settings: Any) -> None:
    settings.PERSISTENT_MEMORY = memory_settings_for("memory")
    chain()
    kept = chain(owner="user:b")
    assert owner_holdings(OWNER)["memories"] == 3  # rows: the memory and its two versions
    assert forget_owner(OWNER, store=get_store())["memories"] == 3
    assert not LongTermMemory.objects.filter(owner=OWNER).exists()
    assert len(versions(kept["id"])) == 2


def test_json_lines_round_trip_the_versions(tmp_path: Any) -> None:
    memory = chain()
    alice = memories_for(OWNER)
    alice.add("Prefers tea.", key="tea", happened_at=FEB)
    before = {moment: alice.search("dog", as_of=moment) for moment in (JAN, FEB, MAR)}
    path = tmp_path / "memories.jsonl"
    call_command("memory_export_memories", "-o", str(path), stdout=StringIO(), stderr=StringIO())
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["key"] for line in lines] == ["dog", "tea"]  # one line a memory
    assert [v["content"] for v in lines[0]["versions"]] == ["My dog is called Max.", "My dog is called Rex."]
    assert (
        lines[0]["versions"][0]["valid_until"] == MAR.isoformat()
        and lines[1]["happened_at"] == FEB.isoformat()
    )
    LongTermMemory.objects.all().delete()
    for _ in range(2):  # the second import adds no version twice
        out = StringIO()
        call_command("memory_import_memories", str(path), "--json", stdout=out, stderr=StringIO())
        assert json.loads(out.getvalue()) == {"imported": 2, "refused": 0}
    dog = alice.get_by_key("dog")
    assert dog["content"] == memory["content"] and alice.get_by_key("tea")["happened_at"] == FEB
    assert [(v.content, v.said_at, v.valid_until) for v in versions(dog["id"])] == [
        ("My dog is called Max.", FEB, MAR),
        ("My dog is called Rex.", JAN, FEB),
    ]
    for moment, found in before.items():
        assert [m["content"] for m in alice.search("dog", as_of=moment)] == [m["content"] for m in found]
    # A line with a version that is none writes nothing of the line.
    bad = dict(lines[0], key="dog2", versions=[{"content": "x", "valid_until": None}])
    path.write_text(json.dumps(bad) + "\n")
    out = StringIO()
    call_command("memory_import_memories", str(path), "--json", stdout=out, stderr=StringIO())
    assert json.loads(out.getvalue()) == {"imported": 0, "refused": 1}
    assert alice.get_by_key("dog2") is None


ADMIN = "/admin/persistent_memory/longtermmemory/"


def test_the_admin_shows_the_chain_read_only() -> None:
    get_user_model().objects.create_superuser("root", "root@example.com", "pw-for-tests")
    client = Client()
    client.login(username="root", password="pw-for-tests")
    memory = chain()
    newest, oldest = versions(memory["id"])
    page = client.get(f"{ADMIN}{memory['id']}/change/").content.decode()
    assert "Older versions" in page and 'class="memory-versions"' in page
    assert page.index("My dog is called Max.") < page.index("My dog is called Rex.")  # newest first
    assert f"{ADMIN}{oldest.pk}/change/" in page
    listed = client.get(ADMIN).content.decode()
    assert "My dog is called Bo." in listed and "My dog is called Rex." not in listed
    superseded = client.get(ADMIN, {"version": "superseded"}).content.decode()
    assert "My dog is called Rex." in superseded and "My dog is called Bo." not in superseded
    assert "My dog is called Rex." in client.get(ADMIN, {"version": "all"}).content.decode()
    # A version's page: what replaced it, no save, no delete.
    version_page = client.get(f"{ADMIN}{oldest.pk}/change/")
    assert version_page.status_code == 200
    body = version_page.content.decode()
    assert f"{ADMIN}{memory['id']}/change/" in body and 'name="_save"' not in body
    assert client.post(f"{ADMIN}{oldest.pk}/change/", {"content": "edited"}).status_code == 403
    assert client.post(f"{ADMIN}{oldest.pk}/delete/", {"post": "yes"}).status_code == 403
    assert LongTermMemory.objects.get(pk=oldest.pk).content == "My dog is called Rex."
    # happened_at is edited on the memory's form (a correction: no version kept).
    form = {"session_id": "", "type": "factual", "key": "dog", "content": "My dog is called Bo.",
            "metadata": "{}", "said_at_0": "2025-03-01", "said_at_1": "00:00:00",
            "happened_at_0": "2024-05-01", "happened_at_1": "10:00:00",
            "expires_at_0": "", "expires_at_1": ""}  # fmt: skip
    assert client.post(f"{ADMIN}{memory['id']}/change/", form).status_code == 302
    edited = memories_for(OWNER).get(memory["id"])
    assert edited["happened_at"] == timezone.make_aware(datetime(2024, 5, 1, 10))
    assert edited["source"] == "admin"
    assert len(versions(memory["id"])) == 2


API = "/api/memory/memories/"


def test_rest_as_of_and_happened_at() -> None:
    user = get_user_model().objects.create_user("alice", password="pw-for-tests")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    first = client.post(
        API,
        {
            "content": "Went to Rome.",
            "key": "trip",
            "said_at": "2025-01-01T00:00:00Z",
            "happened_at": "2024-12-20T00:00:00Z",
        },
        format="json",
    ).json()
    assert first["happened_at"] == "2024-12-20T00:00:00Z" and first["valid_until"] is None
    client.post(
        API, {"content": "Went to Oslo.", "key": "trip", "said_at": "2025-03-01T00:00:00Z"}, format="json"
    )

    def search(**extra: str) -> Any:
        return client.post(f"{API}search/", {"query": "Went", "strategy": "keyword", **extra}, format="json")

    assert [m["content"] for m in search().json()["results"]] == ["Went to Oslo."]
    [old] = search(as_of="2025-02-01T00:00:00Z").json()["results"]
    assert (old["content"], old["superseded_by"], old["valid_until"]) == (
        "Went to Rome.",
        first["id"],
        "2025-03-01T00:00:00Z",
    )
    assert client.get(f"{API}{old['id']}/").json()["content"] == "Went to Rome."
    assert client.patch(f"{API}{old['id']}/", {"content": "x"}, format="json").status_code == 404
    listed = client.get(API, {"as_of": "2025-02-01T00:00:00Z"}).json()
    assert [m["content"] for m in listed["results"]] == ["Went to Rome."] and client.get(API).json()[
        "count"
    ] == 1
    for bad in (search(as_of="last May"), client.get(API, {"as_of": "never"})):
        assert bad.status_code == 400 and bad["Content-Type"] == "application/json"
        assert bad.json()["code"] == "invalid" and "as_of" in bad.json()["errors"]
    assert client.delete(f"{API}{first['id']}/").status_code == 200
    assert not LongTermMemory.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_migration_0017_goes_both_ways_and_keeps_keyword_search() -> None:
    """Undone, 0017 drops the versions (the unconditional constraint would refuse them);
    done again, keyword search still follows every write (SQLite rebuilds the table to
    change its constraint, which dropped the full-text triggers: 0017 makes them again)."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    chain()
    executor = MigrationExecutor(connection)
    target = ("persistent_memory", "0017_memories_supersession")
    before = executor.loader.graph.node_map[target].parents
    executor.migrate([parent.key for parent in before if parent.key[0] == "persistent_memory"])
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT content FROM persistent_memory_longtermmemory")
            assert [row[0] for row in cursor.fetchall()] == ["My dog is called Bo."]
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes("persistent_memory"))
    alice = memories_for(OWNER)
    tom = alice.add("My cat is called Tom.", key="cat")
    alice.add("My cat is called Felix.", key="cat")
    assert [m["content"] for m in alice.search("Felix", strategy="keyword")] == ["My cat is called Felix."]
    assert alice.search("Tom", strategy="keyword") == []
    then = alice.search("Tom", strategy="keyword", as_of=tom["created_at"])
    assert [m["content"] for m in then] == ["My cat is called Tom."]
    assert [m["content"] for m in alice.search("Bo", strategy="keyword")] == ["My dog is called Bo."]
