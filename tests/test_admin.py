"""The admin through Django's test client, on both backends (mirror in deferred mode,
so the page loads are what sync it)."""

from __future__ import annotations

import json

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from django.utils import timezone
from django.utils.text import capfirst

from persistent_memory.admin import MemorySessionAdmin, duration
from persistent_memory.conf import MEMORY_IDLE_TTL_SECONDS
from persistent_memory.models import HistoryEntry, MemorySession
from tests.timing import LIVE_TTL, wait_past

CHANGELIST = "/admin/persistent_memory/memorysession/"
HISTORY = "/admin/persistent_memory/historyentry/"


@pytest.fixture
def store(db, configure):
    return configure(MIRROR_MODE="deferred", MAX_HISTORY=8)


@pytest.fixture
def admin_client(db):
    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw-for-tests")
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def viewer_client(db):
    user = get_user_model().objects.create_user("viewer", password="pw-for-tests", is_staff=True)
    user.user_permissions.add(
        Permission.objects.get(codename="view_memorysession"),
        Permission.objects.get(codename="view_historyentry"),
    )
    client = Client()
    client.force_login(user)
    return client


def session_pk(session_id: str) -> int:
    return MemorySession.objects.get(session_id=session_id).pk


def fill(store):
    store.create_session("chat-1", ttl_seconds=3600)
    store.put("chat-1", "topic", {"city": "Paris"})
    store.increment("chat-1", "turns", 3)
    store.create_session("chat-2")
    store.record_answer("chat-2", "hello")
    store.create_session("other")


def test_changelist_syncs_and_lists(admin_client, store):
    fill(store)
    assert MemorySession.objects.count() == 0  # nothing mirrored before the page load
    response = admin_client.get(CHANGELIST)
    assert response.status_code == 200
    body = response.content.decode()
    for session_id in ("chat-1", "chat-2", "other"):
        assert session_id in body
    assert "never" in body and ">in 59\xa0minutes</span>" in body  # expiry: the time remaining
    assert store.backend.describe() in body
    # Written after the last load: shown on the next one.
    store.create_session("late")
    assert "late" in admin_client.get(CHANGELIST).content.decode()


def test_search_filters_and_date_hierarchy(admin_client, configure):
    # No idle expiry, so that sessions without a TTL "never expire" on both backends (the
    # memory backend's default idle expiry under these filters: test_idle_expiry_shows_and_filters).
    store = configure(MIRROR_MODE="deferred", MAX_HISTORY=8, SESSION_IDLE_TTL_SECONDS=0)
    fill(store)
    # Long enough to be mirrored live on a loaded machine, then expired.
    short = store.create_session("short", ttl_seconds=LIVE_TTL)
    admin_client.get(CHANGELIST)
    assert MemorySession.objects.filter(session_id="short", state="live").exists()
    wait_past(short["expires_at"])
    found = admin_client.get(CHANGELIST, {"q": "chat"}).context["cl"].result_list
    assert sorted(s.session_id for s in found) == ["chat-1", "chat-2"]

    def ids(**params):
        return sorted(s.session_id for s in admin_client.get(CHANGELIST, params).context["cl"].result_list)

    assert ids(ttl="yes") == ["chat-1", "short"]
    assert ids(ttl="no") == ["chat-2", "other"]
    assert ids(state="expired") == ["short"]
    assert ids(state="live") == ["chat-1", "chat-2", "other"]
    store.delete_session("other")
    assert ids(state="gone") == ["other"]
    today = MemorySession.objects.get(session_id="chat-1").last_activity
    assert "chat-1" in ids(last_activity__year=str(today.year))
    assert ids(o="1") == sorted(ids())  # sortable by id


def test_session_page_shows_values_and_history(admin_client, store):
    store.create_session("s1")
    store.put("s1", "topic", {"city": "Paris", "tags": ["a"]})
    for _ in range(12):  # MAX_HISTORY=8: summarized on the way
        store.increment("s1", "n")
    admin_client.get(CHANGELIST)
    response = admin_client.get(f"{CHANGELIST}{session_pk('s1')}/change/")
    assert response.status_code == 200
    body = response.content.decode()
    assert "&quot;city&quot;: &quot;Paris&quot;" in body  # pretty-printed JSON
    assert "summary of 9 operations: increment 8, put 1; keys: n, topic" in body
    values_inline, history_inline = response.context["inline_admin_formsets"]
    assert [f.original.key for f in values_inline] == ["n", "topic"]
    positions = [f.original.position for f in history_inline]
    assert positions == sorted(positions, reverse=True) and positions[-1] == 0  # newest first
    assert 'name="_save"' not in body  # read-only


