"""Where semantic search compares vectors, chosen by the database the memories are in:

* ``pgvector``: PostgreSQL with the ``vector`` extension. Each memory's vector is also a
  ``vector`` in a table of its own that triggers keep (migration 0014): apart, because
  a memory's row is rewritten whenever its access count moves, and each rewrite would
  insert the vector into the HNSW index again (18 ms a search at 10,000 memories). A
  search is one query ordering by ``<=>`` (cosine distance) with the owner's filters in
  its WHERE, served by an HNSW index per vector length (:func:`ensure_index`) with
  pgvector's iterative scan, so filters never leave a search short of results.
  Conversation messages' vectors likewise, in ``pm_message_vector`` (migration 0018),
  which their writer fills in the transaction that stores their bytes (:class:`Kind`).
* ``sqlite-vec``: SQLite where the Python's ``sqlite3`` can load extensions and the
  ``sqlite-vec`` package is installed: ``vec_distance_cosine`` over the stored float32
  vectors in one query (an exact scan of the owner's vectors, in C).
* ``numpy``: anywhere else, the owner's most recently updated vectors (at most
  ``MEMORY_VECTOR_SCAN_LIMIT``), read as float32 bytes, compared in one matrix product.

Only vectors of the query's model and length are compared. Every function returns
``[(id, similarity)]`` best first, similarity being 1 - cosine distance.
"""

from __future__ import annotations

import json
import logging
import math
from array import array
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, connection, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.signals import connection_created
from django.db.models import QuerySet
from django.dispatch import receiver

from persistent_memory.conf import memory_settings
from persistent_memory.models import LongTermMemory

logger = logging.getLogger("persistent_memory.memories")

PGVECTOR, SQLITE_VEC, NUMPY = "pgvector", "sqlite-vec", "numpy"
TABLE = LongTermMemory._meta.db_table
#: pgvector's copy of each memory's vector (migration 0014), apart from the memories so
#: that bookkeeping updates of a memory (its access count) never touch the HNSW index.
VECTORS = "pm_memory_vector"
#: pgvector's HNSW index takes vectors of up to 2,000 dimensions; longer ones are scanned.
HNSW_MAX_DIMENSIONS = 2000
_columns: dict[tuple[str, str, str], bool] = {}
_indexes: set[tuple[str, str, str, int]] = set()
_iterative: dict[tuple[str, str], bool] = {}


@dataclass(frozen=True)
class Kind:
    """One kind of row with vectors (``embedding_f32``, ``embedding_model``,
    ``embedding_dimensions``): memories, or conversation messages."""

    #: The rows' table.
    rows: str
    #: pgvector's copy of their vectors: ``(<key> bigint, dimensions, vector)``.
    vectors: str
    key: str
    #: The prefix of its HNSW indexes' names (one per vector length).
    index_prefix: str
    #: Joined to the rows where a search's WHERE reads other tables.
    joins: str = ""
    #: The order in which the numpy scan takes the newest rows.
    newest: tuple[str, ...] = ("-updated_at", "-id")


MEMORIES = Kind(rows=TABLE, vectors=VECTORS, key="memory_id", index_prefix="pm_memory_hnsw")


@receiver(connection_created)
def _load_sqlite_vec(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    """Load sqlite-vec into each new SQLite connection, where it can be loaded."""
    if connection.vendor != "sqlite":
        return
    raw = connection.connection
    try:
        import sqlite_vec
    except ImportError:
        return
    if not hasattr(raw, "enable_load_extension"):  # a Python built without extension loading
        return
    try:
        raw.enable_load_extension(True)
        try:
            sqlite_vec.load(raw)
        finally:
            raw.enable_load_extension(False)
    except Exception as exc:  # noqa: BLE001 - sqlite3.OperationalError, or a platform's own
        logger.warning("sqlite-vec could not be loaded (vectors are compared with numpy): %s", exc)
        return
    connection.pm_sqlite_vec = True  # type: ignore[attr-defined]


def _key(conn: BaseDatabaseWrapper) -> tuple[str, str]:
    return conn.alias, str(conn.settings_dict.get("NAME"))


def has_vector_table(
    conn: BaseDatabaseWrapper = connection, kind: Kind = MEMORIES, *, cached: bool = True
) -> bool:
    """Whether ``kind``'s vector table exists (PostgreSQL with pgvector: migration 0014
    for memories, 0018 for messages). ``cached=False`` asks the database again (a writer
    must not miss a table another process created since)."""
    if conn.vendor != "postgresql":
        return False
    key = (*_key(conn), kind.vectors)
    if key not in _columns or not cached:
        with conn.cursor() as cursor:
            cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [kind.vectors])
            _columns[key] = bool(cursor.fetchone()[0])
    return _columns[key]


