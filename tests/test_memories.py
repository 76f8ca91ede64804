"""Long-term memories in the database: upserts by key, validation, owner isolation,
expiry, and every search strategy (run on SQLite and on PostgreSQL)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from persistent_memory.exceptions import InvalidMemory, MemoryKeyExists, MemoryNotFound
from persistent_memory.memories import memories_for
from persistent_memory.models import LongTermMemory
from tests import readme_blocks

pytestmark = pytest.mark.django_db


def fake_embedder(texts: list[str]) -> list[list[float]]:
    """Vectors counting a few topic words: enough to tell topics apart."""
    topics = (("coffee", "tea", "espresso", "drink"), ("python", "code", "editor", "vim"), ("dog", "cat"))
    return [[float(sum(text.lower().count(w) for w in words)) for words in topics] for text in texts]


def test_add_upserts_by_key_and_derives_stable_keys() -> None:
    alice = memories_for("user:alice")
    first = alice.add("  I prefer   dark mode. ", key="ui.theme", metadata={"confidence": 0.9})
    again = alice.add("I prefer light mode", key="ui.theme")
    assert again["id"] == first["id"] and again["content"] == "I prefer light mode"
    assert first["content"] == "I prefer dark mode."  # whitespace normalized
    assert again["created_at"] == first["created_at"] and again["updated_at"] >= first["updated_at"]
    derived = alice.add("Likes green tea", type="semantic")
    assert derived["key"].startswith("semantic.likes-green-tea.")
    assert alice.add("likes GREEN tea.", type="semantic")["id"] == derived["id"]
    assert alice.list()[0] == 2  # two memories; each rewrite kept what it replaced
    assert LongTermMemory.objects.filter(owner="user:alice", superseded_by__isnull=False).count() == 2
    assert derived["tokens"] > 0 and derived["source"] == "api"


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"content": ""}, "empty"),
        ({"content": 5}, "string"),
        ({"content": "x" * 5000}, "MEMORY_MAX_CONTENT_CHARS"),
        ({"content": "a\x00b"}, r"U\+0000"),
        ({"content": "a\ud800"}, "surrogate"),
        ({"content": "ok", "type": "dream"}, "type"),
        ({"content": "ok", "source": "rumour"}, "source"),
        ({"content": "ok", "key": "has space"}, "key"),
        ({"content": "ok", "metadata": [1]}, "object"),
        ({"content": "ok", "metadata": {"x": float("nan")}}, "metadata"),
        ({"content": "ok", "metadata": {"x": "\x00"}}, r"U\+0000"),
        ({"content": "ok", "metadata": {"x": "y" * 20000}}, "metadata"),
        ({"content": "ok", "session_id": "bad id"}, "session_id"),
        ({"content": "ok", "source_messages": [1]}, "source_messages"),
        ({"content": "ok", "expires_at": "tomorrow"}, "expires_at"),
    ],
)
def test_bad_input_is_refused_before_anything_is_written(kwargs: dict, fragment: str) -> None:
    # A copy: the parameter is the module's own dict, and a second session in the same
    # process (mutmut's stats, then its clean run) would find it popped already.
    kwargs = dict(kwargs)
    content = kwargs.pop("content")
    with pytest.raises(InvalidMemory, match=fragment):
        memories_for("user:a").add(content, **kwargs)
    assert not LongTermMemory.objects.exists()


def test_metadata_may_hold_the_text_of_an_escape() -> None:
    """A backslash then "u0000" is six characters, not U+0000: kept as written (a nested
    NUL after an escaped backslash is still refused)."""
    written = {"path": "C:\\u0000", "pattern": "\\u0000", "deep": ["\\\\u0000"]}
    memory = memories_for("user:a").add("ok", metadata=written)
    assert LongTermMemory.objects.get(pk=memory["id"]).metadata == written
    with pytest.raises(InvalidMemory, match=r"U\+0000"):
        memories_for("user:a").add("ok", metadata={"x": "\\\x00"})


@pytest.mark.parametrize("key", ["user:prefs.theme", "a:b:c", ":", "x" * 256, "lg.ns:item"])
def test_keys_may_namespace_with_colons(key: str) -> None:
    alice = memories_for("user:a")
    first = alice.add("Prefers dark mode.", key=key)
    assert first["key"] == key
    assert alice.add("Prefers light mode.", key=key)["id"] == first["id"]  # the same memory
    assert alice.get_by_key(key)["content"] == "Prefers light mode."
    assert alice.update(first["id"], key=key + "2" if len(key) < 256 else "k:2")["id"] == first["id"]


@pytest.mark.parametrize("key", ["", "x" * 257, "a/b", "a b", "k\x00", "ключ", 5, None])
def test_keys_outside_the_pattern_are_refused(key: object) -> None:
    alice = memories_for("user:a")
    memory = alice.add("Prefers dark mode.", key="ok")
    for attempt in (
        lambda: alice.add("x", key=key) if key is not None else alice.get_by_key(key),  # type: ignore[arg-type]
        lambda: alice.update(memory["id"], key=key),
    ):
        with pytest.raises(InvalidMemory, match="key"):
            attempt()
    assert list(LongTermMemory.objects.values_list("key", flat=True)) == ["ok"]


def test_owners_never_see_each_others_memories() -> None:
    alice, bob = memories_for("user:alice"), memories_for("user:bob")
    secret = alice.add("Alice's bank is Acme", key="bank")
    bob_same_key = bob.add("Bob's bank is Bolt", key="bank")
    assert bob_same_key["id"] != secret["id"]
    for call in (
        lambda: bob.get(secret["id"]),
        lambda: bob.update(secret["id"], content="stolen"),
        lambda: bob.delete(secret["id"]),
    ):
        with pytest.raises(MemoryNotFound):
            call()
    for strategy in ("recent", "keyword", "hybrid"):
        assert [m["id"] for m in bob.search("bank Acme", strategy=strategy)] == [bob_same_key["id"]]
    assert bob.list()[0] == 1 and bob.stats()["count"] == 1
    assert alice.get(secret["id"])["content"] == "Alice's bank is Acme"
    assert memories_for("").list() == (0, [])


def test_update_delete_list_stats() -> None:
    svc = memories_for("user:a")
    one = svc.add("Deploys on Fridays are banned", type="procedural", session_id="s1")
    two = svc.add("Met Carol at PyCon", type="episodic")
    svc.add("Moved to Lisbon", key="home")
    with pytest.raises(MemoryKeyExists):
        svc.update(one["id"], key="home")
    with pytest.raises(InvalidMemory, match="cannot be changed"):
        svc.update(one["id"], owner="user:b")
    changed = svc.update(one["id"], content="Deploys on Fridays are fine now", metadata={"v": 2})
    assert changed["content"].endswith("fine now") and changed["metadata"] == {"v": 2}
    assert svc.list(types=["procedural"])[1][0]["id"] == one["id"]
    assert svc.list(session_id="s1")[0] == 1
    count, page = svc.list(limit=2)
    assert count == 3 and len(page) == 2 and page[0]["id"] == one["id"]  # newest update first
    stats = svc.stats()
    assert stats["count"] == 3 and stats["by_type"]["episodic"]["count"] == 1
    assert stats["tokens"] == sum(m["tokens"] for m in svc.list()[1])
    svc.delete(two["id"])
    with pytest.raises(MemoryNotFound):
        svc.get(two["id"])
    with pytest.raises(MemoryNotFound):
        svc.get("1")


def test_expired_memories_are_gone_and_a_new_write_revives_the_key(settings) -> None:
    svc = memories_for("user:a")
    past = timezone.now() - timedelta(seconds=1)
    old = svc.add("Temporary fact", key="tmp", expires_at=past)
    with pytest.raises(MemoryNotFound):
        svc.get(old["id"])
    assert svc.search("Temporary", strategy="keyword") == []
    fresh = svc.add("Temporary fact again", key="tmp")
    assert fresh["id"] == old["id"] and fresh["expires_at"] is None
    settings.PERSISTENT_MEMORY = {"MEMORY_RETENTION_DAYS": 30}
    LongTermMemory.objects.filter(pk=fresh["id"]).update(updated_at=timezone.now() - timedelta(days=31))
    assert svc.list() == (0, [])


def test_extraction_never_overwrites_a_memory_of_another_source() -> None:
    svc = memories_for("user:a")
    mine = svc.add("My editor is Emacs", key="editor", source="admin")
    kept = svc.add("My editor is vim", key="editor", source="extraction", source_messages=["m1"])
    assert kept["content"] == "My editor is Emacs" and kept["source"] == "admin"
    assert svc.get(mine["id"])["source_messages"] == []
    extracted = svc.add("I like tea", key="likes.tea", source="extraction", source_messages=["m2"])
    updated = svc.add("I like green tea", key="likes.tea", source="extraction", source_messages=["m3"])
    assert updated["id"] == extracted["id"] and updated["source_messages"] == ["m3"]


def test_the_guide_memories_example_runs_as_shown() -> None:
    """The example of docs/guide/memories.md (``<!-- example: memories -->``), run
    statement by statement, each ``# ->`` as shown: keyword and hybrid search find a
    memory by the words of its content and of its key; without an EMBEDDER a question
    in other words finds nothing, as the page says."""
    readme_blocks.run_example("memories", {})
    alice = memories_for("user:42")
    count, page = alice.list()
    assert (count, [m["key"] for m in page]) == (1, ["ui.theme"])  # the habit is deleted
    assert page[0]["content"] == "Prefers dark mode and large fonts."
    assert alice.search("Which colours does she like?") == []
    assert alice.search("Which colours does she like?", strategy="keyword") == []


def test_the_guide_message_search_example_runs_as_shown(store, settings) -> None:
    """docs/guide/memories.md's ``<!-- example: message-search -->`` on each backend, with
    the mirror on as sites have it (the suite's default is off): a message written is
    found by the next search, by its owner alone."""
    settings.PERSISTENT_MEMORY = {**settings.PERSISTENT_MEMORY, "MIRROR_MODE": "deferred"}
    readme_blocks.run_example("message-search", {})
    assert memories_for("user:42").search("puppy", kinds=["memory"]) == []


def seed(svc):
    svc.add("I prefer espresso in the morning", key="coffee")
    svc.add("My favourite editor is vim for Python code", key="editor")
    svc.add("The dog is called Rex", key="dog")
    return {m["key"]: m["id"] for m in svc.list()[1]}


def test_keyword_search_ranks_by_relevance_with_stemming_and_uses_the_index() -> None:
    svc = memories_for("user:a")
    ids = seed(svc)
    found = svc.search("Which EDITOR do I use for python?", strategy="keyword")
    assert [m["id"] for m in found] == [ids["editor"]]
    assert found[0]["score"] > 0 and found[0]["access_count"] == 1
    assert svc.get(ids["editor"])["access_count"] == 1
    # English stemming on both databases: "preferred" finds "prefer".
    assert [m["key"] for m in svc.search("preferred", strategy="keyword")] == ["coffee"]
    # Words are matched, never parsed as operators.
    assert svc.search("\" OR * NEAR( AND -- '); DROP", strategy="keyword") == []
    assert svc.search("", strategy="keyword") == []
    svc.update(ids["dog"], content="The cat is called Tom")
    assert [m["key"] for m in svc.search("cat", strategy="keyword")] == ["dog"]
    assert svc.search("Rex", strategy="keyword") == []
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pm_memory_fts")
            assert cursor.fetchone()[0] == 3
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET enable_seqscan = off")
            cursor.execute(
                "EXPLAIN SELECT id FROM persistent_memory_longtermmemory "
                "WHERE search_tsv @@ to_tsquery('english', 'cat')"
            )
            plan = " ".join(row[0] for row in cursor.fetchall())
            cursor.execute("SET enable_seqscan = on")
        assert "pm_memory_search_tsv" in plan


def test_keyword_scores_are_relative_to_the_best_match() -> None:
    """A reader sees 1 for the best match and fractions below it, not the database's raw
    rank (SQLite's BM25 is ``2e-06`` when every word is in half of a few memories)."""
    svc = memories_for("user:a")
    svc.add("I drink tea every morning", key="tea")
    svc.add("Green tea, never coffee, and tea again after lunch", key="green")
    svc.add("Tea or coffee: tea", key="both")
    found = svc.search("tea", strategy="keyword")
    scores = [m["score"] for m in found]
    assert len(found) == 3 and scores[0] == 1.0, scores
    assert all(0 < score <= 1 for score in scores) and scores == sorted(scores, reverse=True), scores
    assert [m["score_parts"]["keyword"] for m in found] == scores
    hybrid = svc.search("tea coffee")  # no embedder: keyword fused with recency
    assert max(m["score_parts"]["keyword"] for m in hybrid) == 1.0


@pytest.mark.parametrize("fulltext", [True, False], ids=["fulltext", "icontains"])
def test_keyword_search_reads_the_key_split_on_its_separators(fulltext: bool, monkeypatch) -> None:
    """``ui.theme`` is found by "theme" (it was not: only the content was read), by every
    strategy that searches words, and a word of the content counts more than one of the key."""
    if not fulltext:  # the fallback of other databases, and of SQLite without FTS5
        monkeypatch.setattr(connection, "vendor", "other")
    svc = memories_for("user:a")
    theme = svc.add("Prefers dark mode.", key="ui.theme")
    svc.add("Writes in British English", key="writing_style-spelling")
    for strategy in ("keyword", "hybrid"):
        assert [m["id"] for m in svc.search("Which theme does she like?", strategy=strategy)] == [theme["id"]]
    assert [m["key"] for m in svc.search("spelling", strategy="keyword")] == ["writing_style-spelling"]
    assert [m["key"] for m in svc.search("style", strategy="keyword")] == ["writing_style-spelling"]
    # The key is read as it is now, on every write path: renamed, the old word is gone.
    LongTermMemory.objects.filter(pk=theme["id"]).update(key="ui.colours")
    assert svc.search("theme", strategy="keyword") == []
    assert [m["id"] for m in svc.search("colours", strategy="keyword")] == [theme["id"]]
    # "mode" is the content of one and the key of the other: the content ranks first
    # (among enough memories that BM25 tells a rare word from a common one).
    in_key = svc.add("Prefers the terminal", key="editor.mode")
    for n in range(8):
        svc.add(f"Unrelated fact {n}", key=f"fact.{n}")
    found = svc.search("mode", strategy="keyword")
    assert [m["id"] for m in found] == [theme["id"], in_key["id"]] and found[0]["score"] > found[1]["score"]


def test_keyword_search_starts_from_the_full_text_matches() -> None:
    """The owner and expiry filters apply to the matches, in the same query: the search
    never lists every memory of the owner (it did, through ``id IN (subquery)``)."""
    svc = memories_for("user:a")
    seed(svc)
    memories_for("user:b").add("The cat is called Tom")
    with CaptureQueriesContext(connection) as queries:
        assert [m["key"] for m in svc.search("dog", strategy="keyword", types=["factual"])] == ["dog"]
    sql = queries.captured_queries[0]["sql"]  # the keyword query, its parameters in place
    assert "IN (SELECT" not in sql.upper() and "'user:a'" in sql and "'factual'" in sql
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"EXPLAIN {sql}")
            plan = " ".join(row[0] for row in cursor.fetchall())
            assert "Semi Join" not in plan and "SubPlan" not in plan, plan
        else:
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}")
            steps = [row[3] for row in cursor.fetchall()]
            assert steps[0].startswith("SCAN pm_memory_fts VIRTUAL TABLE"), steps
            assert "USING INTEGER PRIMARY KEY" in steps[1] and not any("SUBQUERY" in s for s in steps), steps
    assert svc.search("dog", strategy="keyword", types=[]) == []


