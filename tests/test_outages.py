"""Faults the API must answer as JSON with the right status, never a 500 page: the
database down (a real demo server whose database goes away, on SQLite and PostgreSQL),
an exception nothing handles, and the Redis password kept out of Django's debug pages."""

from __future__ import annotations

import logging
import sys
import time
import traceback

import pytest
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, connections
from django.test import RequestFactory, override_settings
from django.views import debug as django_debug
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from persistent_memory import get_store
from persistent_memory.checks import check_debug_reports
from persistent_memory.errors.debug import SafeExceptionReporterFilter, redis_passwords
from tests.conftest import _free_port
from tests.servers import TcpProxy, demo_env, manage, prepare_database, serve

API = "/api/memory/"
ENRICH = {"question": {"text": "q", "metadata": {"session_id": "s1"}}}


def broken_resolver(request):
    """An owner resolver with a bug: the exception nothing in the API handles."""
    raise RuntimeError("bug in the owner resolver")


# The database down, on a real server ------------------------------------------


class Outage:
    """Takes the demo server's database away and brings it back."""

    def __init__(self, down, up) -> None:
        self.down, self.up = down, up


@pytest.fixture
def outage_env(backend_name, request, tmp_path):
    """(environment of a demo server, staff token, Outage) on this run's database vendor."""
    extra = {"MEMORY_BACKEND": backend_name}
    if backend_name == "redis":
        request.getfixturevalue("redis_client")  # a clean keyspace
        extra["REDIS_URL"] = request.getfixturevalue("redis_url")
    if connection.vendor == "sqlite":
        # The server opens a connection per request thread: with its folder renamed the
        # database file cannot be opened.
        folder = tmp_path / "data"
        folder.mkdir()
        env = demo_env(DATABASE_URL=f"sqlite:///{folder / 'db.sqlite3'}", **extra)
        token = prepare_database(env)
        away = tmp_path / "away"
        yield env, token, Outage(lambda: folder.rename(away), lambda: away.rename(folder))
        return
    if connection.vendor != "postgresql":
        pytest.skip(f"no outage recipe for {connection.vendor}")
    # PostgreSQL: the server reaches the test database (committed rows: the test is
    # transactional) through a proxy that can be cut.
    user = get_user_model().objects.create_user("ops", password="pw-for-tests", is_staff=True)
    token = Token.objects.create(user=user).key
    db = connection.settings_dict
    proxy = TcpProxy(db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432))
    proxy.start()
    credentials = db["USER"] + (f":{db['PASSWORD']}" if db["PASSWORD"] else "")
    env = demo_env(DATABASE_URL=f"postgres://{credentials}@127.0.0.1:{proxy.port}/{db['NAME']}", **extra)
    try:
        yield env, token, Outage(proxy.stop, proxy.start)
    finally:
        proxy.stop()


@pytest.mark.django_db(transaction=True)
def test_database_down_answers_503_then_recovers(outage_env, tmp_path):
    env, token, outage = outage_env
    with serve("runserver", env, tmp_path / "server.log") as server:
        assert server.request("GET", API + "health/").json() == {"status": "ok"}
        assert server.request("POST", API + "enrich/", ENRICH, token=token).status == 200
        outage.down()
        try:
            for method, path, body in [
                ("POST", "enrich/", ENRICH),
                ("GET", "sessions/", None),
                ("PUT", "sessions/s1/memory/k/", {"value": 1}),
            ]:
                response = server.request(method, API + path, body, token=token)
                assert response.status == 503, (path, response.body[:500])
                assert response.headers["Content-Type"] == "application/json"
                assert response.headers["Retry-After"] == "5"
                body = response.json()
                assert body == {
                    "detail": "The database is unavailable; try again later.",
                    "code": "database_unavailable",
                    "request_id": response.headers["X-Request-ID"],
                }
            for caller in (None, token):  # a staff token cannot be checked either
                response = server.request("GET", API + "health/", token=caller)
                assert response.status == 503 and response.headers["Retry-After"] == "5"
                assert response.json() == {"status": "unavailable"}
        finally:
            outage.up()
        # The same process, no restart.
        health = server.request("GET", API + "health/", token=token)
        assert health.status == 200, health.body
        assert health.json()["database"]["status"] == "ok"
        response = server.request("POST", API + "enrich/", ENRICH, token=token)
        assert response.status == 200 and response.json()["memory"]["session_id"] == "s1"
    log = server.log
    assert "persistent_memory: the database is unavailable" in log
    assert "Internal Server Error" not in log, log[-3000:]


