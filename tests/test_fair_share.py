"""No owner can lock the others out of the embedded default (the memory backend).

An owner alone may use every place (MAX_SESSIONS_PER_OWNER unset: no cap of its own). A
full process (MAX_SESSIONS live) still admits an owner holding fewer sessions than its
fair share, MAX_SESSIONS // owners holding sessions (the newcomer counted; without a cap
at most a tenth of MAX_SESSIONS), and refuses the others with 507, whose message names
the setting to raise; nothing acknowledged is evicted. The demo expires idle sessions.
"""

from __future__ import annotations

import time

import pytest

from persistent_memory import get_store
from persistent_memory.exceptions import CapacityExceeded, QuotaExceeded, SessionsFull
from tests.servers import demo_env, manage
from tests.test_owners_api import call, error_of, make_user, owner_of, question, scoped


@pytest.fixture
def memory(settings):
    """The memory backend with ``MAX_SESSIONS`` (no cap per owner unless ``extra`` sets one)."""

    def apply(max_sessions: int = 1000, **extra):
        settings.PERSISTENT_MEMORY = {
            "BACKEND": "memory",
            "MAX_SESSIONS": max_sessions,
            "MIRROR_MODE": "off",
            **extra,
        }
        return get_store()

    return apply


def fill(store, owner: str, count: int, prefix: str = "s") -> None:
    scoped_store = store.for_owner(owner)
    for i in range(count):
        scoped_store.create_session(f"{prefix}{i}")


def test_one_owner_alone_may_use_every_place_of_the_default(settings):
    """A newcomer's chat: one user, more than 100 threads and agent conversations (each a
    session), on the default settings; the 1,001st is refused, naming MAX_SESSIONS."""
    settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "MIRROR_MODE": "off"}
    alone = get_store().for_owner("user:1")
    for i in range(1000):
        alone.add_messages(f"thread-{i}", [{"role": "user", "content": "hi"}])
    assert len(alone.list_sessions()) == 1000
    with pytest.raises(SessionsFull) as refused:
        alone.create_session("one-more")
    assert not isinstance(refused.value, QuotaExceeded)
    assert "MAX_SESSIONS" in str(refused.value) and "MAX_SESSIONS_PER_OWNER" not in str(refused.value)
    # A second owner still gets in: a full process admits it below its share.
    get_store().for_owner("user:2").create_session("first")


def test_an_owner_cap_is_named_when_it_refuses(memory):
    alice = memory(100, MAX_SESSIONS_PER_OWNER=2).for_owner("user:1")
    alice.create_session("a")
    alice.create_session("b")
    with pytest.raises(QuotaExceeded) as refused:
        alice.create_session("c")
    assert "MAX_SESSIONS_PER_OWNER" in str(refused.value)


def test_ten_owners_at_their_share_do_not_lock_out_an_eleventh(memory):
    """The issue's case: 10 accounts x 100 sessions fill the default 1,000 places."""
    store = memory()
    for n in range(10):
        fill(store, f"user:{n}", 100)
    assert len(store.list_sessions()) == 0  # all owned: no unowned session
    assert len(store.backend._sessions) == 1000
    with pytest.raises(SessionsFull):  # the owners that filled it hold their share (1000 // 10)
        store.for_owner("user:0").create_session("one-more")
    eleventh = store.for_owner("user:10")
    eleventh.record_answer("first", "hello")  # its first write: not 507
    assert eleventh.get("first", "last_answer") == "hello"
    # Its fair share of a full process: 1000 // 11 = 90 sessions, then 507.
    fill(store, "user:10", 89, prefix="more")
    with pytest.raises(SessionsFull) as refused:
        eleventh.create_session("over")
    assert not isinstance(refused.value, QuotaExceeded)  # the process is full, not its cap
    assert "share" in str(refused.value) and "user:" not in str(refused.value)
    assert "raise MAX_SESSIONS" in str(refused.value)
    assert len(eleventh.list_sessions()) == 90
    # An unowned caller (the app's own code) is one more holder with a share of its own.
    store.create_session("node")
    assert store.list_sessions() == ["node"]


def test_an_owner_over_its_fair_share_is_refused_while_the_process_is_full(memory):
    store = memory(100, MAX_SESSIONS_PER_OWNER=50)  # an explicit cap, kept as it is
    fill(store, "user:1", 50)
    fill(store, "user:2", 50)
    alice = store.for_owner("user:1")
    with pytest.raises(QuotaExceeded):
        alice.create_session("cap")
    alice.delete_session("s0")  # 49 of her 50, but the process holds 99 of 100: not full
    alice.create_session("back")
    fill(store, "user:3", 33)  # share of 100 among 3: 33
    with pytest.raises(CapacityExceeded):
        store.for_owner("user:3").create_session("s33")
    alice.delete_session("s1")  # 49: below her cap, over her share (33) of a full process
    with pytest.raises(CapacityExceeded) as refused:
        alice.create_session("s1")
    assert not isinstance(refused.value, QuotaExceeded)
    # Nothing was evicted for anyone: every acknowledged session is still there.
    assert len(alice.list_sessions()) == 49
    assert len(store.for_owner("user:2").list_sessions()) == 50
    assert len(store.for_owner("user:3").list_sessions()) == 33
    # Once the process is under MAX_SESSIONS again, the cap is all that holds her.
    for i in range(33):
        store.for_owner("user:3").delete_session(f"s{i}")
    alice.create_session("s1")


