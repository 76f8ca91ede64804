"""The memory backend's write-ahead journal: a restart gets back every write made
before it, whether or not the mirror had it, and never applies one twice.

"A crash" here is a store dropped without its last mirror flush (its journal file
closed as the kernel closes it when a process is killed); the same with a real
server process and SIGKILL is in test_crash.py. The journal is the memory backend's:
Redis keeps its own data.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, connections
from hypothesis import HealthCheck, event, given
from hypothesis import settings as examples
from hypothesis import strategies as st

from persistent_memory.backends.base import RunBinding
from persistent_memory.backends.memory import MemoryBackend
from persistent_memory.exceptions import BackendUnavailable, NotANumber
from persistent_memory.journal import Journal, journal_directory
from persistent_memory.models import MemorySession
from persistent_memory.store import MemoryStore
from tests.timing import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def journaled(settings: Any, tmp_path: Path):
    """Build stores as a process would, all on one journal directory."""
    settings.PERSISTENT_MEMORY = {
        "BACKEND": "memory",
        "MIRROR_MODE": "immediate",
        "JOURNAL_DIR": str(tmp_path / "journal"),
        "MAX_HISTORY": 6,
    }
    built: list[MemoryStore] = []

    def build(*, worker: bool = False) -> MemoryStore:
        # from_settings restores and replays; its worker is stopped unless asked for, so
        # that the test decides when the mirror syncs.
        store = MemoryStore.from_settings()
        if not worker:
            store.mirror.stop()
        built.append(store)
        return store

    yield build
    for store in built:
        store.mirror.stop()  # before the test database goes
        if store.backend.journal is not None and store.backend.journal._lock_fd >= 0:
            crash(store)


def crash(store: MemoryStore) -> None:
    """What SIGKILL leaves: the journal file as written, no last mirror flush."""
    journal = store.backend.journal
    assert journal is not None
    journal._stop.set()
    with journal._fds_lock:  # the sync thread may be about to sync them
        if journal._fd is not None:
            os.close(journal._fd)
            journal._fd = None
        for fd in [*journal._record_fds.values(), *journal._retired]:
            os.close(fd)
        journal._record_fds, journal._retired, journal._unsynced_fds = {}, [], set()
    os.close(journal._lock_fd)  # the kernel releases the flock of a dead process
    journal._lock_fd = -1


def state(store: MemoryStore, owner_sessions: dict[str, list[str]]) -> dict[str, Any]:
    """Everything the store holds for these sessions, timestamps included."""
    result = {}
    for owner, session_ids in owner_sessions.items():
        scoped = store.for_owner(owner)
        for session_id in session_ids:
            info = scoped.session_info(session_id)
            result[(owner, session_id)] = (
                info,
                scoped.get_all(session_id),
                scoped.get_history(session_id, 0),
            )
    return result


def write_everything(store: MemoryStore, round_: int) -> None:
    alice = store.for_owner("user:1")
    if round_ == 0:
        alice.create_session("chat", ttl_seconds=3600)
        store.create_session("node")
        store.create_session("doomed")
    alice.put("chat", f"k{round_}", {"round": round_, "text": "caf\u00e9 \u0000"})
    alice.increment("chat", "n", 5)
    alice.record_answer("chat", f"answer {round_}")
    alice.enrich("lane", run_id=f"run{round_}")
    alice.record_answer(None, f"by run {round_}", run_id=f"run{round_}")
    store.put("node", "k", round_)
    for i in range(4):  # past MAX_HISTORY: auto summaries
        store.increment("node", "c", i)
    store.clear("node", "k")
    store.summarize("node", 2)
    with pytest.raises(NotANumber):  # a failed write replays as the same failure
        alice.increment("chat", f"k{round_}", 1)
    if round_ == 1:
        store.delete_session("doomed")


SESSIONS = {"user:1": ["chat", "lane"], "": ["node"]}


def test_a_crash_loses_nothing_the_mirror_had_not_synced(journaled):
    store = journaled()
    write_everything(store, 0)
    before = state(store, SESSIONS)
    crash(store)
    assert MemorySession.objects.count() == 0  # the mirror never ran: all of it is in the journal

    fresh = journaled()
    assert state(fresh, SESSIONS) == before
    assert fresh.list_sessions() == ["doomed", "node"]
    # Run bindings come back too: the run's answer still finds its session.
    assert fresh.for_owner("user:1").record_answer(None, "again", run_id="run0").session_id == "lane"


def test_replay_starts_where_each_mirrored_row_ends_and_applies_nothing_twice(journaled):
    store = journaled()
    write_everything(store, 0)
    store.mirror.sync_dirty()  # rows written, journal not truncated (a crash before the drop)
    write_everything(store, 1)
    before = state(store, SESSIONS)
    crash(store)

    fresh = journaled()
    after = state(fresh, SESSIONS)
    # Counters are the proof of "not twice": 2 rounds of +5, 2 answers on chat.
    assert after[("user:1", "chat")][1]["n"] == 10
    assert after[("user:1", "chat")][1]["answer_count"] == 2
    for key, (info, values, history) in before.items():
        now_info, now_values, now_history = after[key]
        assert now_values == values, key
        assert [(e["op"], e.get("key")) for e in now_history] == [(e["op"], e.get("key")) for e in history]
        assert [e["timestamp"] for e in now_history] == pytest.approx(
            [e["timestamp"] for e in history], abs=1e-5
        )
        if info["expires_at"] is not None:
            assert now_info["expires_at"] == pytest.approx(info["expires_at"], abs=1e-3)
    assert fresh.list_sessions() == ["node"]  # "doomed" was deleted after the rows were written


def test_a_runs_checkpoints_deleted_before_a_crash_stay_deleted_and_the_rest_kept(journaled):
    # A deletion of runs replays as that deletion: not as a prune (which would keep cp3,
    # the newest, instead of cp2) and not as nothing.
    store = journaled()
    for checkpoint_id, run_id in (("cp1", "run-a"), ("cp2", "run-b"), ("cp3", "run-a")):
        store.put_checkpoint("graph", "", checkpoint_id, f"record {checkpoint_id}", run_id=run_id)
    assert store.delete_checkpoint_runs("graph", ["run-a"]) == 2
    before = store.checkpoint_entries("graph")
    crash(store)

    fresh = journaled()
    assert fresh.backend.journal.skipped == {}
    assert [cp.checkpoint_id for cp in fresh.list_checkpoints("graph")] == ["cp2"]
    assert fresh.checkpoint_entries("graph") == before


def test_threads_and_branches_written_before_a_crash_come_back_with_their_new_sessions_ttl(
    journaled, settings
):
    settings.PERSISTENT_MEMORY = {**settings.PERSISTENT_MEMORY, "SESSION_TTL_HOURS": 1}
    store = journaled()
    alice = store.for_owner("user:1")
    alice.write_thread(
        "fresh",
        key="rec",
        expected=None,
        record={"revision": "1"},
        messages=[{"role": "user", "content": "q"}],
        conversation="th",
    )
    # An append that creates its session, then a branch after an older message.
    first, _ = alice.add_messages(
        "new", [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    )["messages"]
    alice.add_messages("new", [{"role": "assistant", "content": "b"}], parent_id=first["id"])

    def both(scoped: MemoryStore) -> tuple[Any, ...]:
        return tuple(
            (
                scoped.session_info(sid),
                scoped.get_all(sid),
                scoped.list_conversations(sid),
                scoped.get_messages(sid),
            )
            for sid in ("fresh", "new")
        )

    before = both(alice)
    assert before[0][0]["ttl_seconds"] == before[1][0]["ttl_seconds"] == 3600
    assert [m["content"] for m in before[1][3]["messages"]] == ["q", "b"]
    crash(store)

    assert both(journaled().for_owner("user:1")) == before


def test_replayed_messages_keep_their_role_and_fingerprint(journaled):
    from tests.chat import system, user

    store = journaled()
    store.add_messages("chat", [system("Be brief."), user("one", id="m1")])
    store.add_messages("chat", [user("two")])
    crash(store)

    fresh = journaled()
    # The system message is still pinned: a window of two messages holds it and the newest.
    window = fresh.get_context("chat", max_messages=2)["messages"]
    assert [message["content"] for message in window] == ["Be brief.", "two"]
    # A resent message is still the same one: no conflict, nothing new.
    fresh.add_messages("chat", [user("one", id="m1")])
    assert fresh.list_conversations("chat")[0]["message_count"] == 3


def test_an_idempotency_key_outlives_a_crash(journaled):
    # The write is replayed from the journal; its answer may never have reached the
    # client, whose retry with the same key must get it and not apply it again.
    from persistent_memory.exceptions import IdempotencyKeyReused
    from persistent_memory.idempotency import Idempotency

    store = journaled()
    alice = store.for_owner("user:1")
    alice.create_session("chat")
    once = Idempotency.of("retry-1", "POST", "increment", 5)
    assert alice.increment("chat", "n", 5, idempotency=once) == 5
    crash(store)

    fresh = journaled().for_owner("user:1")
    assert fresh.increment("chat", "n", 5, idempotency=once) == 5
    assert fresh.get("chat", "n") == 5
    with pytest.raises(IdempotencyKeyReused):
        fresh.increment("chat", "n", 6, idempotency=Idempotency.of("retry-1", "POST", "increment", 6))


def test_idempotency_keys_outlive_the_checkpoint_that_drops_their_writes(journaled):
    # Every kind of result a keyed write returns comes back as it was first answered,
    # once the mirror has the writes and the journal's segments are gone.
    from persistent_memory.idempotency import Idempotency

    store = journaled()
    alice = store.for_owner("user:1")
    writes = {
        "create": lambda key: alice.create_session("chat", ttl_seconds=3600, idempotency=key),
        "put": lambda key: alice.put("chat", "k", {"a": [1, 2.5, None, True]}, idempotency=key),
        "increment": lambda key: alice.increment("chat", "n", 5, idempotency=key),
        "answer": lambda key: alice.record_answer("chat", "an answer", idempotency=key),
        "clear": lambda key: alice.clear("chat", "k", idempotency=key),
        "messages": lambda key: alice.add_messages(
            "chat", [{"role": "user", "content": "hi"}], idempotency=key
        ),
        "enrich": lambda key: alice.enrich("chat", run_id="r1", idempotency=key),
        "delete": lambda key: store.delete_session("gone", idempotency=key),
    }
    store.create_session("gone")
    keys = {name: Idempotency.of(f"key-{name}", name) for name in writes}
    first = {name: write(keys[name]) for name, write in writes.items()}
    assert store.mirror.checkpoint() is True and store.mirror.checkpoint() is True
    assert not any(b"key-" in path.read_bytes() for path in store.backend.journal.segments())
    applied = held(alice)
    crash(store)

    fresh = journaled()
    alice = fresh.for_owner("user:1")
    again = {name: write(keys[name]) for name, write in writes.items()}
    assert again == first
    assert {name: type(result) for name, result in again.items()} == {
        name: type(result) for name, result in first.items()
    }
    assert held(alice) == applied  # none applied twice
    assert fresh.list_sessions() == []  # "gone" was not created again, nor deleted twice


def held(scoped: MemoryStore) -> tuple[Any, ...]:
    """A session's values, history operations and messages (the mirror keeps times to the µs)."""
    history = [(entry["op"], entry.get("key")) for entry in scoped.get_history("chat", 0)]
    messages = [m["content"] for m in scoped.get_messages("chat")["messages"]]
    return scoped.get_all("chat"), history, messages


