"""Semantic long-term memory: the "openai" embedder against a local server speaking the
embeddings API (batching, retries, a failing and a hanging server), vectors stored with
their model, search that finds what a question meant, hybrid scores and their parts,
recency decay, duplicates merged at write time and by ``memory_consolidate``, the
forgetting policies of ``memory_sweep``, similar memories over REST and in the admin,
health and checks. Run on SQLite and on PostgreSQL (with and without pgvector: the
vector backend in use is asserted where ``PM_EXPECT_VECTOR_BACKEND`` names one)."""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from io import StringIO

import pytest
from django.core import checks
from django.core.management import call_command
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from persistent_memory.memories import embedders, memories_for, vectors
from persistent_memory.memories.records import vector_fields
from persistent_memory.models import LongTermMemory
from tests.chat_server import HANG
from tests.embeddings_server import DIMENSIONS, Script, embed_text, embeddings_server

pytestmark = pytest.mark.django_db

PYTHON = "I prefer Python over Java for scripting."
QUESTION = "Which language should I use?"


@pytest.fixture
def server():
    with embeddings_server() as state:
        yield state


def configure(settings, server, **options) -> None:
    settings.PERSISTENT_MEMORY = {
        **getattr(settings, "PERSISTENT_MEMORY", {}),
        "EMBEDDER": "openai",
        "EMBEDDER_OPTIONS": {"base_url": server.url, "model": "stand-in", "api_key_env": None, **options},
    }


@pytest.fixture
def semantic(settings, server):
    configure(settings, server, max_retries=0)
    return server


def run(command: str, *args: str) -> dict:
    out = StringIO()
    call_command(command, *args, "--json", stdout=out, stderr=StringIO())
    return json.loads(out.getvalue())


def test_the_vector_backend_is_the_one_this_database_offers(semantic) -> None:
    expected = os.environ.get("PM_EXPECT_VECTOR_BACKEND")
    kind = vectors.backend()
    if expected:  # CI names it where it must be used: never a silent fallback
        assert kind == expected
    assert kind == (
        vectors.PGVECTOR
        if vectors.has_vector_table()
        else vectors.SQLITE_VEC
        if getattr(connection, "pm_sqlite_vec", False)
        else vectors.NUMPY
    )


def test_the_openai_embedder_batches_in_order_and_stores_model_and_length(
    settings, server, monkeypatch
) -> None:
    monkeypatch.setenv("PM_TEST_EMBEDDINGS_KEY", "sk-test-123")
    configure(settings, server, batch_size=2, api_key_env="PM_TEST_EMBEDDINGS_KEY")
    texts = [f"text {n} about coffee" for n in range(5)]
    assert embedders.current().embed(texts) == [embed_text(t) for t in texts]  # order kept
    assert [len(r["body"]["input"]) for r in server.requests] == [2, 2, 1]
    assert all(r["headers"]["authorization"] == "Bearer sk-test-123" for r in server.requests)
    assert all(r["body"]["model"] == "stand-in" and "dimensions" not in r["body"] for r in server.requests)
    memory = memories_for("user:a").add(PYTHON)
    row = LongTermMemory.objects.get(pk=memory["id"])
    assert row.embedding == pytest.approx(embed_text(PYTHON))
    assert (row.embedding_model, row.embedding_dimensions) == ("stand-in", DIMENSIONS)
    assert "sk-test" not in repr(embedders.current().function)


def test_dimensions_are_sent_and_stored(settings, server) -> None:
    configure(settings, server, dimensions=8)
    memory = memories_for("user:a").add(PYTHON)
    assert server.requests[-1]["body"]["dimensions"] == 8
    assert LongTermMemory.objects.get(pk=memory["id"]).embedding_dimensions == 8


def test_the_client_retries_with_backoff(settings, server) -> None:
    configure(settings, server, max_retries=2)
    server.script = [Script(status=500), Script(status=503), Script()]
    assert embedders.current().embed(["coffee"]) == [embed_text("coffee")]
    assert len(server.requests) == 3


