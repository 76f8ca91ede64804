"""The ORM mirror on both backends: store change -> sync -> mirror equals store."""

from __future__ import annotations

import logging
from contextlib import contextmanager

import pytest
from django.db import DatabaseError, OperationalError, connection, transaction

from persistent_memory import get_store, reset_store
from persistent_memory.conf import memory_settings
from persistent_memory.exceptions import BackendUnavailable, CapacityExceeded, QuotaExceeded
from persistent_memory.health import mirror_health
from persistent_memory.mirror.sessions import ERROR_TEXT_LIMIT, _error_text
from persistent_memory.models import HistoryEntry, MemorySession, MemoryValue
from persistent_memory.owners import storage_id
from persistent_memory.store import MemoryStore
from tests.test_journal import crash, journaled  # noqa: F401  (journaled is a fixture)
from tests.timing import LIVE_TTL, wait_past, wait_until


def assert_mirrored(store: MemoryStore, session_id: str) -> MemorySession:
    """The session's rows say exactly what the store says."""
    info = store.session_info(session_id)
    row = MemorySession.objects.get(session_id=session_id)
    assert row.state == MemorySession.State.LIVE
    assert row.created_at.timestamp() == pytest.approx(info["created_at"], abs=1e-5)
    if info["expires_at"] is None:
        assert row.expires_at is None
    else:
        assert row.expires_at.timestamp() == pytest.approx(info["expires_at"], abs=1e-3)
    assert (row.key_count, row.history_length, row.ttl_seconds) == (
        info["key_count"],
        info["history_length"],
        info["ttl_seconds"],
    )
    assert {v.key: v.decoded_value for v in row.values.all()} == store.get_all(session_id)
    history = store.get_history(session_id, 0)
    rows = list(row.history.order_by("position"))
    assert [(e.op, e.key or None) for e in rows] == [(h["op"], h.get("key")) for h in history]
    for entry, item in zip(rows, history, strict=True):
        assert entry.timestamp.timestamp() == pytest.approx(item["timestamp"], abs=1e-5)
        assert entry.details == {k: v for k, v in item.items() if k not in ("op", "key", "timestamp")}
    if history:
        assert row.last_activity == rows[-1].timestamp
    return row


@pytest.fixture
def mirrored(db, configure):
    """A store whose mirror syncs when told to (deferred), on each backend."""
    store = configure(MIRROR_MODE="deferred", MAX_HISTORY=6)
    assert store.mirror.mode == "deferred" and store.backend.track_dirty
    return store


def test_default_modes(settings, redis_url):
    settings.PERSISTENT_MEMORY = {"BACKEND": "redis", "REDIS_URL": redis_url}
    assert get_store().mirror.mode == "deferred"
    settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "MIRROR_MODE": "off"}
    assert get_store().mirror.mode == "off" and not get_store().backend.track_dirty
    settings.PERSISTENT_MEMORY = {}
    assert memory_settings.MIRROR_MODE is None
    from persistent_memory.conf import mirror_mode

    assert mirror_mode(memory_settings) == "immediate"


def test_writes_sync_and_match(mirrored):
    store = mirrored
    store.create_session("s1", ttl_seconds=3600)
    store.put("s1", "topic", {"city": "Paris", "tags": ["a", None]})
    store.increment("s1", "n", 5)
    store.record_answer("s2", "hello")
    result = store.mirror.sync_dirty()
    assert (result.synced, result.gone, result.failed) == (2, 0, 0)
    assert mirror_health(store)["last_sync_at"] is not None
    row = assert_mirrored(store, "s1")
    assert len(row.history_digest) == MemorySession._meta.get_field("history_digest").max_length
    assert_mirrored(store, "s2")
    # Nothing is dirty any more: a second pass does nothing.
    assert store.mirror.sync_dirty().synced == 0


def test_clears_summaries_and_removed_keys(mirrored):
    store = mirrored
    store.create_session("s1")
    for i in range(9):  # MAX_HISTORY=6: auto-summarized along the way
        store.put("s1", f"k{i % 3}", i)
    store.mirror.sync_dirty()
    assert_mirrored(store, "s1")
    store.clear("s1", "k0")
    store.increment("s1", "n")
    store.mirror.sync_dirty()
    row = assert_mirrored(store, "s1")
    assert not row.values.filter(key="k0").exists()
    store.clear("s1")
    store.summarize("s1", max_entries=1)
    store.mirror.sync_dirty()
    row = assert_mirrored(store, "s1")
    assert row.values.count() == 0
    (summary,) = row.history.all()
    assert summary.op == "summary"
    assert summary.describe().startswith(f"summary of {summary.details['summarized_count']} operations: put ")


def test_a_sync_writes_only_the_history_added_since_the_last(mirrored):
    store = mirrored
    store.create_session("s1")
    store.put("s1", "a", 1)
    store.put("s1", "b", 2)
    store.mirror.sync_dirty()
    before = dict(HistoryEntry.objects.values_list("position", "pk"))
    store.increment("s1", "n")
    store.mirror.sync_dirty()
    assert_mirrored(store, "s1")
    after = dict(HistoryEntry.objects.values_list("position", "pk"))
    # The rows already mirrored are the same rows; only the new entry was written.
    assert {position: after[position] for position in before} == before
    assert set(after) == {0, 1, 2}
    store.increment("s1", "n")  # and again: the rows of every sync before are kept
    store.mirror.sync_dirty()
    assert_mirrored(store, "s1")
    again = dict(HistoryEntry.objects.values_list("position", "pk"))
    assert {position: again[position] for position in after} == after and set(again) == {0, 1, 2, 3}


def test_a_fold_or_a_replaced_history_rewrites_the_rows(mirrored):
    store = mirrored  # MAX_HISTORY=6
    store.create_session("s1")
    for i in range(6):
        store.put("s1", "a", i)
    store.mirror.sync_dirty()
    first = set(HistoryEntry.objects.values_list("pk", flat=True))
    store.put("s1", "b", 0)  # the seventh entry: folded into a summary and 3 entries
    store.mirror.sync_dirty()
    row = assert_mirrored(store, "s1")
    assert row.history.order_by("position").first().op == "summary"
    assert not first & set(HistoryEntry.objects.values_list("pk", flat=True))
    # A history replaced whole, as long as the mirrored one, with other entries.
    snapshot = store.backend.snapshots(["s1"])["s1"]
    snapshot["history"] = [{"op": "put", "key": "z", "timestamp": 1000.0 + i} for i in range(4)]
    store.backend.restore_session(snapshot, replace=True)
    store.mirror.sync_dirty()
    assert_mirrored(store, "s1")
    # Replaced again with the same first and last entries, at the same times, and
    # another entry between them (an edited export imported with --replace).
    snapshot["history"][1] = {"op": "put", "key": "edited", "timestamp": 1001.0}
    store.backend.restore_session(snapshot, replace=True)
    store.mirror.sync_dirty()
    assert_mirrored(store, "s1")


