"""Owners across the operator's tools: the admin, the ORM mirror, export/import and the
maintenance commands, on both backends (mirror in deferred mode, so nothing syncs
behind a test's back).

The same session id lives under several owners in most tests (``chat-1`` of
``user:1``, of ``user:2`` and the unowned one), each with different values: any
place that loses the owner and falls back to the session id alone addresses the
wrong session, and these tests see it.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.core.management.base import CommandError
from django.test import Client
from django.utils import timezone

from persistent_memory.admin import OwnerFilter
from persistent_memory.backends.memory.history import operation_count
from persistent_memory.conf import MEMORY_IDLE_TTL_SECONDS
from persistent_memory.models import HistoryEntry, MemorySession, MemoryValue

from .test_commands import run, run_json

CHANGELIST = "/admin/persistent_memory/memorysession/"
OWNERS = ("user:1", "user:2", "")  # "" is the unowned namespace
SHORT_TTL = 0.2  # seconds: long enough to write a session, short enough to wait out


@pytest.fixture
def store(db, configure):
    return configure(MIRROR_MODE="deferred", MAX_HISTORY=10)


@pytest.fixture
def admin_client(db):
    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw-for-tests")
    client = Client()
    client.force_login(user)
    return client


def fill(store):
    """``chat-1`` under every owner with its own values, TTL and history length, and a
    few sessions of one owner only."""
    for turns, owner in enumerate(OWNERS, start=1):
        scoped = store.for_owner(owner)
        scoped.create_session("chat-1", ttl_seconds=3600 * turns if owner else None)
        scoped.put("chat-1", "who", owner or "nobody")
        for _ in range(turns):  # a history of a different length per owner
            scoped.increment("chat-1", "turns")
    store.for_owner("user:1").create_session("notes")
    store.for_owner("user:1").put("notes", "topic", {"city": "Paris"})
    store.for_owner("user:2").create_session("draft")
    store.for_owner("user:2").record_answer("draft", "hello")
    store.create_session("node-only")


#: What ``fill`` leaves, as (owner, session id).
FILLED = {
    ("user:1", "chat-1"),
    ("user:1", "notes"),
    ("user:2", "chat-1"),
    ("user:2", "draft"),
    ("", "chat-1"),
    ("", "node-only"),
}


def everything(store):
    """Every live session of every owner: {(owner, id): (values, history, info)}."""
    result = {}
    for info in store.list_session_infos(all_owners=True):
        scoped = store.for_owner(info["owner"])
        sid = info["session_id"]
        result[(info["owner"], sid)] = (
            scoped.get_all(sid),
            scoped.get_history(sid, 0),
            scoped.session_info(sid),
        )
    return result


def delete_everything(store):
    for info in store.list_session_infos(all_owners=True):
        store.for_owner(info["owner"]).delete_session(info["session_id"])
    assert store.list_session_infos(all_owners=True) == []


def row(owner, session_id):
    return MemorySession.objects.get(owner=owner, session_id=session_id)


def rows():
    return set(MemorySession.objects.values_list("owner", "session_id"))


# The admin ------------------------------------------------------------------------


def listed(client, **params):
    """(owner, session id) of every row of the changelist, as a list (to see duplicates)."""
    response = client.get(CHANGELIST, params)
    assert response.status_code == 200
    return sorted((s.owner, s.session_id) for s in response.context["cl"].result_list)


class TestAdmin:
    def test_each_owners_session_listed_once_with_its_owner(self, admin_client, store):
        fill(store)
        response = admin_client.get(CHANGELIST)  # the page load syncs
        assert sorted((s.owner, s.session_id) for s in response.context["cl"].result_list) == sorted(FILLED)
        body = response.content.decode()
        # The owner column: the owner, or a dash for the unowned sessions.
        assert body.count('<td class="field-owner_display">user:1</td>') == 2
        assert body.count('<td class="field-owner_display">user:2</td>') == 2
        assert body.count('<td class="field-owner_display">—</td>') == 2

    def test_owner_filter_and_search(self, admin_client, store):
        fill(store)
        assert listed(admin_client, owner="user:1") == [("user:1", "chat-1"), ("user:1", "notes")]
        assert listed(admin_client, owner="-") == [("", "chat-1"), ("", "node-only")]
        assert listed(admin_client, q="user:2") == [("user:2", "chat-1"), ("user:2", "draft")]
        # The search box matches session ids too, of every owner.
        assert listed(admin_client, q="chat") == [("", "chat-1"), ("user:1", "chat-1"), ("user:2", "chat-1")]
        # Filter and search together narrow down to one owner's chat-1.
        assert listed(admin_client, owner="user:2", q="chat") == [("user:2", "chat-1")]

    def test_sidebar_offers_the_owners_with_most_sessions(self, admin_client, store):
        fill(store)  # user:1 and user:2 hold two sessions each
        for i in range(22):
            store.for_owner(f"team:{i:02d}").create_session("only")
        response = admin_client.get(CHANGELIST)
        (owner_filter,) = [f for f in response.context["cl"].filter_specs if isinstance(f, OwnerFilter)]
        offered = [value for value, _ in owner_filter.lookup_choices]
        # Unowned first, then 20 owners: most sessions first, then by name.
        assert offered == ["-", "user:1", "user:2", *(f"team:{i:02d}" for i in range(18))]
        # An owner not offered is still reachable by its parameter.
        assert listed(admin_client, owner="team:21") == [("team:21", "only")]

    def test_session_page_shows_the_owner(self, admin_client, store):
        fill(store)
        admin_client.get(CHANGELIST)
        for owner in ("user:1", "user:2"):
            response = admin_client.get(f"{CHANGELIST}{row(owner, 'chat-1').pk}/change/")
            assert response.status_code == 200
            body = response.content.decode()
            assert f'<div class="readonly">{owner}</div>' in body
            # The values inline is that owner's session's, not another chat-1's.
            values_inline = response.context["inline_admin_formsets"][0]
            assert {f.original.key: f.original.decoded_value for f in values_inline}["who"] == owner

    def post_action(self, client, action, sessions, **extra):
        pks = [row(owner, sid).pk for owner, sid in sessions]
        return client.post(CHANGELIST, {"action": action, "_selected_action": pks, **extra})

    def test_delete_action_deletes_only_that_owners_session(self, admin_client, store):
        fill(store)
        admin_client.get(CHANGELIST)
        response = self.post_action(admin_client, "delete_from_store", [("user:1", "chat-1")])
        assert b"are you sure" in response.content
        assert "chat-1" in store.for_owner("user:1").list_sessions()  # not before confirming
        response = self.post_action(
            admin_client, "delete_from_store", [("user:1", "chat-1")], confirmed="yes"
        )
        assert response.status_code == 302
        assert store.for_owner("user:1").list_sessions() == ["notes"]
        # The other owners' chat-1 keep their values.
        assert store.for_owner("user:2").get_all("chat-1") == {"turns": 2, "who": "user:2"}
        assert store.get_all("chat-1") == {"turns": 3, "who": "nobody"}
        states = {(s.owner, s.session_id): s.state for s in MemorySession.objects.all()}
        assert states.pop(("user:1", "chat-1")) == "deleted"
        assert set(states.values()) == {"live"}
        messages = [m.message for m in admin_client.get(CHANGELIST).context["messages"]]
        assert "Deleted 1 of 1 sessions from the store." in messages

    def test_clear_and_summarize_actions_reach_the_right_owner(self, admin_client, configure, db):
        store = configure(MIRROR_MODE="deferred", MAX_HISTORY=4, AUTO_SUMMARIZE=False)
        for owner in OWNERS:
            store.for_owner(owner).create_session("chat-1")
            for n in range(10):
                store.for_owner(owner).put("chat-1", "k", n)
        admin_client.get(CHANGELIST)
        self.post_action(admin_client, "clear_keys", [("user:2", "chat-1")], confirmed="yes")
        self.post_action(admin_client, "summarize_now", [("", "chat-1")])
        assert store.for_owner("user:2").get_all("chat-1") == {}
        assert store.for_owner("user:1").get_all("chat-1") == {"k": 9}
        assert store.get_all("chat-1") == {"k": 9}
        assert [len(store.for_owner(o).get_history("chat-1", 0)) for o in OWNERS] == [10, 11, 3]
        # The mirror followed each action, on that owner's row only.
        assert row("user:2", "chat-1").key_count == 0 and row("user:1", "chat-1").key_count == 1
        assert [row(o, "chat-1").history_length for o in OWNERS] == [10, 11, 3]

    def test_export_action_carries_owners(self, admin_client, store):
        fill(store)
        admin_client.get(CHANGELIST)
        selected = [(owner, "chat-1") for owner in OWNERS]
        response = self.post_action(admin_client, "export_json", selected)
        assert response["Content-Type"] == "application/json"
        records = {(r["owner"], r["session_id"]): r for r in json.loads(response.content)}
        assert set(records) == set(selected)
        for owner in OWNERS:
            record = records[(owner, "chat-1")]
            scoped = store.for_owner(owner)
            assert record["values"] == scoped.get_all("chat-1")
            assert record["history"] == scoped.get_history("chat-1", 0)
        assert records[("user:2", "chat-1")]["ttl_seconds"] == 7200
        # No TTL of its own: the backend's default idle expiry (memory: 30 days; Redis: none).
        unowned = records[("", "chat-1")]
        if store.backend.name == "memory":
            assert unowned["idle_ttl_seconds"] == MEMORY_IDLE_TTL_SECONDS
            assert MEMORY_IDLE_TTL_SECONDS - 100 < unowned["ttl_remaining_seconds"] <= MEMORY_IDLE_TTL_SECONDS
        else:
            assert unowned["idle_ttl_seconds"] is None and unowned["ttl_remaining_seconds"] is None


# The mirror -----------------------------------------------------------------------


class TestMirror:
    def test_one_session_id_under_two_owners_is_two_rows(self, store):
        fill(store)
        store.mirror.sync_dirty()
        assert rows() == FILLED
        for owner in OWNERS:
            scoped, mirrored = store.for_owner(owner), row(owner, "chat-1")
            values = dict(MemoryValue.objects.filter(session=mirrored).values_list("key", "value"))
            assert {key: json.loads(text) for key, text in values.items()} == scoped.get_all("chat-1")
            history = list(
                HistoryEntry.objects.filter(session=mirrored).order_by("position").values_list("op", "key")
            )
            assert history == [(e["op"], e["key"]) for e in scoped.get_history("chat-1", 0)]
            assert mirrored.history_length == len(history)

    def test_deleting_one_owners_session_marks_only_that_row_gone(self, store):
        fill(store)
        store.mirror.sync_dirty()
        store.for_owner("user:2").delete_session("chat-1")
        assert store.mirror.sync_dirty().gone == 1
        states = {(s.owner, s.session_id): s.state for s in MemorySession.objects.all()}
        assert states.pop(("user:2", "chat-1")) == "deleted"
        assert set(states.values()) == {"live"}
        # The rows left keep their own values.
        assert row("user:1", "chat-1").values.get(key="who").decoded_value == "user:1"
        assert row("", "chat-1").values.get(key="who").decoded_value == "nobody"


# Export and import ----------------------------------------------------------------


def read_records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_same(before, after):
    assert sorted(after) == sorted(before)
    for name, (values, history, info) in before.items():
        new_values, new_history, new_info = after[name]
        assert new_values == values, name
        assert new_history == history, name
        assert new_info["owner"] == info["owner"] == name[0]
        assert new_info["created_at"] == pytest.approx(info["created_at"], abs=1e-6)
        assert new_info["ttl_seconds"] == info["ttl_seconds"], name
        if info["expires_at"] is None:
            assert new_info["expires_at"] is None, name
        else:
            assert new_info["expires_at"] == pytest.approx(info["expires_at"], abs=2), name


class TestExportImport:
    def test_round_trip_restores_every_owners_sessions(self, store, tmp_path):
        fill(store)
        before = everything(store)
        path = tmp_path / "all.jsonl"
        assert run_json("memory_export", "--output", str(path)) == {"exported": 6, "output": str(path)}
        assert {(r["owner"], r["session_id"]) for r in read_records(path)} == FILLED
        delete_everything(store)
        # Three chat-1 in one file: one per owner, not a clash.
        counts = run_json("memory_import", str(path))
        assert counts == {"dry_run": False, "lines": 6, "imported": 6, "replaced": 0, "skipped_expired": 0}
        assert_same(before, everything(store))
        # Counters are still counters, in their own owner's session.
        assert store.for_owner("user:2").increment("chat-1", "turns") == 3

    def test_import_again_is_refused_without_replace(self, store, tmp_path):
        fill(store)
        path = tmp_path / "all.jsonl"
        run("memory_export", "--output", str(path))
        store.for_owner("user:1").put("chat-1", "changed", True)
        store.for_owner("user:2").delete_session("draft")  # one absent: still refused as a whole
        with pytest.raises(CommandError, match="exist already"):
            run("memory_import", str(path))
        assert store.for_owner("user:1").get("chat-1", "changed") is True
        assert "draft" not in store.for_owner("user:2").list_sessions()  # nothing written
        counts = run_json("memory_import", str(path), "--replace")
        assert (counts["imported"], counts["replaced"]) == (6, 5)
        assert "changed" not in store.for_owner("user:1").list_keys("chat-1")
        assert store.for_owner("user:2").get("draft", "last_answer") == "hello"

    def test_export_one_owner(self, store, tmp_path):
        fill(store)
        path = tmp_path / "user1.jsonl"
        assert run_json("memory_export", "--owner", "user:1", "--output", str(path))["exported"] == 2
        records = read_records(path)
        assert {(r["owner"], r["session_id"]) for r in records} == {("user:1", "chat-1"), ("user:1", "notes")}
        # --session with --owner names that owner's session, not another chat-1.
        out, _ = run("memory_export", "--owner", "user:2", "--session", "chat-1")
        (record,) = [json.loads(line) for line in out.splitlines()]
        assert (record["owner"], record["values"]) == ("user:2", {"turns": 2, "who": "user:2"})
        out, _ = run("memory_export", "--session", "chat-1")
        (record,) = [json.loads(line) for line in out.splitlines()]
        assert (record["owner"], record["values"]["who"]) == ("", "nobody")

    def test_import_under_another_owner(self, store, tmp_path):
        fill(store)
        path = tmp_path / "user1.jsonl"
        run("memory_export", "--owner", "user:1", "--output", str(path))
        before = everything(store)
        for sid in ("chat-1", "notes"):
            store.for_owner("user:1").delete_session(sid)
        counts = run_json("memory_import", str(path), "--owner", "user:9")
        assert counts["imported"] == 2
        assert store.for_owner("user:9").list_sessions() == ["chat-1", "notes"]
        assert store.for_owner("user:1").list_sessions() == []  # not back under the original owner
        for sid in ("chat-1", "notes"):
            values, history, info = before[("user:1", sid)]
            assert store.for_owner("user:9").get_all(sid) == values
            assert store.for_owner("user:9").get_history(sid, 0) == history
            assert store.for_owner("user:9").session_info(sid)["ttl_seconds"] == info["ttl_seconds"]
        # user:2's and the unowned chat-1 were no clash, and are untouched.
        assert store.for_owner("user:2").get("chat-1", "who") == "user:2"
        assert store.get("chat-1", "who") == "nobody"
        # The same file again under its own owner: user:9's chat-1 is no clash either.
        assert run_json("memory_import", str(path))["imported"] == 2
        assert store.for_owner("user:1").get("chat-1", "who") == "user:1"

    def test_one_owner_for_a_file_with_a_session_id_twice_is_refused(self, store, tmp_path):
        fill(store)
        path = tmp_path / "all.jsonl"
        run("memory_export", "--output", str(path))
        # Three chat-1 would all be user:8's: refused, and nothing written.
        with pytest.raises(CommandError):
            run("memory_import", str(path), "--owner", "user:8")
        assert store.for_owner("user:8").list_sessions() == []


# Commands with --owner --------------------------------------------------------------


class TestSummarizeOwner:
    def test_folds_only_that_owners_histories(self, configure, db):
        store = configure(MIRROR_MODE="deferred", MAX_HISTORY=10, AUTO_SUMMARIZE=False)
        for owner in OWNERS:
            store.for_owner(owner).create_session("chat-1")
            for n in range(25):
                store.for_owner(owner).put("chat-1", "k", n)
        store.for_owner("user:1").create_session("short")
        store.for_owner("user:1").put("short", "k", 1)

        def lengths():
            return [len(store.for_owner(o).get_history("chat-1", 0)) for o in OWNERS]

        dry = run_json("memory_summarize", "--owner", "user:1", "--all", "--max-history", "6", "--dry-run")
        assert dry == {"dry_run": True, "scanned": 2, "summarized": 1, "folded": 22}
        assert lengths() == [25, 25, 25]
        done = run_json("memory_summarize", "--owner", "user:1", "--all", "--max-history", "6")
        assert done == {"dry_run": False, "scanned": 2, "summarized": 1, "folded": 22}
        assert lengths() == [4, 25, 25]
        assert operation_count(store.for_owner("user:1").get_history("chat-1", 0)) == 25
        # --session with --owner: that owner's chat-1; without: the unowned one.
        run("memory_summarize", "--owner", "user:2", "--session", "chat-1", "--max-history", "6")
        assert lengths() == [4, 4, 25]
        run("memory_summarize", "--session", "chat-1", "--max-history", "6")
        assert lengths() == [4, 4, 4]


class TestSweepOwner:
    def test_removes_only_that_owners_expired_sessions(self, store):
        for owner in OWNERS:
            store.for_owner(owner).create_session("old", ttl_seconds=SHORT_TTL)
            store.for_owner(owner).put("old", "k", owner)
        store.for_owner("user:1").create_session("kept")
        store.mirror.sync_dirty()
        time.sleep(SHORT_TTL + 0.1)
        dry = run_json("memory_sweep", "--owner", "user:1", "--dry-run")
        assert (dry["expired_sessions"], dry["mirror_marked_gone"]) == (1, 1)
        assert row("user:1", "old").state == "live"
        counts = run_json("memory_sweep", "--owner", "user:1")
        assert (counts["expired_sessions"], counts["mirror_marked_gone"]) == (1, 1)
        assert row("user:1", "old").state == "expired"
        assert row("user:2", "old").state == row("", "old").state == "live"
        # (No listing here: the memory backend drops every expired session when it lists.)
        again = run_json("memory_sweep", "--owner", "user:1")
        assert (again["expired_sessions"], again["mirror_marked_gone"]) == (0, 0)
        # The other owners' expired sessions were left for a sweep of theirs.
        full = run_json("memory_sweep")
        assert (full["expired_sessions"], full["mirror_marked_gone"]) == (2, 2)
        assert {s.state for s in MemorySession.objects.filter(session_id="old")} == {"expired"}
        assert row("user:1", "kept").state == "live"
        assert store.for_owner("user:1").list_sessions() == ["kept"]

    def test_mirror_retention_of_one_owner(self, store):
        for owner in OWNERS:
            store.for_owner(owner).create_session("gone")
        store.mirror.sync_dirty()
        for owner in OWNERS:
            store.for_owner(owner).delete_session("gone")
        store.mirror.sync_dirty()
        MemorySession.objects.update(gone_at=timezone.now() - timedelta(days=31))
        assert run_json("memory_sweep", "--owner", "user:1")["mirror_deleted"] == 1
        assert rows() == {("user:2", "gone"), ("", "gone")}


class TestMirrorOwner:
    def test_all_of_one_owner(self, store):
        for owner in OWNERS:
            store.for_owner(owner).create_session("a")
        store.for_owner("user:1").create_session("b")
        counts = run_json("memory_mirror", "--owner", "user:1", "--all")
        assert counts == {"passes": 1, "synced": 2, "gone": 0, "failed": 0, "sync_errors": []}
        assert rows() == {("user:1", "a"), ("user:1", "b")}
        assert run_json("memory_mirror", "--owner", "user:2", "--session", "a")["synced"] == 1
        assert rows() == {("user:1", "a"), ("user:1", "b"), ("user:2", "a")}
        with pytest.raises(CommandError):
            run("memory_mirror", "--owner", "user:1")  # needs --all or --session

    def test_all_of_one_owner_marks_only_its_gone_sessions(self, store):
        for owner in OWNERS:
            store.for_owner(owner).create_session("a")
        store.mirror.sync_dirty()
        for owner in OWNERS:
            store.for_owner(owner).delete_session("a")
        store.backend.pop_dirty(100)  # as if the deletes happened while nobody listened
        assert run_json("memory_mirror", "--owner", "user:1", "--all")["gone"] == 1
        assert row("user:1", "a").state == "deleted"
        assert row("user:2", "a").state == row("", "a").state == "live"
        assert run_json("memory_mirror", "--all")["gone"] == 2
        assert {s.state for s in MemorySession.objects.all()} == {"deleted"}


@pytest.mark.parametrize("owner", ["bad owner", "user~1", "user:*", "x" * 201])
@pytest.mark.parametrize(
    "command",
    [
        ["memory_sweep"],
        ["memory_sweep", "--dry-run"],
        ["memory_summarize", "--all"],
        ["memory_summarize"],
        ["memory_mirror", "--all"],
        ["memory_mirror", "--session", "chat-1"],
        ["memory_export"],
        ["memory_import", "FILE"],
    ],
)
def test_invalid_owner_is_refused(store, tmp_path, command, owner):
    # '~' delimits owners in storage ids and '*' is SCAN syntax: either could reach
    # another owner's sessions, were it let through.
    fill(store)
    path = tmp_path / "one.jsonl"
    run("memory_export", "--session", "chat-1", "--output", str(path))
    before = everything(store)
    args = [str(path) if arg == "FILE" else arg for arg in command]
    with pytest.raises(CommandError, match="[Ii]nvalid owner"):
        run(*args, "--owner", owner)
    assert everything(store).keys() == before.keys()


@pytest.mark.parametrize(
    "command",
    [["memory_sweep"], ["memory_summarize", "--all"], ["memory_mirror", "--all"], ["memory_export"]],
)
def test_empty_owner_is_refused(store, command):
    # The unowned sessions are not an owner: --owner "" must not widen to every owner's.
    with pytest.raises(CommandError, match="Name an owner"):
        run(*command, "--owner", "")


# Checking the owner only once there is work to do lets a typo in a cron line pass
# silently, or clobber what was there: each of these checks it first.


def test_export_with_an_invalid_owner_leaves_the_output_file_alone(store, tmp_path):
    backup = tmp_path / "backup.jsonl"
    backup.write_text('{"an": "earlier export"}\n')
    with pytest.raises(CommandError, match="Invalid owner"):
        run("memory_export", "--owner", "bad owner", "--output", str(backup))
    assert backup.read_text() == '{"an": "earlier export"}\n'  # not truncated


def test_import_of_an_empty_file_with_an_invalid_owner_is_refused(store, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(CommandError, match="Invalid owner"):
        run("memory_import", str(empty), "--owner", "bad owner")


def test_summarize_with_an_invalid_owner_is_refused_with_auto_summarize_off(configure, db):
    configure(MIRROR_MODE="deferred", AUTO_SUMMARIZE=False)
    with pytest.raises(CommandError, match="Invalid owner"):
        run("memory_summarize", "--owner", "bad owner")  # no --all: nothing to do, but a bad option


def test_deleting_sessions_leaves_no_run_binding_for_the_sweep(store):
    u1, u2 = store.for_owner("user:1"), store.for_owner("user:2")
    for scoped in (u1, u2, store):
        scoped.enrich("s1", run_id="r1")  # one run id, three owners' bindings
        scoped.delete_session("s1")
    u1.enrich("s2", run_id="r2")
    assert run_json("memory_sweep", "--dry-run")["run_bindings"] == 0  # deleting dropped them
    for scoped in (u1, u2, store):
        scoped.create_session("s1")  # the same id again: no run of the one before reaches it
        assert scoped.record_answer(None, "stale", run_id="r1") is None
        assert scoped.get_all("s1") == {}
    assert u1.record_answer(None, "kept", run_id="r2").session_id == "s2"


def test_sweep_of_one_owner_drops_only_its_expired_run_bindings(configure, backend_name, db):
    # db: memory_sweep deletes expired long-term memories too.
    store = configure(RUN_BINDING_TTL_SECONDS=SHORT_TTL)
    u1, u2 = store.for_owner("user:1"), store.for_owner("user:2")
    for scoped in (u1, u2, store):
        scoped.enrich("s1", run_id="r1")
    time.sleep(SHORT_TTL + 0.05)
    # The memory backend holds expired bindings until a sweep; Redis expires them itself.
    held = backend_name == "memory"
    assert run_json("memory_sweep", "--owner", "user:1")["run_bindings"] == (1 if held else 0)
    assert run_json("memory_sweep", "--owner", "user:1")["run_bindings"] == 0
    assert run_json("memory_sweep")["run_bindings"] == (2 if held else 0)
    for scoped in (u1, u2, store):
        assert scoped.record_answer(None, "late", run_id="r1") is None


# Redis: the keys themselves ---------------------------------------------------------


def keys(client, pattern):
    return {key.decode() for key in client.scan_iter(pattern)}


class TestSweepOwnerRedis:
    def test_no_key_of_an_expired_owned_session_is_left(self, db, redis_store, redis_client):
        store = redis_store
        u1, u2 = store.for_owner("user:1"), store.for_owner("user:2")
        for scoped in (u1, u2):
            scoped.create_session("gone", ttl_seconds=SHORT_TTL)
            scoped.put("gone", "a", 1)
        u1.create_session("live")
        u1.put("live", "b", 2)
        # Leftovers with no TTL, as a crash could leave them: they outlive the session's keys.
        redis_client.set("rr:memory:~o:user:1~gone:orphan", "1")
        redis_client.set("rr:memory:~o:user:2~gone:orphan", "1")
        redis_client.rpush("rr:memory:~o:user:1~crashed:__history__", "{}")
        redis_client.zadd("rr:memory:~o:user:1~:sessions", {"~o:user:1~crashed": 1.0})
        redis_client.sadd("rr:memory:~owned", "~o:user:1~crashed")
        time.sleep(SHORT_TTL + 0.1)
        counts = run_json("memory_sweep", "--owner", "user:1", "--batch-size", "2")
        assert (counts["expired_sessions"], counts["leftover_keys"]) == (2, 2)
        assert keys(redis_client, "rr:memory:~o:user:1~*") == {
            "rr:memory:~o:user:1~:sessions",
            "rr:memory:~o:user:1~:names",
            "rr:memory:~o:user:1~live:__meta__",
            "rr:memory:~o:user:1~live:__keys__",
            "rr:memory:~o:user:1~live:__history__",
            "rr:memory:~o:user:1~live:b",
        }
        assert redis_client.zrange("rr:memory:~o:user:1~:sessions", 0, -1) == [b"~o:user:1~live"]
        assert redis_client.zrange("rr:memory:~o:user:1~:names", 0, -1) == [b"~o:user:1~live"]
        owned = redis_client.smembers("rr:memory:~owned")
        assert b"~o:user:1~gone" not in owned and b"~o:user:1~crashed" not in owned
        # user:2's are left for a sweep of theirs (or a full one).
        assert redis_client.exists("rr:memory:~o:user:2~gone:orphan") == 1
        assert b"~o:user:2~gone" in owned
        full = run_json("memory_sweep")
        assert (full["expired_sessions"], full["leftover_keys"]) == (1, 1)
        assert keys(redis_client, "rr:memory:~o:user:2~*") == set()
        assert redis_client.smembers("rr:memory:~owned") == {b"~o:user:1~live"}

    def test_run_bindings_of_deleted_sessions(self, db, redis_store, redis_client):
        store = redis_store
        u1, u2 = store.for_owner("user:1"), store.for_owner("user:2")
        u1.enrich("s1", run_id="r1")
        u1.enrich("s2", run_id="r2")
        u2.enrich("s1", run_id="r1")  # the same run id under another owner: its own binding
        store.enrich("s1", run_id="r1")  # and an unowned one
        assert redis_client.get("rr:memory:~o:user:1~:run:r1") == b"~o:user:1~s1"
        assert redis_client.zrange("rr:memory:~o:user:1~s1:~runs", 0, -1) == [b"~o:user:1~:run:r1"]
        for scoped in (u1, u2, store):
            scoped.delete_session("s1")
        # Deleting a session drops its bindings and its run index: no key of run r1 is left.
        assert keys(redis_client, "*r1*") == set()
        assert keys(redis_client, "*s1*") == set()
        # Bindings that outlived their session (written before deleting dropped them, or
        # left by a crash): a sweep of one owner removes that owner's only.
        redis_client.set("rr:memory:~o:user:1~:run:r9", "~o:user:1~s1")
        redis_client.set("rr:memory:~o:user:2~:run:r9", "~o:user:2~s1")
        redis_client.set("rr:memory:~run:r9", "s1")
        counts = run_json("memory_sweep", "--owner", "user:1")
        assert counts["run_bindings"] == 1
        assert redis_client.exists("rr:memory:~o:user:1~:run:r9") == 0
        assert redis_client.exists("rr:memory:~o:user:2~:run:r9", "rr:memory:~run:r9") == 2
        # The binding of a live session stays and still works.
        assert u1.record_answer(None, "still bound", run_id="r2").session_id == "s2"
        assert run_json("memory_sweep")["run_bindings"] == 2
        assert keys(redis_client, "rr:memory:*run*") == {
            "rr:memory:~o:user:1~:run:r2",
            "rr:memory:~o:user:1~s2:~runs",
        }