def test_a_failing_embedder_never_fails_a_write_and_memory_embed_catches_up(semantic) -> None:
    semantic.script = [Script(status=500)]
    before = embedders.health.failures
    alice = memories_for("user:alice")
    memory = alice.add(PYTHON, metadata={"via": "test"})
    row = LongTermMemory.objects.get(pk=memory["id"])
    assert row.embedding is None and row.embedding_model == "" and memory["content"] == PYTHON
    assert embedders.health.failures == before + 1 and "500" in embedders.health.last_error
    # Search falls back: semantic answers by keyword, hybrid by keyword and recency.
    assert [m["id"] for m in alice.search("Python scripting", strategy="semantic")] == [memory["id"]]
    assert alice.search("Python scripting")[0]["score_parts"]["semantic"] is None
    staff = _staff_client()
    part = staff.get("/api/memory/health/").json()["embedder"]
    assert part["status"] == "ok" and part["pending"] == 1 and part["failures"] >= 1
    # Still failing: counted, not embedded, the command exits non-zero.
    with pytest.raises(Exception, match="failed for 1"):
        call_command("memory_embed", stdout=StringIO(), stderr=StringIO())
    semantic.script = [Script()]
    counts = run("memory_embed")
    assert counts["embedded"] == 1 and counts["pending"] == 0 and counts["failed"] == 0
    assert LongTermMemory.objects.get(pk=memory["id"]).embedding == pytest.approx(embed_text(PYTHON))
    assert [m["id"] for m in alice.search(QUESTION, strategy="semantic")] == [memory["id"]]


def test_a_hanging_embedder_times_out_and_the_write_goes_through(settings, server) -> None:
    configure(settings, server, timeout=0.5, max_retries=0)
    server.script = [Script(delay=HANG)]
    memory = memories_for("user:a").add("Drinks espresso daily.")
    assert LongTermMemory.objects.get(pk=memory["id"]).embedding is None
    assert "Timeout" in embedders.health.last_error


def test_semantic_and_hybrid_find_what_the_question_meant(semantic) -> None:
    owner = memories_for("user:alice")
    python = owner.add(PYTHON)
    owner.add("Drinks green tea in the morning.")
    owner.add("Has a dog called Rex.")
    memories_for("user:bob").add("Prefers Java for every language task.")  # another owner's
    assert owner.search(QUESTION, strategy="keyword") == []
    for strategy in ("semantic", "hybrid"):
        found = owner.search(QUESTION, strategy=strategy)
        assert found[0]["id"] == python["id"], strategy
        assert all(m["owner"] == "user:alice" for m in found)
    parts = owner.search(QUESTION)[0]["score_parts"]
    assert parts["keyword"] is None and parts["semantic"] > 0.5 and parts["relevance"] > 0
    assert parts["recency"] == 1.0 and parts["frequency"] == 1.0  # no decay, no access weight by default
    # A question sharing a keyword ranks first in both lists: its fused score is higher.
    both = owner.search("Which language, python?")[0]
    assert both["id"] == python["id"] and both["score_parts"]["keyword"] > 0
    assert all(
        m["score_parts"]["relevance"] < both["score_parts"]["relevance"]
        for m in owner.search("Which language, python?")[1:]
    )


def test_recency_decay_and_access_weight(settings, semantic) -> None:
    settings.PERSISTENT_MEMORY = {
        **settings.PERSISTENT_MEMORY,
        "MEMORY_DEDUP_DISTANCE": None,
    }  # equal vectors
    owner = memories_for("user:a")
    old = owner.add("Lives in Berlin.", type="episodic")
    new = owner.add("Lives in Paris.", type="episodic")
    LongTermMemory.objects.filter(pk=old["id"]).update(updated_at=timezone.now() - timedelta(days=30))
    LongTermMemory.objects.filter(pk=new["id"]).update(updated_at=timezone.now() - timedelta(days=1))
    settings.PERSISTENT_MEMORY = {**settings.PERSISTENT_MEMORY, "MEMORY_HALF_LIFE_DAYS": 30}
    ranked = owner.search("Which city is home?", strategy="hybrid")
    found = {m["id"]: m["score_parts"] for m in ranked}
    assert found[old["id"]]["recency"] == pytest.approx(0.5, abs=0.01)
    assert found[new["id"]]["recency"] > 0.95
    assert [m["id"] for m in ranked] == [new["id"], old["id"]]  # equally relevant, one fresher
    # Those searches counted an access of both: a use, so the decay starts again.
    found = {m["id"]: m["score_parts"] for m in owner.search("Which city is home?")}
    assert found[old["id"]]["recency"] > 0.99
    settings.PERSISTENT_MEMORY = {**settings.PERSISTENT_MEMORY, "MEMORY_HALF_LIFE_DAYS": None}
    LongTermMemory.objects.filter(pk=old["id"]).update(access_count=50)
    settings.PERSISTENT_MEMORY = {**settings.PERSISTENT_MEMORY, "MEMORY_ACCESS_WEIGHT": 0.5}
    top = owner.search("Which city is home?")[0]
    assert top["id"] == old["id"] and top["score_parts"]["frequency"] > 2