def test_a_replayed_key_is_kept_on_disk_too(journaled):
    # Killed between a write's journal record and its idempotency record: the replay
    # makes the record, and keeps it past the next checkpoint.
    from persistent_memory.idempotency import Idempotency

    store = journaled()
    store.create_session("s")
    once = Idempotency.of("replayed", "increment")
    assert store.increment("s", "n", 2, idempotency=once) == 2
    crash(store)
    for path in store.backend.journal._record_files():
        path[1].unlink()
    fresh = journaled()
    assert fresh.mirror.checkpoint() is True and fresh.mirror.checkpoint() is True
    crash(fresh)
    again = journaled()
    assert again.increment("s", "n", 2, idempotency=once) == 2
    assert again.get("s", "n") == 2


def test_expired_idempotency_records_go_with_their_files(journaled, monkeypatch):
    from persistent_memory import journal as journal_module
    from persistent_memory.idempotency import Idempotency

    store = journaled()
    store.create_session("s")
    journal = store.backend.journal
    store.put("s", "k", 1, idempotency=Idempotency.of("soon", "put"))
    assert len(journal._record_files()) == 1
    ((bucket, _),) = journal._record_files()
    # An hour later (the bucket's end) the whole file goes at the next checkpoint.
    later = bucket * journal_module.RECORDS_BUCKET_SECONDS + 1
    monkeypatch.setattr(time, "time", lambda: later)
    assert list(journal.remembered(later)) == []
    store.put("s", "k", 2)  # no key: no record of its own
    assert store.mirror.checkpoint() is True
    assert journal._record_files() == []


def test_forgetting_an_owner_removes_their_idempotency_records_from_disk(journaled):
    from persistent_memory.idempotency import Idempotency
    from persistent_memory.operations.forget import forget_owner

    store = journaled()
    alice, bob = store.for_owner("user:1"), store.for_owner("user:2")
    alice.create_session("s", idempotency=Idempotency.of("alice-key", "create"))
    bob.create_session("s", idempotency=Idempotency.of("bob-key", "create"))
    assert forget_owner("user:1", store=store)["records"] == 1
    on_disk = b"".join(path.read_bytes() for _, path in store.backend.journal._record_files())
    assert b"alice-key" not in on_disk and b"bob-key" in on_disk
    crash(store)
    fresh = journaled()
    assert [ref for ref in fresh.backend._records if "alice-key" in ref] == []
    assert [ref for ref in fresh.backend._records if "bob-key" in ref] != []


def test_a_checkpoint_truncates_the_journal_once_the_mirror_has_everything(journaled, tmp_path):
    store = journaled()
    write_everything(store, 0)
    journal = store.backend.journal
    assert journal.size() > 0
    assert store.mirror.checkpoint() is True
    # What is left is the new segment with the live run bindings only.
    kept = [record for _, record in journal.records()]
    assert {record[1] for record in kept} == {"bind"}
    assert store.mirror.checkpoint() is True  # nothing new: no new segment either
    assert len(journal.segments()) == 1
    store.for_owner("user:1").put("chat", "after", 1)  # in the new segment only
    before = state(store, SESSIONS)
    crash(store)
    after = state(journaled(), SESSIONS)
    assert after[("user:1", "chat")][1] == before[("user:1", "chat")][1]
    assert after[("", "node")][1] == before[("", "node")][1]


def test_a_failed_sync_keeps_the_journal(journaled, monkeypatch):
    store = journaled()
    write_everything(store, 0)
    segments = len(store.backend.journal.segments())
    from django.db import DatabaseError

    from persistent_memory.mirror import sessions as mirror_module

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise DatabaseError("database is locked")

    monkeypatch.setattr(mirror_module.Mirror, "_apply", refuse)
    assert store.mirror.checkpoint() is False
    assert len(store.backend.journal.segments()) == segments + 1  # rotated, nothing dropped
    monkeypatch.undo()
    before = state(store, SESSIONS)
    crash(store)
    assert state(journaled(), SESSIONS) == before


def test_the_store_refuses_calls_until_its_sessions_are_restored(journaled, monkeypatch):
    from persistent_memory.mirror import sessions as mirror_module

    store = journaled()
    write_everything(store, 0)
    crash(store)
    calls = {"n": 0}
    original = mirror_module.Mirror.restore
    # The database comes back when the test says so, not after however many of the
    # worker's retries (every half second) a loaded machine lets pass meanwhile.
    database_back = threading.Event()

    def restore_fails_until_the_database_is_back(self: Any) -> int:
        calls["n"] += 1
        if not database_back.is_set():
            from django.db import OperationalError

            raise OperationalError("the database is down")
        return original(self)

    monkeypatch.setattr(mirror_module.Mirror, "restore", restore_fails_until_the_database_is_back)
    fresh = journaled(worker=True)  # its worker retries the restore every half second
    assert fresh.mirror.restore_pending
    refused = [
        lambda: fresh.get_all("node"),
        lambda: fresh.put("node", "x", 1),
        lambda: fresh.list_sessions(),
        lambda: fresh.list_session_page(),
        lambda: fresh.for_owner("user:1").record_answer(None, "x", run_id="run0"),
    ]
    for call in refused:
        with pytest.raises(BackendUnavailable, match="waiting for its database"):
            call()
    database_back.set()
    wait_until(lambda: not fresh.mirror.restore_pending)  # the worker retried, on its own
    assert fresh.get("node", "c") == 6
    assert calls["n"] >= 2  # the restore at start failed; a retry worked


def test_a_second_process_reads_the_journal_but_writes_none(journaled):
    owner = journaled()
    write_everything(owner, 0)
    reader = journaled()  # the owner still runs
    assert reader.backend.journal.owned is False
    assert reader.get("node", "c") == 6  # replayed from the owner's journal
    size = owner.backend.journal.size()
    reader.put("node", "only-here", 1)
    assert reader.mirror.checkpoint() is True
    assert owner.backend.journal.size() == size


def test_a_torn_last_record_is_skipped(tmp_path):
    journal = Journal(tmp_path)
    journal.append("put", "s", 1.0, None, "k", "1")
    segment = journal.segments()[-1]
    journal.close()
    with segment.open("ab") as file:
        file.write(b'[2,"put","s",2.0,null,"k"')  # cut short by a kill mid-write
    again = Journal(tmp_path)
    try:
        assert [seq for seq, _ in again.records()] == [1]
        assert again.append("put", "s", 3.0, None, "k", "2") == 2
    finally:
        again.close()