def _iterative_scans(conn: BaseDatabaseWrapper) -> bool:
    """Whether the installed pgvector has iterative index scans (0.8 and newer)."""
    key = _key(conn)
    if key not in _iterative:
        with conn.cursor() as cursor:
            cursor.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
            row = cursor.fetchone()
        version = tuple(int(part) for part in row[0].split(".")[:2] if part.isdigit()) if row else ()
        _iterative[key] = version >= (0, 8)
    return _iterative[key]


def pgvector_available(conn: BaseDatabaseWrapper = connection) -> bool:
    """Whether the PostgreSQL server offers the ``vector`` extension (installed or not)."""
    if conn.vendor != "postgresql":
        return False
    with conn.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'")
        return cursor.fetchone() is not None


#: The vector table and the triggers that keep it equal to the memories' vectors: every
#: write path (the ORM, bulk_create, COPY, raw SQL) fills it, and it can never disagree.
_VECTOR_TABLE = [
    f"CREATE TABLE IF NOT EXISTS {VECTORS} (memory_id bigint PRIMARY KEY, dimensions integer NOT NULL, "
    "vector vector NOT NULL)",
    f"""CREATE OR REPLACE FUNCTION {VECTORS}_write() RETURNS trigger AS $$
    BEGIN
      IF TG_OP = 'DELETE' OR NEW.embedding IS NULL OR NEW.embedding_dimensions IS NULL THEN
        DELETE FROM {VECTORS} WHERE memory_id = OLD.id;
      END IF;
      IF TG_OP <> 'DELETE' AND NEW.embedding IS NOT NULL AND NEW.embedding_dimensions IS NOT NULL THEN
        INSERT INTO {VECTORS} (memory_id, dimensions, vector)
        VALUES (NEW.id, NEW.embedding_dimensions, (NEW.embedding::text)::vector)
        ON CONFLICT (memory_id) DO UPDATE SET dimensions = EXCLUDED.dimensions, vector = EXCLUDED.vector;
      END IF;
      RETURN NULL;
    END $$ LANGUAGE plpgsql""",  # noqa: S608 - names of ours
    f"""CREATE OR REPLACE FUNCTION {VECTORS}_truncate() RETURNS trigger AS $$
    BEGIN TRUNCATE {VECTORS}; RETURN NULL; END $$ LANGUAGE plpgsql""",
    f"DROP TRIGGER IF EXISTS {VECTORS}_insert ON {TABLE}",
    f"CREATE TRIGGER {VECTORS}_insert AFTER INSERT ON {TABLE} FOR EACH ROW "
    f"WHEN (NEW.embedding IS NOT NULL) EXECUTE FUNCTION {VECTORS}_write()",
    f"DROP TRIGGER IF EXISTS {VECTORS}_update ON {TABLE}",
    f"CREATE TRIGGER {VECTORS}_update AFTER UPDATE ON {TABLE} FOR EACH ROW "
    "WHEN (OLD.embedding IS DISTINCT FROM NEW.embedding "
    "OR OLD.embedding_dimensions IS DISTINCT FROM NEW.embedding_dimensions) "
    f"EXECUTE FUNCTION {VECTORS}_write()",
    f"DROP TRIGGER IF EXISTS {VECTORS}_delete ON {TABLE}",
    f"CREATE TRIGGER {VECTORS}_delete AFTER DELETE ON {TABLE} FOR EACH ROW "
    f"EXECUTE FUNCTION {VECTORS}_write()",
    f"DROP TRIGGER IF EXISTS {VECTORS}_truncate ON {TABLE}",
    f"CREATE TRIGGER {VECTORS}_truncate AFTER TRUNCATE ON {TABLE} FOR EACH STATEMENT "
    f"EXECUTE FUNCTION {VECTORS}_truncate()",
    # What was embedded before the table existed.
    f"INSERT INTO {VECTORS} (memory_id, dimensions, vector) "  # noqa: S608 - names of ours
    f"SELECT id, embedding_dimensions, (embedding::text)::vector FROM {TABLE} "
    "WHERE embedding IS NOT NULL AND embedding_dimensions IS NOT NULL ON CONFLICT (memory_id) DO NOTHING",
]