@pytest.mark.parametrize("cap", [None, 10])
def test_the_total_stays_within_the_stated_bounds(memory, cap):
    """Owners arriving one after another, each taking all it is given (the worst order):
    every newcomer gets in until the process holds twice MAX_SESSIONS, the j-th largest
    holding stays at most MAX_SESSIONS // j, the total at most sum(min(cap, MAX_SESSIONS //
    j)) (no cap: the first owner's MAX_SESSIONS, then at most a tenth each), and never past
    twice MAX_SESSIONS, where even a newcomer is refused."""
    store = memory(100, MAX_SESSIONS_PER_OWNER=cap)
    refused_newcomers = 0
    for n in range(150):
        scoped_store = store.for_owner(f"user:{n}")
        total_before = len(store.backend._sessions)
        created = 0
        while True:
            try:
                scoped_store.create_session(f"s{created}")
            except CapacityExceeded as exc:
                assert "user:" not in str(exc)
                break
            created += 1
        if total_before < 200:
            assert created >= 1, f"owner {n} was locked out below the ceiling"
        else:
            assert created == 0
            refused_newcomers += 1
    assert refused_newcomers > 0  # the worst order reaches the ceiling (after about 12, or 30)
    held = sorted(store.backend._owned.values(), reverse=True)
    assert all(count <= 100 // rank for rank, count in enumerate(held, start=1))
    bound = sum(min(10, 100 // j) for j in range(1, len(held) + 1))
    if cap is None:
        assert held[0] == 100 and held[1:] and max(held[1:]) <= 10  # alone, then a tenth
        bound += 100 - 10
    assert len(store.backend._sessions) == sum(held) <= bound
    assert len(store.backend._sessions) == 200  # twice MAX_SESSIONS, not more
    # Deletions bring it under the ceiling: a newcomer gets in again.
    for i in range(9):
        store.for_owner("user:10").delete_session(f"s{i}")
    store.for_owner("user:149").create_session("s0")


@pytest.mark.django_db
def test_ten_users_at_their_cap_do_not_lock_out_an_eleventh_over_the_api(memory):
    memory(20)  # 20 places: ten users with 2 each fill them
    users = [make_user(f"user{n}") for n in range(11)]
    for _, client in users[:10]:
        for sid in ("s1", "s2"):
            assert call(client, "post", "sessions/", {"session_id": sid}).status_code == 201
    first_user, first = users[0]
    refused = call(first, "post", "sessions/", {"session_id": "s3"})
    assert error_of(refused) == (507, "capacity_exceeded")
    # The setting to raise, told to the caller too (nothing of the other users).
    assert "raise MAX_SESSIONS" in refused.json()["detail"] and "user" not in refused.json()["detail"]
    newcomer_user, newcomer = users[10]
    # 20 // 11 = 1: the newcomer's first write gets in, the full process refuses a second.
    assert call(newcomer, "post", "sessions/", {"session_id": "s1"}).status_code == 201
    response = call(newcomer, "post", "enrich/", {"question": question("s2")})
    assert error_of(response) == (507, "capacity_exceeded")
    assert scoped(owner_of(newcomer_user)).list_sessions() == ["s1"]
    # 21 live: one of the first ten deletes one, and the process (20) is still full, so
    # holding its share (20 // 11 = 1) it cannot take the place back.
    assert call(first, "delete", "sessions/s1/").status_code == 200
    assert error_of(call(first, "post", "sessions/", {"session_id": "s1"})) == (507, "capacity_exceeded")
    assert call(newcomer, "delete", "sessions/s1/").status_code == 200  # 19 live: room again
    assert call(first, "post", "sessions/", {"session_id": "s1"}).status_code == 201
    assert scoped(owner_of(first_user)).list_sessions() == ["s1", "s2"]


@pytest.mark.parametrize(
    ("extra", "expected"), [({}, 7 * 24 * 3600.0), ({"SESSION_IDLE_TTL_SECONDS": "3600"}, 3600.0)]
)
def test_the_demo_expires_idle_sessions_by_default(extra, expected, tmp_path):
    """The demo site's sessions expire after a week unused, or as its environment says."""
    env = {k: v for k, v in demo_env().items() if k != "SESSION_IDLE_TTL_SECONDS"}
    env.update(DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}", **extra)
    code = "from persistent_memory.conf import memory_settings as s; print(s.SESSION_IDLE_TTL_SECONDS)"
    assert manage(env, "shell", "--no-imports", "-c", code).split()[-1] == str(expected)


@pytest.mark.django_db(transaction=True)
def test_a_restart_restores_every_session_the_fair_share_admitted(settings):
    """A restore loads newest first, not in the order the sessions were admitted: the
    owner whose sessions are the oldest must not be refused for being over a fair share."""
    from persistent_memory.store import MemoryStore, reset_store

    settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "MIRROR_MODE": "immediate", "MAX_SESSIONS": 20}
    store = get_store()
    owners = [f"user:{n}" for n in range(11)]
    for owner in owners[:10]:  # user:0's are the oldest
        for sid in ("s1", "s2"):
            store.for_owner(owner).record_answer(sid, "a")
            time.sleep(0.002)
    store.for_owner(owners[10]).record_answer("s1", "a")  # the 21st: 20 // 11 = 1 share
    before = {owner: store.for_owner(owner).list_sessions() for owner in owners}
    reset_store()  # its mirror's last flush, as at a shutdown
    fresh = MemoryStore.from_settings()
    try:
        assert {owner: fresh.for_owner(owner).list_sessions() for owner in owners} == before
        # And the restored process goes on with the fair share: full, user:10 holds its 1.
        with pytest.raises(CapacityExceeded) as refused:
            fresh.for_owner(owners[10]).create_session("s2")
        assert not isinstance(refused.value, QuotaExceeded)
        fresh.for_owner("user:11").create_session("s1")  # a newcomer still gets in
    finally:
        fresh.close()


@pytest.mark.django_db(transaction=True)
def test_a_write_refused_with_507_does_not_come_back_after_a_restart(settings, tmp_path):
    """Only admitted writes are journaled: a create, an enrich, an answer or messages
    refused for the fair share stay refused when the journal is replayed (a restore once
    admitted them by a looser rule, and a restart made 12 sessions of 10)."""
    from persistent_memory.store import MemoryStore

    settings.PERSISTENT_MEMORY = {
        "BACKEND": "memory",
        "MIRROR_MODE": "immediate",
        "JOURNAL_DIR": str(tmp_path / "journal"),
        "MAX_SESSIONS": 10,
        "MAX_SESSIONS_PER_OWNER": 10,
    }
    store = MemoryStore.from_settings()
    store.mirror.stop()  # nothing mirrored: the restart gets everything from the journal
    for owner, count in (("user:a", 5), ("user:b", 3), ("user:c", 2)):
        fill(store, owner, count)
    b = store.for_owner("user:b")
    refused = [
        lambda: b.create_session("s3"),
        lambda: b.enrich("lane"),
        lambda: b.enrich_recording("asked", "a question?"),
        lambda: b.record_answer("answered", "an answer"),
        lambda: b.add_messages("chat", [{"role": "user", "content": "hi"}]),
    ]
    for write in refused:  # full, and b holds its share: 10 // 3
        with pytest.raises(CapacityExceeded):
            write()
    before = {owner: store.for_owner(owner).list_sessions() for owner in ("user:a", "user:b", "user:c")}
    store.close()  # its worker stopped: no last flush
    fresh = MemoryStore.from_settings()
    try:
        after = {owner: fresh.for_owner(owner).list_sessions() for owner in before}
        assert after == before
        assert len(fresh.backend._sessions) == 10
        with pytest.raises(CapacityExceeded):  # and the restored process refuses it alike
            fresh.for_owner("user:b").create_session("s3")
    finally:
        fresh.close()


@pytest.mark.django_db(transaction=True)
def test_a_restore_from_a_mirror_holding_a_mixed_state_loads_every_session(settings, tmp_path):
    """The mirror is written batch by batch: a crash between two batches leaves rows of
    two states, more sessions than the process ever held at once. The restore loads them
    all and the journal's replay then deletes what was deleted, so the restart holds
    what was acknowledged (it stopped loading at the cap before, losing the oldest)."""
    from persistent_memory.owners import storage_id
    from persistent_memory.store import MemoryStore

    settings.PERSISTENT_MEMORY = {
        "BACKEND": "memory",
        "MIRROR_MODE": "immediate",
        "JOURNAL_DIR": str(tmp_path / "journal"),
        "MAX_SESSIONS": 10,
        "MAX_SESSIONS_PER_OWNER": 10,
    }
    store = MemoryStore.from_settings()
    store.mirror.stop()  # the test decides what the mirror gets
    fill(store, "user:x", 5)  # the oldest sessions
    time.sleep(0.002)  # distinct activity times: the restore loads the newest first
    fill(store, "user:y", 5)
    assert store.mirror.sync_dirty().synced == 10
    for i in range(5):
        store.for_owner("user:y").delete_session(f"s{i}")
    time.sleep(0.002)
    fill(store, "user:z", 5)  # full again: x 5, z 5
    # The sync's batch with z's rows was written, the one with y's deletions never was.
    store.backend.pop_dirty(100)
    store.mirror.sync_sessions([storage_id("user:z", f"s{i}") for i in range(5)])
    owners = ("user:x", "user:y", "user:z")
    before = {owner: store.for_owner(owner).list_sessions() for owner in owners}
    assert before["user:y"] == []
    store.close()  # its worker stopped: no last flush (a crash, as far as the mirror goes)
    fresh = MemoryStore.from_settings()  # 15 live rows: x 5, y 5 (stale), z 5
    try:
        assert {owner: fresh.for_owner(owner).list_sessions() for owner in owners} == before
        assert len(fresh.backend._sessions) == 10
    finally:
        fresh.close()