def test_duplicates_merge_at_write_time_within_one_owner_and_type(settings, semantic) -> None:
    alice = memories_for("user:alice")
    first = alice.add("I prefer dark mode.", metadata={"confidence": 0.7, "via": "chat"})
    merged = alice.add("I prefer the dark mode", metadata={"confidence": 0.9})
    assert merged["id"] == first["id"] and merged["key"] == first["key"]
    assert merged["content"] == "I prefer the dark mode"
    assert merged["metadata"] == {"confidence": 0.9, "via": "chat"}
    assert [h["content"] for h in merged["history"]] == ["I prefer dark mode."]
    assert merged["history"][0]["reason"] == "merged"
    # One memory; what it said before, a superseded version of it.
    assert LongTermMemory.objects.filter(owner="user:alice", superseded_by__isnull=True).count() == 1
    assert LongTermMemory.objects.get(superseded_by=first["id"]).content == "I prefer dark mode."
    # Another type, another owner, an explicit key, or a distinct fact: a row of its own.
    alice.add("I prefer dark mode.", type="procedural")
    memories_for("user:bob").add("I prefer dark mode.")
    alice.add("I prefer dark mode.", key="ui.theme")
    alice.add("Has a dog called Rex.")
    assert LongTermMemory.objects.filter(owner="user:alice", superseded_by__isnull=True).count() == 4
    assert LongTermMemory.objects.filter(owner="user:bob").count() == 1
    # An extraction never changes a memory another source wrote.
    kept = alice.add("Drinks coffee every day.")
    again = alice.add("drinks coffee, every day!", source="extraction")
    assert again["id"] == kept["id"] and again["content"] == "Drinks coffee every day."
    settings.PERSISTENT_MEMORY = {**settings.PERSISTENT_MEMORY, "MEMORY_DEDUP_DISTANCE": None}
    assert alice.add("I prefer a dark mode")["id"] != first["id"]


def test_memory_consolidate_merges_stored_duplicates_per_owner(settings, semantic) -> None:
    settings.PERSISTENT_MEMORY = {**settings.PERSISTENT_MEMORY, "MEMORY_DEDUP_DISTANCE": None}
    alice, bob = memories_for("user:alice"), memories_for("user:bob")
    oldest = alice.add("I prefer dark mode.", metadata={"a": 1})
    alice.add("I prefer the dark mode.", metadata={"b": 2})
    newest = alice.add("I prefer a dark mode", source="extraction")
    alice.add("Has a dog called Rex.")
    bob.add("I prefer dark mode.")
    bob_twin = bob.add("I prefer the dark mode.")
    LongTermMemory.objects.filter(pk=oldest["id"]).update(access_count=2)
    dry = run("memory_consolidate", "--dry-run", "--distance", "0.05")
    assert (dry["groups"], dry["merged"]) == (2, 3) and LongTermMemory.objects.count() == 6
    counts = run("memory_consolidate", "--distance", "0.05", "--owner", "user:alice")
    assert (counts["groups"], counts["merged"]) == (1, 2)
    survivor = alice.get(oldest["id"])
    # The newest content not extracted wins; the extracted one is kept in the history.
    assert survivor["content"] == "I prefer the dark mode." and survivor["key"] == oldest["key"]
    assert survivor["metadata"] == {"a": 1, "b": 2} and survivor["access_count"] == 2
    assert {h["content"] for h in survivor["history"]} == {"I prefer dark mode.", newest["content"]}
    assert alice.list()[0] == 2 and bob.get(bob_twin["id"])  # bob's untouched
    assert run("memory_consolidate", "--distance", "0.05")["merged"] == 1  # now bob's pair