def test_delete_marks_gone(mirrored):
    store = mirrored
    store.create_session("s1")
    store.put("s1", "k", 1)
    store.mirror.sync_dirty()
    store.delete_session("s1")
    result = store.mirror.sync_dirty()
    assert result.gone == 1
    row = MemorySession.objects.get(session_id="s1")
    assert row.state == MemorySession.State.DELETED and row.gone_at is not None
    # Recreated: live again, with nothing of the old session.
    store.create_session("s1")
    store.mirror.sync_dirty()
    assert assert_mirrored(store, "s1").values.count() == 0


def test_expiry_is_noticed_by_a_full_sync(mirrored):
    store = mirrored
    short = store.create_session("short", ttl_seconds=LIVE_TTL)
    store.put("short", "k", 1)
    store.create_session("kept")
    store.mirror.sync_dirty()
    wait_past(short["expires_at"])
    result = store.mirror.sync_all()
    assert result.gone == 1
    row = MemorySession.objects.get(session_id="short")
    assert row.state == MemorySession.State.EXPIRED and row.gone_at is not None
    assert MemorySession.objects.get(session_id="kept").state == MemorySession.State.LIVE


def test_sync_is_idempotent(mirrored):
    store = mirrored
    store.create_session("s1")
    store.put("s1", "a", 1)
    store.put("s1", "b", [1, 2])
    store.mirror.sync_sessions(["s1"])
    written = set(HistoryEntry.objects.values_list("pk", flat=True))
    for _ in range(3):
        store.mirror.sync_sessions(["s1"])
    assert set(HistoryEntry.objects.values_list("pk", flat=True)) == written  # kept, not rewritten
    assert MemorySession.objects.count() == 1
    assert MemoryValue.objects.count() == 2
    assert HistoryEntry.objects.count() == 2
    assert_mirrored(store, "s1")


def test_sync_all_without_dirty_marks(db, settings, redis_client, redis_url):
    # Written while the mirror was off, mirrored by a full pass (Redis: a rebuilt
    # memory store would start empty).
    settings.PERSISTENT_MEMORY = {"BACKEND": "redis", "REDIS_URL": redis_url, "MIRROR_MODE": "off"}
    store = get_store()
    store.create_session("s1")
    store.put("s1", "k", "v")
    settings.PERSISTENT_MEMORY = {"BACKEND": "redis", "REDIS_URL": redis_url}
    store = get_store()
    assert store.mirror.sync_dirty().synced == 0
    assert store.mirror.sync_all().synced == 1
    assert_mirrored(store, "s1")


def test_database_failure_is_logged_and_retried(mirrored, caplog):
    store = mirrored
    store.create_session("s1")
    store.put("s1", "k", 1)
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE persistent_memory_memoryvalue RENAME TO pm_broken")
    try:
        with caplog.at_level(logging.ERROR, logger="persistent_memory.mirror"):
            result = store.mirror.sync_dirty()
        assert result.failed == 1 and result.synced == 0
        assert "mirror could not write session s1" in caplog.text
        assert "persistent_memory_memoryvalue" in MemorySession.objects.get(session_id="s1").sync_error
        store.put("s1", "k2", 2)  # store writes go on while the mirror fails
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE pm_broken RENAME TO persistent_memory_memoryvalue")
    assert store.mirror.sync_dirty().synced == 1
    assert_mirrored(store, "s1")


def test_dirty_mark_costs_no_extra_round_trip(counting_client):
    from persistent_memory.backends.redis import RedisBackend
    from tests.conftest import CountingConnection

    backend = RedisBackend(client=counting_client, max_history=10, auto_summarize=True, track_dirty=True)
    store = MemoryStore(backend)
    store.create_session("warm")
    for name, call in {
        "create": lambda: store.create_session("s1"),
        "put": lambda: store.put("s1", "k", 1),
        "increment": lambda: store.increment("s1", "n"),
        "clear": lambda: store.clear("s1", "k"),
        "answer": lambda: store.record_answer("s2", "a"),
        "delete": lambda: store.delete_session("warm"),
    }.items():
        CountingConnection.sends = 0
        call()
        assert CountingConnection.sends == 1, name
    assert sorted(backend.pop_dirty(10)) == ["s1", "s2", "warm"]
    assert backend.pop_dirty(10) == []


def _row_exists_yet(rows) -> bool:
    """Whether ``rows`` has a row; no while the worker's write holds the table (SQLite's
    shared in-memory test database refuses at once where a database file would wait)."""
    try:
        return rows.exists()
    except OperationalError as exc:
        if "locked" not in str(exc):
            raise
        return False


@pytest.mark.django_db(transaction=True)
def test_immediate_mode_flushes_without_a_sync(configure):
    store = configure(MIRROR_MODE="immediate")
    try:
        store.create_session("s1")
        store.put("s1", "k", {"v": 1})
        # Nobody calls a sync: the write-behind worker must get there on its own, however
        # long a loaded machine takes to schedule it.
        wait_until(lambda: _row_exists_yet(MemoryValue.objects.filter(session__session_id="s1", key="k")))
        assert_mirrored(store, "s1")
        # A daemon: it keeps no process from exiting (the atexit hook that stops it runs
        # only once the threads that are not daemons have ended).
        assert store.mirror._worker.daemon
    finally:
        reset_store()


@pytest.mark.django_db(transaction=True)
def test_closing_the_store_flushes(configure):
    store = configure(MIRROR_MODE="immediate")
    store.create_session("s1")
    for i in range(20):
        store.put("s1", f"k{i}", i)
    snapshot = store.get_all("s1")
    reset_store()  # what atexit does at shutdown
    assert {v.key: v.decoded_value for v in MemoryValue.objects.filter(session__session_id="s1")} == snapshot


