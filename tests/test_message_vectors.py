"""Conversation messages compared by meaning where the memories are: on PostgreSQL with
pgvector, by the database (``pm_message_vector``, migration 0018, written with each
message's bytes, emptied by triggers with its rows; an HNSW index per length; iterative
scans); elsewhere sqlite-vec or numpy over the stored bytes. Run on SQLite and on
PostgreSQL with and without pgvector (CI's semantic pass names the backend that must be
in use in ``PM_EXPECT_VECTOR_BACKEND``)."""

from __future__ import annotations

import os
from array import array
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from persistent_memory.memories import embedders, memories_for, message_search, vectors
from persistent_memory.models import MemoryConversation, MemoryMessage, MemorySession
from persistent_memory.operations.forget import forget_owner
from persistent_memory.operations.maintenance import sweep
from tests.embeddings_server import embed_text, embeddings_server

pytestmark = pytest.mark.django_db

QUESTION = "Which pet do they have?"  # shares no word with the answer: found by meaning alone
PUPPY = "We adopted a puppy last week!"
TABLE = message_search.VECTORS.vectors


@pytest.fixture
def server():
    with embeddings_server() as state:
        yield state


@pytest.fixture
def semantic_store(configure, server):
    """The store on each backend, mirrored into the database, with the stand-in embedder
    (messages are embedded by ``memory_embed``: the worker's commit hook never fires
    inside a test's transaction)."""
    return configure(
        MIRROR_MODE="deferred",
        EMBEDDER="openai",
        EMBEDDER_OPTIONS={"base_url": server.url, "model": "stand-in", "api_key_env": None, "max_retries": 0},
    )


def in_database() -> bool:
    """Whether this database compares the messages' vectors (pgvector's table exists)."""
    return vectors.has_vector_table(connection, message_search.VECTORS)


def vector_rows(owner: str | None = None) -> int:
    """Rows of ``pm_message_vector`` (of one owner's messages)."""
    sql = f"SELECT count(*) FROM {TABLE}"  # noqa: S608 - our own table
    params: list[str] = []
    if owner is not None:
        sql += (
            f" v JOIN {message_search.MESSAGES} ON {message_search.MESSAGES}.id = v.message_row_id "  # noqa: S608
            f"{message_search._JOINS} WHERE {message_search.SESSIONS}.owner = %s"
        )
        params = [owner]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()[0]


def embed_all() -> dict:
    from persistent_memory.memories.upkeep import embed_memories

    return vars(embed_memories())


def semantic_search(owner: str, query: str = QUESTION, **options) -> tuple[list[dict], list[str]]:
    """The owner's messages nearest ``query``, and the SQL of the vector queries it ran."""
    with CaptureQueriesContext(connection) as queries:
        found = memories_for(owner).search(query, kinds=["message"], strategy="semantic", **options)
    return found, [
        q["sql"] for q in queries.captured_queries if "<=>" in q["sql"] or "vec_distance" in q["sql"]
    ]


def test_messages_are_compared_where_memories_are(semantic_store) -> None:
    expected = os.environ.get("PM_EXPECT_VECTOR_BACKEND")
    if expected:  # CI names the backend that must be in use: never a silent fallback
        assert vectors.backend() == expected
    # pgvector's message table exists exactly where the memories' does: never on SQLite,
    # nor on PostgreSQL without the extension.
    assert in_database() == (vectors.backend() == vectors.PGVECTOR)
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM sqlite_master WHERE name = %s", [TABLE])
            assert cursor.fetchone()[0] == 0