def test_a_model_change_leaves_old_vectors_out_until_memory_embed(settings, semantic) -> None:
    owner = memories_for("user:a")
    python = owner.add(PYTHON)
    owner.add("Drinks green tea.")
    configure(settings, semantic, model="stand-in-2", max_retries=0)
    assert owner.search(QUESTION, strategy="semantic") == []  # no vector of this model yet
    warnings = [m for m in checks.run_checks(databases=["default"]) if m.id == "persistent_memory.W008"]
    assert warnings and "2 memories" in warnings[0].msg
    counts = run("memory_embed")
    assert counts["embedded"] == 2 and counts["pending"] == 0
    assert owner.search(QUESTION, strategy="semantic")[0]["id"] == python["id"]
    assert LongTermMemory.objects.get(pk=python["id"]).embedding_model == "stand-in-2"
    assert run("memory_embed")["embedded"] == 0
    assert run("memory_embed", "--all")["embedded"] == 2
    assert run("memory_embed", "--all", "--owner", "user:nobody")["embedded"] == 0


def test_checks_report_the_vector_backend(semantic) -> None:
    infos = [m for m in checks.run_checks(databases=["default"]) if m.id == "persistent_memory.I001"]
    assert len(infos) == 1 and vectors.backend() in infos[0].msg
    if vectors.backend() == vectors.NUMPY:
        assert infos[0].hint  # what would compare in the database instead
    assert not [m for m in checks.run_checks() if m.id == "persistent_memory.I001"]  # offline check


def test_forgetting_policies_in_memory_sweep(settings) -> None:
    owner, other = memories_for("user:a"), memories_for("user:b")
    ids = [owner.add(f"Fact number {n}.", key=f"fact.{n}")["id"] for n in range(5)]
    now = timezone.now()
    for age, pk in enumerate(ids):  # fact.0 is the least recently used
        LongTermMemory.objects.filter(pk=pk).update(updated_at=now - timedelta(days=100 - age))
    LongTermMemory.objects.filter(pk=ids[0]).update(last_accessed_at=now)  # used today
    other.add("Another owner's fact.", key="fact.0")
    settings.PERSISTENT_MEMORY = {"MEMORY_INACTIVE_DAYS": 97, "MEMORY_MAX_PER_OWNER": 2}
    dry = run("memory_sweep", "--dry-run")
    assert (dry["memories_inactive"], dry["memories_over_budget"]) == (3, 0)
    settings.PERSISTENT_MEMORY = {"MEMORY_INACTIVE_DAYS": 98, "MEMORY_MAX_PER_OWNER": 2}
    counts = run("memory_sweep")
    assert (counts["memories_inactive"], counts["memories_over_budget"]) == (2, 1)
    # fact.1 and fact.2 unused for 99 and 98+ days; then of fact.0, .3, .4 the least recently used goes.
    assert sorted(m["key"] for m in owner.list()[1]) == ["fact.0", "fact.4"]
    assert other.list()[0] == 1


def test_similar_memories_over_rest_and_in_the_admin(semantic, admin_client) -> None:
    from tests.test_memories_api import make_user

    (_, alice), (_, bob) = make_user("alice"), make_user("bob")
    python = alice.post("/api/memory/memories/", {"content": PYTHON}, format="json").json()
    alice.post("/api/memory/memories/", {"content": "Writes code in Java at work."}, format="json")
    alice.post("/api/memory/memories/", {"content": "Has a dog called Rex."}, format="json")
    answer = alice.get(f"/api/memory/memories/{python['id']}/similar/?limit=1")
    assert answer.status_code == 200
    results = answer.json()["results"]
    assert [m["content"] for m in results] == ["Writes code in Java at work."]
    assert results[0]["score"] == results[0]["score_parts"]["semantic"] > 0.5
    assert bob.get(f"/api/memory/memories/{python['id']}/similar/").json()["code"] == "memory_not_found"
    assert alice.get("/api/memory/memories/x/similar/").status_code == 404
    assert alice.get(f"/api/memory/memories/{python['id']}/similar/?limit=0").json()["code"] == "invalid"
    page = admin_client.get(
        f"/admin/persistent_memory/longtermmemory/{python['id']}/change/"
    ).content.decode()
    assert "Similar memories" in page and "Writes code in Java at work." in page


