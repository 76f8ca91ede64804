"""Bodies sent without a Content-Length (``Transfer-Encoding: chunked``, as ``http.client``
sends an iterable body): read like any other where the server decodes the chunks
(gunicorn, an ASGI server), refused with 411 where it cannot (runserver), never read
as an empty body. Against real server processes of the demo site."""

from __future__ import annotations

import asyncio
import json

import pytest
from django.core.asgi import get_asgi_application

from persistent_memory.conf import DEFAULTS
from tests.servers import demo_env, prepare_database, serve

API = "/api/memory/"


def chunked(value: object, size: int = 7) -> list[bytes]:
    """``value`` as JSON in chunks of ``size`` bytes (http.client sends each as one chunk)."""
    body = json.dumps(value).encode()
    return [body[i : i + size] for i in range(0, len(body), size)]


def enrich(session_id: str) -> dict:
    return {"question": {"text": "Where?", "metadata": {"session_id": session_id}}}


@pytest.fixture(scope="module")
def demo_database(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A migrated SQLite database of the demo's, and a staff user's token."""
    url = f"sqlite:///{tmp_path_factory.mktemp('bodies') / 'db.sqlite3'}"
    return url, prepare_database(demo_env(DATABASE_URL=url))


@pytest.fixture
def server_env(backend_name, demo_database, request) -> tuple[dict[str, str], str]:
    url, token = demo_database
    extra = {"MEMORY_BACKEND": backend_name, "DATABASE_URL": url}
    if backend_name == "redis":
        request.getfixturevalue("redis_client")  # a clean keyspace
        extra["REDIS_URL"] = request.getfixturevalue("redis_url")
    return demo_env(**extra), token


def test_gunicorn_reads_chunked_bodies(server_env, tmp_path):
    env, token = server_env
    session = f"chunked-{env['MEMORY_BACKEND']}"
    value = {"nested": [1, 2, {"text": "é" * 50}]}
    with serve("gunicorn", env, tmp_path / "gunicorn.log") as server:
        response = server.request("POST", API + "enrich/", chunked(enrich(session)), token=token)
        assert response.status == 200, response.body
        assert response.json()["memory"]["session_id"] == session
        key = f"{API}sessions/{session}/memory/k/"
        response = server.request("PUT", key, chunked({"value": value}), token=token)
        assert response.status == 200, response.body
        assert server.request("GET", key, token=token).json()["value"] == value
        # Still capped: the body is read up to MAX_REQUEST_BYTES and refused past it.
        too_large = chunked({"value": "x" * DEFAULTS["MAX_REQUEST_BYTES"]}, size=64 * 1024)
        response = server.request("PUT", key, too_large, token=token)
        assert response.status == 413 and response.json()["code"] == "payload_too_large"
        assert server.request("GET", key, token=token).json()["value"] == value


def test_runserver_refuses_chunked_bodies_with_411(server_env, tmp_path):
    env, token = server_env
    session = f"refused-{env['MEMORY_BACKEND']}"
    key = f"{API}sessions/{session}/memory/k/"
    with serve("runserver", env, tmp_path / "runserver.log") as server:
        for method, path, body in [("POST", API + "enrich/", enrich(session)), ("PUT", key, {"value": 1})]:
            response = server.request(method, path, chunked(body), token=token)
            assert response.status == 411, response.body
            assert response.headers["Content-Type"] == "application/json"
            assert response.json()["code"] == "length_required"
        # Nothing was written; the same request with a length is served.
        assert server.request("GET", f"{API}sessions/{session}/", token=token).status == 404
        response = server.request("POST", API + "enrich/", enrich(session), token=token)
        assert response.status == 200 and response.json()["memory"]["session_id"] == session


def test_asgi_reads_chunked_bodies(configure):
    """Django's ASGI handler, given what an ASGI server hands it for a chunked request:
    the transfer-encoding header and the body in parts, with no content-length."""
    configure(
        API_AUTHENTICATION_CLASSES=[],
        API_PERMISSION_CLASSES=["rest_framework.permissions.AllowAny"],
        OWNER_RESOLVER="persistent_memory.owners.resolvers.shared_owner",
    )
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": API + "enrich/",
        "raw_path": (API + "enrich/").encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"localhost"),
            (b"content-type", b"application/json"),
            (b"transfer-encoding", b"chunked"),
        ],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    parts = chunked(enrich("asgi-chunked"))
    messages = [{"type": "http.request", "body": part, "more_body": True} for part in parts]
    messages.append({"type": "http.request", "body": b"", "more_body": False})
    sent: list[dict] = []

    async def run() -> None:
        async def receive() -> dict:
            if messages:
                return messages.pop(0)
            await asyncio.Event().wait()  # no disconnect: the handler stops listening when done
            return {"type": "http.disconnect"}

        async def send(message: dict) -> None:
            sent.append(message)

        await get_asgi_application()(scope, receive, send)

    asyncio.run(run())
    assert sent[0]["status"] == 200, sent
    body = json.loads(b"".join(m.get("body", b"") for m in sent[1:]))
    assert body["memory"]["session_id"] == "asgi-chunked"