def test_a_torn_idempotency_record_is_skipped_and_the_next_one_kept(tmp_path):
    from persistent_memory.backends.base import IdempotencyRecord

    def opened() -> MemoryBackend:
        backend = MemoryBackend(max_sessions=10, max_history=100, auto_summarize=True)
        backend.open_journal(tmp_path)
        return backend

    backend = opened()
    backend.create_session("s", None)
    assert backend.increment("s", "n", 1, idempotency=IdempotencyRecord("~idem:a", "f", 60)) == 1
    backend.close()
    [(_, path)] = backend.journal._record_files()
    with open(path, "ab") as torn:  # killed half way through a record
        torn.write(b'["~idem:b","f",')
    backend = opened()
    assert set(backend._records) == {"~idem:a"}
    backend.create_session("t", None)
    backend.increment("t", "n", 7, idempotency=IdempotencyRecord("~idem:c", "f", 60))
    backend.close()
    again = opened()
    assert set(again._records) == {"~idem:a", "~idem:c"}
    again.close()


def test_records_keep_exact_values_and_times(tmp_path):
    backend = MemoryBackend(max_sessions=10, max_history=100, auto_summarize=True)
    backend.open_journal(tmp_path)
    backend.create_session("s", None)
    value = '{"a": "\\u0000\\ud83d\\ude00", "b": 1e-300}'
    backend.put("s", "k", value)
    backend.enrich("t", None, RunBinding("~run:r", 60))
    backend.close()
    replica = MemoryBackend(max_sessions=10, max_history=100, auto_summarize=True)
    replica.open_journal(tmp_path)
    assert sorted(replica.replay({})) == ["s", "t"]
    assert replica.get("s", "k") == value
    assert replica.get_history("s", 0) == backend.get_history("s", 0)
    assert replica._runs == backend._runs
    replica.close()


def test_journal_dir_defaults_to_a_folder_of_the_database_own(tmp_path, settings):
    def outside_tests(setting, database):
        return journal_directory(setting, database, testing=False)

    sqlite = {"ENGINE": "django.db.backends.sqlite3", "NAME": tmp_path / "db.sqlite3"}
    assert outside_tests(None, sqlite) == tmp_path / "db.sqlite3.memory-journal"
    assert outside_tests(False, sqlite) is None
    assert outside_tests("/x/y", sqlite) == Path("/x/y")
    # Nothing outlives an in-memory SQLite: nothing to replay into it.
    assert outside_tests(None, {**sqlite, "NAME": "file:memorydb_default?mode=memory&cache=shared"}) is None
    # Any other database: a folder in the project named after its server and name, so that
    # two databases never share one.
    settings.BASE_DIR = tmp_path / "project"
    postgres = {"ENGINE": "django.db.backends.postgresql", "NAME": "app", "HOST": "db.local", "PORT": 5432}
    folder = outside_tests(None, postgres)
    assert folder == tmp_path / "project" / "memory-journal" / "postgresql-db.local-5432-app"
    assert outside_tests(None, {**postgres, "NAME": "other"}) != folder
    assert outside_tests(None, {**postgres, "PORT": 5433}) != folder
    assert outside_tests(None, {**postgres, "HOST": "/run/postgresql"}).parent == folder.parent
    assert outside_tests(False, postgres) is None
    del settings.BASE_DIR  # a project without one: the working directory
    assert outside_tests(None, postgres) == Path.cwd() / "memory-journal" / "postgresql-db.local-5432-app"
    # In a test environment (this one, set up by pytest-django) the default journal goes
    # nowhere: the test database is new each run, and one run's writes must not come back
    # into the next one's store. An explicit JOURNAL_DIR is used as given.
    assert journal_directory(None, postgres) is None
    assert journal_directory(None, sqlite) is None
    assert journal_directory("/x/y", postgres) == Path("/x/y")


class TestChecks:
    @staticmethod
    def ids() -> list[str]:
        from django.core.checks import run_checks

        messages = run_checks(include_deployment_checks=True, databases=[])
        return sorted(m.id for m in messages if m.id.startswith("persistent_"))

    def test_a_bad_journal_dir_is_an_error(self, settings):
        settings.PERSISTENT_MEMORY = {"JOURNAL_DIR": 42}
        assert self.ids() == ["persistent_memory.E010"]

    def test_an_unjournaled_memory_backend_is_a_deploy_warning(self, settings):
        # The default journal is on wherever the database outlives the process: on
        # PostgreSQL; not on the in-memory SQLite test database, which W006 names.
        settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "JOURNAL_DIR": None}
        in_memory = journal_directory(None, connections.databases["default"], testing=False) is None
        assert ("persistent_memory.W006" in self.ids()) is in_memory
        assert connection.vendor == "sqlite" or not in_memory
        for chosen in ({"JOURNAL_DIR": False}, {"JOURNAL_DIR": "/var/lib/memory"}, {"MIRROR_MODE": "off"}):
            settings.PERSISTENT_MEMORY = {"BACKEND": "memory", **chosen}
            assert "persistent_memory.W006" not in self.ids(), chosen


def test_health_shows_staff_the_mirror_lag_last_error_and_journal(journaled, monkeypatch):
    from django.contrib.auth import get_user_model
    from django.db import DatabaseError
    from rest_framework.test import APIClient

    from persistent_memory import store as store_module
    from persistent_memory.mirror import sessions as mirror_module

    store = journaled()
    monkeypatch.setattr(store_module, "_store", store)  # the API's store is this one
    staff = APIClient()
    staff.force_login(get_user_model().objects.create_user("ops", is_staff=True))
    write_everything(store, 0)

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise DatabaseError("disk I/O error")

    with monkeypatch.context() as patched:
        patched.setattr(mirror_module.Mirror, "_apply", refuse)
        assert store.mirror.checkpoint() is False
    mirror = staff.get("/api/memory/health/").json()["mirror"]
    assert mirror["mode"] == "immediate" and mirror["status"] == "ok"
    assert mirror["pending_sessions"] == 4
    assert "disk I/O error" in mirror["last_error"] and mirror["last_error_at"]
    assert mirror["journal_bytes"] == store.backend.journal.size() > 0

    assert store.mirror.checkpoint() is True  # the database is back
    mirror = staff.get("/api/memory/health/").json()["mirror"]
    assert mirror["pending_sessions"] == 0 and mirror["last_sync_at"]
    assert mirror["journal_bytes"] < 1000  # only the live run bindings are kept
    monkeypatch.setattr(store_module, "_store", None)


# Review fixes ------------------------------------------------------------------


POSTGRES = {"ENGINE": "django.db.backends.postgresql", "NAME": "app", "HOST": "db.local", "PORT": 5432}


def test_a_locmem_outbox_is_no_test_environment(monkeypatch, caplog):
    # The locmem EmailBackend gives django.core.mail an outbox in any deployment that sends
    # a mail with it: that must not turn the default journal off.
    import logging

    from django.core import mail
    from django.test import utils

    from persistent_memory import journal as journal_module
    from persistent_memory.journal import in_test_environment

    with monkeypatch.context() as deployed:
        deployed.delattr(utils._TestState, "saved_data")  # as outside setup_test_environment
        deployed.setattr(mail, "outbox", [], raising=False)  # what the locmem backend sets
        assert not in_test_environment()
        assert journal_directory(None, POSTGRES) is not None

    # In pytest-django's test environment the default journal goes nowhere, which is said once.
    monkeypatch.setattr(journal_module, "_told_testing", False, raising=False)
    with caplog.at_level(logging.INFO, logger="persistent_memory.journal"):
        assert journal_directory(None, POSTGRES) is None
        assert journal_directory(None, POSTGRES) is None
    told = [r for r in caplog.records if "test environment" in r.getMessage()]
    assert [r.levelno for r in told] == [logging.INFO]


def no_sync_thread(journal: Journal) -> Journal:
    """``journal`` with its sync thread stopped: the test calls :meth:`Journal.sync`."""
    journal._stop.set()
    journal._syncer.join()
    return journal