def test_injection_and_the_langgraph_store_use_semantic_search(settings, semantic) -> None:
    from persistent_memory.integrations.langgraph import PersistentMemoryStore
    from persistent_memory.memories.injection import relevant_memories

    memories_for("user:a").add(PYTHON)
    settings.PERSISTENT_MEMORY = {**settings.PERSISTENT_MEMORY, "INJECT_MEMORIES": True}
    assert [m["content"] for m in relevant_memories("user:a", QUESTION)] == [PYTHON]
    assert relevant_memories("user:b", QUESTION) == []
    store = PersistentMemoryStore(owner="user:a")
    store.put(("prefs",), "lang", {"text": "Python for scripting"})
    store.put(("prefs",), "pet", {"text": "a dog called Rex"})
    assert [item.key for item in store.search(("prefs",), query=QUESTION, limit=1)] == ["lang"]


def _staff_client() -> APIClient:
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.create_user("staff-embed", password="x", is_staff=True)
    client = APIClient()
    client.force_authenticate(user)
    return client


def _bulk(owner: str, vector: list[float], count: int, prefix: str) -> None:
    LongTermMemory.objects.bulk_create(
        LongTermMemory(
            owner=owner, key=f"{prefix}.{n}", content=f"{prefix} {n}", **vector_fields(vector, "stand-in")
        )
        for n in range(count)
    )


def test_pgvector_search_uses_the_hnsw_index_and_keeps_owners_apart(settings, server) -> None:
    from django.test.utils import CaptureQueriesContext

    if not vectors.has_vector_table():
        pytest.skip("PostgreSQL with pgvector only (CI runs this file on one: tests/pgvector_server.py)")

    configure(settings, server, dimensions=384, max_retries=0)  # a sentence model's length
    target = embed_text(QUESTION, 384)
    near_miss = embed_text(QUESTION + " python", 384)
    vectors.ensure_index(len(target))
    _bulk("user:crowd", target, 3000, "crowd")  # nearer than anything of alice's
    _bulk("user:alice", near_miss, 5, "alice")
    with connection.cursor() as cursor:
        cursor.execute(f"ANALYZE {vectors.TABLE}, {vectors.VECTORS}")  # as autovacuum would
    alice = memories_for("user:alice")
    # Alice's five are found although 3,000 nearer vectors of another owner come first in
    # the index: the iterative scan goes on past them.
    found = alice.search(QUESTION, strategy="semantic", limit=5)
    assert sorted(m["key"] for m in found) == [f"alice.{n}" for n in range(5)]
    crowd = memories_for("user:crowd")
    with CaptureQueriesContext(connection) as queries:
        found = crowd.search(QUESTION, strategy="semantic", limit=3, kinds=["memory"])
    assert len(found) == 3 and all(m["owner"] == "user:crowd" for m in found)
    [sql] = [q["sql"] for q in queries.captured_queries if "<=>" in q["sql"]]
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + sql)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert f"Index Scan using {vectors.index_name(len(target))}" in plan, plan

    def vector_rows() -> int:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT count(*) FROM {vectors.VECTORS}")  # noqa: S608 - our table
            return cursor.fetchone()[0]

    # The triggers keep the vector table equal to the memories' vectors on every path.
    assert vector_rows() == LongTermMemory.objects.filter(embedding__isnull=False).count() == 3005
    memories_for("user:crowd").delete_all()  # forgetting an owner
    assert vector_rows() == 5
    alice.update(alice.list()[1][0]["id"], content="Something else entirely.")  # replaced, not added
    assert vector_rows() == 5
    LongTermMemory.objects.filter(owner="user:alice").update(**vector_fields(None, ""))
    assert vector_rows() == 0