@pytest.mark.django_db(transaction=True)
def test_memory_store_restores_from_the_mirror_after_restart(settings):
    settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "MIRROR_MODE": "immediate", "MAX_HISTORY": 8}
    store = get_store()
    store.create_session("kept", ttl_seconds=600)
    store.put("kept", "topic", {"a": [1, 2]})
    store.increment("kept", "n", 41)
    for i in range(10):
        store.put("kept", "k", i)
    store.create_session("forever")
    store.record_answer("forever", "hi")
    short = store.create_session("short", ttl_seconds=LIVE_TTL)
    before = {
        sid: (store.session_info(sid), store.get_all(sid), store.get_history(sid, 0))
        for sid in ("kept", "forever")
    }
    reset_store()  # the process ends: the worker flushes
    wait_past(short["expires_at"])  # "short" expires meanwhile

    fresh = MemoryStore.from_settings()  # a new process over the same database
    try:
        assert fresh.list_sessions() == ["forever", "kept"]
        for session_id, (info, values, history) in before.items():
            assert fresh.get_all(session_id) == values
            restored = fresh.get_history(session_id, 0)
            assert [{k: v for k, v in e.items() if k != "timestamp"} for e in restored] == [
                {k: v for k, v in e.items() if k != "timestamp"} for e in history
            ]
            assert [e["timestamp"] for e in restored] == pytest.approx(
                [e["timestamp"] for e in history], abs=1e-5
            )
            now_info = fresh.session_info(session_id)
            assert now_info["created_at"] == pytest.approx(info["created_at"], abs=1e-5)
            assert now_info["ttl_seconds"] == info["ttl_seconds"]
            if info["expires_at"] is None:
                assert now_info["expires_at"] is None
            else:  # the remaining TTL carries over, it does not start again
                assert now_info["expires_at"] == pytest.approx(info["expires_at"], abs=1e-3)
        # Counters are still integers that increment accepts.
        assert fresh.increment("kept", "n") == 42
        assert fresh.record_answer("forever", "again").answer_count == 2
    finally:
        fresh.close()


@pytest.mark.django_db(transaction=True)
def test_restore_loads_every_session_under_a_lowered_max_sessions(settings, caplog):
    """The cap applies to new sessions: a restart loses none it had acknowledged (it kept
    the newest six and left four in the mirror only before)."""
    settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "MIRROR_MODE": "immediate", "MAX_SESSIONS": 10}
    store = get_store()
    for i in range(10):
        store.record_answer(f"s{i}", "a")
    reset_store()
    settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "MIRROR_MODE": "immediate", "MAX_SESSIONS": 6}
    with caplog.at_level(logging.WARNING, logger="persistent_memory.mirror"):
        fresh = MemoryStore.from_settings()
    try:
        assert fresh.list_sessions() == [f"s{i}" for i in range(10)]
        assert "mirror only" not in caplog.text
        with pytest.raises(CapacityExceeded):  # unowned: over its share (6) of a full process
            fresh.create_session("s10")
        fresh.for_owner("user:1").create_session("a")  # a newcomer's share: 6 // 2
    finally:
        fresh.close()


@pytest.mark.django_db(transaction=True)
def test_two_processes_syncing_at_once_leave_the_rows_whole(configure):
    # Two syncers with connections of their own, as two processes: A is inside its
    # transaction when B, which read the store later, starts. B must wait for A's
    # commit and then build on what A wrote, not on what was there before.
    import threading

    from django.db import connections
    from django.utils import timezone

    from persistent_memory.mirror import sessions as mirror_module

    if connection.vendor != "postgresql":
        pytest.skip("row locks are PostgreSQL's; SQLite lets one writer in at a time")
    store = configure(MIRROR_MODE="deferred")
    store.create_session("s1")
    for i in range(5):
        store.put("s1", f"a{i}", i)
    store.mirror.sync_dirty()
    store.put("s1", "b", 1)
    a_read = (store.backend.snapshots(["s1"]), timezone.now())
    store.put("s1", "c", 1)
    b_read = (store.backend.snapshots(["s1"]), timezone.now())
    store.backend.pop_dirty(100)
    inserted, release = threading.Event(), threading.Event()
    insert = mirror_module._insert

    def pausing_insert(model, fields, rows):
        insert(model, fields, rows)
        if model is HistoryEntry and threading.current_thread().name == "A":
            inserted.set()
            release.wait(10)

    errors = []

    def sync(read):
        try:
            store.mirror._apply(*read)
        except Exception as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    mirror_module._insert = pausing_insert
    try:
        a = threading.Thread(target=sync, args=(a_read,), name="A")
        a.start()
        assert inserted.wait(10)
        b = threading.Thread(target=sync, args=(b_read,), name="B")
        b.start()
        b.join(1.0)  # B is waiting for A's row lock
        release.set()
        a.join(10)
        b.join(10)
    finally:
        mirror_module._insert = insert
    assert errors == []
    assert_mirrored(store, "s1")
    store.put("s1", "d", 1)
    assert store.mirror.sync_dirty().failed == 0
    assert_mirrored(store, "s1")


def test_an_older_snapshot_never_replaces_a_newer_row(mirrored):
    # Two syncers (another process) read the same session at t1 and t2 and write in
    # the other order: the row keeps what was read at t2.
    from django.utils import timezone

    store = mirrored
    store.create_session("s1")
    store.put("s1", "k", "old")
    t1, old = timezone.now(), store.backend.snapshots(["s1"])
    store.put("s1", "k", "new")
    t2, new = timezone.now(), store.backend.snapshots(["s1"])
    store.mirror._apply(new, t2)
    store.mirror._apply(old, t1)
    assert MemoryValue.objects.get(session__session_id="s1", key="k").decoded_value == "new"
    store.delete_session("s1")
    store.mirror._apply(store.backend.snapshots(["s1"]), t1)  # "gone", but read before t2
    assert MemorySession.objects.get(session_id="s1").state == "live"


@pytest.mark.django_db(transaction=True)
def test_restore_loads_every_session_of_an_owner_over_a_lowered_cap(settings, caplog):
    """The owner's cap applies to its new sessions: a restart keeps all four it had
    acknowledged (it kept its newest two before), and refuses it a fifth."""
    settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "MIRROR_MODE": "immediate", "MAX_SESSIONS": 100}
    store = get_store()
    for i in range(4):
        store.for_owner("user:1").record_answer(f"a{i}", "a")
    store.for_owner("user:2").record_answer("b0", "b")
    store.record_answer("node", "n")
    reset_store()
    settings.PERSISTENT_MEMORY = {**settings.PERSISTENT_MEMORY, "MAX_SESSIONS_PER_OWNER": 2}
    with caplog.at_level(logging.WARNING, logger="persistent_memory.mirror"):
        fresh = MemoryStore.from_settings()
    try:
        assert fresh.for_owner("user:1").list_sessions() == ["a0", "a1", "a2", "a3"]
        assert fresh.for_owner("user:2").get("b0", "last_answer") == "b"
        assert fresh.get("node", "answer_count") == 1
        assert "mirror only" not in caplog.text
        with pytest.raises(QuotaExceeded):
            fresh.for_owner("user:1").create_session("a4")
        fresh.for_owner("user:2").create_session("b1")
    finally:
        fresh.close()


