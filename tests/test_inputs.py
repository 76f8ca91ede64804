"""Inputs the store could not hold exactly are refused before anything is written, and
what it accepts is mirrored exactly (issue 11, "nothing poisoned").

Lone surrogates, non-finite numbers (``NaN``, ``Infinity``, ``1e400``, which Python
parses to inf) and nesting deeper than ``MAX_JSON_DEPTH`` are 400s at the API's parser
on every endpoint, and ``InvalidValue`` in the Python API; U+0000 is valid and kept.
The mirror holds each value's JSON text as the store does (PostgreSQL's ``jsonb``
cannot hold ``\\u0000``), and one session it cannot write does not stop the others.
Run on both backends, and on SQLite or PostgreSQL as ``DATABASE_URL`` says.
"""

from __future__ import annotations

import io
import json
import time

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test import Client
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from persistent_memory import get_store, reset_store
from persistent_memory.exceptions import InvalidValue, KeyNotFound
from persistent_memory.models import MemorySession, MemoryValue
from persistent_memory.pipeline import MemoryFilter
from persistent_memory.store import MemoryStore
from tests.test_mirror import assert_mirrored

API = "/api/memory/"
DEPTH = 100  # MAX_JSON_DEPTH's default


def nested(depth: int, leaf: str = "1") -> str:
    """JSON text of lists nested ``depth`` deep (0: the leaf itself)."""
    return "[" * depth + leaf + "]" * depth


def nested_list(depth: int) -> list | int:
    """The value of :func:`nested` (built without recursion)."""
    value: list | int = 1
    for _ in range(depth):
        value = [value]
    return value


#: JSON text the store cannot hold exactly -> the API's code.
POISONS = {
    "lone high surrogate": ('"\\ud800"', "invalid_unicode"),
    "lone low surrogate": ('"a\\uDFFFb"', "invalid_unicode"),
    "swapped pair": ('"\\ude00\\ud83d"', "invalid_unicode"),
    "surrogate in a key": ('{"\\ud800": 1}', "invalid_unicode"),
    "1e400": ("1e400", "invalid_json"),
    "-1e400": ('{"x": -1e400}', "invalid_json"),
    "long mantissa": ("1" + "0" * 400 + ".0", "invalid_json"),
    "NaN": ("NaN", "invalid_json"),
    "Infinity": ("[Infinity]", "invalid_json"),
    "-Infinity": ("-Infinity", "invalid_json"),
    "990 deep": (nested(990), "json_too_deep"),
    "deeper than the limit": (nested(DEPTH + 1), "json_too_deep"),
}

#: Every endpoint family with a body, ``POISON`` where the bad JSON goes (in a value,
#: or in a field the lanes echo back, or in one nobody reads).
ENDPOINTS = {
    "put": ("put", "sessions/s0/memory/k/", '{"value": POISON}'),
    "put nested": ("put", "sessions/s0/memory/k/", '{"value": {"a": [1, POISON]}}'),
    "enrich": (
        "post",
        "enrich/",
        '{"question": {"text": "q", "metadata": {"session_id": "s1"}, "x": POISON}}',
    ),
    "enrich metadata": (
        "post",
        "enrich/",
        '{"question": {"text": "q", "metadata": {"session_id": "s1", "x": POISON}}}',
    ),
    "store": ("post", "store/", '{"answer": {"text": "a", "metadata": {"session_id": "s1"}, "x": POISON}}'),
    "store with run_id": ("post", "store/", '{"answer": {"text": "a", "x": POISON}, "run_id": "r1"}'),
    "process": (
        "post",
        "process/",
        '{"entries": [{"lane": "questions", "entry": {"text": "q", "metadata": {"session_id": "s1"}}},'
        ' {"lane": "answers", "entry": {"text": "a", "x": POISON}}]}',
    ),
    "sessions create": ("post", "sessions/", '{"session_id": "s1", "ttl_hours": 1, "x": POISON}'),
    "increment": ("post", "sessions/s0/memory/n/increment/", '{"amount": 1, "x": POISON}'),
    "summarize": ("post", "sessions/s0/summarize/", '{"max_history": 1, "x": POISON}'),
}


