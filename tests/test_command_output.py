"""What the ``memory_*`` commands say and ask: ``memory_forget`` asks only a terminal,
results go to stdout in the success style, notes and progress to stderr in no error
style, long lists end with "and N more", and ``memory_mirror --all`` is not redone by
the next sync."""

from __future__ import annotations

import io
import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.core.management.color import color_style
from django.utils import timezone

from persistent_memory.models import MemorySession
from tests.servers import demo_env

ROOT = Path(__file__).resolve().parent.parent
STYLE = color_style(force_color=True)
#: The escape sequence that opens Django's error style, and the success style's.
ERROR_CODES = STYLE.ERROR("x").split("x")[0]
SUCCESS_CODES = STYLE.SUCCESS("x").split("x")[0]
OWNER = "user:1004"


def run(*args: str, **options) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command(*args, stdout=out, stderr=err, **options)
    return out.getvalue(), err.getvalue()


def manage_py(env: dict[str, str], *args: str, **popen) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "manage.py", *args], cwd=ROOT, env=env, **popen)


def read_until(fd: int, marker: bytes, seconds: float = 60.0) -> bytes:
    """What ``fd`` gives until ``marker`` shows (or it ends, or a generous deadline)."""
    data = b""
    deadline = time.monotonic() + seconds
    while marker not in data and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # a pseudo-terminal whose other side closed
                break
            if not chunk:
                break
            data += chunk
    return data


@pytest.fixture
def demo(tmp_path, redis_url, redis_store, redis_client):
    """The demo's environment on this test's Redis and a migrated SQLite file, and the
    store of this process on the same Redis (with 3 sessions of OWNER)."""
    env = demo_env(
        DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}",
        MEMORY_BACKEND="redis",
        REDIS_URL=redis_url,
        PYTHONUNBUFFERED="1",
    )
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    owned = redis_store.for_owner(OWNER)
    for i in range(3):
        owned.record_answer(f"s{i}", "an answer")
    return env, owned