def written_vectors_table(kind: Kind) -> list[str]:
    """The statements of a vector table its writer fills (:func:`write_vectors`): the
    table, and triggers that empty it with its rows. Triggers rather than a foreign key:
    Django's ``flush`` (and TransactionTestCase) truncates the rows' table alone, which
    PostgreSQL refuses while another table references it."""
    table, rows, key = kind.vectors, kind.rows, kind.key
    return [
        f"CREATE TABLE IF NOT EXISTS {table} ({key} bigint PRIMARY KEY, dimensions integer NOT NULL, "
        "vector vector NOT NULL)",
        f"""CREATE OR REPLACE FUNCTION {table}_forget() RETURNS trigger AS $$
        BEGIN DELETE FROM {table} WHERE {key} = OLD.id; RETURN NULL; END $$ LANGUAGE plpgsql""",  # noqa: S608
        f"""CREATE OR REPLACE FUNCTION {table}_truncate() RETURNS trigger AS $$
        BEGIN TRUNCATE {table}; RETURN NULL; END $$ LANGUAGE plpgsql""",
        f"DROP TRIGGER IF EXISTS {table}_delete ON {rows}",
        f"CREATE TRIGGER {table}_delete AFTER DELETE ON {rows} FOR EACH ROW "
        f"EXECUTE FUNCTION {table}_forget()",
        f"DROP TRIGGER IF EXISTS {table}_truncate ON {rows}",
        f"CREATE TRIGGER {table}_truncate AFTER TRUNCATE ON {rows} FOR EACH STATEMENT "
        f"EXECUTE FUNCTION {table}_truncate()",
    ]


def add_vector_table(conn: BaseDatabaseWrapper = connection, kind: Kind = MEMORIES) -> bool:
    """Create the extension (where the server has it and the role may) and ``kind``'s
    vector table with its triggers, filled with the vectors already stored; whether the
    table exists now. Migrations 0014 (memories) and 0018 (messages) and ``memory_embed``
    run it."""
    if conn.vendor != "postgresql" or not pgvector_available(conn):
        return False
    with conn.cursor() as cursor:
        try:  # in a savepoint: a role that may not create it leaves the caller's transaction going
            with transaction.atomic(using=conn.alias):
                cursor.execute("CREATE EXTENSION IF NOT EXISTS vector")
        except DatabaseError as exc:
            logger.warning("The vector extension could not be created: %s", exc)
            return False
        for statement in _VECTOR_TABLE if kind == MEMORIES else written_vectors_table(kind):
            cursor.execute(statement)
    _columns.pop((*_key(conn), kind.vectors), None)
    if kind != MEMORIES and has_vector_table(conn, kind):
        _copy_missing(conn, kind)
    return has_vector_table(conn, kind)