def test_messages_are_found_by_meaning_by_their_owner_and_go_with_their_session(semantic_store) -> None:
    alice, bob = semantic_store.for_owner("user:alice"), semantic_store.for_owner("user:bob")
    alice.add_messages("chat-1", [{"role": "user", "name": "Caroline", "content": PUPPY}])
    alice.add_messages("chat-2", [{"role": "user", "content": "Espresso in the morning, always."}])
    bob.add_messages("chat-1", [{"role": "user", "content": "Our puppy chews everything."}])
    memories_for("user:alice").search("anything", kinds=["message"])  # syncs the mirror
    report = embed_all()
    assert report["messages_embedded"] == 3 and report["messages_failed"] == 0
    embedded = MemoryMessage.objects.filter(embedding_f32__isnull=False)
    assert embedded.count() == 3
    if in_database():
        # Each vector is in pgvector's table too, equal to the bytes.
        assert vector_rows() == 3 and vector_rows("user:alice") == 2
        puppy = embedded.get(content_text=PUPPY)
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT vector::text FROM {TABLE} WHERE message_row_id = %s", [puppy.pk])  # noqa: S608
            stored = [float(x) for x in cursor.fetchone()[0].strip("[]").split(",")]
        assert stored == pytest.approx(embed_text(f"Caroline: {PUPPY}"), abs=1e-6)

    assert memories_for("user:alice").search(QUESTION, kinds=["message"], strategy="keyword") == []
    found, sql = semantic_search("user:alice")
    assert [hit["content"] for hit in found][0] == PUPPY
    assert {hit["owner"] for hit in found} == {"user:alice"}  # never bob's puppy
    # One query where the database compares (pgvector's table where it exists), none
    # where numpy does.
    assert len(sql) == (vectors.backend() != vectors.NUMPY)
    assert any(TABLE in query for query in sql) == in_database(), sql
    found, _ = semantic_search("user:bob")
    assert [hit["content"] for hit in found] == ["Our puppy chews everything."]
    # One session of the owner's.
    found, _ = semantic_search("user:alice", session_id="chat-2")
    assert [hit["session_id"] for hit in found] == ["chat-2"]

    # A deleted session's messages are no longer found; their rows, and vectors, go when
    # the mirror's retention deletes its row.
    alice.delete_session("chat-1")
    found, _ = semantic_search("user:alice")
    assert PUPPY not in [hit["content"] for hit in found]
    sweep(mirror_retention_days=0, store=semantic_store)
    assert not MemoryMessage.objects.filter(content_text=PUPPY).exists()
    if in_database():
        assert vector_rows("user:alice") == 1 and vector_rows() == 2
    # So are a forgotten owner's.
    forget_owner("user:bob", store=semantic_store)
    assert semantic_search("user:bob")[0] == []
    if in_database():
        assert vector_rows() == 1 == vector_rows("user:alice")


def test_a_message_embedded_again_keeps_one_vector(semantic_store, server, settings) -> None:
    semantic_store.for_owner("user:alice").add_messages("chat-1", [{"role": "user", "content": PUPPY}])
    memories_for("user:alice").search("anything", kinds=["message"])
    embed_all()
    # Another model of another length: memory_embed embeds the message again.
    settings.PERSISTENT_MEMORY = {
        **settings.PERSISTENT_MEMORY,
        "EMBEDDER_OPTIONS": {
            **settings.PERSISTENT_MEMORY["EMBEDDER_OPTIONS"],
            "model": "other",
            "dimensions": 24,
        },
    }
    assert embed_all()["messages_embedded"] == 1
    row = MemoryMessage.objects.get(content_text=PUPPY)
    assert (row.embedding_model, row.embedding_dimensions) == ("other", 24)
    if in_database():
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT dimensions, vector_dims(vector) FROM {TABLE}")  # noqa: S608
            assert cursor.fetchall() == [(24, 24)]
    found, _ = semantic_search("user:alice")
    assert [hit["content"] for hit in found] == [PUPPY]