class TestForgetAsksOnlyATerminal:
    @pytest.mark.parametrize("stdin", ["no\n", "yes\n", ""])
    def test_piped_input_is_no_consent(self, demo, stdin):
        env, owned = demo
        process = manage_py(
            env,
            "memory_forget",
            "--owner",
            OWNER,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        out, err = process.communicate(stdin.encode(), timeout=120)
        assert process.returncode == 1, (out, err)
        assert b"--yes" in err and b"Traceback" not in err
        assert owned.list_sessions() == ["s0", "s1", "s2"]

    def test_no_input_at_all(self, demo):
        env, owned = demo
        with open(os.devnull, "rb") as devnull:
            result = subprocess.run(
                [sys.executable, "manage.py", "memory_forget", "--owner", OWNER],
                cwd=ROOT,
                env=env,
                stdin=devnull,
                capture_output=True,
                timeout=120,
            )
        assert result.returncode == 1
        assert b"--yes" in result.stderr and b"Traceback" not in result.stderr
        assert owned.list_sessions() == ["s0", "s1", "s2"]

    def test_yes_deletes_without_a_terminal(self, demo):
        env, owned = demo
        result = subprocess.run(
            [sys.executable, "manage.py", "memory_forget", "--owner", OWNER, "--yes"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=120,
        )
        assert result.returncode == 0, result.stderr
        assert f"Forgot {OWNER}: 3 sessions".encode() in result.stdout
        assert owned.list_sessions() == []

    @pytest.mark.parametrize(("typed", "code", "left"), [(b"\x04", 1, 3), (b"no\n", 1, 3), (b"yes\n", 0, 0)])
    def test_on_a_terminal(self, demo, typed, code, left):
        """A real pseudo-terminal: end of input (Ctrl-D), "no" and "yes"."""
        env, owned = demo
        controller, terminal = pty.openpty()
        try:
            process = manage_py(
                env,
                "memory_forget",
                "--owner",
                OWNER,
                stdin=terminal,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            os.close(terminal)
            terminal = -1
            prompt = read_until(process.stdout.fileno(), b"Type 'yes': ")
            assert b"Type 'yes': " in prompt, (prompt, process.stderr.read() if process.poll() else "")
            os.write(controller, typed)
            out, err = process.communicate(timeout=120)
        finally:
            os.close(controller)
            if terminal != -1:
                os.close(terminal)
        assert process.returncode == code, err
        assert b"Traceback" not in err
        if code:
            assert b"Nothing deleted" in err
        else:
            assert f"Forgot {OWNER}: 3 sessions".encode() in out
        assert len(owned.list_sessions()) == left


def test_progress_and_notes_are_not_errors_on_a_terminal(tmp_path):
    """stdout and stderr each a real pseudo-terminal (colours on, as at a shell): the
    note and the progress on stderr carry no error style; the result is on stdout, in
    the success style."""
    env = demo_env(DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}", MEMORY_BACKEND="memory")
    env.pop("NO_COLOR", None)
    env["TERM"] = "xterm-256color"
    subprocess.run([sys.executable, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    export = tmp_path / "export.jsonl"
    now = time.time()
    export.write_text(
        "".join(
            json.dumps({"session_id": f"p{i}", "created_at": now, "values": {"k": i}, "history": []}) + "\n"
            for i in range(400)
        )
    )
    out_controller, out_terminal = pty.openpty()
    err_controller, err_terminal = pty.openpty()
    try:
        process = manage_py(
            env,
            "memory_import",
            str(export),
            stdin=subprocess.DEVNULL,
            stdout=out_terminal,
            stderr=err_terminal,
        )
        os.close(out_terminal)
        os.close(err_terminal)
        out = read_until(out_controller, b"sessions (")
        err = read_until(err_controller, b" sessions\r\n")
        assert process.wait(timeout=120) == 0, (out, err)
        # The rest, to the end (the command has exited): no deadline a loaded machine could
        # hit with the result's line still unread.
        out += read_until(out_controller, b"\x00")
    finally:
        os.close(out_controller)
        os.close(err_controller)
    out_text, err_text = out.decode(), err.decode()
    assert "Note: the memory backend" in err_text and "400 sessions" in err_text  # the progress
    assert ERROR_CODES not in err_text
    assert "Imported 400 of 400 sessions" in out_text
    assert SUCCESS_CODES in out_text and ERROR_CODES not in out_text


@pytest.fixture
def store(db, configure):
    return configure(MIRROR_MODE="deferred")


def test_force_color_success_on_stdout_notes_plain(store, tmp_path):
    store.create_session("s1")
    out, err = run("memory_mirror", force_color=True)
    assert out.startswith(SUCCESS_CODES) and "synced: 1" in out and ERROR_CODES not in out
    assert ERROR_CODES not in err
    out, _ = run("memory_export", "--output", str(tmp_path / "x.jsonl"), force_color=True)
    assert SUCCESS_CODES in out and "Exported 1 sessions" in out
    out, _ = run("memory_mirror", "--no-color")
    assert "\x1b[" not in out


def test_import_lists_ten_existing_ids_and_how_many_more(configure, db, tmp_path):
    store = configure(MIRROR_MODE="deferred", MAX_SESSIONS=2000)
    for i in range(1012):
        store.create_session(f"s{i:04d}")
    path = tmp_path / "export.jsonl"
    run("memory_export", "--output", str(path))
    with pytest.raises(CommandError) as refused:
        run("memory_import", str(path))
    message = str(refused.value)
    assert message.startswith("1,012 sessions exist already (pass --replace): s0000, s0001,")
    assert message.endswith("s0009 and 1,002 more")
    store.delete_session("s0000")  # fewer than ten: all listed, no "more"
    for i in range(1, 1004):
        store.delete_session(f"s{i:04d}")
    with pytest.raises(CommandError) as refused:
        run("memory_import", str(path))
    assert str(refused.value).endswith(": " + ", ".join(f"s{i:04d}" for i in range(1004, 1012)))


class TestMirrorAllIsNotRedone:
    def test_a_sync_after_all_has_nothing_to_do(self, store):
        for i in range(30):
            store.record_answer(f"s{i}", "a")
        counts = json.loads(run("memory_mirror", "--all", "--json")[0])
        assert counts["synced"] == 30
        assert store.backend.dirty_count() == 0
        assert json.loads(run("memory_mirror", "--json")[0])["synced"] == 0
        store.put("s3", "k", 1)  # written after: the next sync has it
        assert json.loads(run("memory_mirror", "--json")[0])["synced"] == 1
        assert MemorySession.objects.get(session_id="s3").key_count == 3

    def test_one_owner_all_leaves_the_others_marked(self, store):
        alice, bob = store.for_owner("user:1"), store.for_owner("user:2")
        for i in range(3):
            alice.record_answer(f"a{i}", "a")
            bob.record_answer(f"b{i}", "b")
        store.record_answer("gone", "x")
        run("memory_mirror")
        for i in range(3):
            alice.put(f"a{i}", "k", 1)
            bob.put(f"b{i}", "k", 1)
        store.delete_session("gone")  # not the owner's: its mark stays for the next sync
        assert json.loads(run("memory_mirror", "--all", "--owner", "user:1", "--json")[0])["synced"] == 3
        counts = json.loads(run("memory_mirror", "--json")[0])
        assert (counts["synced"], counts["gone"]) == (3, 1)
        assert set(MemorySession.objects.filter(owner="user:2").values_list("key_count", flat=True)) == {3}
        assert MemorySession.objects.get(session_id="gone").state == "deleted"
        assert json.loads(run("memory_mirror", "--json")[0])["synced"] == 0


def test_mirror_lists_twenty_failing_sessions_and_how_many_more(store):
    now = timezone.now()
    MemorySession.objects.bulk_create(
        MemorySession(
            session_id=f"f{i:02d}",
            created_at=now,
            last_activity=now,
            sync_failed_at=now,
            sync_error="refused",
        )
        for i in range(23)
    )
    out, _ = run("memory_mirror")
    assert out.count(": refused") == 20
    assert out.rstrip().splitlines()[-1].startswith("  and 3 more")