def test_a_record_after_a_short_write_is_not_appended_to_the_torn_line(tmp_path, monkeypatch):
    journal = Journal(tmp_path)
    expires = time.time() + 60
    journal.remember("~idem:a", "f", expires, 1)
    real_write = os.write

    def short(fd: int, data: bytes) -> int:  # a full disk: half the record written
        return real_write(fd, data[: len(data) // 2])

    with monkeypatch.context() as patched:
        patched.setattr(os, "write", short)
        with pytest.raises(OSError):
            journal.remember("~idem:b", "f", expires, 2)
    journal.remember("~idem:c", "f", expires, 3)
    try:
        assert [ref for ref, *_ in journal.remembered(time.time())] == ["~idem:a", "~idem:c"]
    finally:
        journal.close()


def test_a_record_file_closed_while_it_is_synced_is_synced_safely(tmp_path, monkeypatch, caplog):
    # The sync thread fsyncs outside the backend's lock; a checkpoint meanwhile deletes an
    # expired record file and closes it: the fsync must neither fail nor hit another file.
    import logging

    journal = no_sync_thread(Journal(tmp_path))
    journal.append("put", "s", 1.0, None, "k", "1")
    journal.remember("~idem:a", "f", time.time() + 60, 1)
    real_fsync = os.fsync
    in_fsync, closed = threading.Event(), threading.Event()

    def paused(fd: int) -> None:
        if threading.current_thread() is syncer and not in_fsync.is_set():
            in_fsync.set()
            assert closed.wait(30)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", paused)
    syncer = threading.Thread(target=journal.sync)
    with caplog.at_level(logging.WARNING, logger="persistent_memory.journal"):
        syncer.start()
        assert in_fsync.wait(30)
        journal.expire_records(time.time() + 7200)  # the record file's hour is over
        closed.set()
        syncer.join(30)
    assert not syncer.is_alive()
    assert "fsync failed" not in caplog.text
    assert journal._record_files() == []
    journal.close()


def open_record_files() -> list[str]:
    """The idempotency record files this process holds open."""
    names = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the fd listdir itself used, closed meanwhile
            continue
        if os.path.basename(target).startswith("records-"):
            names.append(os.path.basename(target))
    return names


def test_only_the_newest_record_file_stays_open_and_only_written_files_are_synced(tmp_path, monkeypatch):
    from persistent_memory.journal import RECORDS_BUCKET_SECONDS

    journal = no_sync_thread(Journal(tmp_path))
    now = time.time()
    for hour in range(30):  # a 30 hours' TTL: a file per hour of expiry
        journal.remember(f"~idem:{hour}", "f", now + 60 + hour * RECORDS_BUCKET_SECONDS, hour)
    journal.sync()
    assert len(open_record_files()) == 1
    journal.remember("~idem:old", "f", now + 60, "late")  # an older hour: opened again
    journal.sync()
    assert len(open_record_files()) == 1
    assert {ref for ref, *_ in journal.remembered(now)} == {f"~idem:{hour}" for hour in range(30)} | {
        "~idem:old"
    }

    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    journal.sync()
    assert synced == []  # nothing written since the last sync
    journal.remember("~idem:new", "f", now + 29 * RECORDS_BUCKET_SECONDS, "new")
    journal.sync()
    assert len(synced) == 1
    journal.close()
    assert open_record_files() == []


def test_the_default_journal_folder_unusable_runs_without_a_journal(settings, tmp_path, monkeypatch, caplog):
    # A read-only app filesystem (as root chmod stops nothing: BASE_DIR is a file, so
    # the folder under it cannot be made) worked before the journal was on by default.
    import logging

    from django.core import mail
    from django.core.exceptions import ImproperlyConfigured
    from django.test import utils

    from persistent_memory import store as store_module

    base = tmp_path / "app"
    base.write_text("not a folder")
    settings.BASE_DIR = base
    # The default journal as deployed (nor the outbox, which older checks went by).
    monkeypatch.delattr(utils._TestState, "saved_data")
    monkeypatch.delattr(mail, "outbox", raising=False)
    if journal_directory(None, connections.databases["default"]) is None:
        # The in-memory SQLite test database has no default journal: ask for the folder
        # of a server database (on PostgreSQL the test database's own folder is used).
        real = store_module.journal_directory
        monkeypatch.setattr(store_module, "journal_directory", lambda setting, _: real(setting, POSTGRES))
    settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "MIRROR_MODE": "immediate"}
    with caplog.at_level(logging.ERROR, logger="persistent_memory.store"):
        store = MemoryStore.from_settings()
    try:
        assert store.backend.journal is None
        assert "running without a journal" in caplog.text
        store.create_session("works")
        assert store.list_sessions() == ["works"]
    finally:
        store.mirror.stop()
        store.backend.close()
    settings.PERSISTENT_MEMORY = {
        "BACKEND": "memory",
        "MIRROR_MODE": "immediate",
        "JOURNAL_DIR": str(base / "j"),
    }
    with pytest.raises(ImproperlyConfigured, match="JOURNAL_DIR"):
        MemoryStore.from_settings()  # asked for by name: a start without it would surprise


def test_journal_size_counts_segments_only_and_a_file_gone_meanwhile(journaled, monkeypatch):
    from django.contrib.auth import get_user_model
    from rest_framework.test import APIClient

    from persistent_memory import store as store_module
    from persistent_memory.idempotency import Idempotency

    store = journaled()
    store.create_session("s")
    store.put("s", "k", 1, idempotency=Idempotency.of("kept-for-a-day", "put"))
    assert store.mirror.checkpoint() is True and store.mirror.checkpoint() is True
    journal = store.backend.journal
    segments = sum(path.stat().st_size for path in journal.segments())
    records = sum(path.stat().st_size for _, path in journal._record_files())
    assert records > 0
    monkeypatch.setattr(store_module, "_store", store)
    staff = APIClient()
    staff.force_authenticate(get_user_model()(username="ops", is_staff=True))
    mirror = staff.get("/api/memory/health/").json()["mirror"]
    assert (mirror["journal_bytes"], mirror["idempotency_bytes"]) == (segments, records)

    # A segment the owner drops between listing and measuring is no error.
    real_exists = Path.exists

    def dropped_meanwhile(path: Path, *args: Any, **kwargs: Any) -> bool:
        found = real_exists(path, *args, **kwargs)
        path.unlink(missing_ok=True)
        return found

    listed = journal.segments()
    monkeypatch.setattr(Path, "exists", dropped_meanwhile)
    monkeypatch.setattr(journal, "segments", lambda: [*listed, journal.directory / "9.journal"])
    assert journal.size() <= segments
    monkeypatch.undo()


def records_file(directory: Path) -> Path:
    from persistent_memory.journal import RECORDS_BUCKET_SECONDS

    return directory / f"records-{int(time.time() // RECORDS_BUCKET_SECONDS) + 100}"


def test_malformed_record_lines_are_skipped_with_a_warning(tmp_path, caplog):
    import logging

    later = time.time() + 3600
    lines = [
        "[1,2]",
        '"a string"',
        '{"a": 1}',
        f'["~idem:unknown","f",{later},{{"t":["Nope",[]]}}]',  # decoded(): KeyError
        f'["~idem:flat","f",{later},{{"t":5}}]',  # decoded(): TypeError
        '["~idem:when","f","soon",1]',
        f'["~idem:good","f",{later},{{"t":["",[1,2]]}}]',
    ]
    records_file(tmp_path).write_text("".join(line + "\n" for line in lines))
    backend = MemoryBackend(max_sessions=10, max_history=100, auto_summarize=True)
    with caplog.at_level(logging.WARNING, logger="persistent_memory"):
        backend.open_journal(tmp_path)
    try:
        assert {ref: recorded.result for ref, recorded in backend._records.items()} == {"~idem:good": (1, 2)}
        assert len([r for r in caplog.records if "idempotency record" in r.getMessage()]) == 6
    finally:
        backend.close()


def test_a_replay_keeps_the_answer_read_back_from_the_record_files(tmp_path):
    # The mirror restored a state the keyed write's replay gives another result on: the
    # retry still gets the answer the client got, and the record is not written again.
    from persistent_memory.backends.base import IdempotencyRecord

    once = IdempotencyRecord("~idem:inc", "f", 600)
    backend = MemoryBackend(max_sessions=10, max_history=100, auto_summarize=True)
    backend.open_journal(tmp_path)
    backend.create_session("s", None)
    assert backend.increment("s", "n", 5, idempotency=once) == 5
    backend.close()
    [(_, path)] = backend.journal._record_files()
    written = path.read_bytes()

    replica = MemoryBackend(max_sessions=10, max_history=100, auto_summarize=True)
    replica.open_journal(tmp_path)
    with replica.restoring():  # what the mirror held: n already 10
        replica.create_session("s", None)
        replica.put("s", "n", "10")
    replica.replay({})
    try:
        assert replica.increment("s", "n", 5, idempotency=once) == 5
        assert path.read_bytes() == written
    finally:
        replica.close()


def test_forgetting_an_owner_whose_records_cannot_be_rewritten_is_retryable(journaled, monkeypatch):
    from persistent_memory.idempotency import Idempotency
    from persistent_memory.operations.forget import forget_owner

    store = journaled()
    alice, bob = store.for_owner("user:1"), store.for_owner("user:2")
    alice.create_session("s", idempotency=Idempotency.of("alice-key", "create"))
    bob.create_session("s", idempotency=Idempotency.of("bob-key", "create"))
    journal = store.backend.journal
    [(_, path)] = journal._record_files()
    blocker = path.with_name(f".{path.name}.tmp")
    blocker.mkdir()  # the rewrite cannot be written (as a full disk would refuse it)
    with pytest.raises(BackendUnavailable, match="again"):
        forget_owner("user:1", store=store)
    assert b"alice-key" in path.read_bytes()  # the file as it was, whole
    blocker.rmdir()

    real_replace = os.replace

    def refused(*args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refused)
    with pytest.raises(BackendUnavailable):
        forget_owner("user:1", store=store)
    assert sorted(p.name for p in journal.directory.iterdir() if p.name.endswith(".tmp")) == []
    monkeypatch.setattr(os, "replace", real_replace)

    forget_owner("user:1", store=store)  # the retry finishes it
    assert b"alice-key" not in path.read_bytes() and b"bob-key" in path.read_bytes()


# Lines that are not records ------------------------------------------------------
#
# A journal line that parses but is not a record a write made (an edit, a disk's
# corruption, another program's file) is skipped whole and counted: a restart never
# fails on it (500 from a failed start, or 503 "waiting for its database" from a replay
# that raised forever after) and never applies part of it.


def every_write(store: MemoryStore) -> None:
    """At least one write of every operation the memory backend journals."""
    from persistent_memory.backends.conversations import Summary

    write_everything(store, 0)  # create, put, increment, answer, enrich, clear, summarize
    store.delete_session("doomed")
    alice = store.for_owner("user:1")
    alice.enrich_recording("lane", "what is new?", run_id="asked")  # enrich with its question
    alice.record_answer(None, "all of it", run_id="asked")  # answer with its message
    call = {"id": "call_1", "type": "function", "function": {"name": "look", "arguments": "{}"}}
    added = alice.add_messages(
        "chat",
        [
            {"role": "user", "content": "hi", "name": "ann", "metadata": {"n": [1, 2.5]}},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "42"}]},
        ],
        conversation="tools",
    )["messages"]
    alice.set_head("chat", added[0]["id"], conversation="tools")
    alice.pop_message(
        "chat", added[0]["id"], conversation="tools", replacement=[{"role": "user", "content": "hey"}]
    )
    alice.add_messages("chat", [{"role": "user", "content": "bye"}], conversation="gone")
    alice.clear_messages("chat", conversation="gone")
    alice.write_thread("chat", key="rec", expected=None, record={"revision": "1"}, conversation="th")
    alice.write_thread(
        "chat",
        key="rec",
        expected="1",
        record={"revision": "2"},
        messages=[{"role": "user", "content": "threaded"}],
        conversation="th",
    )
    alice.remove_thread("chat", key="rec", expected="2", conversation="th")
    backend, sid = store.backend, "~o:user:1~chat"
    source = backend.summary_source(sid, "tools")
    anchor = json.loads(source.messages[-1])
    assert backend.commit_summary(sid, "tools", None, Summary("so far", anchor["id"], anchor["seq"], 3, 5))
    ref = "channel\x1fv1"
    store.put_checkpoint("graph", "", "cp1", "one", run_id="run-a", refs=[ref], blobs={ref: "f\x1dv1\x1dx"})
    store.put_checkpoint_writes("graph", "", "cp1", [("task", 0, "channel", "v", "")])
    store.put_checkpoint("graph", "", "cp2", "two", refs=[ref])
    assert store.prune_checkpoints("graph") == 1
    store.load_checkpoint_entries("graph2", store.checkpoint_entries("graph"))
    store.load_checkpoint_entries("graph2", store.checkpoint_entries("graph"), replace=True)  # copy_thread
    backend.restore_session(backend.snapshots(["node"])["node"], replace=True)
    backend.checkpoint()  # rotates: the live run bindings go to the new segment