def _copy_missing(conn: BaseDatabaseWrapper, kind: Kind, chunk: int = 500) -> None:
    """Copy into ``kind``'s vector table the vectors stored without it (float32 bytes,
    read in Python: SQL has no cast from them), ``chunk`` rows at a time."""
    select = (
        f"SELECT r.id, r.embedding_f32 FROM {kind.rows} r LEFT JOIN {kind.vectors} v ON v.{kind.key} = r.id "  # noqa: S608
        "WHERE r.embedding_f32 IS NOT NULL AND r.embedding_dimensions IS NOT NULL AND v.vector IS NULL "
        "AND r.id > %s ORDER BY r.id LIMIT %s"
    )
    after = 0
    while True:
        with conn.cursor() as cursor:
            cursor.execute(select, [after, chunk])
            found = [(pk, array("f", bytes(blob)).tolist()) for pk, blob in cursor.fetchall()]
        if not found:
            return
        write_vectors(found, kind, conn)
        after = found[-1][0]


def write_vectors(
    vectors: list[tuple[int, list[float]]], kind: Kind, conn: BaseDatabaseWrapper = connection
) -> None:
    """Put these rows' vectors (``(row id, vector)``) into ``kind``'s vector table, where
    it exists; the caller holds the transaction that writes the rows' own columns."""
    if not vectors or not has_vector_table(conn, kind, cached=False):
        return
    for length in {len(vector) for _, vector in vectors}:
        ensure_index(length, conn, kind)
    with conn.cursor() as cursor:
        cursor.executemany(
            f"INSERT INTO {kind.vectors} ({kind.key}, dimensions, vector) VALUES (%s, %s, %s::vector) "  # noqa: S608
            f"ON CONFLICT ({kind.key}) DO UPDATE "
            "SET dimensions = EXCLUDED.dimensions, vector = EXCLUDED.vector",
            [(pk, len(vector), json.dumps(vector)) for pk, vector in vectors],
        )


def backend(conn: BaseDatabaseWrapper = connection) -> str:
    """The vector backend semantic search uses on ``conn``."""
    if has_vector_table(conn):
        return PGVECTOR
    if conn.vendor == "sqlite":
        conn.ensure_connection()
        if getattr(conn, "pm_sqlite_vec", False):
            return SQLITE_VEC
    return NUMPY


def index_name(dimensions: int, kind: Kind = MEMORIES) -> str:
    return f"{kind.index_prefix}_{int(dimensions)}"


def ensure_index(dimensions: int, conn: BaseDatabaseWrapper = connection, kind: Kind = MEMORIES) -> bool:
    """The HNSW index of ``kind``'s vectors of this length (pgvector; created when
    missing). Called when a vector is written, so that it is created while few vectors
    have that length; a search never creates it (it scans until the index exists)."""
    if not has_vector_table(conn, kind) or not 0 < dimensions <= HNSW_MAX_DIMENSIONS:
        return False
    key = (*_key(conn), kind.vectors, int(dimensions))
    if key in _indexes:
        return True
    _indexes.add(key)  # tried once per process: a role that may not create it is not asked again
    try:  # in a savepoint: the write that asked must not fail for want of an index
        with transaction.atomic(using=conn.alias), conn.cursor() as cursor:
            cursor.execute(
                f"CREATE INDEX IF NOT EXISTS {index_name(dimensions, kind)} ON {kind.vectors} USING hnsw "
                f"((vector::vector({int(dimensions)})) vector_cosine_ops) "
                f"WHERE dimensions = {int(dimensions)}"
            )
    except DatabaseError as exc:
        logger.warning(
            "The HNSW index of %d-dimension vectors could not be created (searches scan): %s", dimensions, exc
        )
        return False
    return True


def _pgvector(
    kind: Kind, where: str, params: list[Any], vector: list[float], model: str, limit: int
) -> list[tuple[int, float]]:
    dims = int(len(vector))
    rows = kind.rows
    # The length is a literal: the partial index's predicate must match the query's. The
    # rows' own filters (``where``, compiled for their table and joins) apply to each
    # vector the index gives, in order, until `limit` pass.
    sql = (
        f"SELECT {rows}.id, (v.vector::vector({dims})) <=> %s::vector({dims}) AS distance "  # noqa: S608
        f"FROM {kind.vectors} v JOIN {rows} ON {rows}.id = v.{kind.key} {kind.joins} "
        f"WHERE v.dimensions = {dims} AND {rows}.embedding_model = %s AND {where} "
        "ORDER BY distance LIMIT %s"
    )
    with transaction.atomic(), connection.cursor() as cursor:
        # Iterative scans (pgvector 0.8) keep reading the index while filters drop rows,
        # in exact order, so an owner among many still gets `limit` results; before 0.8,
        # a wider search list is what there is.
        cursor.execute(f"SET LOCAL hnsw.ef_search = {max(40, min(1000, limit))}")
        if _iterative_scans(connection):
            cursor.execute("SET LOCAL hnsw.iterative_scan = strict_order")
        cursor.execute(sql, [json.dumps(vector), model, *params, limit])
        return [(pk, 1.0 - float(distance)) for pk, distance in cursor.fetchall()]