def test_recent_and_hybrid_without_an_embedder() -> None:
    svc = memories_for("user:a")
    ids = seed(svc)
    assert [m["key"] for m in svc.search("", strategy="recent")] == ["dog", "editor", "coffee"]
    svc.add("Python 3.13 is what the team code uses", key="python")
    hybrid = svc.search("python code", strategy="hybrid")
    # Only matches come back; relevance and recency both count.
    assert {m["key"] for m in hybrid} == {"python", "editor"}
    assert all(m["score"] > 0 for m in hybrid)
    assert ids["dog"] not in [m["id"] for m in hybrid]
    assert svc.search("", strategy="hybrid")[0]["key"] == "python"  # no words: recency


def test_token_budget_keeps_order_and_at_least_one() -> None:
    svc = memories_for("user:a")
    for n in range(5):
        svc.add(f"Fact number {n} about tea " + "padding " * 20, key=f"f{n}")
    every = svc.search("tea", strategy="keyword")
    assert len(every) == 5
    tokens = every[0]["tokens"]
    two = svc.search("tea", strategy="keyword", max_tokens=tokens * 2 + 1)
    assert [m["id"] for m in two] == [m["id"] for m in every[:2]]
    assert len(svc.search("tea", strategy="keyword", max_tokens=1)) == 1
    assert len(svc.search("tea", strategy="keyword", limit=3)) == 3
    assert svc.search("coffee", strategy="keyword", max_tokens=1) == []
    with pytest.raises(InvalidMemory):
        svc.search("tea", strategy="magic")
    with pytest.raises(InvalidMemory, match="EMBEDDER"):
        svc.search("tea", strategy="semantic")