def journal_ops(directory: Path) -> set[str]:
    ops = set()
    for path in directory.glob("*.journal"):
        ops.update(json.loads(line)[1] for line in path.read_bytes().splitlines() if line)
    return ops


def everything(backend: MemoryBackend) -> dict[str, Any]:
    """All a backend holds that a replay makes (no random checkpoint epochs)."""
    with backend._lock:
        ids = sorted(backend._sessions)
        questions = {sid: dict(session.questions) for sid, session in backend._sessions.items()}
        records = {ref: (r.fingerprint, r.result, r.expires_at) for ref, r in backend._records.items()}
        runs = dict(backend._runs)
    snapshots = backend.snapshots(ids)
    for snapshot in snapshots.values():
        assert snapshot is not None
        snapshot.pop("journal_seq")
        snapshot.get("checkpoint_state", {}).pop("epoch", None)
    return {"sessions": snapshots, "questions": questions, "records": records, "runs": runs}


def test_every_write_replays_and_none_is_skipped(journaled):
    from persistent_memory.backends.memory.replay import CHECKS

    store = journaled()
    every_write(store)
    before = everything(store.backend)
    directory = store.backend.journal.directory
    assert journal_ops(directory) == set(CHECKS)  # every operation is here
    crash(store)

    fresh = journaled()
    assert fresh.backend.journal.skipped == {}
    assert fresh.backend.journal_skipped() == 0
    after = everything(fresh.backend)
    assert after["sessions"].keys() == before["sessions"].keys()
    for sid, snapshot in before["sessions"].items():
        assert after["sessions"][sid]["values"] == snapshot["values"], sid
        assert after["sessions"][sid]["conversations"] == snapshot["conversations"], sid
        assert after["sessions"][sid].get("checkpoints") == snapshot.get("checkpoints"), sid
    assert after["runs"].keys() == before["runs"].keys()
    assert after["questions"] == before["questions"]


def segment_with_lines(store: MemoryStore, lines: list[bytes]) -> Path:
    """Append ``lines`` to the live segment between two writes, as a disk or an edit would."""
    journal = store.backend.journal
    segment = journal.segments()[-1]
    with segment.open("ab") as file:
        file.write(b"".join(line + b"\n" for line in lines))
    return segment


#: Lines that parse, or nearly, and are no record (in the middle of a segment), and
#: records whose arguments are not what any write journals, down to a message's link.
NOT_RECORDS = {
    "a number": b"5",
    "an object": b'{"a": 1}',
    "a list of one": b"[999999]",
    "too short": b'[999999, "put", "node", 1.0]',
    "an unknown operation": b'[999999, "nope", "node", 1.0, null]',
    "a wrong seq": b'[true, "put", "node", 1.0, null, "k", "1"]',
    "a seq past 64 bits": b'[99999999999999999999, "put", "node", 1.0, null, "k", "1"]',
    "a time of NaN": b'[999999, "put", "node", NaN, null, "k", "1"]',
    "a malformed key record": b'[999999, "create", "made", 1.0, ["a"], null, null]',
    "a session id not one": b'[999999, "create", "a b", 1.0, null, null, null]',
    "too few arguments": b'[999999, "put", "node", 1.0, null, "k"]',
    "too many arguments": b'[999999, "delete", "node", 1.0, null, 1]',
    "arguments of the wrong type": b'[999999, "put", "node", 1.0, null, 5, 6]',
    "a value that is no JSON": b'[999999, "put", "node", 1.0, null, "k", "{oops"]',
    "an amount that is text": b'[999999, "increment", "node", 1.0, null, "c", "x"]',
    "a message's link with a text token count": (
        b'[999999, "messages", "made", 1.0, null, "c", null, [["m1", '
        b'"{\\"role\\": \\"user\\", \\"content\\": \\"hi\\", \\"tokens\\": 1, \\"tokenizer\\": \\"t\\", '
        b'\\"created_at\\": 1.0}", '
        b'"{\\"t\\": \\"1\\", \\"r\\": \\"user\\", \\"c\\": [], \\"a\\": null, \\"f\\": \\"x\\"}"]], null]'
    ),
    "an answer whose message is a number": (
        b'[999999, "answer", "made", 1.0, null, "\\"a\\"", null, ["c", 5, null], null]'
    ),
    "a snapshot without its info": (
        b'[999999, "restore", "made", 1.0, null, {"values": {}, "history": []}, false]'
    ),
    "a history entry timed in text": (
        b'[999999, "restore", "made", 1.0, null, {"info": {"created_at": 1.0, "ttl_seconds": null, '
        b'"expires_at": null}, "values": {}, "history": [{"op": "put", "timestamp": "now"}]}, false]'
    ),
    "a checkpoint entry without a name": b'[999999, "cp_load", "made", 1.0, null, {"": "x"}, null]',
    "a record write of four": (
        b'[999999, "thread", "made", 1.0, null, "c", ["k", null, "{}", null], [], null]'
    ),
    "nested past the parser": b"[" * 100_000 + b"]" * 100_000,
    "random bytes": bytes(byte for byte in range(256) if byte != ord("\n")),
    "NUL bytes": b"\x00" * 40,
}