@pytest.fixture
def owned(db, configure):
    """(API client, the store scoped to its user's owner) with session s0 seeded."""
    user = get_user_model().objects.create_user("pipeline", password="pw-for-tests")
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    store = configure().for_owner(f"user:{user.pk}")
    store.create_session("s0")
    store.put("s0", "k", "before")
    store.record_answer("s0", "first")
    # A run bound to s0, so that store/ with run_id "r1" would write there.
    MemoryFilter(store).enrich({"metadata": {"session_id": "s0"}}, run_id="r1")
    return client, store


def state(store: MemoryStore) -> tuple:
    """Everything a write could change."""
    return store.list_sessions(), store.get_all("s0"), store.get_history("s0", 0)


def send(client: APIClient, method: str, path: str, body: str):
    return client.generic(method.upper(), API + path, body.encode(), content_type="application/json")


class TestTheAPIRefusesBeforeWriting:
    @pytest.mark.parametrize("endpoint", ENDPOINTS)
    def test_every_endpoint_refuses_every_poison(self, owned, endpoint):
        client, store = owned
        method, path, template = ENDPOINTS[endpoint]
        before = state(store)
        for name, (poison, code) in POISONS.items():
            response = send(client, method, path, template.replace("POISON", poison))
            assert response["Content-Type"] == "application/json", name
            assert (response.status_code, response.json()["code"]) == (400, code), name
            assert state(store) == before, name

    def test_the_same_bodies_without_the_poison_are_accepted(self, owned):
        client, store = owned
        for endpoint, (method, path, template) in ENDPOINTS.items():
            if "s1" in store.list_sessions():
                store.delete_session("s1")  # made by the lane before: sessions/ would answer 409
            response = send(client, method, path, template.replace("POISON", '"fine"'))
            assert response.status_code in (200, 201), (endpoint, response.content)

    def test_an_answer_text_with_a_lone_surrogate(self, owned):
        client, store = owned
        before = state(store)
        for body in [
            '{"answer": {"text": "\\udbff", "metadata": {"session_id": "s0"}}}',
            '{"answer": {"text": "ok \\ud800", "metadata": {"session_id": "s1"}}}',
        ]:
            response = send(client, "post", "store/", body)
            assert (response.status_code, response.json()["code"]) == (400, "invalid_unicode")
        assert state(store) == before
        assert store.get("s0", "answer_count") == 1

    def test_not_utf8_is_invalid_unicode(self, owned):
        client, store = owned
        response = client.generic(
            "PUT",
            API + "sessions/s0/memory/k/",
            b'{"value": "\xed\xa0\x80"}',
            content_type="application/json",
        )
        assert (response.status_code, response.json()["code"]) == (400, "invalid_unicode")
        assert store.get("s0", "k") == "before"

    def test_other_charsets(self, owned):
        client, store = owned
        path = API + "sessions/s0/memory/k/"
        # UTF-7 decodes "+2AA-" to a lone surrogate itself, with no escape in the JSON.
        utf7 = client.generic(
            "PUT", path, b'{"value": "+2AA-"}', content_type="application/json; charset=utf-7"
        )
        assert (utf7.status_code, utf7.json()["code"]) == (400, "invalid_unicode")
        bz2 = client.generic("PUT", path, b'{"value": 1}', content_type="application/json; charset=bz2_codec")
        assert (bz2.status_code, bz2.json()["code"]) == (400, "parse_error")
        latin = client.generic(
            "PUT", path, '{"value": "é"}'.encode("latin-1"), content_type="application/json; charset=latin-1"
        )
        assert latin.status_code == 200
        assert store.get("s0", "k") == "é"

    def test_malformed_json_is_still_a_parse_error(self, owned):
        client, _ = owned
        response = send(client, "put", "sessions/s0/memory/k/", '{"value": ')
        assert (response.status_code, response.json()["code"]) == (400, "parse_error")

    def test_the_depth_limit_is_max_json_depth(self, owned, configure):
        client, store = owned
        store = configure(MAX_JSON_DEPTH=10).for_owner(store.owner)
        store.create_session("deep")
        path = "sessions/deep/memory/k/"
        # The body is one level: a value 9 deep is the deepest a put can carry.
        ok = send(client, "put", path, '{"value": ' + nested(9) + "}")
        assert ok.status_code == 200, ok.content
        assert store.get("deep", "k") == nested_list(9)
        too_deep = send(client, "put", path, '{"value": ' + nested(10) + "}")
        assert (too_deep.status_code, too_deep.json()["code"]) == (400, "json_too_deep")
        assert store.get("deep", "k") == nested_list(9)
        with pytest.raises(InvalidValue, match="more than 10 levels"):
            store.put("deep", "k", nested_list(11))
        store.put("deep", "k", nested_list(10))  # the Python API takes a value 10 deep

    def test_nul_and_surrogate_pairs_are_valid(self, owned):
        client, store = owned
        body = '{"value": {"a\\u0000b": "\\u0000", "emoji": "\\ud83d\\ude00", "raw": "\u00e9\U0001f600"}}'
        response = send(client, "put", "sessions/s0/memory/k/", body)
        assert response.status_code == 200, response.content
        expected = {"a\x00b": "\x00", "emoji": "\U0001f600", "raw": "\u00e9\U0001f600"}
        assert response.json()["value"] == expected
        assert store.get("s0", "k") == expected
        assert client.get(API + "sessions/s0/memory/k/").json()["value"] == expected
        enriched = send(
            client, "post", "enrich/", '{"question": {"text": "\\u0000", "metadata": {"session_id": "s0"}}}'
        )
        assert enriched.status_code == 200
        assert enriched.json()["question"]["metadata"]["memory_context"]["k"] == expected