@pytest.mark.django_db(transaction=True)
def test_the_first_request_after_the_database_returns_succeeds(outage_env, backend_name, tmp_path):
    """PostgreSQL only: an SQLite connection never goes stale (a file, no server to lose).
    Gunicorn's one sync worker keeps its connection between requests (CONN_MAX_AGE); the
    database goes away and comes back with no request in between, so the connection it
    kept is dead: the demo's health checks, or else one more read, replace it."""
    if connection.vendor != "postgresql":
        pytest.skip("a connection to SQLite does not go stale")
    env, token, outage = outage_env
    with serve("gunicorn", env, tmp_path / "server.log") as server:
        assert server.request("POST", API + "enrich/", ENRICH, token=token).status == 200
        assert server.request("GET", API + "sessions/", token=token).status == 200
        if backend_name == "memory":
            wait_for_mirror(server, token)  # the mirror's thread holds a connection too
        outage.down()
        deadline = time.monotonic() + 30
        while True:  # back on the same port once the old listener has let it go
            try:
                outage.up()
                break
            except OSError:
                assert time.monotonic() < deadline, "the proxy's port stayed taken"
                time.sleep(0.1)
        response = server.request("GET", API + "sessions/", token=token)
        assert response.status == 200, response.body[:500]
        response = server.request("PUT", API + "sessions/s1/memory/k/", {"value": 1}, token=token)
        assert response.status == 200, response.body[:500]
        if backend_name == "memory":
            wait_for_mirror(server, token)  # its flush failed once at most, then reconnected
    assert "Internal Server Error" not in server.log, server.log[-3000:]


def wait_for_mirror(server, token) -> None:
    """Poll until the memory backend's mirror holds every write."""
    deadline = time.monotonic() + 120
    while True:
        mirror = server.request("GET", API + "health/", token=token).json()["mirror"]
        if mirror["pending_sessions"] == 0:
            return
        assert time.monotonic() < deadline, mirror
        time.sleep(0.2)


@pytest.mark.django_db(transaction=True)
def test_a_read_on_a_dropped_connection_is_made_once_more(db, store):
    """Without health checks (the test client sends no request signals): the connection
    this thread keeps is ended by the server, and token authentication's read meets it."""
    if connection.vendor != "postgresql":
        pytest.skip("an SQLite connection cannot be ended from outside")
    user = get_user_model().objects.create_user("pipeline", password="pw-for-tests")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
    assert api.get(API + "sessions/").status_code == 200
    other = connection.get_new_connection(connection.get_connection_params())  # as an admin would
    try:
        other.autocommit = True
        other.execute("SELECT pg_terminate_backend(%s)", [connection.connection.info.backend_pid])
    finally:
        other.close()
    response = api.get(API + "sessions/")
    assert response.status_code == 200, response.content
    assert api.get(API + "sessions/").status_code == 200


# The database down, in this process: what staff see --------------------------


@pytest.fixture
def database_down(tmp_path):
    """This thread's default connection points at a database that is not there."""
    original = connections["default"]
    target = {**original.settings_dict}
    if original.vendor == "sqlite":
        target["NAME"] = str(tmp_path / "gone" / "db.sqlite3")
    else:
        target.update(HOST="127.0.0.1", PORT=str(_free_port()))  # nothing listens there
    broken = original.__class__(target, alias="default")
    connections["default"] = broken
    try:
        yield
    finally:
        broken.close()
        connections["default"] = original


def test_health_shows_staff_which_part_is_down(db, store, backend_name, database_down):
    staff = APIClient()
    staff.force_authenticate(get_user_model()(username="ops", is_staff=True))  # no database needed
    response = staff.get(API + "health/")
    assert response.status_code == 503 and response["Retry-After"] == "5"
    body = response.json()
    assert body["status"] == "unavailable"
    assert body["backend"]["status"] == "ok" and body["backend"]["name"] == backend_name
    database = body["database"]
    assert database["status"] == "unavailable" and database["code"] == "database_unavailable"
    assert database["alias"] == "default" and database["vendor"] == connection.vendor
    assert database["detail"]
    assert APIClient().get(API + "health/").json() == {"status": "unavailable"}