@pytest.mark.parametrize("line", NOT_RECORDS.values(), ids=NOT_RECORDS.keys())
def test_a_line_that_is_no_record_is_skipped_counted_and_logged(journaled, line, caplog):
    import logging

    store = journaled()
    write_everything(store, 0)
    segment = segment_with_lines(store, [line])
    number = segment.read_bytes().count(b"\n")
    write_everything(store, 1)  # records after it are replayed too
    before = state(store, SESSIONS)
    crash(store)

    with caplog.at_level(logging.WARNING, logger="persistent_memory"):
        fresh = journaled()
    assert not fresh.mirror.restore_pending  # the store answers
    assert state(fresh, SESSIONS) == before  # every write is back
    assert fresh.list_sessions() == ["node"]  # and nothing of the line: no session "made"
    assert fresh.backend.journal_skipped() == 1
    assert [f"{segment.name}:{number}"] == list(fresh.backend.journal.skipped)
    assert any(f"{segment.name}:{number}" in r.getMessage() for r in caplog.records)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_lock_that_cannot_be_taken_is_the_error_and_leaves_no_file_open(tmp_path, monkeypatch):
    import errno
    import fcntl

    def refuse(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")  # a network filesystem's, say

    before = set(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(fcntl, "flock", refuse)
    with pytest.raises(OSError) as refused:
        Journal(tmp_path)
    assert refused.value.errno == errno.ENOLCK
    assert set(os.listdir("/proc/self/fd")) <= before


def test_a_failed_start_reports_its_own_error_whatever_giving_the_folder_up_raises(tmp_path, monkeypatch):
    real_close = Journal.close

    def close(self: Journal) -> None:
        real_close(self)
        raise OSError(5, "Input/output error")

    def refuse(self: Journal, first_seq: int) -> Path:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Journal, "close", close)
    monkeypatch.setattr(Journal, "_open_segment", refuse)
    with pytest.raises(OSError) as refused:
        Journal(tmp_path)
    assert refused.value.errno == 28


def test_a_failed_start_gives_the_journal_folder_up(tmp_path, monkeypatch):
    def refuse(self: Journal, first_seq: int) -> Path:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patched:
        patched.setattr(Journal, "_open_segment", refuse)
        with pytest.raises(OSError):
            Journal(tmp_path)
    again = Journal(tmp_path)  # a retry in the same process owns the folder
    try:
        assert again.owned
    finally:
        again.close()


def test_health_shows_the_skipped_lines(journaled, monkeypatch):
    from django.contrib.auth import get_user_model
    from rest_framework.test import APIClient

    from persistent_memory import store as store_module

    store = journaled()
    write_everything(store, 0)
    segment_with_lines(store, [NOT_RECORDS["an unknown operation"], NOT_RECORDS["a number"]])
    crash(store)
    fresh = journaled()
    monkeypatch.setattr(store_module, "_store", fresh)
    staff = APIClient()
    staff.force_login(get_user_model().objects.create_user("ops", is_staff=True))
    answer = staff.get("/api/memory/health/")
    assert answer.status_code == 200
    assert answer.json()["mirror"]["journal_skipped"] == 2
    monkeypatch.setattr(store_module, "_store", None)


# Arbitrary lines and records (hypothesis) -------------------------------------------

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


def fresh_backend() -> MemoryBackend:
    return MemoryBackend(max_sessions=50, max_history=6, auto_summarize=True)


@functools.cache
def corpus() -> tuple[bytes, ...]:
    """The journal lines of :func:`every_write`, made once."""
    with tempfile.TemporaryDirectory() as directory:
        backend = fresh_backend()
        backend.open_journal(directory)
        every_write(MemoryStore(backend))
        backend.close()
        lines = b"".join(path.read_bytes() for path in backend.journal.segments())
    return tuple(line for line in lines.split(b"\n") if line)


def replayed(lines: list[bytes]) -> tuple[dict[str, Any], Journal]:
    """What a restart makes of a journal of these lines (no mirror): its state and journal."""
    with tempfile.TemporaryDirectory() as directory:
        (Path(directory) / f"{1:020d}.journal").write_bytes(b"".join(line + b"\n" for line in lines))
        backend = fresh_backend()
        backend.open_journal(directory)
        try:
            backend.replay({})
            return everything(backend), backend.journal
        finally:
            backend.close()


def bugs(journal: Journal) -> list[str]:
    """Records the checks let through that then failed: what a write cannot make."""
    return [why for why in journal.skipped.values() if why.startswith("failed to replay")]


@examples(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=_JSON, position=st.integers(min_value=0))
def test_any_json_value_as_a_line_is_skipped_or_a_record(value, position):
    lines = list(corpus())
    position %= len(lines) + 1
    line = json.dumps(value).encode()
    baseline, _ = replayed(lines)
    after, journal = replayed([*lines[:position], line, *lines[position:]])
    assert bugs(journal) == []
    event("skipped" if journal.skipped else "a record")
    if journal.skipped:  # not a record: nothing of it applied, and everything else is
        assert list(journal.skipped) == [f"{1:020d}.journal:{position + 1}"]
        assert after == baseline


class _Json:
    """A step into JSON text inside a record (a message's body or link, a value)."""


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in ``value``, JSON texts' insides included."""
    yield prefix
    if isinstance(value, list):
        for index, item in enumerate(value):
            yield from _paths(item, (*prefix, index))
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, str) and value[:1] in ("{", "["):
        try:
            inner = json.loads(value)
        except ValueError:
            return
        for path in _paths(inner):
            if path:
                yield (*prefix, _Json, *path)


class _Removed:
    """What :func:`_replaced` puts in a place to take it out (a field or an item gone)."""


def _replaced(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    if not path:
        return new
    step, rest = path[0], path[1:]
    if step is _Json:
        return json.dumps(_replaced(json.loads(value), rest, new))
    copied = copy.copy(value)
    if new is _Removed and not rest:
        del copied[step]
    else:
        copied[step] = _replaced(value[step], rest, new)
    return copied


@examples(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_record_with_any_argument_changed_or_removed_is_skipped_whole_or_replayed(data):
    lines = list(corpus())
    index = data.draw(st.integers(min_value=0, max_value=len(lines) - 1), label="record")
    record = json.loads(lines[index])
    paths = [path for path in _paths(record) if path and path[0] != 0]  # seq 0's are fine either way
    path = data.draw(st.sampled_from(paths), label="path")
    changed = _replaced(record, path, data.draw(_JSON | st.just(_Removed), label="value"))
    without, _ = replayed([*lines[:index], *lines[index + 1 :]])
    after, journal = replayed([*lines[:index], json.dumps(changed).encode(), *lines[index + 1 :]])
    assert bugs(journal) == []
    event("skipped" if journal.skipped else "replayed" if after != without else "no change")
    if journal.skipped:  # nothing of it applied: as if it had never been written
        assert after == without


# The journal on its own (issue 46: each test fails on a fault mutation testing showed no
# other test noticed). A temporary folder, no store: they run in milliseconds.


def an_hour_ahead() -> float:
    """The start of an hour a few hours from now: records expiring in it share one file."""
    from persistent_memory.journal import RECORDS_BUCKET_SECONDS

    return (int(time.time() // RECORDS_BUCKET_SECONDS) + 5) * RECORDS_BUCKET_SECONDS


def test_a_short_write_is_out_of_space_and_keeps_no_half_record(tmp_path):
    # A real short write: the kernel cuts a write at RLIMIT_FSIZE as at a full disk
    # (SIGXFSZ ignored, so the write past the limit fails with EFBIG instead of killing us).
    import resource
    import signal

    journal = no_sync_thread(Journal(tmp_path))
    assert journal.append("put", "s", 1.0, None, "k", "1") == 1
    segment = journal.segments()[-1]
    size = segment.stat().st_size
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (size + 20, limits[1]))
        with pytest.raises(BackendUnavailable, match="^The memory backend's journal is out of space.$"):
            journal.append("put", "s", 2.0, None, "k", "x" * 100)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, limits[1]))
        with pytest.raises(
            BackendUnavailable, match="^The memory backend's journal cannot be written: .*large"
        ):
            journal.append("put", "s", 2.0, None, "k", "x" * 100)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, previous)
    assert segment.stat().st_size == size  # no half record left
    assert journal.append("put", "s", 3.0, None, "k", "3") == 2  # the next write is whole
    journal.close()
    again = Journal(tmp_path)
    try:
        assert [(seq, record[3]) for seq, record in again.records()] == [(1, 1.0), (2, 3.0)]
        assert again.skipped == {}
    finally:
        again.close()