def test_the_guides_semantic_examples_run_as_shown(settings, server) -> None:
    """docs/guide/memories.md: its settings (pointed at the stand-in server instead of
    Ollama) and its example, each ``# ->`` as shown; then the README's own question
    finds the memory keyword search could not."""
    from tests import readme_blocks

    shown: dict = {}
    exec(readme_blocks.example("memories-embedder-settings"), shown)  # noqa: S102 - the page's own code
    conf = shown["PERSISTENT_MEMORY"]
    assert (
        conf["EMBEDDER"] == "openai" and conf["EMBEDDER_OPTIONS"]["base_url"] == "http://localhost:11434/v1"
    )
    conf["EMBEDDER_OPTIONS"]["base_url"] = server.url
    settings.PERSISTENT_MEMORY = conf
    readme_blocks.run_example("memories-semantic", {})
    assert {r["body"]["model"] for r in server.requests} == {"nomic-embed-text"}
    ada = memories_for("user:7")
    assert ada.list()[0] == 1
    ada.add("Prefers dark mode.", key="ui.theme")
    assert [m["key"] for m in ada.search("Which colours does she like?", limit=1)] == ["ui.theme"]


def test_the_numpy_comparison_is_bounded_by_the_scan_limit(settings, semantic) -> None:
    """Where no database compares vectors, a search reads at most MEMORY_VECTOR_SCAN_LIMIT
    of the owner's vectors, the most recently updated."""
    if vectors.backend() != vectors.NUMPY:
        pytest.skip("the numpy backend only (this database compares vectors itself)")
    owner = memories_for("user:a")
    python = owner.add(PYTHON)
    owner.add("Drinks green tea.")
    owner.add("Has a dog called Rex.")
    LongTermMemory.objects.filter(pk=python["id"]).update(updated_at=timezone.now() - timedelta(days=1))
    assert owner.search(QUESTION, strategy="semantic")[0]["id"] == python["id"]
    settings.PERSISTENT_MEMORY = {**settings.PERSISTENT_MEMORY, "MEMORY_VECTOR_SCAN_LIMIT": 2}
    assert python["id"] not in [m["id"] for m in owner.search(QUESTION, strategy="semantic")]


def test_checks_refuse_bad_embedder_settings(settings) -> None:
    from persistent_memory.checks import check_settings

    for bad in (
        {"EMBEDDER": "openai", "EMBEDDER_OPTIONS": {"modle": "x"}},
        {"EMBEDDER": "no.such.embedder"},
        {"MEMORY_HYBRID_ALPHA": 1.5},
        {"MEMORY_DEDUP_DISTANCE": -0.1},
        {"MEMORY_MAX_PER_OWNER": 0},
        {"MEMORY_HALF_LIFE_DAYS": 0},
    ):
        settings.PERSISTENT_MEMORY = bad
        assert check_settings(), bad
    with pytest.MonkeyPatch.context() as patch:  # "openai" without the openai package
        patch.setitem(sys.modules, "openai", None)
        settings.PERSISTENT_MEMORY = {"EMBEDDER": "openai"}
        assert [m.id for m in check_settings()] == ["persistent_memory.E012"]
    settings.PERSISTENT_MEMORY = {
        "EMBEDDER": "openai",
        "EMBEDDER_OPTIONS": {"model": "m", "base_url": "http://127.0.0.1:1/v1", "api_key_env": None},
        "MEMORY_HYBRID_ALPHA": 0.5,
        "MEMORY_MAX_PER_OWNER": 100,
    }
    assert check_settings() == []


def test_alpha_weighs_the_lists(settings, semantic) -> None:
    """MEMORY_HYBRID_ALPHA 1: meaning alone orders hybrid results; 0: each keyword match
    weighs the share of the question's information it holds (keyword alone)."""
    owner = memories_for("user:a")
    python = owner.add(PYTHON)
    worded = owner.add(
        "Use the stairs, not the lift, in the old office building downtown."
    )  # words, no meaning
    question = "Office stairs, python?"  # worded holds 2 of its 3 words; python the third, and its meaning
    settings.PERSISTENT_MEMORY = {**settings.PERSISTENT_MEMORY, "MEMORY_HYBRID_ALPHA": 0.0}
    assert owner.search(question)[0]["id"] == worded["id"]
    settings.PERSISTENT_MEMORY = {**settings.PERSISTENT_MEMORY, "MEMORY_HYBRID_ALPHA": 1.0}
    assert owner.search(question)[0]["id"] == python["id"]
    # The same match of one word in four: at the default, meaning outweighs it.
    settings.PERSISTENT_MEMORY = {**settings.PERSISTENT_MEMORY, "MEMORY_HYBRID_ALPHA": 0.5}
    assert owner.search("Which language should I use?")[0]["id"] == python["id"]
