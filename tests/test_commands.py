"""The maintenance commands through call_command, on both backends."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from persistent_memory.backends.memory.history import operation_count
from persistent_memory.models import MemorySession
from tests.timing import LIVE_TTL, wait_past

ROOT = Path(__file__).resolve().parent.parent


class TTY(io.StringIO):
    def isatty(self) -> bool:
        return True


def run(*args, **options):
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err, **options)
    return out.getvalue(), err.getvalue()


def run_json(*args, **options):
    out, _ = run(*args, "--json", **options)
    return json.loads(out)


@pytest.fixture
def store(db, configure):
    return configure(MIRROR_MODE="deferred", MAX_HISTORY=10)


def long_histories(store, sessions=3, writes=25):
    for i in range(sessions):
        store.create_session(f"s{i}")
    store_off = store.backend.auto_summarize
    store.backend.auto_summarize = False  # let histories grow past the limit
    if store.backend.name == "redis":
        store.backend._policy = (store.backend._policy[0], "0", *store.backend._policy[2:])
    for i in range(sessions):
        for n in range(writes):
            store.put(f"s{i}", "k", n)
    store.backend.auto_summarize = store_off
    if store.backend.name == "redis":
        store.backend._policy = (store.backend._policy[0], "1", *store.backend._policy[2:])


class TestSummarize:
    def test_dry_run_then_run(self, configure, db):
        store = configure(MIRROR_MODE="deferred", MAX_HISTORY=10, AUTO_SUMMARIZE=False)
        for i in range(3):
            store.create_session(f"s{i}")
            for n in range(25 if i < 2 else 5):
                store.put(f"s{i}", "k", n)
        dry = run_json("memory_summarize", "--all", "--dry-run")
        assert dry == {"dry_run": True, "scanned": 3, "summarized": 2, "folded": 40}
        assert len(store.get_history("s0", 0)) == 25  # nothing changed
        done = run_json("memory_summarize", "--all")
        assert done == {"dry_run": False, "scanned": 3, "summarized": 2, "folded": 40}
        for i in range(3):
            history = store.get_history(f"s{i}", 0)
            assert operation_count(history) == (25 if i < 2 else 5)
        assert len(store.get_history("s0", 0)) == 6
        # The writes marked the sessions for the mirror; its next pass follows.
        assert run_json("memory_mirror")["synced"] == 3
        assert MemorySession.objects.get(session_id="s0").history_length == 6

    def test_prose_output(self, configure, db):
        store = configure(MIRROR_MODE="off", MAX_HISTORY=4, AUTO_SUMMARIZE=False)
        store.create_session("s1")
        for n in range(6):
            store.put("s1", "k", n)
        out, _ = run("memory_summarize", "--all")
        assert out.strip() == "Scanned 1 sessions, summarized 1, 4 history entries folded."
        out, _ = run("memory_summarize", "--all", verbosity=0)
        assert out == ""

    def test_auto_summarize_off_needs_all(self, configure, db):
        store = configure(MAX_HISTORY=4, AUTO_SUMMARIZE=False)
        store.create_session("s1")
        for n in range(10):
            store.put("s1", "k", n)
        out, _ = run("memory_summarize")
        assert "AUTO_SUMMARIZE is off" in out
        assert len(store.get_history("s1", 0)) == 10
        assert run_json("memory_summarize", "--session", "s1", "--max-history", "6")["folded"] == 7
        assert len(store.get_history("s1", 0)) == 4

    def test_named_sessions_and_limit(self, configure, db):
        store = configure(MAX_HISTORY=100, AUTO_SUMMARIZE=True)
        for session_id in ("a", "b"):
            store.create_session(session_id)
            for n in range(20):
                store.put(session_id, "k", n)
        counts = run_json("memory_summarize", "--session", "a", "--session", "gone", "--max-history", "10")
        assert counts == {"dry_run": False, "scanned": 1, "summarized": 1, "folded": 15}
        assert len(store.get_history("b", 0)) == 20

    @pytest.mark.parametrize(
        "args",
        [
            ["--max-history", "0"],
            ["--session", "a", "--all"],
            ["--max-history", "x"],
            ["--session", "bad id"],
        ],
    )
    def test_bad_input(self, store, args):
        with pytest.raises(CommandError):
            run("memory_summarize", *args)

    def test_invariant_holds_while_writers_write(self, configure, db):
        store = configure(MAX_HISTORY=1000, AUTO_SUMMARIZE=False)
        ids = [f"w{i}" for i in range(4)]
        for session_id in ids:
            store.create_session(session_id)
        stop = threading.Event()
        written = dict.fromkeys(ids, 0)

        def writer(session_id: str) -> None:
            while not stop.is_set():
                store.increment(session_id, "n")
                written[session_id] += 1

        threads = [threading.Thread(target=writer, args=(sid,)) for sid in ids]
        for thread in threads:
            thread.start()
        try:
            for _ in range(15):
                run("memory_summarize", "--all", "--max-history", "6")
        finally:
            stop.set()
            for thread in threads:
                thread.join()
        for session_id in ids:
            history = store.get_history(session_id, 0)
            assert operation_count(history) == written[session_id] == store.get(session_id, "n")
            assert any(e["op"] == "summary" for e in history)


class TestSweep:
    def test_sweeps_expired_sessions_store_and_mirror(self, store):
        short = store.create_session("short", ttl_seconds=LIVE_TTL)
        store.put("short", "k", 1)
        store.create_session("kept")
        store.enrich("kept", run_id="run-kept")
        store.mirror.sync_dirty()
        wait_past(short["expires_at"])
        dry = run_json("memory_sweep", "--dry-run")
        assert dry["dry_run"] is True and dry["mirror_marked_gone"] == 1
        assert MemorySession.objects.get(session_id="short").state == "live"
        if store.backend.name == "redis":
            assert dry["expired_sessions"] == 1
        counts = run_json("memory_sweep", "--batch-size", "1")
        assert counts["mirror_marked_gone"] == 1
        assert MemorySession.objects.get(session_id="short").state == "expired"
        assert store.list_sessions() == ["kept"]
        assert store.record_answer(None, "still bound", run_id="run-kept").session_id == "kept"
        assert run_json("memory_sweep")["mirror_marked_gone"] == 0  # nothing left to do

    def test_mirror_retention(self, store):
        store.create_session("old")
        store.create_session("recent")
        store.mirror.sync_dirty()
        store.delete_session("old")
        store.delete_session("recent")
        store.mirror.sync_dirty()
        MemorySession.objects.filter(session_id="old").update(gone_at=timezone.now() - timedelta(days=31))
        assert run_json("memory_sweep", "--dry-run")["mirror_deleted"] == 1
        assert MemorySession.objects.count() == 2
        assert run_json("memory_sweep")["mirror_deleted"] == 1
        assert list(MemorySession.objects.values_list("session_id", flat=True)) == ["recent"]
        assert run_json("memory_sweep", "--mirror-retention-days", "0")["mirror_deleted"] == 1

    def test_prose_and_bad_input(self, store):
        out, _ = run("memory_sweep", "--dry-run")
        assert out.startswith("Dry run, would remove: 0 expired sessions")
        for args in (["--batch-size", "0"], ["--mirror-retention-days", "-1"]):
            with pytest.raises(CommandError):
                run("memory_sweep", *args)


class TestSweepRedis:
    def test_leftovers_bindings_and_no_keys_command(self, db, redis_store, redis_client):
        store = redis_store
        gone = store.create_session("gone", ttl_seconds=LIVE_TTL)
        store.put("gone", "a", 1)
        store.enrich("gone", run_id="run-gone")
        store.create_session("live")
        store.put("live", "b", 2)
        store.enrich("live", run_id="run-live")
        # Leftovers with no TTL, as a crash of the original node could leave them.
        redis_client.set("rr:memory:gone:orphan", "1")
        redis_client.rpush("rr:memory:crashed:__history__", "{}")
        redis_client.sadd("rr:memory:__sessions__", "crashed")
        redis_client.set("rr:memory:~run:run-dangling", "crashed")
        # A binding that outlives its session (one bound before bindings expired with it).
        redis_client.set("rr:memory:~run:run-old", "gone")
        wait_past(gone["expires_at"])
        redis_client.config_resetstat()
        dry = run_json("memory_sweep", "--dry-run", "--batch-size", "2")
        assert (dry["expired_sessions"], dry["leftover_keys"], dry["run_bindings"]) == (2, 2, 2)
        assert redis_client.exists("rr:memory:gone:orphan", "rr:memory:crashed:__history__") == 2
        counts = run_json("memory_sweep", "--batch-size", "2")
        assert (counts["expired_sessions"], counts["leftover_keys"], counts["run_bindings"]) == (2, 2, 2)
        assert {k.decode() for k in redis_client.scan_iter("rr:memory:*")} == {
            "rr:memory:__sessions__",
            "rr:memory:~sessions",
            "rr:memory:~names",
            "rr:memory:~run:run-live",
            "rr:memory:live:~runs",
            "rr:memory:live:__meta__",
            "rr:memory:live:__keys__",
            "rr:memory:live:__history__",
            "rr:memory:live:b",
        }
        assert redis_client.smembers("rr:memory:__sessions__") == {b"live"}
        assert redis_client.zrange("rr:memory:~sessions", 0, -1) == [b"live"]
        stats = redis_client.info("commandstats")
        assert "cmdstat_keys" not in stats
        assert stats["cmdstat_scan"]["calls"] >= 2 and stats["cmdstat_sscan"]["calls"] >= 2

    def test_sweep_leaves_a_deployment_with_a_longer_prefix_alone(self, db, redis_store, redis_client):
        # Another deployment whose KEY_PREFIX starts with ours: rr:memory:staging.
        other = {
            "rr:memory:staging:__sessions__": ("sadd", "s1"),
            "rr:memory:staging:s1:__meta__": ("hset", "created_at"),
            "rr:memory:staging:s1:k": ("set", "1"),
            "rr:memory:staging:~run:r1": ("set", "s1"),
        }
        for key, (kind, value) in other.items():
            if kind == "hset":
                redis_client.hset(key, value, "1")
            else:
                getattr(redis_client, kind)(key, value)
        counts = run_json("memory_sweep")
        assert (counts["expired_sessions"], counts["leftover_keys"], counts["run_bindings"]) == (0, 0, 0)
        assert redis_client.exists(*other) == len(other)


class TestMirrorCommand:
    def test_passes(self, store):
        store.create_session("s1")
        store.put("s1", "k", 1)
        assert run_json("memory_mirror") == {
            "passes": 1,
            "synced": 1,
            "gone": 0,
            "failed": 0,
            "sync_errors": [],
        }
        assert run_json("memory_mirror")["synced"] == 0
        assert run_json("memory_mirror", "--session", "s1", "--session", "nope")["synced"] == 1
        store.delete_session("s1")
        store.backend.pop_dirty(10)  # as if the write happened while nobody listened
        counts = run_json("memory_mirror", "--all")
        assert counts["gone"] == 1
        assert MemorySession.objects.get(session_id="s1").state == "deleted"
        out, _ = run("memory_mirror")
        assert out.strip() == "passes: 1, synced: 0, gone: 0, failed: 0"

    def test_off_and_bad_input(self, configure, db):
        configure(MIRROR_MODE="off")
        with pytest.raises(CommandError, match="mirror is off"):
            run("memory_mirror")
        configure(MIRROR_MODE="deferred")
        for args in (["--all", "--session", "a"], ["--watch", "0"]):
            with pytest.raises(CommandError):
                run("memory_mirror", *args)

    def test_watch_until_ctrl_c(self, tmp_path):
        env = {
            **os.environ,
            "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
            "MEMORY_BACKEND": "memory",
            "PYTHONUNBUFFERED": "1",
        }
        subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
        # One mirrored session, which the watcher restores: every --all pass then syncs it
        # and says so at -v 2, so the test sees each pass instead of guessing how many a
        # loaded machine manages in a given time.
        create = (
            "from persistent_memory.store import get_store; "
            "s = get_store(); s.create_session('a'); s.mirror.sync_dirty()"
        )
        subprocess.run([sys.executable, "manage.py", "shell", "-c", create], cwd=ROOT, env=env, check=True)
        process = subprocess.Popen(
            [sys.executable, "manage.py", "memory_mirror", "--all", "--watch", "0.1", "-v", "2"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        guard = threading.Timer(120, process.kill)  # a hung watcher ends the test, not the run
        guard.start()
        try:
            seen = []
            for line in process.stdout:
                seen.append(line)
                if line.startswith("pass 3:"):
                    break
            assert seen and seen[-1].startswith("pass 3:"), "".join(seen) + process.stderr.read()
            process.send_signal(signal.SIGINT)
            out, err = process.communicate()
        finally:
            guard.cancel()
        assert process.returncode == 0, err
        assert "memory backend" in err
        assert "Interrupted" in out and "Traceback" not in err
        passes = int(out.strip().splitlines()[-1].split(",")[0].split(":")[1])
        assert passes >= 3


class TestWatchPasses:
    """``--watch``: a signal ends the wait between passes, never a pass half-counted."""

    def command(self):
        from persistent_memory.management.base import MemoryCommand

        command = MemoryCommand(stdout=io.StringIO(), stderr=io.StringIO())
        command.as_json, command.verbosity = False, 1
        return command

    @pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
    def test_a_signal_inside_a_pass_lets_it_finish(self, signum):
        command, finished = self.command(), []
        before = signal.getsignal(signum)
        for number in command.passes(0.01):
            if number == 2:
                os.kill(os.getpid(), signum)  # arrives while the pass still has work to do
                time.sleep(0.05)
            finished.append(number)
        assert finished == [1, 2]
        assert "Interrupted" in command.stdout.getvalue()
        assert signal.getsignal(signum) is before  # the command's handlers are gone

    def test_a_second_ctrl_c_interrupts_at_once(self):
        command, before = self.command(), signal.getsignal(signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            for _ in command.passes(0.01):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
        assert signal.getsignal(signal.SIGINT) is before

    def test_without_watch_one_pass_and_no_handler(self):
        command, before = self.command(), signal.getsignal(signal.SIGINT)
        handlers = []
        for number in command.passes(None):
            handlers.append((number, signal.getsignal(signal.SIGINT)))
        assert handlers == [(1, before)]


class TestExportImport:
    def fill(self, store, count):
        for i in range(count):
            session_id = f"s{i:04d}"
            store.create_session(session_id, ttl_seconds=3600 if i % 2 else None)
            store.put(session_id, "topic", {"n": i, "tags": ["x", None], "ok": i % 3 == 0})
            store.increment(session_id, "turns", i)
            store.record_answer(session_id, f"answer {i}")
            if i % 5 == 0:
                store.clear(session_id, "topic")

    def snapshot(self, store):
        return {
            sid: (store.get_all(sid), store.get_history(sid, 0), store.session_info(sid))
            for sid in store.list_sessions()
        }

    def assert_same(self, before, after):
        assert sorted(after) == sorted(before)
        for sid, (values, history, info) in before.items():
            new_values, new_history, new_info = after[sid]
            assert new_values == values
            assert new_history == history
            assert new_info["created_at"] == pytest.approx(info["created_at"], abs=1e-6)
            assert new_info["ttl_seconds"] == info["ttl_seconds"]
            if info["expires_at"] is None:
                assert new_info["expires_at"] is None
            elif info["expires_by"] == "idle":  # an import is activity: the idle deadline moves on
                assert (
                    info["expires_at"] - 2 <= new_info["expires_at"] <= time.time() + info["idle_ttl_seconds"]
                )
            else:
                assert new_info["expires_at"] == pytest.approx(info["expires_at"], abs=10)

    def test_round_trip_1000_sessions_memory_redis_memory(
        self, db, settings, redis_client, redis_url, tmp_path
    ):
        settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "MIRROR_MODE": "off", "MAX_SESSIONS": 2000}
        from persistent_memory import get_store

        self.fill(get_store(), 1000)
        before = self.snapshot(get_store())
        first, second = tmp_path / "from-memory.jsonl", tmp_path / "from-redis.jsonl"
        assert run_json("memory_export", "--output", str(first)) == {"exported": 1000, "output": str(first)}
        assert len(first.read_text().splitlines()) == 1000

        settings.PERSISTENT_MEMORY = {"BACKEND": "redis", "REDIS_URL": redis_url, "MIRROR_MODE": "off"}
        counts = run_json("memory_import", str(first))
        assert counts == {
            "dry_run": False,
            "lines": 1000,
            "imported": 1000,
            "replaced": 0,
            "skipped_expired": 0,
        }
        self.assert_same(before, self.snapshot(get_store()))
        # Counters are still Redis integers, and the TTL left carried over.
        assert redis_client.get("rr:memory:s0007:turns") == b"7"
        assert 3500 < redis_client.pttl("rr:memory:s0001:__meta__") / 1000 <= 3600

        run("memory_export", "--output", str(second))
        settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "MIRROR_MODE": "off", "MAX_SESSIONS": 2000}
        assert run_json("memory_import", str(second))["imported"] == 1000
        self.assert_same(before, self.snapshot(get_store()))
        assert get_store().increment("s0007", "turns") == 8

    def test_export_to_stdout_and_selected(self, store):
        self.fill(store, 3)
        out, err = run("memory_export", "--session", "s0001", "--session", "nope")
        (record,) = [json.loads(line) for line in out.splitlines()]
        assert record["session_id"] == "s0001"
        assert record["values"] == {
            "answer_count": 1,
            "last_answer": "answer 1",
            "topic": {"n": 1, "tags": ["x", None], "ok": False},
            "turns": 1,
        }
        assert record["history"] == store.get_history("s0001", 0)
        info = store.session_info("s0001")
        assert {k: record[k] for k in info} == info  # what GET sessions/{id}/ answers, and more
        assert 3500 < record["ttl_remaining_seconds"] <= 3600
        assert err.strip().endswith("Exported 1 sessions.")
        assert ("memory backend lives inside each process" in err) == (store.backend.name == "memory")
        with pytest.raises(CommandError):
            run("memory_export", "--json")

    def test_import_refuses_existing_unless_replace(self, store, tmp_path):
        self.fill(store, 2)
        path = tmp_path / "export.jsonl"
        run("memory_export", "--output", str(path))
        store.put("s0000", "changed", True)
        with pytest.raises(CommandError, match="exist already"):
            run("memory_import", str(path))
        assert store.get("s0000", "changed") is True
        dry = run_json("memory_import", str(path), "--replace", "--dry-run")
        assert dry == {"dry_run": True, "lines": 2, "imported": 2, "replaced": 2, "skipped_expired": 0}
        assert store.get("s0000", "changed") is True
        assert run_json("memory_import", str(path), "--replace")["replaced"] == 2
        assert "changed" not in store.list_keys("s0000")
        run("memory_mirror")  # the import marked the sessions for the mirror
        assert (
            MemorySession.objects.get(session_id="s0000").key_count
            == store.session_info("s0000")["key_count"]
        )

    @pytest.mark.parametrize(
        ("bad", "message"),
        [
            ("not json", "line 2: not JSON"),
            (
                '{"session_id": "a b", "created_at": 1, "values": {}, "history": []}',
                "line 2: Invalid session_id",
            ),
            (
                '{"session_id": "x", "created_at": 1, "values": {"k:1": 1}, "history": []}',
                "line 2: Invalid key",
            ),
            ('{"session_id": "x", "created_at": 1, "values": [], "history": []}', "line 2: values must be"),
            ('{"session_id": "x", "created_at": -5, "values": {}, "history": []}', "line 2: created_at"),
            ('{"session_id": "x", "created_at": 1, "values": {}, "history": [{"op": 1}]}', "line 2: history"),
            (
                '{"session_id": "x", "created_at": 1, "ttl_remaining_seconds": "soon", '
                '"values": {}, "history": []}',
                "line 2: ttl_remaining_seconds",
            ),
            # What the store could not give back, or the mirror could not hold (issue 11).
            (
                '{"session_id": "x", "created_at": 1, "values": {"k": "\\ud800"}, "history": []}',
                "lone surrogate",
            ),
            (
                '{"session_id": "x", "created_at": 1, "values": {"k": NaN}, "history": []}',
                "JSON-serialisable",
            ),
            (
                '{"session_id": "x", "created_at": 1, "values": {"k": 1e400}, "history": []}',
                "JSON-serialisable",
            ),
            (
                '{"session_id": "x", "created_at": 1, "values": {"k": '
                + "[" * 101
                + "]" * 101
                + '}, "history": []}',
                "levels deep",
            ),
            (
                '{"session_id": "x", "created_at": 1, "values": {}, '
                '"history": [{"op": "put", "key": "k", "note": "a\\u0000", "timestamp": 1}]}',
                "line 2: history must not contain U.0000",
            ),
            (
                '{"session_id": "x", "created_at": 1, "values": {}, '
                '"history": [{"op": "put\\udc00", "key": "k", "timestamp": 1}]}',
                "line 2: history: .*lone surrogate",
            ),
            (
                '{"session_id": "x", "created_at": 1, "values": {}, '
                '"history": [{"op": "put", "key": "k", "n": Infinity, "timestamp": 1}]}',
                "line 2: history: .*JSON-serialisable",
            ),
        ],
    )
    def test_bad_line_writes_nothing(self, store, tmp_path, bad, message):
        good = json.dumps({"session_id": "good", "created_at": 1.5, "values": {"k": 1}, "history": []})
        path = tmp_path / "bad.jsonl"
        path.write_text(f"{good}\n{bad}\n")
        with pytest.raises(CommandError, match=message):
            run("memory_import", str(path))
        assert store.list_sessions() == []

    def test_a_failing_import_is_undone(self, db, settings, tmp_path):
        # The memory backend's cap stops this import at its sixth session.
        settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "MIRROR_MODE": "off", "MAX_SESSIONS": 5}
        from persistent_memory import get_store

        store = get_store()
        for session_id in ("s0000", "s0001"):
            store.create_session(session_id)
            store.put(session_id, "before", True)
        records = [
            {"session_id": f"s{i:04d}", "created_at": 1.0, "values": {"n": i}, "history": []}
            for i in range(8)
        ]
        path = tmp_path / "too-many.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
        before = {sid: store.get_all(sid) for sid in store.list_sessions()}
        with pytest.raises(CommandError):
            run("memory_import", str(path), "--replace")
        assert {sid: store.get_all(sid) for sid in store.list_sessions()} == before

    def test_foreign_summaries_do_not_break_later_writes(self, configure, db, tmp_path):
        store = configure(MAX_HISTORY=2)
        odd = {"op": "summary", "summarized_count": "many", "op_counts": {"put": "x"}, "timestamp": 1.0}
        record = {"session_id": "odd", "created_at": 1.0, "values": {}, "history": [odd, odd]}
        path = tmp_path / "odd.jsonl"
        path.write_text(json.dumps(record) + "\n")
        run("memory_import", str(path))
        store.put("odd", "k", 1)  # folds the odd summaries in
        (summary, last) = store.get_history("odd", 0)
        assert summary["op"] == "summary" and summary["summarized_count"] == 2
        assert last["key"] == "k"

    def test_expired_records_are_skipped(self, store, tmp_path):
        path = tmp_path / "expired.jsonl"
        record = {
            "session_id": "late",
            "created_at": 1.0,
            "ttl_remaining_seconds": 0,
            "values": {},
            "history": [],
        }
        path.write_text(json.dumps(record) + "\n")
        assert run_json("memory_import", str(path))["skipped_expired"] == 1
        assert store.list_sessions() == []

    def test_missing_file(self, store):
        with pytest.raises(CommandError, match="Cannot read"):
            run("memory_import", "/nonexistent/file.jsonl")


def test_progress_only_on_a_terminal(db, configure):
    store = configure(MAX_HISTORY=10)
    for i in range(400):
        store.create_session(f"p{i}")
    tty, piped = TTY(), io.StringIO()
    call_command("memory_summarize", "--all", stdout=io.StringIO(), stderr=tty)
    assert "  400 sessions" in tty.getvalue().splitlines()
    call_command("memory_summarize", "--all", stdout=io.StringIO(), stderr=piped)
    assert "400 sessions" not in piped.getvalue()
    tty = TTY()
    call_command("memory_summarize", "--all", "--json", stdout=io.StringIO(), stderr=tty)
    assert "400 sessions" not in tty.getvalue()


def test_manage_py_exits_non_zero_on_bad_input(tmp_path):
    result = subprocess.run(
        [sys.executable, "manage.py", "memory_summarize", "--max-history", "0"],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}"},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert "--max-history must be 1 or more" in result.stderr
