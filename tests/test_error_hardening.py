"""Errors as an attacker, an operator and a new user meet them: JSON with a code on every
API path, Django's own pre-view errors included (a bad Host, a malformed chunked body,
the database down), on real runserver, gunicorn and uvicorn processes; no backend
address, script hash or password in what a caller sees; a request id that finds the
details in the log."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from typing import Any
from urllib.parse import quote

import pytest
import redis
from django.contrib.auth import get_user_model
from django.core.exceptions import DisallowedHost, RequestDataTooBig
from django.test import Client, RequestFactory
from django.views import debug as django_debug
from mcp.server.mcpserver.exceptions import ToolError
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from persistent_memory import get_store
from persistent_memory.conf import DEFAULTS
from persistent_memory.errors.debug import SafeExceptionReporterFilter
from persistent_memory.mcp.server import build_server
from tests.conftest import RedisServer, _free_port, memory_settings_for
from tests.servers import demo_env, prepare_database, serve
from tests.test_outages import database_down, outage_env  # noqa: F401 - fixtures used here

API = "/api/memory/"
USER_PK = 5151
OWNER = f"user:{USER_PK}"
ENRICH = {"question": {"text": "q", "metadata": {"session_id": "s1"}}}
#: What no caller may read in an error: a backend address, a Redis script's hash or line.
INTERNALS = ("redis://", "127.0.0.1", "script", "@user_script", "OOM")


def raw_request(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """Send ``request`` as is (http.client cannot send a malformed chunk); status, headers, body."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding") == "chunked":  # uvicorn's own answers are chunked
        decoded, rest = b"", body
        while rest:
            size, _, rest = rest.partition(b"\r\n")
            if not int(size, 16):
                break
            decoded, rest = decoded + rest[: int(size, 16)], rest[int(size, 16) + 2 :]
        body = decoded
    return int(status_line.split()[1]), headers, body


def header(response: Any, name: str) -> str:
    """A response header, whatever case the server wrote its name in."""
    return {key.lower(): value for key, value in response.headers.items()}[name.lower()]


def malformed_chunked(token: str) -> bytes:
    """A POST whose first chunk size is ``ZZ``, not hexadecimal."""
    return (
        b"POST /api/memory/enrich/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Authorization: Token " + token.encode() + b"\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        b"ZZ\r\n{}\r\n0\r\n\r\n"
    )


# Errors Django raises before a view, on real servers --------------------------------


@pytest.mark.parametrize("kind", ["runserver", "gunicorn", "uvicorn"])
def test_errors_before_a_view_are_json_on_every_server(kind, tmp_path):
    env = demo_env(DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}")
    token = prepare_database(env)
    with serve(kind, env, tmp_path / f"{kind}.log") as server:
        # A Host not in ALLOWED_HOSTS: Django's DisallowedHost, raised in a middleware.
        for path in ("health/", "enrich/", "no/such/path/"):
            response = server.request("GET", API + path, token=token, headers={"Host": "evil.example"})
            assert response.status == 400, (path, response.body[:300])
            assert header(response, "Content-Type") == "application/json"
            assert response.json() == {
                "detail": "The request's Host header names no host this site serves.",
                "code": "disallowed_host",
            }
        # Outside the API the site answers as Django does.
        page = server.request("GET", "/admin/", headers={"Host": "evil.example"})
        assert page.status == 400 and header(page, "Content-Type").startswith("text/html")

        status, headers, body = raw_request(server.port, malformed_chunked(token))
        if kind == "gunicorn":  # gunicorn decodes the chunks: its parse error reaches the app
            assert (status, headers["content-type"]) == (400, "application/json")
            assert body == (
                b'{"detail":"The request body could not be read: its chunked encoding is malformed.",'
                b'"code":"malformed_body"}'
            )
        elif kind == "runserver":  # cannot read chunked bodies at all (see api/bodies.py)
            assert (status, headers["content-type"]) == (411, "application/json")
        else:  # uvicorn refuses the request itself, before the application sees it
            assert (status, body) == (400, b"Invalid HTTP request received.")
        # The server goes on.
        assert server.request("POST", API + "enrich/", ENRICH, token=token).status == 200
    assert "Internal Server Error" not in server.log