def test_expired_idempotency_records_are_not_taken_back(tmp_path):
    from persistent_memory.journal import RECORDS_BUCKET_SECONDS

    hour = an_hour_ahead()
    journal = Journal(tmp_path)
    journal.remember("~idem:earlier", "f", hour - RECORDS_BUCKET_SECONDS + 5, 0)  # the hour before
    journal.remember("~idem:a", "f", hour + 10, 1)
    journal.remember("~idem:b", "f", hour + 20, 2)
    try:
        assert [ref for ref, *_ in journal.remembered(hour + 9.5)] == ["~idem:a", "~idem:b"]
        # At its expiry a record is gone, though its file (the hour's) is still there; a
        # file expired whole is passed over, not the end of the reading.
        assert [ref for ref, *_ in journal.remembered(hour + 10)] == ["~idem:b"]
        assert list(journal.remembered(hour + 20)) == []
        # Each file goes as soon as its hour is over, not an hour later.
        journal.expire_records(hour)
        assert [bucket * RECORDS_BUCKET_SECONDS for bucket, _ in journal._record_files()] == [
            hour + RECORDS_BUCKET_SECONDS
        ]
        journal.sync()  # closes the older file (retired by the newer one) once synced
        journal.remember("~idem:c", "f", hour + 30, 3)  # not synced yet
        journal.expire_records(hour + RECORDS_BUCKET_SECONDS)
        assert journal._record_files() == []
        assert open_record_files() == []  # deleted, and not held open: their space is freed
        journal.sync()  # the closed files are not synced (nor anything else, by number)
    finally:
        journal.close()


def test_the_newest_record_file_stays_open_and_the_older_is_synced_then_closed(tmp_path, monkeypatch):
    from persistent_memory.journal import RECORDS_BUCKET_SECONDS

    hour = an_hour_ahead()
    journal = no_sync_thread(Journal(tmp_path))
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(os.fstat(fd).st_ino) or real_fsync(fd))

    def inode(bucket_hour: float) -> int:
        return (tmp_path / f"records-{int(bucket_hour // RECORDS_BUCKET_SECONDS) + 1}").stat().st_ino

    journal.remember("~idem:old", "f", hour, 1)
    journal.remember("~idem:new", "f", hour + RECORDS_BUCKET_SECONDS, 2)
    journal.sync()  # both written since the last sync: both synced, the older one closed
    assert sorted(synced) == sorted([inode(hour), inode(hour + RECORDS_BUCKET_SECONDS)])
    assert open_record_files() == [f"records-{int(hour // RECORDS_BUCKET_SECONDS) + 2}"]
    synced.clear()
    journal.remember("~idem:old2", "f", hour, 3)  # the older hour again: opened for this write
    journal.sync()
    assert synced == [inode(hour)]
    synced.clear()
    journal.remember("~idem:new2", "f", hour + RECORDS_BUCKET_SECONDS, 4)  # synced, unwritten: closed
    journal.sync()
    assert synced == [inode(hour + RECORDS_BUCKET_SECONDS)]
    assert open_record_files() == [f"records-{int(hour // RECORDS_BUCKET_SECONDS) + 2}"]
    synced.clear()
    assert journal.append("put", "s", 1.0, None, "k", "1") == 1
    journal.sync()
    assert synced == [journal.segments()[-1].stat().st_ino]
    synced.clear()
    journal.sync()
    assert synced == []  # nothing written since
    journal.close()


def test_a_journal_another_owns_is_read_and_never_written(tmp_path):
    hour = an_hour_ahead()
    owner = Journal(tmp_path)
    owner.append("put", "s", 1.0, None, "k", "1")
    owner.remember("~idem:a", "f", hour + 10, 1)
    owner.sync()
    files = {path.name: path.read_bytes() for path in tmp_path.iterdir()}
    reader = Journal(tmp_path)  # another process's would be refused the same flock
    try:
        assert owner.owned and not reader.owned
        assert [seq for seq, _ in reader.records()] == [1]
        assert [ref for ref, *_ in reader.remembered(hour)] == ["~idem:a"]
        assert reader.append("put", "s", 2.0, None, "k", "2") == 0
        reader.remember("~idem:b", "f", hour + 10, 2)
        reader.remember("~idem:c", "f", hour + 7200, 3)
        reader.forget_records("~idem:a")
        reader.expire_records(hour + 7200)
        assert reader.rotate() == []
        assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == files
    finally:
        reader.close()
        owner.close()
    again = Journal(tmp_path)  # the owner gone: the next one owns it
    assert again.owned
    again.close()


def test_a_closed_journal_writes_nothing(tmp_path):
    journal = Journal(tmp_path)
    journal.close()
    assert not journal._syncer.is_alive()  # stopped with it
    files = sorted(path.name for path in tmp_path.iterdir())
    assert journal.append("put", "s", 1.0, None, "k", "1") == 0
    journal.remember("~idem:a", "f", time.time() + 60, 1)
    assert sorted(path.name for path in tmp_path.iterdir()) == files
    assert open_record_files() == []


def test_segments_are_named_by_their_first_record_and_read_in_order(tmp_path):
    from persistent_memory.journal import _total_size

    journal = Journal(tmp_path)
    journal.append("put", "s", 1.0, None, "k", "1")
    assert journal.rotate() == [tmp_path / f"{1:020d}.journal"]
    journal.append("put", "s", 2.0, None, "k", "2")
    journal.append("put", "s", 3.0, None, "k", "3")
    older = journal.rotate()
    journal.append("put", "s", 4.0, None, "k", "4")
    assert [path.name for path in journal.segments()] == [f"{seq:020d}.journal" for seq in (1, 2, 4)]
    assert [seq for seq, _ in journal.records()] == [1, 2, 3, 4]
    assert journal.size() == sum(path.stat().st_size for path in journal.segments())
    gone = tmp_path / f"{9:020d}.journal"  # dropped between listing and measuring
    assert _total_size([journal.segments()[0], gone, *journal.segments()[1:]]) == journal.size()
    journal.drop(older)
    journal.drop(older)  # dropped already (by a checkpoint meanwhile): no error
    assert [seq for seq, _ in journal.records()] == [4]
    journal.close()


def test_record_files_are_private_and_reopened_without_blank_lines(tmp_path):
    hour = an_hour_ahead()
    journal = Journal(tmp_path)
    journal.remember("~idem:a", "f", hour + 10, 1)
    journal.close()
    [(_, path)] = journal._record_files()
    assert path.stat().st_mode & 0o777 == 0o600  # a write's answer may be anyone's data
    again = Journal(tmp_path)
    again.remember("~idem:b", "f", hour + 20, 2)
    again.close()
    assert path.read_bytes().count(b"\n") == 2 and b"\n\n" not in path.read_bytes()


def test_forgetting_records_by_prefix_keeps_every_other_record_whole(tmp_path):
    from persistent_memory.journal import RECORDS_BUCKET_SECONDS

    hour = an_hour_ahead()
    journal = Journal(tmp_path)
    journal.remember("~idem:bob", "f", hour + 10, "a b c")  # the first file: nothing to forget
    journal.remember("~idem:ab", "f", hour + RECORDS_BUCKET_SECONDS + 10, 1)
    journal.remember("~idem:ac", "f", hour + RECORDS_BUCKET_SECONDS + 20, "x y")
    journal.remember("~idem:ae", "f", hour + RECORDS_BUCKET_SECONDS + 25, 2)
    journal.forget_records("~idem:ab")
    # The open file was rewritten: a later record goes to the new one.
    journal.remember("~idem:ad", "f", hour + RECORDS_BUCKET_SECONDS + 30, 3)
    journal.close()
    again = Journal(tmp_path)
    try:
        assert [(ref, result) for ref, _, _, result in again.remembered(hour)] == [
            ("~idem:bob", "a b c"),
            ("~idem:ac", "x y"),
            ("~idem:ae", 2),
            ("~idem:ad", 3),
        ]
    finally:
        again.close()


def test_records_that_cannot_be_rewritten_say_to_forget_again(tmp_path):
    journal = Journal(tmp_path)
    journal.remember("~idem:a", "f", an_hour_ahead(), 1)
    [(_, path)] = journal._record_files()
    (tmp_path / f".{path.name}.tmp").mkdir()  # the rewrite cannot be written
    try:
        with pytest.raises(BackendUnavailable) as refused:
            journal.forget_records("~idem:a")
        assert str(refused.value) == (
            "The memory backend could not remove the owner's idempotency records from disk; "
            "forgetting the owner again finishes it."
        )
    finally:
        journal.close()