class TestThePythonAPIRefusesBeforeWriting:
    BAD_VALUES = {
        "lone surrogate": ("\ud800", "invalid_unicode"),
        "surrogate in a key": ({"\udc00": 1}, "invalid_unicode"),
        "a pair as two code points": ("\ud83d\ude00", "invalid_unicode"),
        "inf": (float("inf"), "invalid_value"),
        "nan in a list": ([1, float("nan")], "invalid_value"),
        "deeper than the limit": (nested_list(DEPTH + 1), "json_too_deep"),
        "990 deep": (nested_list(990), "json_too_deep"),
    }

    @pytest.mark.parametrize("name", BAD_VALUES)
    def test_put_refuses(self, store, name):
        value, code = self.BAD_VALUES[name]
        store.create_session("s0")
        with pytest.raises(InvalidValue) as caught:
            store.put("s0", "k", value)
        assert caught.value.code == code
        with pytest.raises(KeyNotFound):
            store.get("s0", "k")
        assert store.get_history("s0", 0) == []

    def test_the_deepest_value_allowed(self, store):
        store.create_session("s0")
        store.put("s0", "k", nested_list(DEPTH))
        assert store.get("s0", "k") == nested_list(DEPTH)

    def test_record_answer_and_the_answers_lane_refuse(self, store):
        for text in ["\ud800", "ok \udfff"]:
            with pytest.raises(InvalidValue) as caught:
                store.record_answer("s1", text)
            assert caught.value.code == "invalid_unicode"
            with pytest.raises(InvalidValue):
                MemoryFilter(store).store({"text": text, "metadata": {"session_id": "s1"}})
        assert store.list_sessions() == []

    def test_nul_is_kept(self, store):
        value = {"\x00": ["a\x00b", "\x00"], "k": "\x00\x00"}
        store.create_session("s0")
        store.put("s0", "k", value)
        assert store.get("s0", "k") == value
        assert store.record_answer("s0", "\x00").answer_count == 1
        assert store.get("s0", "last_answer") == "\x00"
        assert store.enrich("s0")["k"] == value


# The mirror ---------------------------------------------------------------------


@pytest.fixture
def mirrored(db, configure):
    return configure(MIRROR_MODE="deferred")


NUL_VALUES = {
    "text": "a\x00b",
    "nested": {"\x00key": ["\x00", {"b": 1, "a": 2}], "f": 1.0, "big": 2**70},
    "answer": "ok",
}


def test_a_value_with_nul_is_mirrored_exactly(mirrored):
    store = mirrored
    store.create_session("s1")
    store.create_session("s2")
    for key, value in NUL_VALUES.items():
        store.put("s1", key, value)
    store.record_answer("s1", "last\x00")
    store.put("s2", "k", 1)
    result = store.mirror.sync_dirty()
    assert (result.synced, result.failed) == (2, 0)
    stored = store.backend.snapshots(["s1"])["s1"]["values"]
    rows = {v.key: v for v in MemorySession.objects.get(session_id="s1").values.all()}
    assert {key: row.value for key, row in rows.items()} == stored  # the same JSON text
    assert {key: row.decoded_value for key, row in rows.items()} == store.get_all("s1")
    assert_mirrored(store, "s1")
    assert_mirrored(store, "s2")
    # A later write to the other session still reaches the mirror.
    store.put("s2", "k", 2)
    assert store.mirror.sync_dirty().synced == 1
    assert MemoryValue.objects.get(session__session_id="s2", key="k").decoded_value == 2