def test_handlers_answer_json_on_api_paths_and_django_pages_elsewhere(db):
    from persistent_memory.api.error_views import bad_request

    factory = RequestFactory()
    too_big = bad_request(factory.post(API + "store/"), RequestDataTooBig("too big"))
    assert too_big.status_code == 413 and too_big["Content-Type"] == "application/json"
    assert too_big.content == b'{"detail": "The request body is too large.", "code": "payload_too_large"}'
    host = bad_request(factory.get(API + "health/"), DisallowedHost("evil.example"))
    assert host.status_code == 400 and b'"code": "disallowed_host"' in host.content
    # The API's URLconf wherever the project mounts it: its app_name, not a prefix.
    page = bad_request(factory.get("/admin/"), DisallowedHost("evil.example"))
    assert page.status_code == 400 and page["Content-Type"].startswith("text/html")
    assert Client(HTTP_HOST="evil.example").get(API + "health/").json()["code"] == "disallowed_host"


def test_a_500_outside_a_view_on_the_api_is_json_with_a_request_id(db, caplog):
    from persistent_memory.api.error_views import server_error

    request = RequestFactory().get(API + "sessions/")
    with caplog.at_level(logging.ERROR, logger="persistent_memory"):
        try:
            raise RuntimeError("bug in a middleware at 10.0.0.7")
        except RuntimeError:
            response = server_error(request)
    assert response.status_code == 500 and response["Content-Type"] == "application/json"
    body = json.loads(response.content)
    assert set(body) == {"detail", "code", "request_id"}
    assert body["code"] == "server_error" and "10.0.0.7" not in response.content.decode()
    assert response["X-Request-ID"] == body["request_id"]
    [record] = [r for r in caplog.records if body["request_id"] in r.getMessage()]
    assert record.exc_info[1].args == ("bug in a middleware at 10.0.0.7",)


def failing_middleware(get_response: Any) -> Any:
    """A project's middleware with a bug, raising before any view runs."""

    def middleware(request: Any) -> Any:
        raise RuntimeError("bug in a middleware at 10.0.0.7")

    return middleware


@pytest.mark.parametrize("debug", [False, True])
def test_errors_before_a_view_are_the_same_json_whatever_debug(db, settings, debug):
    """The REST page's promise: JSON with a code on every API path, DEBUG on or off; with
    it on, Django renders its debug page for a bad Host itself (the handlers never run),
    which would show the Host, the caller's address and the settings."""
    settings.DEBUG = debug
    client = Client(HTTP_HOST="evil.example", REMOTE_ADDR="10.9.8.7", raise_request_exception=False)
    for method, path in (("get", "health/"), ("post", "enrich/"), ("get", "sessions/"), ("get", "no/such/")):
        response = getattr(client, method)(API + path)
        assert response.status_code == 400, (path, response.content[:300])
        assert response["Content-Type"] == "application/json"
        assert response.json() == {
            "detail": "The request's Host header names no host this site serves.",
            "code": "disallowed_host",
        }
        assert b"evil.example" not in response.content and b"10.9.8.7" not in response.content
    # Outside the API, the site answers as Django does (its debug page with DEBUG on).
    page = client.get("/admin/")
    assert page.status_code == 400 and page["Content-Type"].startswith("text/html")
    # A middleware's exception: a JSON 500 with a request id, not the debug page.
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "tests.test_error_hardening.failing_middleware"]
    response = Client(raise_request_exception=False).get(API + "health/")
    assert response.status_code == 500 and response["Content-Type"] == "application/json"
    assert set(response.json()) == {"detail", "code", "request_id"} and b"10.0.0.7" not in response.content


@pytest.mark.django_db(transaction=True)
def test_database_down_in_a_middleware_with_debug_on_is_a_json_503(settings, store, database_down):  # noqa: F811
    settings.DEBUG = True
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "django.contrib.auth.middleware.LoginRequiredMiddleware"]
    client = Client(raise_request_exception=False)
    client.cookies["sessionid"] = "x" * 32
    response = client.get(API + "sessions/")
    assert response.status_code == 503 and response["Content-Type"] == "application/json"
    assert response.json()["code"] == "database_unavailable"