def _sqlite_vec(
    kind: Kind, where: str, params: list[Any], vector: list[float], model: str, limit: int
) -> list[tuple[int, float]]:
    dims = len(vector)
    rows = kind.rows
    sql = (
        f"SELECT {rows}.id, vec_distance_cosine({rows}.embedding_f32, %s) AS distance "  # noqa: S608
        f"FROM {rows} {kind.joins} WHERE {rows}.embedding_dimensions = %s AND {rows}.embedding_model = %s "
        f"AND {where} ORDER BY distance LIMIT %s"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [array("f", vector).tobytes(), dims, model, *params, limit])
        return [(pk, 1.0 - float(distance)) for pk, distance in cursor.fetchall()]


def scan(
    rows: QuerySet[Any],
    vector: list[float],
    model: str,
    limit: int,
    newest: tuple[str, ...] = ("-updated_at", "-id"),
) -> list[tuple[int, float]]:
    """The rows (memories, or messages: any with the three vector columns) whose vectors
    of ``model`` are nearest ``vector``, comparing the newest MEMORY_VECTOR_SCAN_LIMIT in
    one matrix product."""
    import numpy as np

    dims = len(vector)
    candidates = list(
        rows.filter(embedding_model=model, embedding_dimensions=dims, embedding_f32__isnull=False)
        .order_by(*newest)
        .values_list("id", "embedding_f32")[: memory_settings.MEMORY_VECTOR_SCAN_LIMIT]
    )
    if not candidates:
        return []
    ids = [pk for pk, _ in candidates]
    # One buffer of float32s, read without parsing anything.
    matrix = np.frombuffer(b"".join(bytes(blob) for _, blob in candidates), dtype=np.float32).reshape(
        len(ids), dims
    )
    query = np.asarray(vector, dtype=np.float32)
    norms = np.linalg.norm(matrix, axis=1) * (np.linalg.norm(query) or 1.0)
    similarity = (matrix @ query) / np.where(norms == 0, 1.0, norms)
    count = min(limit, len(ids))
    best = np.argpartition(-similarity, count - 1)[:count]
    best = best[np.argsort(-similarity[best], kind="stable")]
    return [(ids[i], float(similarity[i])) for i in best]


def nearest(
    rows: QuerySet[Any],
    where: tuple[str, list[Any]] | None,
    vector: list[float],
    model: str,
    limit: int,
    kind: Kind = MEMORIES,
) -> list[tuple[int, float]]:
    """The rows of ``rows`` (memories, or ``kind``'s) whose vectors (of ``model``) are
    nearest ``vector``. ``where`` is ``rows``' WHERE compiled for a raw query on the
    table and ``kind.joins`` (None: nothing can match). A vector with no direction (all
    zero, or not finite) is near nothing: every cosine with it is undefined (numpy
    answered every row at 0, pgvector NaN)."""
    if where is None or not vector or not any(vector) or not all(math.isfinite(x) for x in vector):
        return []
    # Each kind's own table: the backend is the memories', and a kind's table is made
    # where theirs is (by its own migration and memory_embed).
    if has_vector_table(connection, kind):
        return _pgvector(kind, *where, vector, model, limit)
    if backend() == SQLITE_VEC:
        return _sqlite_vec(kind, *where, vector, model, limit)
    return scan(rows, vector, model, limit, newest=kind.newest)