@pytest.mark.django_db(transaction=True)
def test_restore_gives_back_exactly_the_text_the_store_held(settings):
    settings.PERSISTENT_MEMORY = {"BACKEND": "memory", "MIRROR_MODE": "immediate"}
    store = get_store()
    store.create_session("s1")
    for key, value in NUL_VALUES.items():
        store.put("s1", key, value)
    store.put("s1", "null", None)
    store.increment("s1", "n", 7)
    store.record_answer("s2", "\x00")
    before = store.backend.snapshots(["s1", "s2"])
    reset_store()  # the process ends: the worker flushes
    assert not MemorySession.objects.exclude(sync_error="").exists()

    fresh = MemoryStore.from_settings()  # a new process over the same database
    try:
        after = fresh.backend.snapshots(["s1", "s2"])
        for sid in ("s1", "s2"):
            assert after[sid]["values"] == before[sid]["values"]
        assert fresh.get("s1", "nested") == NUL_VALUES["nested"]
        assert fresh.increment("s1", "n") == 8
    finally:
        fresh.close()


# One session the database refuses ---------------------------------------------------


def refuse_key(name: str) -> None:
    """Make the database itself refuse any value row under key ``name``."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # The test's transaction may have foreign key checks pending on the table.
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            cursor.execute(
                "ALTER TABLE persistent_memory_memoryvalue "
                f"ADD CONSTRAINT pm_test_refused CHECK (key <> '{name}')"  # noqa: S608 (a test's constant)
            )
        else:
            cursor.execute(
                "CREATE TRIGGER pm_test_refused BEFORE INSERT ON persistent_memory_memoryvalue "
                f"WHEN NEW.key = '{name}' BEGIN SELECT RAISE(ABORT, 'pm_test_refused'); END"
            )


def accept_again() -> None:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
            cursor.execute("ALTER TABLE persistent_memory_memoryvalue DROP CONSTRAINT pm_test_refused")
        else:
            cursor.execute("DROP TRIGGER pm_test_refused")


def mirror_command(*args: str) -> tuple[str, str | None]:
    out = io.StringIO()
    try:
        call_command("memory_mirror", *args, stdout=out, stderr=io.StringIO())
    except CommandError as exc:
        return out.getvalue(), str(exc)
    return out.getvalue(), None


def test_a_session_the_database_refuses_does_not_block_the_others(mirrored, caplog):
    store = mirrored
    for sid in ("s1", "s2", "s3"):
        store.create_session(sid)
        store.put(sid, "k", sid)
    store.put("s2", "refused", 1)
    refuse_key("refused")
    started = time.time()

    result = store.mirror.sync_dirty()
    assert (result.synced, result.failed) == (2, 1)
    assert_mirrored(store, "s1")
    assert_mirrored(store, "s3")
    row = MemorySession.objects.get(session_id="s2")  # created with what could be written
    assert "pm_test_refused" in row.sync_error
    assert row.sync_failed_at is not None and row.sync_failed_at.timestamp() >= started - 1
    assert "pm_test_refused" in store.mirror.last_error
    assert store.mirror.last_error_at >= row.sync_failed_at
    assert "s2" in caplog.text

    # It is retried at every sync, and the others keep syncing meanwhile.
    store.put("s1", "k", "changed")
    store.put("s2", "k", "changed")
    result = store.mirror.sync_dirty()
    assert (result.synced, result.failed) == (1, 1)
    assert_mirrored(store, "s1")
    assert MemoryValue.objects.get(session__session_id="s1", key="k").decoded_value == "changed"

    # memory_mirror names it, with the error, and exits non-zero.
    out, error = mirror_command()
    assert error is not None and "1 sessions failed" in error
    assert "s2" in out and "pm_test_refused" in out
    counts = json.loads(mirror_command("--json")[0])
    assert counts["failed"] == 1
    assert [(e["session_id"], e["owner"]) for e in counts["sync_errors"]] == [("s2", "")]
    assert "pm_test_refused" in counts["sync_errors"][0]["error"]

    # The admin shows it and filters on it.
    admin = Client()
    admin.force_login(get_user_model().objects.create_superuser("root", "root@example.com", "pw"))
    page = admin.get("/admin/persistent_memory/memorysession/?sync=failing").content.decode()
    assert ">s2<" in page and ">s1<" not in page
    page = admin.get(f"/admin/persistent_memory/memorysession/{row.pk}/change/").content.decode()
    assert "pm_test_refused" in page

    # Once the database takes it, the next sync mirrors it and clears the error.
    accept_again()
    assert store.mirror.sync_dirty().synced == 1
    row = assert_mirrored(store, "s2")
    assert (row.sync_error, row.sync_failed_at) == ("", None)
    assert mirror_command()[1] is None


def test_a_session_that_was_mirrored_keeps_its_rows_when_a_later_sync_fails(mirrored):
    store = mirrored
    store.create_session("s1")
    store.put("s1", "k", 1)
    store.mirror.sync_dirty()
    refuse_key("refused")
    store.put("s1", "refused", 2)
    assert store.mirror.sync_dirty().failed == 1
    row = MemorySession.objects.get(session_id="s1")
    assert "pm_test_refused" in row.sync_error
    assert {v.key: v.decoded_value for v in row.values.all()} == {"k": 1}  # as last synced
    assert store.mirror.sync_dirty().failed == 1  # still dirty: tried again


def test_admin_shows_a_value_with_nul_readably(mirrored):
    store = mirrored
    store.create_session("s1")
    store.put("s1", "k", {"a": "x\x00y"})
    store.mirror.sync_dirty()
    admin = Client()
    admin.force_login(get_user_model().objects.create_superuser("root", "root@example.com", "pw"))
    pk = MemorySession.objects.get(session_id="s1").pk
    page = admin.get(f"/admin/persistent_memory/memorysession/{pk}/change/").content.decode()
    assert "&quot;a&quot;: &quot;x\\u0000y&quot;" in page  # pretty-printed, the NUL visible


def test_a_database_that_refuses_every_session_is_retried_whole(mirrored, caplog):
    """When not even the failure can be recorded, the database is failing, not a session."""
    store = mirrored
    store.create_session("s1")
    store.record_answer("s2", "a")
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE persistent_memory_memorysession RENAME TO pm_broken")
    try:
        result = store.mirror.sync_dirty()
        assert (result.synced, result.failed) == (0, 2)
        assert "mirror sync of 2 sessions failed; will retry" in caplog.text
        assert "pm_broken" not in store.mirror.last_error  # it names the table it missed
        assert "persistent_memory_memorysession" in store.mirror.last_error
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE pm_broken RENAME TO persistent_memory_memorysession")
    assert store.mirror.sync_dirty().synced == 2
    assert not MemorySession.objects.exclude(sync_error="").exists()
    assert_mirrored(store, "s1")
    assert_mirrored(store, "s2")


@pytest.mark.django_db(transaction=True)
def test_migration_0004_keeps_mirrored_values_as_json_text():
    """Rows mirrored as JSON before 0004 become JSON text; JSON null (SQL NULL then) 'null'."""
    from django.db.migrations.executor import MigrationExecutor

    before, after = (
        [("persistent_memory", "0003_owners")],
        [("persistent_memory", "0004_mirror_value_text_and_sync_errors")],
    )
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    try:
        old = executor.loader.project_state(before).apps
        session = old.get_model("persistent_memory", "MemorySession").objects.create(
            session_id="s1", created_at="2026-01-01T00:00:00Z", last_activity="2026-01-01T00:00:00Z"
        )
        values = {"obj": {"b": [1, 2.5, None], "a": "é"}, "n": 7, "text": "x", "none": None}
        Value = old.get_model("persistent_memory", "MemoryValue")
        for key, value in values.items():
            Value.objects.create(session=session, key=key, value=value)
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(after)
    # Back to the latest migration before the ORM reads the table (and for the tests after).
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes("persistent_memory"))
    rows = {v.key: v for v in MemoryValue.objects.filter(session__session_id="s1")}
    assert rows["none"].value == "null"
    assert {key: row.decoded_value for key, row in rows.items()} == values