def test_semantic_and_hybrid_with_an_embedder(settings) -> None:
    settings.PERSISTENT_MEMORY = {"EMBEDDER": "tests.test_memories.fake_embedder"}
    svc = memories_for("user:a")
    ids = seed(svc)
    row = LongTermMemory.objects.get(pk=ids["coffee"])
    assert row.embedding == [1.0, 0.0, 0.0]
    # A custom embedder's vectors are named by its import string: the same in every process.
    assert (row.embedding_model, row.embedding_dimensions) == ("tests.test_memories.fake_embedder", 3)
    # No shared word, same topic: only meaning finds it.
    found = svc.search("a cup of tea", strategy="semantic", limit=1)
    assert [m["key"] for m in found] == ["coffee"] and found[0]["score"] == pytest.approx(1.0)
    assert svc.search("tea drink", strategy="keyword") == []
    hybrid = svc.search("tea drink", strategy="hybrid", limit=1)
    assert [m["key"] for m in hybrid] == ["coffee"]
    svc.update(ids["coffee"], content="I own a cat")
    assert LongTermMemory.objects.get(pk=ids["coffee"]).embedding == [0.0, 0.0, 1.0]
    assert memories_for("user:b").search("tea", strategy="semantic") == []


def test_memory_sweep_deletes_expired_memories(settings) -> None:
    from io import StringIO

    from django.core.management import call_command

    svc, other = memories_for("user:a"), memories_for("user:b")
    past = timezone.now() - timedelta(seconds=1)
    svc.add("Gone", key="gone", expires_at=past)
    kept = svc.add("Kept", key="kept", expires_at=timezone.now() + timedelta(days=1))
    other.add("Also gone", key="gone", expires_at=past)
    old = svc.add("Old", key="old")
    LongTermMemory.objects.filter(pk=old["id"]).update(updated_at=timezone.now() - timedelta(days=10))

    def sweep(*args: str) -> dict:
        out = StringIO()
        call_command("memory_sweep", "--json", *args, stdout=out, stderr=StringIO())
        return json.loads(out.getvalue())

    assert sweep("--dry-run", "--owner", "user:a")["memories_deleted"] == 1
    assert LongTermMemory.objects.count() == 4
    assert sweep("--owner", "user:a")["memories_deleted"] == 1
    assert sweep()["memories_deleted"] == 1  # user:b's
    settings.PERSISTENT_MEMORY = {"MEMORY_RETENTION_DAYS": 7}
    assert sweep()["memories_deleted"] == 1  # not updated for 10 days
    assert list(LongTermMemory.objects.values_list("id", flat=True)) == [kept["id"]]