# One session the database refuses -------------------------------------------------------


@contextmanager
def refusing(key: str, message: str):
    """The database refuses a value row under ``key`` (a constraint of its own, as a
    column type or a CHECK a deployment adds would), with ``message`` (an identifier:
    PostgreSQL's error names the constraint, which is named after it)."""
    name = f"pm_refuse_{message}"
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # Rows written earlier in the test's transaction hold deferred foreign-key
            # checks: PostgreSQL alters a table only once they have run.
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            cursor.execute(
                f"ALTER TABLE persistent_memory_memoryvalue ADD CONSTRAINT {name} CHECK (key <> '{key}')"
            )
        else:
            cursor.execute(
                f"CREATE TRIGGER {name} BEFORE INSERT ON persistent_memory_memoryvalue "
                f"WHEN NEW.key = '{key}' BEGIN SELECT RAISE(ABORT, '{message}'); END"
            )
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                # The test's transaction holds deferred foreign-key checks: PostgreSQL alters
                # a table only once they have run.
                cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
                cursor.execute(f"ALTER TABLE persistent_memory_memoryvalue DROP CONSTRAINT {name}")
            else:
                cursor.execute(f"DROP TRIGGER {name}")


def errors_logged(caplog, session_id: str) -> list[int]:
    """The levels at which the mirror said it could not write ``session_id``."""
    return [r.levelno for r in caplog.records if f"could not write session {session_id}" in r.getMessage()]


def test_a_session_the_database_refuses_fails_alone_and_says_why(mirrored, caplog):
    store = mirrored
    for sid in ("s1", "s2", "s3"):
        store.create_session(sid)
        store.put(sid, "fine", 1)
    store.put("s2", "refused", 2)
    with refusing("refused", "no_such_key_here"), caplog.at_level(logging.DEBUG, "persistent_memory.mirror"):
        result = store.mirror.sync_dirty()
        # The others are written; the refused one is counted once, and marked for the next sync.
        assert (result.synced, result.gone, result.failed) == (2, 0, 1)
        assert_mirrored(store, "s1")
        assert_mirrored(store, "s3")
        row = MemorySession.objects.get(session_id="s2")
        assert row.sync_error.startswith("IntegrityError: ") and "no_such_key_here" in row.sync_error
        failed_at = row.sync_failed_at
        assert failed_at is not None
        # Its row holds none of it: never restored, and a restart replays all its writes.
        assert (row.history_digest, row.journal_seq, row.values.count()) == ("", 0, 0)
        health = mirror_health(store)
        assert "no_such_key_here" in health["last_error"] and health["last_error_at"] == failed_at
        assert store.backend.dirty_count() == 1
        # Retried with the same error: still failing alone, said at the error level once.
        store.put("s1", "more", 2)
        result = store.mirror.sync_dirty()
        assert (result.synced, result.failed) == (1, 1)  # s1 written again, s2 failed again
        row = MemorySession.objects.get(session_id="s2")
        assert "no_such_key_here" in row.sync_error and row.sync_failed_at > failed_at
        assert errors_logged(caplog, "s2") == [logging.ERROR, logging.DEBUG]
        assert [r.levelno for r in caplog.records if "one at a time" in r.getMessage()] == [
            logging.WARNING,
            logging.DEBUG,
        ]
        said = next(r.getMessage() for r in caplog.records if "one at a time" in r.getMessage())
        assert said.startswith("persistent_memory: mirror sync of 3 sessions failed (IntegrityError: ")
        assert "no_such_key_here" in said and said.endswith("); writing them one at a time")
    with refusing("refused", "another_reason"), caplog.at_level(logging.DEBUG, "persistent_memory.mirror"):
        assert store.mirror.sync_dirty().failed == 1
        assert "another_reason" in MemorySession.objects.get(session_id="s2").sync_error
        # A new error is said again; the log names the session, its owner and the error.
        assert errors_logged(caplog, "s2") == [logging.ERROR, logging.DEBUG, logging.ERROR]
        # (the database's own words follow "IntegrityError: ", over two lines on PostgreSQL)
        assert "could not write session s2: IntegrityError: " in caplog.text and "; will retry" in caplog.text
        owned = store.for_owner("user:1")
        owned.create_session("o1")
        owned.put("o1", "refused", 1)
        assert store.mirror.sync_dirty().failed == 2
        assert "could not write session o1 (owner 'user:1'): IntegrityError: " in caplog.text
        assert store.mirror.sync_all().failed == 2  # counted the same by a full sync
    result = store.mirror.sync_dirty()
    assert (result.synced, result.failed) == (2, 0)
    row = assert_mirrored(store, "s2")
    assert (row.sync_error, row.sync_failed_at) == ("", None)


def test_error_texts_fit_any_column():
    """NUL (which PostgreSQL's text refuses) and a lone surrogate (which no UTF-8 column
    holds) are kept as their escapes; a long text is cut."""
    text = _error_text(ValueError("bad \x00 and \ud800 here"))
    assert text == "ValueError: bad \\x00 and \\ud800 here"
    text.encode("utf-8")
    assert len(_error_text(ValueError("x" * 10_000))) == ERROR_TEXT_LIMIT