def _jittered(vector: list[float], n: int) -> list[float]:
    """``vector`` moved a little, differently for each ``n``: thousands of equal vectors
    make a degenerate HNSW graph (what follows them may be unreachable), as no embedder's
    vectors of different texts do."""
    moved = list(vector)
    moved[len(vector) // 2 + n % (len(vector) // 2)] += 0.001 * (1 + n // (len(vector) // 2))
    return moved


def _crowd(owner: str, vector: list[float], count: int) -> list[int]:
    """``count`` embedded messages of one session of ``owner``'s, near ``vector``, written
    as the mirror and the embedder would (rows, then their vectors)."""
    now = timezone.now()
    session = MemorySession.objects.create(
        owner=owner, session_id=f"{owner}-chat", created_at=now, last_activity=now
    )
    conversation = MemoryConversation.objects.create(session=session, name="default")
    near = [_jittered(vector, n) for n in range(count)]
    rows = MemoryMessage.objects.bulk_create(
        MemoryMessage(
            conversation=conversation,
            message_id=f"m{n}",
            seq=n,
            role="user",
            content_text=f"{owner} {n}",
            created_at=now,
            stored="{}",
            digest="0",
            embedding_f32=array("f", near[n]).tobytes(),
            embedding_model="stand-in",
            embedding_dimensions=len(vector),
        )
        for n in range(count)
    )
    ids = [row.pk for row in rows]
    vectors.write_vectors(list(zip(ids, near, strict=True)), message_search.VECTORS)
    return ids


def test_an_owner_among_many_gets_limit_messages_from_the_hnsw_index(settings, server) -> None:
    if not in_database():
        pytest.skip("PostgreSQL with pgvector only (CI runs this file on one: tests/pgvector_server.py)")
    settings.PERSISTENT_MEMORY = {
        **settings.PERSISTENT_MEMORY,
        "MIRROR_MODE": "deferred",
        "EMBEDDER": "openai",
        "EMBEDDER_OPTIONS": {
            "base_url": server.url,
            "model": "stand-in",
            "api_key_env": None,
            "dimensions": 384,
        },
    }
    target = embed_text(QUESTION, 384)
    near_miss = embed_text(QUESTION + " puppy", 384)
    _crowd("user:crowd", target, 3000)  # nearer than anything of alice's
    alice = _crowd("user:alice", near_miss, 5)
    with connection.cursor() as cursor:
        tables = (message_search.MESSAGES, message_search.CONVERSATIONS, message_search.SESSIONS, TABLE)
        cursor.execute(f"ANALYZE {', '.join(tables)}")  # as autovacuum would
    # Alice's five are found although 3,000 nearer vectors of another owner come first in
    # the index: the iterative scan goes on past them.
    found, [alice_sql] = semantic_search("user:alice", limit=5)
    assert sorted(hit["id"] for hit in found) == [f"m{n}" for n in range(5)]
    assert {hit["owner"] for hit in found} == {"user:alice"} and len(alice) == 5
    found, [crowd_sql] = semantic_search("user:crowd", limit=3)
    assert len(found) == 3 and {hit["owner"] for hit in found} == {"user:crowd"}
    for sql in (alice_sql, crowd_sql):
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN " + sql)
            plan = "\n".join(row[0] for row in cursor.fetchall())
        assert f"Index Scan using {vectors.index_name(384, message_search.VECTORS)}" in plan, plan


def test_memory_embed_adds_the_table_with_the_vectors_stored_before_it(semantic_store) -> None:
    if not in_database():
        pytest.skip("PostgreSQL with pgvector only")
    from importlib import import_module

    migration = import_module("persistent_memory.migrations.0018_message_pgvector")

    class Editor:  # what the migration's backward step uses of a schema editor
        def __init__(self) -> None:
            self.connection = connection

        def execute(self, sql: str) -> None:
            with connection.cursor() as cursor:
                cursor.execute(sql)

    migration._backward(None, Editor())  # as a database migrated before pgvector was installed
    assert not vectors.has_vector_table(connection, message_search.VECTORS, cached=False)
    semantic_store.for_owner("user:alice").add_messages("chat-1", [{"role": "user", "content": PUPPY}])
    memories_for("user:alice").search("anything", kinds=["message"])
    # Embedded without the table: the bytes alone, compared with numpy meanwhile.
    ids = list(MemoryMessage.objects.values_list("pk", flat=True))
    assert message_search.embed_batch(ids, embedder=embedders.current()) == 1
    found, sql = semantic_search("user:alice")
    assert [hit["content"] for hit in found] == [PUPPY] and sql == []
    out = StringIO()
    call_command("memory_embed", stdout=out, stderr=StringIO())
    assert vector_rows() == 1  # copied from the bytes
    found, sql = semantic_search("user:alice")
    assert [hit["content"] for hit in found] == [PUPPY] and TABLE in sql[0]
    # The triggers are back: deleting the rows empties the table.
    MemorySession.objects.filter(owner="user:alice").delete()
    assert vector_rows() == 0