def test_token_authentication_without_database_is_503(db, store, database_down):
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION="Token 0123456789abcdef0123456789abcdef01234567")
    response = api.post(API + "enrich/", ENRICH, format="json")
    assert response.status_code == 503 and response["Retry-After"] == "5"
    assert response.json()["code"] == "database_unavailable"


# Exceptions nothing handles --------------------------------------------------


@pytest.mark.parametrize("debug", [False, True])
def test_unhandled_exception_is_logged_and_answered_json_500(db, configure, settings, caplog, debug):
    configure(OWNER_RESOLVER="tests.test_outages.broken_resolver")
    settings.DEBUG = debug
    user = get_user_model().objects.create_user("pipeline", password="pw-for-tests")
    api = APIClient(raise_request_exception=False)
    api.force_authenticate(user)
    with caplog.at_level(logging.ERROR, logger="persistent_memory"):
        response = api.post(API + "enrich/", ENRICH, format="json")
    assert response.status_code == 500
    assert response["Content-Type"] == "application/json"
    request_id = response["X-Request-ID"]
    body = {"detail": "A server error occurred.", "code": "server_error", "request_id": request_id}
    assert response.json() == body
    [record] = [r for r in caplog.records if r.name.startswith("persistent_memory")]
    assert record.name == "persistent_memory.api" and record.levelno == logging.ERROR
    assert "POST /api/memory/enrich/" in record.getMessage() and request_id in record.getMessage()
    assert record.exc_info[0] is RuntimeError
    assert "in broken_resolver" in "".join(traceback.format_exception(*record.exc_info))
    # Error trackers (and the test client) still hear of it through got_request_exception.
    strict = APIClient()
    strict.force_authenticate(user)
    with pytest.raises(RuntimeError, match="bug in the owner resolver"):
        strict.post(API + "enrich/", ENRICH, format="json")


# The Redis password and Django's debug pages ---------------------------------

PASSWORD = "s3cret-Redis-pw"
URL = f"redis://:{PASSWORD}@127.0.0.1:not-a-port/0"


def _report(reporter_filter: django_debug.SafeExceptionReporterFilter) -> tuple[dict, str]:
    """Django's technical 500 data and page for a store built from a URL that does not parse."""
    request = RequestFactory().get("/", REDIS_URL=URL)  # runserver copies os.environ into META
    request.exception_reporter_filter = reporter_filter
    try:
        get_store()
    except ImproperlyConfigured:  # raised from redis-py's ValueError: both tracebacks show
        exc_info = sys.exc_info()
    data = django_debug.ExceptionReporter(request, *exc_info).get_traceback_data()
    html = django_debug.technical_500_response(request, *exc_info).content.decode()
    return data, html


def test_debug_page_never_shows_the_redis_password(settings):
    settings.DEBUG = True
    settings.PERSISTENT_MEMORY = {"BACKEND": "redis", "REDIS_URL": URL}
    # Django's own filter shows it in the settings, META and the frames' local variables.
    data, html = _report(django_debug.SafeExceptionReporterFilter())
    assert PASSWORD in str(data["settings"]["PERSISTENT_MEMORY"]) and PASSWORD in str(data["request_meta"])
    assert any(PASSWORD in str(frame["vars"]) for frame in data["frames"])
    assert PASSWORD in html
    data, html = _report(SafeExceptionReporterFilter())
    assert PASSWORD not in html
    assert (
        data["settings"]["PERSISTENT_MEMORY"]["REDIS_URL"]
        == "redis://:********************@127.0.0.1:not-a-port/0"
    )
    assert data["request_meta"]["REDIS_URL"] == data["settings"]["PERSISTENT_MEMORY"]["REDIS_URL"]
    assert "********************@127.0.0.1" in "".join(str(frame["vars"]) for frame in data["frames"])


def test_error_reports_hide_the_locals_below_building_the_redis_client(settings):
    """DEBUG off (error mails): Django's own filter hides every local variable of
    ``build_client``'s topology function and the redis-py calls under it (``sensitive_variables``)."""
    settings.DEBUG = False
    settings.PERSISTENT_MEMORY = {"BACKEND": "redis", "REDIS_URL": URL}
    data, _ = _report(django_debug.SafeExceptionReporterFilter())
    frames = {frame["function"]: str(frame["vars"]) for frame in data["frames"]}
    assert "from_url" in frames and "_single" in frames
    assert not any(PASSWORD in variables for variables in frames.values())