# The memory backend's graph checkpoints ---------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_after_a_restart_from_the_mirror_only_changed_checkpoints_are_written(settings):
    """The counters come back with the entries: the next sync writes what changed since,
    not every entry again (a new count would); an import without checkpoints removes them."""
    from persistent_memory.models import CheckpointEntry
    from tests.test_langgraph_saver import PersistentMemorySaver, build, run_turn, thread_session

    def entries() -> dict[str, tuple[int, str]]:
        return {e.name: (e.pk, e.value) for e in CheckpointEntry.objects.all()}

    settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "MIRROR_MODE": "deferred"}
    store = get_store()
    run_turn(build(PersistentMemorySaver.for_owner("alice")), "t", "one", "yes")
    store.mirror.sync_dirty()
    before = entries()
    reset_store()
    restarted = get_store()
    assert restarted.mirror.restore() == 1
    run_turn(build(PersistentMemorySaver.for_owner("alice")), "t", "two", "no")
    assert restarted.mirror.sync_dirty().synced == 1
    after = entries()
    assert {name: after[name] for name in before} == before and len(after) > len(before)
    session = thread_session("t")
    assert {name: value for name, (_, value) in after.items()} == restarted.for_owner(
        "alice"
    ).checkpoint_entries(session)
    # Replaced by an import of the session without its checkpoints: the rows go too.
    sid = storage_id("alice", session)
    snapshot = {k: v for k, v in restarted.backend.snapshots([sid])[sid].items() if "checkpoint" not in k}
    restarted.backend.restore_session(snapshot, replace=True)
    restarted.mirror.sync_dirty()
    assert not CheckpointEntry.objects.exists()
    restarted.close()


def test_a_full_sync_of_one_owner_keeps_the_other_owners_marks(mirrored):
    """``memory_mirror --all --owner``: that owner's sessions are written and their marks
    taken; the other owners' marks stay for the next sync."""
    store = mirrored
    alice, bob = store.for_owner("user:alice"), store.for_owner("user:bob")
    alice.create_session("s")
    bob.create_session("s")
    assert store.mirror.sync_all(owner="user:alice").synced == 1
    assert list(MemorySession.objects.values_list("owner", flat=True)) == ["user:alice"]
    assert store.backend.pop_dirty(10) == [storage_id("user:bob", "s")]
    # Bob's mirrored session, deleted since: not noticed by a sync of Alice's.
    store.mirror.sync_dirty()
    bob.create_session("t")
    store.mirror.sync_dirty()
    bob.delete_session("t")
    result = store.mirror.sync_all(owner="user:alice")
    assert (result.synced, result.gone) == (1, 0)
    assert MemorySession.objects.get(owner="user:bob", session_id="t").state == MemorySession.State.LIVE
    assert store.mirror.sync_dirty().gone == 1


@pytest.mark.django_db(transaction=True)
def test_a_restore_that_failed_is_retried_by_the_worker(settings, caplog):
    settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "MIRROR_MODE": "immediate"}
    get_store().create_session("kept", ttl_seconds=0, idle_ttl_seconds=0)  # never expires
    get_store().record_answer("kept", "hello")
    reset_store()  # the worker flushes: the row is written
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE persistent_memory_memorysession RENAME TO pm_away")
    try:
        with caplog.at_level(logging.WARNING, logger="persistent_memory.mirror"):
            fresh = MemoryStore.from_settings()  # the database cannot give the sessions back yet
            fresh.mirror.stop()  # the test flushes, not the worker
            assert fresh.mirror.restore_pending
            assert mirror_health(fresh)["status"] == "unavailable"
            # Said once, with the database's error; not again at each retry that fails alike.
            assert not fresh.mirror.restore_safely() and fresh.mirror.restore_pending
        (warning,) = [r for r in caplog.records if "restore" in r.getMessage()]
        assert warning.levelno == logging.WARNING and warning.getMessage() == (
            "persistent_memory: could not restore sessions from the mirror; will retry"
        )
        assert warning.exc_info is not None and "pm_away" not in str(warning.exc_info[1])
        assert "persistent_memory_memorysession" in str(warning.exc_info[1])
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE pm_away RENAME TO persistent_memory_memorysession")
    try:
        fresh.mirror._flush()  # what the worker does next
        assert not fresh.mirror.restore_pending
        assert fresh.get("kept", "last_answer") == "hello"
        assert fresh.session_info("kept")["expires_at"] is None
    finally:
        fresh.close()


def test_a_sync_with_a_limit_takes_no_more_sessions_than_that(mirrored):
    store = mirrored
    for n in range(3):
        store.create_session(f"s{n}")
    assert store.mirror.sync_dirty(limit=2).synced == 2
    assert MemorySession.objects.count() == 2
    assert store.mirror.sync_dirty(limit=2).synced == 1


def test_a_checkpoint_written_again_is_mirrored_in_place(db, settings):
    from persistent_memory.models import CheckpointEntry

    settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "MIRROR_MODE": "deferred"}
    store = get_store()
    store.put_checkpoint("thread", "", "cp-1", '{"v": 1}')
    store.mirror.sync_dirty()
    store.put_checkpoint("thread", "", "cp-1", '{"v": 2}')  # the same checkpoint id again
    assert store.mirror.sync_dirty().synced == 1
    mirrored = {e.name: e.value for e in CheckpointEntry.objects.all()}
    assert mirrored == store.checkpoint_entries("thread") and '{"v": 2}' in mirrored.values()


def test_a_restart_from_the_mirror_keeps_an_idle_ttl(db, settings):
    """A session that also expires when idle comes back still expiring when idle, with the
    same expiry (not the fixed TTL's, nor none)."""
    settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "MIRROR_MODE": "deferred"}
    store = get_store()
    store.create_session("idle", ttl_seconds=3600, idle_ttl_seconds=600)
    store.put("idle", "k", 1)
    before = store.session_info("idle")
    assert (before["idle_ttl_seconds"], before["expires_by"]) == (600, "idle")
    store.mirror.sync_dirty()
    reset_store()
    restarted = get_store()
    try:
        assert restarted.mirror.restore() == 1
        after = restarted.session_info("idle")
        assert (after["idle_ttl_seconds"], after["expires_by"], after["ttl_seconds"]) == (600, "idle", 3600)
        assert after["expires_at"] == pytest.approx(before["expires_at"], abs=1e-3)
    finally:
        restarted.close()


def test_a_restart_loads_every_mirrored_session_and_none_the_database_never_took(db, settings):
    """A row made only to say why a session could not be mirrored holds none of it: a
    restart from the mirror leaves it out. A session mirrored before and refused since, and
    a row written before rows had a history digest, are loaded."""
    settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "MIRROR_MODE": "deferred"}
    store = get_store()
    for sid, value in (("before", 1), ("older", 2)):
        store.create_session(sid)
        store.put(sid, "k", value)
    store.mirror.sync_dirty()
    MemorySession.objects.filter(session_id="older").update(history_digest="")  # as 0002 left them
    store.put("before", "refused", 3)
    store.create_session("never")
    store.put("never", "refused", 4)
    with refusing("refused", "not_here"):
        assert store.mirror.sync_dirty().failed == 2
    errors = dict(MemorySession.objects.values_list("session_id", "sync_error"))
    assert "not_here" in errors["before"] and "not_here" in errors["never"] and errors["older"] == ""
    reset_store()
    restarted = get_store()
    try:
        assert restarted.mirror.restore() == 2
        assert restarted.list_sessions() == ["before", "older"]
        assert (restarted.get_all("before"), restarted.get_all("older")) == ({"k": 1}, {"k": 2})
    finally:
        restarted.close()