def session_page(client, session_id: str):
    client.get(CHANGELIST)  # syncs
    return client.get(f"{CHANGELIST}{session_pk(session_id)}/change/")


def readonly_labels(response) -> list[str]:
    """The labels of the session page's fields, in order, as the page shows them."""
    return [
        capfirst(field.field["label"])
        for fieldset in response.context["adminform"]
        for line in fieldset
        for field in line
    ]


def test_session_page_reads_as_a_product(admin_client, store):
    store.create_session("s1", ttl_seconds=3600)
    store.put("s1", "topic", "Paris")
    response = session_page(admin_client, "s1")
    body = response.content.decode().replace("\xa0", " ")  # Django's durations: "59\xa0minutes"
    assert readonly_labels(response) == [
        "Session ID",
        "Owner",
        "State",
        "Created",
        "Expires",
        "Time to live",
        "Idle expiry",
        "Last activity",
        "Keys",
        "History entries",
        "Last sync",
    ]
    for internal in ("Ttl seconds", "History digest", "Journal seq", "journal_seq", "Synced at", "Gone at"):
        assert internal not in body, internal
    assert "1 hour from creation" in body
    assert "(in 59 minutes)" in body
    assert "none: the unowned namespace" in body
    assert "persistent_memory/admin.css" in body  # hides the inline rows' repeated labels
    values_inline, history_inline = response.context["inline_admin_formsets"]
    assert (values_inline.opts.verbose_name_plural, history_inline.opts.verbose_name_plural) == (
        "values",
        "session history (newest first)",
    )