# The database down: authentication before a view, the schema, the admin ----------


@pytest.mark.django_db(transaction=True)
def test_database_down_in_a_middleware_is_a_json_503_on_the_api(settings, store, database_down):  # noqa: F811
    """A project's middleware that reads the user (Django's LoginRequiredMiddleware) meets
    the database down before any API view runs."""
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "django.contrib.auth.middleware.LoginRequiredMiddleware"]
    client = Client(raise_request_exception=False)
    client.cookies["sessionid"] = "x" * 32
    response = client.get(API + "sessions/")
    assert response.status_code == 503 and response["Retry-After"] == "5"
    body = response.json()
    assert body["code"] == "database_unavailable" and body["request_id"] == response["X-Request-ID"]
    page = client.get("/admin/")
    assert page.status_code == 503 and page["Content-Type"].startswith("text/html")
    assert b"database cannot be reached" in page.content


@pytest.mark.django_db(transaction=True)
def test_the_503_page_needs_no_template_loader_of_the_app(settings, store, database_down):  # noqa: F811
    """A project without APP_DIRS cannot load the app's 503 template: still a 503 page."""
    settings.TEMPLATES = [{**settings.TEMPLATES[0], "APP_DIRS": False, "DIRS": []}]
    client = Client(raise_request_exception=False)
    client.cookies["sessionid"] = "x" * 32
    page = client.get("/admin/")
    assert page.status_code == 503 and page["Content-Type"].startswith("text/html")
    assert b"Service unavailable (503)" in page.content and page["X-Request-ID"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("backend_name", ["memory"])  # the database's outage, not the store's
def test_schema_needs_no_database_and_the_admin_answers_a_503_page(outage_env, tmp_path):  # noqa: F811
    env, token, outage = outage_env
    with serve("runserver", env, tmp_path / "server.log") as server:
        outage.down()
        try:
            # A token (or a session cookie) made the schema look its owner up: a 500 page.
            schema = server.request("GET", "/api/schema/", token=token)
            assert schema.status == 200, schema.body[:500]
            assert b"/api/memory/enrich/" in schema.body and b"request_id" in schema.body
            for path in ("/admin/", "/admin/persistent_memory/"):
                page = server.request("GET", path, headers={"Cookie": "sessionid=" + "x" * 32})
                assert page.status == 503, (path, page.body[:300])
                assert page.headers["Content-Type"].startswith("text/html")
                assert page.headers["Retry-After"] == "5"
                text = page.body.decode()
                assert "Service unavailable (503)" in text and "database cannot be reached" in text
                assert page.headers["X-Request-ID"] in text
                assert "Server Error (500)" not in text
        finally:
            outage.up()
        assert server.request("GET", "/admin/login/").status == 200


@pytest.mark.parametrize("kind", ["gunicorn", "uvicorn"])
def test_an_unreachable_database_is_a_503_page_and_json_on_wsgi_and_asgi(kind, tmp_path):
    """PostgreSQL at an address that refuses (a free port): the admin's page and the API."""
    env = demo_env(DATABASE_URL=f"postgres://postgres@127.0.0.1:{_free_port()}/test")
    with serve(kind, env, tmp_path / f"{kind}.log") as server:
        page = server.request("GET", "/admin/", headers={"Cookie": "sessionid=" + "x" * 32})
        assert page.status == 503 and header(page, "Content-Type").startswith("text/html")
        assert "Service unavailable (503)" in page.body.decode()
        api = server.request("GET", API + "sessions/", token="a" * 40)
        assert api.status == 503 and api.json()["code"] == "database_unavailable"
        assert api.json()["request_id"] == header(api, "X-Request-ID")
        if kind == "uvicorn":  # the MCP endpoint reads the token before Django's handler
            mcp = server.request("POST", "/mcp/", b"{}", token="a" * 40)
            assert (mcp.status, header(mcp, "Content-Type")) == (503, "application/json")
            assert mcp.json()["code"] == "database_unavailable"
            assert mcp.json()["request_id"] == header(mcp, "X-Request-ID")
            assert header(mcp, "Retry-After")


# No internals for ordinary callers -----------------------------------------------


@pytest.fixture
def full_redis(settings, db) -> Any:
    """A redis-server of this test's own, at its maxmemory with noeviction, and an API client."""
    server = RedisServer()
    server.start()
    try:
        settings.PERSISTENT_MEMORY = memory_settings_for("redis", server.url)
        get_store().for_owner(OWNER).create_session("s1")
        user = get_user_model().objects.create_user("pipeline", password="pw-for-tests", pk=USER_PK)
        api = APIClient()
        api.credentials(HTTP_AUTHORIZATION=f"Token {Token.objects.create(user=user).key}")
        client = redis.Redis.from_url(server.url)
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", 1)  # already over it: every write is refused
        yield server, api
        client.close()
    finally:
        server.stop()


def plain_server_error(response, status: int, code: str, caplog) -> dict:
    """The answer's body, after checking it tells a code, a plain message and a request id,
    and that the log has the details under that id."""
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"detail", "code", "request_id"} and body["code"] == code
    assert response["X-Request-ID"] == body["request_id"]
    text = response.content.decode()
    assert not [internal for internal in INTERNALS if internal in text], text
    [record] = [r for r in caplog.records if body["request_id"] in r.getMessage()]
    assert record.name == "persistent_memory.api"
    return body