@pytest.mark.parametrize(
    "bad",
    [
        {"MEMORY_MAX_CONTENT_CHARS": 0},
        {"MEMORY_MAX_TOKENS": "many"},
        {"MEMORY_RETENTION_DAYS": -1},
        {"INJECT_MEMORIES": "yes"},
        {"MEMORY_SEARCH_STRATEGY": "magic"},
        {"MEMORY_SEARCH_STRATEGY": "semantic"},
        {"EMBEDDER": "no.such.embedder"},
        {"MEMORY_EXTRACTORS": ["no.such.extractor"]},
        {"MEMORY_EXTRACTORS": "persistent_memory.memories.extraction.rules.extract"},
        {"MEMORY_EXTRACTION_WORKER": "yes"},
        {"MEMORY_EXTRACTION_QUEUE_SIZE": 0},
        {"MEMORY_EXTRACTOR_OPTIONS": ["model"]},
    ],
)
def test_checks_report_bad_memory_settings(settings, bad: dict) -> None:
    from persistent_memory.checks import check_settings

    settings.PERSISTENT_MEMORY = bad
    ids = {message.id for message in check_settings()}
    assert ids & {"persistent_memory.E002", "persistent_memory.E012"}, ids


def test_checks_accept_the_memory_defaults_and_an_embedder(settings) -> None:
    from persistent_memory.checks import MEMORY_STRATEGIES, check_settings
    from persistent_memory.memories.search import STRATEGIES

    assert MEMORY_STRATEGIES == STRATEGIES
    settings.PERSISTENT_MEMORY = {
        "EMBEDDER": "tests.test_memories.fake_embedder",
        "MEMORY_SEARCH_STRATEGY": "semantic",
        "INJECT_MEMORIES": True,
        "MEMORY_RETENTION_DAYS": 30,
        "MEMORY_EXTRACTION_WORKER": False,
        "MEMORY_EXTRACTION_QUEUE_SIZE": 10,
        "MEMORY_EXTRACTOR_OPTIONS": {"model": "m"},
    }
    assert check_settings() == []