@pytest.mark.django_db(transaction=True)
def test_a_restart_replays_only_the_writes_an_owners_rows_lack(journaled):  # noqa: F811
    """The journal still holds writes the mirror has (no checkpoint let them go): a restart
    replays, for each session of each owner, only those after its row's position."""
    store = journaled()
    owned = store.for_owner("user:1")
    owned.record_answer("s", "first")
    store.mirror.sync_dirty()  # the row holds it; the journal keeps it too
    owned.record_answer("s", "second")
    crash(store)
    fresh = journaled().for_owner("user:1")
    assert (fresh.get("s", "answer_count"), fresh.get("s", "last_answer")) == (2, "second")
    assert [e["op"] for e in fresh.get_history("s", 0)] == [e["op"] for e in owned.get_history("s", 0)]


def test_a_restore_leaves_out_only_what_a_backend_rule_refuses(db, settings, caplog, monkeypatch):
    """A backend with a rule of its own for restores (here one that refuses a session with
    QuotaExceeded): that session stays in the mirror only, said in a warning, and the
    others are loaded. A session the store holds already is left as it is."""
    settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "MIRROR_MODE": "deferred"}
    store = get_store()
    for sid in ("oldest", "refused", "held", "newest"):  # a restore loads the newest first
        store.create_session(sid)
        store.put(sid, "k", sid)
    store.mirror.sync_dirty()
    reset_store()
    restarted = get_store()
    restarted.create_session("held")
    restarted.put("held", "k", "this process's")
    restore = restarted.backend.restore_session

    def with_a_rule(snapshot, *, replace):
        if snapshot["info"]["session_id"] == "refused":
            raise QuotaExceeded("over a cap of its own")
        restore(snapshot, replace=replace)

    monkeypatch.setattr(restarted.backend, "restore_session", with_a_rule)
    try:
        with caplog.at_level(logging.WARNING, "persistent_memory.mirror"):
            assert restarted.mirror.restore() == 2
        assert restarted.list_sessions() == ["held", "newest", "oldest"]
        assert [restarted.get(sid, "k") for sid in ("held", "newest")] == ["this process's", "newest"]
        assert caplog.messages == [
            "persistent_memory: over a cap of its own; session refused stays in the mirror only"
        ]
    finally:
        restarted.close()


@pytest.mark.django_db(transaction=True)
def test_a_flush_mirrors_nothing_until_the_restore_worked(journaled, caplog):  # noqa: F811
    """While the restore fails, a flush neither syncs nor checkpoints (a checkpoint would
    let the journal drop writes not yet replayed); the flush whose restore works replays
    the journal and mirrors what it brought back at once."""
    store = journaled()
    store.create_session("s")
    store.put("s", "k", 1)
    store.mirror.sync_dirty()
    store.put("s", "k", 2)  # in the journal only
    crash(store)
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE persistent_memory_memorysession RENAME TO pm_away")
    try:
        fresh = journaled()
        assert fresh.mirror.restore_pending
        fresh.mirror._flush()
        assert fresh.mirror.restore_pending
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE pm_away RENAME TO persistent_memory_memorysession")
    with caplog.at_level(logging.INFO, "persistent_memory.mirror"):
        fresh.mirror._flush()
    assert not fresh.mirror.restore_pending and fresh.get("s", "k") == 2
    assert MemoryValue.objects.get(session__session_id="s", key="k").decoded_value == 2
    assert "persistent_memory: restored 1 sessions from the mirror" in caplog.messages
    assert "persistent_memory: replayed the journal's writes to 1 sessions" in caplog.messages


@pytest.mark.django_db(transaction=True)
def test_a_checkpoint_mirrors_what_was_written_then_lets_the_journal_go(journaled):  # noqa: F811
    store = journaled()
    journal = store.backend.journal
    store.create_session("s")
    store.put("s", "k", 1)
    assert store.mirror.checkpoint() is True
    assert MemoryValue.objects.get(session__session_id="s", key="k").decoded_value == 1
    assert [record[1] for _, record in journal.records()] == []  # all in the mirror now
    assert store.mirror.checkpoint() is True  # nothing written since: nothing to do
    store.put("s", "k", 2)
    segments = len(journal.segments())
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE persistent_memory_memoryvalue RENAME TO pm_broken")
    try:
        assert store.mirror.checkpoint() is False  # the sync failed: the journal keeps it all
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE pm_broken RENAME TO persistent_memory_memoryvalue")
    assert len(journal.segments()) == segments + 1
    assert [record[1] for _, record in journal.records()] == ["put"]


def test_a_flush_that_fails_says_so_and_the_worker_goes_on(db, settings, caplog, monkeypatch):
    settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "MIRROR_MODE": "deferred"}
    store = get_store()

    def broken() -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(store.backend, "checkpoint", broken)
    with caplog.at_level(logging.ERROR, "persistent_memory.mirror"):
        store.mirror._flush()  # returns: the worker's loop calls it again
    (record,) = caplog.records
    assert record.getMessage() == "persistent_memory: mirror flush failed"
    assert isinstance(record.exc_info[1], RuntimeError)


def test_a_sync_with_a_limit_over_a_batch_takes_that_many(mirrored):
    """A limit past BATCH_SIZE is taken over several batches, and no more than it."""
    from persistent_memory.mirror.sessions import BATCH_SIZE

    store = mirrored
    for n in range(BATCH_SIZE + 3):
        store.create_session(f"s{n}")
    assert store.mirror.sync_dirty(limit=BATCH_SIZE + 1).synced == BATCH_SIZE + 1
    assert MemorySession.objects.count() == BATCH_SIZE + 1
    assert store.backend.dirty_count() == 2


def test_a_full_sync_of_an_owner_notices_sessions_gone_without_a_mark(mirrored):
    """Marks lost (a backend down when they were to be kept): ``memory_mirror --all``
    still finds the owner's mirrored sessions the store no longer has."""
    store = mirrored
    alice = store.for_owner("user:alice")
    alice.create_session("kept")
    alice.create_session("gone")
    store.mirror.sync_dirty()
    alice.delete_session("gone")
    store.backend.pop_dirty(10)  # the mark is lost
    result = store.mirror.sync_all(owner="user:alice")
    assert (result.synced, result.gone) == (1, 1)
    states = dict(MemorySession.objects.values_list("session_id", "state"))
    assert states == {"kept": MemorySession.State.LIVE, "gone": MemorySession.State.DELETED}