def test_a_full_redis_answers_507_without_internals_and_logs_them(full_redis, caplog):
    server, api = full_redis
    with caplog.at_level(logging.WARNING, logger="persistent_memory"):
        response = api.put(API + "sessions/s1/memory/k/", {"value": "v"}, format="json")
    body = plain_server_error(response, 507, "capacity_exceeded", caplog)
    assert body["detail"] == "The memory store is full: nothing was written."
    [record] = [r for r in caplog.records if body["request_id"] in r.getMessage()]
    assert f"127.0.0.1:{server.port}" in record.getMessage() and "OOM" not in body["detail"]


def test_creating_a_session_in_a_full_redis_answers_507_and_creates_nothing(full_redis, caplog):
    _, api = full_redis
    with caplog.at_level(logging.WARNING, logger="persistent_memory"):
        response = api.post(API + "sessions/", {"session_id": "new-one"}, format="json")
        plain_server_error(response, 507, "capacity_exceeded", caplog)
        question = {"question": {"text": "q", "metadata": {"session_id": "new-two"}}}
        answer = api.post(API + "enrich/", question, format="json")
        plain_server_error(answer, 507, "capacity_exceeded", caplog)
    assert get_store().for_owner(OWNER).list_sessions() == ["s1"]


def test_a_redis_down_answers_503_without_its_address(full_redis, caplog):
    server, api = full_redis
    server.stop()
    with caplog.at_level(logging.WARNING, logger="persistent_memory"):
        response = api.get(API + "sessions/s1/")
    body = plain_server_error(response, 503, "backend_unavailable", caplog)
    assert body["detail"] == "The memory store is unavailable; try again later."
    assert response["Retry-After"] == "5"


def test_mcp_tool_errors_tell_no_internals(full_redis, caplog):
    server, _ = full_redis
    tools = build_server(OWNER)
    messages = [{"role": "user", "content": "hi"}]
    with caplog.at_level(logging.WARNING, logger="persistent_memory"):
        with pytest.raises(ToolError) as full:
            asyncio.run(tools.call_tool("add_messages", {"session_id": "s1", "messages": messages}))
        server.stop()
        with pytest.raises(ToolError) as down:
            asyncio.run(tools.call_tool("get_context", {"session_id": "s1"}))
    for error, code in ((full, "capacity_exceeded"), (down, "backend_unavailable")):
        text = str(error.value)
        assert f"{code}: The memory store is " in text
        assert not [internal for internal in INTERNALS if internal in text], text
        request_id = text.rsplit("request_id: ", 1)[1].rstrip(")")
        [record] = [r for r in caplog.records if request_id in r.getMessage()]
        assert record.name == "persistent_memory.mcp" and f"127.0.0.1:{server.port}" in record.getMessage()