@pytest.mark.django_db(transaction=True)
def test_access_counts_commit_without_waiting_for_the_log_flush_on_postgresql() -> None:
    svc = memories_for("user:a")
    ids = seed(svc)
    with CaptureQueriesContext(connection) as queries:
        found = svc.search("editor", strategy="keyword")
    assert [m["id"] for m in found] == [ids["editor"]]
    assert svc.get(ids["editor"])["access_count"] == 1  # committed, outside any test transaction
    relaxed = [q["sql"] for q in queries.captured_queries if "synchronous_commit" in q["sql"]]
    assert relaxed == (["SET LOCAL synchronous_commit TO OFF"] if connection.vendor == "postgresql" else [])


@pytest.mark.parametrize("strategy", ["keyword", "hybrid", "recent"])
def test_search_keeps_to_when_things_were_said(strategy: str) -> None:
    alice = memories_for("user:a")
    may, june = datetime(2023, 5, 8, tzinfo=UTC), datetime(2023, 6, 20, tzinfo=UTC)
    alice.add("Caroline went hiking in the Alps.", key="hike.alps", said_at=may)
    alice.add("Caroline went hiking in Norway.", key="hike.norway", said_at=june)
    undated = alice.add("Caroline went hiking near home.", key="hike.home")  # said: created now
    memories_for("user:b").add("Caroline went hiking in Peru.", key="hike.peru", said_at=may)

    def keys(**bounds: datetime) -> set[str]:
        return {m["key"] for m in alice.search("Caroline hiking", strategy=strategy, **bounds)}

    assert keys() == {"hike.alps", "hike.norway", "hike.home"}
    assert keys(said_before=june) == {"hike.alps"}
    assert keys(said_after=june) == {"hike.norway", "hike.home"}
    assert keys(said_after=may, said_before=june + timedelta(days=1)) == {"hike.alps", "hike.norway"}
    assert keys(said_after=undated["created_at"] + timedelta(seconds=1)) == set()
    with pytest.raises(InvalidMemory, match="said_after"):
        alice.search("Caroline", said_after="May")  # type: ignore[arg-type]