def test_the_demo_site_uses_the_filter():
    assert (
        django_settings.DEFAULT_EXCEPTION_REPORTER_FILTER
        == "persistent_memory.errors.debug.SafeExceptionReporterFilter"
    )


def test_redis_passwords_in_every_place_and_form(settings):
    settings.PERSISTENT_MEMORY = {"BACKEND": "redis", "REDIS_URL": "redis://u:p%40ss@h:6379/0?password=q%2Bq"}
    assert redis_passwords() == {"p%40ss", "p@ss", "q%2Bq", "q+q"}
    settings.PERSISTENT_MEMORY = {"BACKEND": "redis", "REDIS_HOST": "h", "REDIS_PASSWORD": "hostpw"}
    assert redis_passwords() == {"hostpw"}
    sentinel = {"REDIS_TOPOLOGY": "sentinel", "REDIS_SENTINEL_PASSWORD": "sp"}
    settings.PERSISTENT_MEMORY = {"BACKEND": "redis", **sentinel}
    assert redis_passwords() == {"sp"}
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "redis": {
            "BACKEND": "django_redis.cache.RedisCache",
            "LOCATION": ["redis://:cachepw@h:6379/1", "redis://:replicapw@h2:6379/1"],
            "OPTIONS": {"PASSWORD": "optionpw"},
        },
    }
    settings.PERSISTENT_MEMORY = {"BACKEND": "redis", "REDIS_CACHE_ALIAS": "redis"}
    assert redis_passwords() == {"cachepw", "replicapw", "optionpw"}
    settings.PERSISTENT_MEMORY = {"BACKEND": "memory"}
    assert redis_passwords() == set()


def _w005() -> list:
    return [m.id for m in check_debug_reports()]


def test_check_warns_when_debug_pages_could_show_the_password(settings):
    settings.PERSISTENT_MEMORY = {"BACKEND": "redis", "REDIS_URL": "redis://:pw@127.0.0.1:6399/0"}
    django_filter = "django.views.debug.SafeExceptionReporterFilter"
    with override_settings(DEBUG=True, DEFAULT_EXCEPTION_REPORTER_FILTER=django_filter):
        assert _w005() == ["persistent_memory.W005"]
    with override_settings(DEBUG=False, DEFAULT_EXCEPTION_REPORTER_FILTER=django_filter):
        assert _w005() == []
    with override_settings(DEBUG=True):  # the demo's: the project's filter
        assert _w005() == []
    with override_settings(DEBUG=True, DEFAULT_EXCEPTION_REPORTER_FILTER=f"{__name__}.OwnFilter"):
        assert _w005() == []
    settings.PERSISTENT_MEMORY = {"BACKEND": "redis", "REDIS_URL": "redis://127.0.0.1:6399/0"}
    with override_settings(DEBUG=True, DEFAULT_EXCEPTION_REPORTER_FILTER=django_filter):
        assert _w005() == []  # no password to show


def test_check_warns_when_debug_pages_could_show_a_database_password(settings, monkeypatch):
    # The database driver's frames hold its password (psycopg's conninfo, params, kwargs).
    settings.PERSISTENT_MEMORY = {"BACKEND": "memory"}
    django_filter = "django.views.debug.SafeExceptionReporterFilter"
    with override_settings(DEBUG=True, DEFAULT_EXCEPTION_REPORTER_FILTER=django_filter):
        assert _w005() == []  # no password configured anywhere
        # Read where the filter reads it (override_settings of DATABASES warns, rightly).
        monkeypatch.setitem(settings.DATABASES["default"], "PASSWORD", "db-pw")
        assert _w005() == ["persistent_memory.W005"]
    with override_settings(DEBUG=True):  # the demo's: the app's filter
        assert _w005() == []


class OwnFilter(SafeExceptionReporterFilter):
    """A project's own filter, built on the app's."""


def test_demo_runs_with_debug_off_unless_asked(tmp_path):
    env = demo_env(DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}")
    code = "from django.conf import settings; print(settings.DEBUG)"
    assert manage(env, "shell", "--no-imports", "-c", code).split() == ["False"]
    assert manage({**env, "DJANGO_DEBUG": "1"}, "shell", "--no-imports", "-c", code).split() == ["True"]