def test_mcp_errors_the_sdk_answers_as_text_are_json(tmp_path, redis_url, redis_client):
    env = demo_env(
        DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}", MEMORY_BACKEND="redis", REDIS_URL=redis_url
    )
    token = prepare_database(env)
    headers = {"Accept": "application/json, text/event-stream", "Authorization": f"Token {token}"}
    with serve("uvicorn", env, tmp_path / "uvicorn.log") as server:
        # Over the SDK's own 4 MiB limit too: today's text/plain 413.
        too_big = (
            b'{"jsonrpc": "2.0", "id": 1, "method": "ping", "params": {"pad": "' + b"x" * (5 << 20) + b'"}}'
        )
        response = server.request("POST", "/mcp/", too_big, headers=headers)
        assert (response.status, header(response, "Content-Type")) == (413, "application/json")
        assert response.json() == {"detail": "The request body is too large.", "code": "payload_too_large"}
        # Over MAX_REQUEST_BYTES, the API's limit, is over the endpoint's.
        over = b'{"pad": "' + b"x" * DEFAULTS["MAX_REQUEST_BYTES"] + b'"}'
        assert server.request("POST", "/mcp/", over, headers=headers).status == 413
        not_json = server.request("POST", "/mcp/", b"hi", headers={**headers, "Content-Type": "text/plain"})
        assert (not_json.status, header(not_json, "Content-Type")) == (400, "application/json")
        assert not_json.json()["code"] == "bad_request"


# Passwords on the debug page ---------------------------------------------------

#: A password with characters a URL encodes and a conninfo string escapes.
DB_PASSWORD = "Pw-s3cret/for:debug's"


def test_debug_page_never_shows_the_database_password(tmp_path):
    """DJANGO_DEBUG=1 and a PostgreSQL that refuses connections (a free port): psycopg's
    frames hold the password (``conninfo``, ``params``, ``kwargs``)."""
    url = f"postgres://postgres:{quote(DB_PASSWORD, safe='')}@127.0.0.1:{_free_port()}/test"
    env = demo_env(DATABASE_URL=url, DJANGO_DEBUG="1")
    forms = {DB_PASSWORD, quote(DB_PASSWORD, safe=""), "Pw-s3cret"}
    with serve("gunicorn", env, tmp_path / "gunicorn.log") as server:
        page = server.request("GET", "/admin/", headers={"Cookie": "sessionid=" + "x" * 32})
        assert page.status == 500 and b"OperationalError" in page.body  # the debug page
        assert b"conninfo" in page.body and b"127.0.0.1" in page.body
        api = server.request("POST", API + "enrich/", ENRICH, token="a" * 40)
        assert api.status == 503
        for answer in (page, api):
            text = answer.body.decode(errors="replace")
            assert not [form for form in forms if form in text]


def _debug_page(request: Any, seen: dict[str, Any]) -> bytes:
    """The DEBUG page of an exception raised where ``seen`` is a local variable."""
    try:
        raise ConnectionError(f"cannot reach {len(seen)} databases")
    except ConnectionError as exc:
        return django_debug.technical_500_response(request, type(exc), exc, exc.__traceback__).content


def test_filter_masks_passwords_in_urls_and_conninfo_it_was_not_told_of(settings):
    settings.DEBUG = True
    password = "-".join(("unconfigured", "pw"))  # built: the page shows source lines too
    seen = {
        "url": f"postgres://app:{password}1@db.internal:5432/app",
        "conninfo": f"host=db.internal user=app password={password}2 dbname=app",
        "kwargs": {"host": "db.internal", "password": f"{password}3"},
    }
    request = RequestFactory().get("/", DATABASE_URL=seen["url"])  # runserver copies the environment
    request.exception_reporter_filter = SafeExceptionReporterFilter()
    html = _debug_page(request, seen)
    assert password.encode() not in html
    assert b"db.internal" in html and b"user=app password=********************" in html