def test_a_segment_line_is_a_record_only_with_a_valid_head(tmp_path):
    from persistent_memory.journal import MAX_SEQ

    lines = {
        b"[1]": "not a list of at least five items",
        b'[0,"put","s",1.0,null,"k","1"]': "its sequence number is not a positive 64-bit integer",
        b'[2,5,"s",1.0,null,"k","1"]': "its operation or session id is not a string",
        b'[3,"put","s",-1,null,"k","1"]': "its time is not a number of seconds",
        b'[4,"put","s",1.0,["r","f",0],"k","1"]': "its idempotency record is malformed",
        b'[5,"put","s",0,null,"k","1"]': None,
        b'[6,"put","s",0.5,["r","f",1],"k","1"]': None,
        f'[{MAX_SEQ},"put","s",1.0,null,"k","1"]'.encode(): None,
    }
    (tmp_path / f"{1:020d}.journal").write_bytes(b"".join(line + b"\n" for line in lines))
    journal = Journal(tmp_path)
    try:
        assert journal.seq == MAX_SEQ
        assert [seq for seq, _ in journal.records()] == [5, 6, MAX_SEQ]
        assert list(journal.skipped.values()) == [why for why in lines.values() if why]
    finally:
        journal.close()


def test_the_default_folder_of_a_database_with_settings_left_out(tmp_path, settings):
    settings.BASE_DIR = tmp_path
    sqlite = "django.db.backends.sqlite3"
    for name in (None, "", ":memory:"):
        assert journal_directory(None, {"ENGINE": sqlite, "NAME": name}, testing=False) is None
    assert journal_directory(None, {"NAME": "a/b c"}, testing=False) == (
        tmp_path / "memory-journal" / "db-local-default-a_b_c"
    )


# The journal's files, its sync thread and its reading, one behaviour each ---------------


def test_the_journal_folder_is_made_with_its_parents_and_its_files_are_private(tmp_path):
    # Every file may hold anyone's data (a write's value, a keyed write's answer): owner only,
    # whatever the umask lets through.
    directory = tmp_path / "not" / "made" / "yet"
    umask = os.umask(0)
    try:
        journal = Journal(directory)
        journal.append("put", "s", 1.0, None, "k", "1")
        journal.remember("~idem:a", "f", an_hour_ahead(), 1)
    finally:
        os.umask(umask)
    journal.close()
    names = sorted(path.name for path in directory.iterdir())
    assert names == [f"{1:020d}.journal", "lock", journal._record_files()[0][1].name]
    assert {name: (directory / name).stat().st_mode & 0o777 for name in names} == dict.fromkeys(names, 0o600)


def test_a_journal_another_owns_is_said_once_and_gets_no_sync_thread(tmp_path, caplog):
    import logging

    owner = Journal(tmp_path)
    with caplog.at_level(logging.WARNING, logger="persistent_memory.journal"):
        reader = Journal(tmp_path)
    try:
        assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
            (
                logging.WARNING,
                f"persistent_memory: another process owns the journal in {tmp_path}; this one reads "
                "it but journals none of its own writes",
            )
        ]
        assert reader._syncer is None
    finally:
        reader.close()
        owner.close()
    assert not owner._syncer.is_alive()  # the owner's stopped with its journal


@pytest.fixture
def fsynced(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The inodes of the files ``os.fsync`` is called on, with the sync thread's interval
    made short (the thread reads it each round). The waits for the thread give it 15 s for
    rounds 10 ms apart: a deadline only there so that a broken journal's test ends soon."""
    from persistent_memory import journal as journal_module

    monkeypatch.setattr(journal_module, "FSYNC_INTERVAL_SECONDS", 0.01)
    inodes: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        inodes.append(os.fstat(fd).st_ino)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return inodes


def test_the_sync_thread_forces_each_write_to_disk_on_its_own(tmp_path, fsynced):
    journal = Journal(tmp_path)
    try:
        syncer = journal._syncer
        # A daemon: a process that exits without closing its store is not held up by it.
        assert syncer.is_alive() and syncer.daemon and syncer.name == "persistent-memory-journal"
        journal.append("put", "s", 1.0, None, "k", "1")
        segment = journal.segments()[-1].stat().st_ino
        wait_until(lambda: segment in fsynced, 15)  # no sync() called: the thread did it
        journal.remember("~idem:a", "f", an_hour_ahead(), 1)
        records = journal._record_files()[0][1].stat().st_ino
        wait_until(lambda: records in fsynced, 15)
    finally:
        journal.close()
    assert not syncer.is_alive()


def fsync_failures(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The journal's warnings of a failed sync, each with its error's traceback (what
    failed, for the operator)."""
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "persistent_memory.journal" and r.exc_info and isinstance(r.exc_info[1], OSError)
    ]


def test_a_sync_round_that_fails_is_logged_and_the_next_round_syncs(tmp_path, fsynced, monkeypatch, caplog):
    import logging

    real_dup = os.dup
    failing, refused = threading.Event(), threading.Event()
    failing.set()

    def dup(fd: int) -> int:  # out of fds for the duplicates
        if failing.is_set():
            refused.set()
            raise OSError(24, "Too many open files")
        return real_dup(fd)

    journal = Journal(tmp_path)
    try:
        with caplog.at_level(logging.WARNING, logger="persistent_memory.journal"):
            monkeypatch.setattr(os, "dup", dup)
            journal.append("put", "s", 1.0, None, "k", "1")
            assert refused.wait(15)
            failing.clear()
            segment = journal.segments()[-1].stat().st_ino
            wait_until(lambda: segment in fsynced, 15)  # the next round synced the write, with no other
        failures = fsync_failures(caplog)
        assert failures and set(failures) == {"persistent_memory: journal fsync failed"}
        assert journal._syncer.is_alive()
    finally:
        journal.close()


def test_a_file_that_fails_to_sync_is_logged_and_the_others_are_synced(tmp_path, monkeypatch, caplog):
    import errno
    import logging

    journal = no_sync_thread(Journal(tmp_path))
    journal.append("put", "s", 1.0, None, "k", "1")
    journal.remember("~idem:a", "f", an_hour_ahead(), 1)
    segment = journal.segments()[-1].stat().st_ino
    synced: list[int] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:  # a failing disk under the segment only
        if os.fstat(fd).st_ino == segment:
            raise OSError(errno.EIO, "Input/output error")
        synced.append(os.fstat(fd).st_ino)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    try:
        with caplog.at_level(logging.WARNING, logger="persistent_memory.journal"):
            journal.sync()
        assert fsync_failures(caplog) == ["persistent_memory: journal fsync failed"]
        assert synced == [journal._record_files()[0][1].stat().st_ino]
    finally:
        monkeypatch.undo()
        journal.close()


def test_reading_goes_on_past_a_segment_dropped_meanwhile_and_past_lines_that_are_no_records(
    tmp_path, monkeypatch
):
    journal = no_sync_thread(Journal(tmp_path))
    journal.append("put", "s", 1.0, None, "k", "1")
    journal.rotate()
    journal.append("put", "s", 2.0, None, "k", "2")
    first, second = journal.segments()
    with first.open("ab") as file:  # an edit: a blank line, a line torn, a line no record, then a record
        file.write(b'\n[1,"put"\n[2,"put"]\n[3,"put","s",3.0,null,"k","3"]\n')
    listed = journal.segments()
    gone = tmp_path / f"{0:020d}.journal"  # dropped by the owning process between listing and reading
    monkeypatch.setattr(journal, "segments", lambda: [gone, *listed])
    try:
        assert [seq for seq, _ in journal.records()] == [1, 3, 2]
        assert journal.skipped == {
            f"{first.name}:3": "torn, or not JSON",
            f"{first.name}:4": "not a list of at least five items",
        }
    finally:
        journal.close()


def test_an_hour_of_idempotency_records_is_not_read_once_it_is_over(tmp_path, caplog, monkeypatch):
    # At the very end of its hour a file's records have all expired: it is passed over
    # unread (a line in it that is no record is not even reported), and the files after
    # it are read.
    import logging

    from persistent_memory.journal import RECORDS_BUCKET_SECONDS

    hour = an_hour_ahead()
    journal = no_sync_thread(Journal(tmp_path))
    journal.remember("~idem:a", "f", hour - 10, 1)
    journal.remember("~idem:b", "f", hour + 10, 2)
    journal.sync()
    over = tmp_path / f"records-{int(hour // RECORDS_BUCKET_SECONDS)}"
    with over.open("ab") as file:
        file.write(b'["not a record"]\n')
    try:
        with caplog.at_level(logging.WARNING, logger="persistent_memory.journal"):
            assert [ref for ref, *_ in journal.remembered(hour)] == ["~idem:b"]
        assert caplog.records == []
        with caplog.at_level(logging.WARNING, logger="persistent_memory.journal"):
            assert [ref for ref, *_ in journal.remembered(hour - 20)] == ["~idem:a", "~idem:b"]
        assert [r.getMessage() for r in caplog.records] == [
            f"persistent_memory: skipping a malformed idempotency record: {over.name}"
        ]
        # A file listed, then deleted by the owning process (its hour over) before it is read.
        listed = journal._record_files()
        gone = (listed[0][0], tmp_path / "records-0")
        monkeypatch.setattr(journal, "_record_files", lambda: [gone, *listed])
        assert [ref for ref, *_ in journal.remembered(hour - 20)] == ["~idem:a", "~idem:b"]
    finally:
        journal.close()