def test_a_full_sync_that_fails_keeps_the_marks_it_took(mirrored):
    store = mirrored
    alice = store.for_owner("user:alice")
    alice.create_session("s")
    store.create_session("t")
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE persistent_memory_memorysession RENAME TO pm_away")
    try:
        # A savepoint: on PostgreSQL the failed query would abort the test's transaction.
        with pytest.raises(DatabaseError), transaction.atomic():
            store.mirror.sync_all(owner="user:alice")
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE pm_away RENAME TO persistent_memory_memorysession")
    assert sorted(store.backend.pop_dirty(10)) == sorted([storage_id("user:alice", "s"), "t"])


def test_marks_that_cannot_be_kept_are_said_in_a_warning(mirrored, caplog, monkeypatch):
    """The database fails and then the backend cannot mark the batch again: a warning says
    how many sessions wait for a full sync."""
    store = mirrored
    store.create_session("s1")
    store.create_session("s2")

    def down(session_ids: list[str]) -> None:
        raise BackendUnavailable("the backend is down")

    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE persistent_memory_memorysession RENAME TO pm_away")
    try:
        monkeypatch.setattr(store.backend, "mark_dirty", down)
        with caplog.at_level(logging.WARNING, "persistent_memory.mirror"):
            assert store.mirror.sync_dirty().failed == 2
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE pm_away RENAME TO persistent_memory_memorysession")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "persistent_memory: could not mark 2 sessions for a later sync" in warnings
    assert "persistent_memory: mirror sync of 2 sessions failed; will retry" in caplog.messages
    assert "persistent_memory_memorysession" in mirror_health(store)["last_error"]


def test_history_entries_the_mirror_cannot_read_whole_still_get_rows(mirrored):
    """An imported history may hold entries without an op or a time, or an op longer than
    the column: each still gets its row (op "unknown", op cut to 32 characters, the sync's
    time)."""
    from django.utils import timezone

    store = mirrored
    store.create_session("s1")
    snapshot = store.backend.snapshots(["s1"])["s1"]
    snapshot["history"] = [{"key": "a", "timestamp": 1000.0}, {"op": "x" * 40, "key": "b"}]
    store.backend.restore_session(snapshot, replace=True)
    before = timezone.now()
    store.mirror.sync_dirty()
    rows = list(HistoryEntry.objects.order_by("position"))
    assert [(e.op, e.key) for e in rows] == [("unknown", "a"), ("x" * 32, "b")]
    assert rows[0].timestamp.timestamp() == 1000.0 and before <= rows[1].timestamp <= timezone.now()


def test_checkpoint_rows_follow_removals_and_each_session_of_a_batch(db, settings):
    """Every session of a batch gets its checkpoints, after one that has none; a removal
    rewrites the session's entries once, and the syncs after it write only what changed."""
    from persistent_memory.models import CheckpointEntry

    def mirrored() -> dict[str, tuple[int, str]]:
        return {e.name: (e.pk, e.value) for e in CheckpointEntry.objects.all()}

    settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "MIRROR_MODE": "deferred"}
    store = get_store()
    store.create_session("plain")
    store.put_checkpoint("thread", "", "cp-1", '{"v": 1}')
    store.put_checkpoint("thread", "", "cp-2", '{"v": 2}')
    assert store.mirror.sync_sessions(["plain", "thread"]).synced == 2
    assert {name: value for name, (_, value) in mirrored().items()} == store.checkpoint_entries("thread")
    plain = MemorySession.objects.get(session_id="plain")
    assert (plain.checkpoint_epoch, plain.checkpoint_seq) == ("", 0)  # no checkpoints, no counters
    assert store.prune_checkpoints("thread") == 1
    store.mirror.sync_dirty()
    before = mirrored()
    assert {name: value for name, (_, value) in before.items()} == store.checkpoint_entries("thread")
    store.put_checkpoint("thread", "", "cp-3", '{"v": 3}')
    store.mirror.sync_dirty()
    after = mirrored()
    assert {name: value for name, (_, value) in after.items()} == store.checkpoint_entries("thread")
    assert {name: after[name] for name in before} == before and len(after) > len(before)


def test_the_figures_of_a_sync_add_up_over_its_batches(mirrored):
    """Three batches: one gone and one refused in the first, all written in the second,
    one refused in the third."""
    from persistent_memory.mirror.sessions import BATCH_SIZE

    store = mirrored
    store.create_session("gone")
    store.mirror.sync_dirty()
    store.delete_session("gone")
    others = [f"s{n}" for n in range(2 * BATCH_SIZE - 2)]
    for sid in ["refused-a", "refused-b", *others]:
        store.create_session(sid)
    store.put("refused-a", "refused", 1)
    store.put("refused-b", "refused", 1)
    with refusing("refused", "not_this_one"):
        result = store.mirror.sync_sessions(["gone", "refused-a", *others, "refused-b"])
    assert (result.synced, result.gone, result.failed) == (len(others), 1, 2)


def test_a_sync_goes_on_past_a_batch_where_some_sessions_were_refused(mirrored):
    """Only a batch that wrote nothing stops sync_dirty: with two of BATCH_SIZE + 1 sessions
    refused, the first batch holds one at least, and the one left for the next is written."""
    from persistent_memory.mirror.sessions import BATCH_SIZE

    store = mirrored
    for n in range(BATCH_SIZE + 1):
        store.create_session(f"s{n}")
    store.put("s0", "refused", 1)
    store.put("s1", "refused", 1)
    with refusing("refused", "not_these"):
        result = store.mirror.sync_dirty()
    assert (result.synced, result.gone, result.failed) == (BATCH_SIZE - 1, 0, 2)


def test_a_batch_that_fails_whole_adds_to_the_failures_before_it(mirrored, monkeypatch):
    from persistent_memory.mirror.sessions import BATCH_SIZE

    store = mirrored
    ids = [f"s{n}" for n in range(BATCH_SIZE + 3)]
    for sid in ids:
        store.create_session(sid)
    store.put("s0", "refused", 1)
    store.backend.pop_dirty(len(ids) + 1)
    snapshots, calls = store.backend.snapshots, []

    def second_fails(batch: list[str]):
        calls.append(batch)
        if len(calls) == 2:
            raise BackendUnavailable("the backend went away")
        return snapshots(batch)

    monkeypatch.setattr(store.backend, "snapshots", second_fails)
    with refusing("refused", "not_this_one"):
        result = store.mirror.sync_sessions(ids)
    assert (result.synced, result.failed) == (BATCH_SIZE - 1, 1 + 3)
    assert sorted(store.backend.pop_dirty(10)) == sorted(["s0", *ids[BATCH_SIZE:]])