def test_session_page_links_its_own_history_not_djangos_change_log(admin_client, viewer_client, store):
    store.create_session("s1")
    for i in range(3):
        store.put("s1", "k", i)
    store.create_session("s2")
    store.put("s2", "k", 0)
    pk = session_pk_after_sync(admin_client, "s1")
    body = admin_client.get(f"{CHANGELIST}{pk}/change/").content.decode()
    assert 'class="historylink"' not in body and f"{CHANGELIST}{pk}/history/" not in body
    assert 'href="#history-group"' in body and "Session history (3)" in body
    assert 'id="history-group"' in body  # where that link leads
    history_list = f"{HISTORY}?session__id__exact={pk}"
    assert f'href="{history_list}"' in body
    entries = admin_client.get(history_list).context["cl"].result_list
    assert [(e.session.session_id, e.op, e.key) for e in entries] == [("s1", "put", "k")] * 3
    # Without the permission to see the history list, no link to it.
    viewer = get_user_model().objects.create_user("values-only", password="pw-for-tests", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_memorysession"))
    client = Client()
    client.force_login(viewer)
    page = client.get(f"{CHANGELIST}{pk}/change/").content.decode()
    assert "Session history (3)" in page and history_list not in page


def session_pk_after_sync(client, session_id: str) -> int:
    client.get(CHANGELIST)
    return session_pk(session_id)


def test_session_page_says_why_a_sync_fails_and_when_a_session_went(admin_client, store):
    store.create_session("s1")
    store.create_session("s2")
    pk = session_pk_after_sync(admin_client, "s1")
    failed_at = timezone.now()
    MemorySession.objects.filter(pk=pk).update(sync_error="value too long", sync_failed_at=failed_at)
    body = admin_client.get(f"{CHANGELIST}{pk}/change/").content.decode()
    assert f"failing since {failed_at:%Y-%m-%d %H:%M} (retried at every sync): value too long" in body
    listed = admin_client.get(CHANGELIST).context["cl"].result_list
    assert {row.session_id: MemorySessionAdmin.synced(None, row) for row in listed} == {
        "s1": False,
        "s2": True,
    }
    store.delete_session("s2")
    gone = session_page(admin_client, "s2")
    row = MemorySession.objects.get(session_id="s2")
    assert f"gone (since {row.gone_at:%Y-%m-%d %H:%M})" in gone.content.decode()


def test_history_changelist(admin_client, store):
    fill(store)
    admin_client.get(CHANGELIST)
    response = admin_client.get(HISTORY, {"op__exact": "increment"})
    entries = response.context["cl"].result_list
    assert {(e.session.session_id, e.key) for e in entries} == {
        ("chat-1", "turns"),
        ("chat-2", "answer_count"),
    }
    assert f'href="{CHANGELIST}{session_pk("chat-1")}/change/"' in response.content.decode()
    by_key = admin_client.get(HISTORY, {"q": "topic"}).context["cl"].result_list
    assert [(e.op, e.key) for e in by_key] == [("put", "topic")]
    by_session = admin_client.get(HISTORY, {"q": "chat-2"}).context["cl"].result_list
    assert {e.key for e in by_session} == {"last_answer", "answer_count"}


def post_action(client, action, session_ids, **extra):
    pks = [session_pk(s) for s in session_ids]
    return client.post(CHANGELIST, {"action": action, "_selected_action": pks, **extra})


def test_delete_action_confirms_then_acts_on_the_store(admin_client, store):
    fill(store)
    admin_client.get(CHANGELIST)
    response = post_action(admin_client, "delete_from_store", ["chat-1", "chat-2"])
    assert response.status_code == 200 and b"are you sure" in response.content
    assert store.list_sessions() == ["chat-1", "chat-2", "other"]  # nothing yet
    response = post_action(admin_client, "delete_from_store", ["chat-1", "chat-2"], confirmed="yes")
    assert response.status_code == 302
    assert store.list_sessions() == ["other"]
    states = dict(MemorySession.objects.values_list("session_id", "state"))
    assert states == {"chat-1": "deleted", "chat-2": "deleted", "other": "live"}
    messages = [m.message for m in admin_client.get(CHANGELIST).context["messages"]]
    assert "Deleted 2 of 2 sessions from the store." in messages


def test_clear_action(admin_client, store):
    fill(store)
    admin_client.get(CHANGELIST)
    assert b"are you sure" in post_action(admin_client, "clear_keys", ["chat-1"]).content
    post_action(admin_client, "clear_keys", ["chat-1"], confirmed="yes")
    assert store.get_all("chat-1") == {}
    row = MemorySession.objects.get(session_id="chat-1")
    assert row.key_count == 0 and row.values.count() == 0
    assert row.history.order_by("-position").first().details == {"cleared": ["topic", "turns"]}


def test_summarize_action(admin_client, configure, db):
    store = configure(MIRROR_MODE="deferred", MAX_HISTORY=4, AUTO_SUMMARIZE=False)
    store.create_session("s1")
    for i in range(10):
        store.put("s1", "k", i)
    store.create_session("s2")
    admin_client.get(CHANGELIST)
    response = post_action(admin_client, "summarize_now", ["s1", "s2"])
    assert response.status_code == 302
    assert store.get_history("s1", 0)[0]["summarized_count"] == 9 - 1
    assert HistoryEntry.objects.filter(session__session_id="s1", op="summary").count() == 1
    messages = [m.message for m in admin_client.get(CHANGELIST).context["messages"]]
    assert "Summarized 1 of 2 sessions (8 entries folded)." in messages


def test_export_action(admin_client, store):
    fill(store)
    admin_client.get(CHANGELIST)
    response = post_action(admin_client, "export_json", ["chat-1", "chat-2"])
    assert response["Content-Type"] == "application/json"
    assert response["Content-Disposition"].startswith('attachment; filename="memory-sessions-')
    records = {r["session_id"]: r for r in json.loads(response.content)}
    assert set(records) == {"chat-1", "chat-2"}
    assert records["chat-1"]["values"] == {"topic": {"city": "Paris"}, "turns": 3}
    assert records["chat-1"]["history"] == store.get_history("chat-1", 0)
    assert 3500 < records["chat-1"]["ttl_remaining_seconds"] <= 3600
    # No TTL of its own: the backend's default idle expiry (memory: 30 days; Redis: none).
    idle = MEMORY_IDLE_TTL_SECONDS if store.backend.name == "memory" else None
    assert records["chat-2"]["idle_ttl_seconds"] == idle
    if idle is None:
        assert records["chat-2"]["ttl_remaining_seconds"] is None
    else:
        assert idle - 100 < records["chat-2"]["ttl_remaining_seconds"] <= idle


def test_permissions(viewer_client, store, db):
    fill(store)
    response = viewer_client.get(CHANGELIST)
    assert response.status_code == 200
    actions = [name for name, _ in response.context["action_form"].fields["action"].choices if name]
    assert actions == ["export_json"]  # acting on the store takes the delete permission
    post_action(viewer_client, "delete_from_store", ["chat-1"], confirmed="yes")
    assert "chat-1" in store.list_sessions()
    assert viewer_client.get(f"{CHANGELIST}add/").status_code == 403
    page = viewer_client.get(f"{CHANGELIST}{session_pk('chat-1')}/change/")
    assert page.status_code == 200 and b'name="_save"' not in page.content
    assert viewer_client.post(f"{CHANGELIST}{session_pk('chat-1')}/delete/").status_code == 403
    # Not staff, or staff without the permission: no sessions.
    plain = get_user_model().objects.create_user("plain", password="pw-for-tests")
    client = Client()
    client.force_login(plain)
    assert client.get(CHANGELIST).status_code == 302
    staff = get_user_model().objects.create_user("staff", password="pw-for-tests", is_staff=True)
    client.force_login(staff)
    assert client.get(CHANGELIST).status_code == 403


def test_changelist_queries_stay_bounded(admin_client, configure, django_assert_max_num_queries):
    # No idle expiry, so that "never expires" holds every session on both backends.
    store = configure(MIRROR_MODE="deferred", MAX_HISTORY=8, SESSION_IDLE_TTL_SECONDS=0)
    for i in range(500):
        store.create_session(f"s{i:03d}")
        store.put(f"s{i:03d}", "k", i)
    admin_client.get(CHANGELIST)  # syncs all 500 (ADMIN_SYNC_LIMIT)
    assert MemorySession.objects.count() == 500
    with django_assert_max_num_queries(12):
        response = admin_client.get(CHANGELIST, {"state": "live", "ttl": "no"})
    assert response.status_code == 200
    assert len(response.context["cl"].result_list) == 100


def test_no_redis_password_anywhere(admin_client, db, settings):
    settings.PERSISTENT_MEMORY = {"BACKEND": "redis", "REDIS_URL": "redis://:hunter2-secret@127.0.0.1:1/0"}
    response = admin_client.get(CHANGELIST)
    assert response.status_code == 200
    body = response.content.decode()
    assert "hunter2-secret" not in body
    assert "Showing the mirror as last synced" in body
    assert "redis://127.0.0.1:1/0" in body


def test_idle_expiry_shows_and_filters(store, admin_client):
    on_memory = store.backend.name == "memory"  # its default idle expiry: 30 days; Redis: none
    store.create_session("idle", ttl_seconds=3600, idle_ttl_seconds=600)
    store.put("idle", "k", 1)
    # The default idle expiry: on memory longer than this fixed TTL, so it never ends it.
    store.create_session("fixed", ttl_seconds=3600)
    store.create_session("plain")  # no TTL: only the default idle expiry ends it
    listing = admin_client.get(CHANGELIST, {"ttl": "idle"}).content.decode()  # the page load syncs
    assert ">idle<" in listing and ">fixed<" not in listing
    assert (">plain<" in listing) is on_memory
    assert listing.count(">if idle</span>") == (2 if on_memory else 1)  # idle ends "idle" before its TTL
    page = admin_client.get(f"{CHANGELIST}{session_pk('idle')}/change/").content.decode()
    assert "10\xa0minutes after the last write" in page or "10 minutes after the last write" in page
    assert "idle for" in page
    fixed = admin_client.get(f"{CHANGELIST}{session_pk('fixed')}/change/").content.decode()
    month = duration(MEMORY_IDLE_TTL_SECONDS)  # "1 month" or "4 weeks, 2 days", by the calendar
    if on_memory:
        assert f"{month} after the last write; the fixed time to live ends it first" in fixed
    else:
        assert "after the last write" not in fixed
    everything = admin_client.get(CHANGELIST).content.decode()
    assert ">in 59\xa0minutes</span></td>" in everything  # "fixed": no "if idle"
    assert (f'title="{month} after its last write">if idle</span>' in everything) is on_memory