def test_a_bug_in_a_sync_keeps_the_batch_marked(mirrored, monkeypatch):
    store = mirrored
    store.create_session("s1")
    store.backend.pop_dirty(10)

    def bug(batch: list[str]):
        raise RuntimeError("a bug")

    monkeypatch.setattr(store.backend, "snapshots", bug)
    with pytest.raises(RuntimeError, match="a bug"):
        store.mirror.sync_sessions(["s1"])
    assert store.backend.pop_dirty(10) == ["s1"]


def test_a_fresh_mirror_reports_no_sync_and_no_error(mirrored):
    health = mirror_health(mirrored)
    assert (health["last_sync_at"], health["last_error"], health["last_error_at"]) == (None, None, None)


def test_sessions_of_one_name_under_two_owners_keep_rows_of_their_own(mirrored):
    """Rows are found by owner and session id: one owner's sync neither rewrites nor
    marks gone the same-named session of another."""
    store = mirrored
    alice, bob = store.for_owner("user:alice"), store.for_owner("user:bob")
    for owned in (alice, bob):
        owned.create_session("s")
        owned.put("s", "k", 1)
    store.mirror.sync_dirty()

    def alices_history() -> set[int]:
        return set(HistoryEntry.objects.filter(session__owner="user:alice").values_list("pk", flat=True))

    before = alices_history()
    alice.put("s", "k", 2)
    store.mirror.sync_dirty()
    assert before < alices_history()  # the rows already mirrored are kept, one row added
    bob.delete_session("s")
    assert store.mirror.sync_dirty().gone == 1
    states = dict(MemorySession.objects.values_list("owner", "state"))
    assert states == {"user:alice": MemorySession.State.LIVE, "user:bob": MemorySession.State.DELETED}


def test_a_snapshot_read_at_the_moment_of_the_row_is_written(mirrored):
    """Only a row synced from a LATER read is left alone; the row says when it was read."""
    from django.utils import timezone

    store = mirrored
    store.create_session("s1")
    store.put("s1", "k", "first")
    moment = timezone.now()
    store.mirror._apply(store.backend.snapshots(["s1"]), moment)
    assert MemorySession.objects.get(session_id="s1").synced_at == moment
    store.put("s1", "k", "second")
    store.mirror._apply(store.backend.snapshots(["s1"]), moment)
    assert MemoryValue.objects.get(session__session_id="s1", key="k").decoded_value == "second"


def test_without_a_journal_the_rows_hold_no_journal_position(mirrored):
    store = mirrored
    for sid in ("a", "b"):
        store.create_session(sid)
        store.put(sid, "k", 1)
    store.mirror.sync_dirty()
    store.put("a", "k", 2)
    store.delete_session("b")
    assert store.mirror.sync_dirty().synced == 1  # one batch: "a" written, "b" marked gone
    assert dict(MemorySession.objects.values_list("session_id", "journal_seq")) == {"a": 0, "b": 0}


@pytest.mark.django_db(transaction=True)
def test_a_session_gone_in_a_batch_takes_the_batchs_journal_position(journaled):  # noqa: F811
    """A replay from a gone row's position must not bring back writes before its end."""
    store = journaled()
    store.record_answer("a", "x")
    store.record_answer("b", "y")
    store.mirror.sync_dirty()
    first = dict(MemorySession.objects.values_list("session_id", "journal_seq"))
    store.record_answer("a", "z")
    store.delete_session("b")
    store.mirror.sync_dirty()
    after = dict(MemorySession.objects.values_list("session_id", "journal_seq"))
    assert after["b"] == after["a"] > first["b"]
    assert MemorySession.objects.get(session_id="b").state == MemorySession.State.DELETED


def test_a_session_that_failed_then_went_loses_its_error(mirrored):
    store = mirrored
    store.create_session("s1")
    store.put("s1", "refused", 1)
    with refusing("refused", "gone_reason"):
        assert store.mirror.sync_dirty().failed == 1
    assert "gone_reason" in MemorySession.objects.get(session_id="s1").sync_error
    store.delete_session("s1")
    assert store.mirror.sync_dirty().gone == 1
    row = MemorySession.objects.get(session_id="s1")
    assert (row.state, row.sync_error, row.sync_failed_at) == (MemorySession.State.DELETED, "", None)


def test_a_history_time_the_mirror_cannot_read_leaves_the_activity_at_creation(mirrored):
    store = mirrored
    store.create_session("s1")
    snapshot = store.backend.snapshots(["s1"])["s1"]
    snapshot["history"] = [{"op": "put", "key": "a", "timestamp": "soon"}]
    store.backend.restore_session(snapshot, replace=True)
    store.mirror.sync_dirty()
    row = MemorySession.objects.get(session_id="s1")
    assert row.last_activity == row.created_at


def test_a_sync_stores_moments_with_their_time_zone(mirrored):
    """Every moment the mirror writes is aware (a naive one would be read in the
    project's TIME_ZONE, with a RuntimeWarning)."""
    import warnings

    store = mirrored
    store.create_session("s1", ttl_seconds=3600)
    store.put("s1", "k", 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store.mirror.sync_dirty()
    assert not [w for w in caught if "naive datetime" in str(w.message)]
    assert_mirrored(store, "s1")


def test_session_times_no_column_can_hold_are_stored_as_the_syncs_time(db, settings):
    """A restored info may hold times past any date (the memory backend takes any number):
    the row still gets written, with the sync's time in their place."""
    from django.utils import timezone

    settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "MIRROR_MODE": "deferred"}
    store = get_store()
    store.create_session("s1", ttl_seconds=3600)
    snapshot = store.backend.snapshots(["s1"])["s1"]
    snapshot["info"]["created_at"] = snapshot["info"]["expires_at"] = 1e300
    store.backend.restore_session(snapshot, replace=True)
    before = timezone.now()
    assert store.mirror.sync_dirty().synced == 1
    row = MemorySession.objects.get(session_id="s1")
    assert before <= row.created_at == row.expires_at == row.synced_at <= timezone.now()
