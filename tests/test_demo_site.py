"""The demo site: its landing page and its environment switches."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.servers import demo_env, serve

ROOT = Path(__file__).resolve().parent.parent


def test_home_page_shows_backend_and_sessions(client, store):
    store.create_session("visible")
    response = client.get("/")
    assert response.status_code == 200
    body = response.content.decode()
    assert store.backend.describe() in body
    assert "Live sessions: 1" in body


def test_home_page_reports_unreachable_redis(client, settings):
    settings.PERSISTENT_MEMORY = {"BACKEND": "redis", "REDIS_URL": "redis://:pw@127.0.0.1:1/0"}
    response = client.get("/")
    assert response.status_code == 200
    body = response.content.decode()
    assert "Unavailable" in body and "127.0.0.1:1" in body and "pw@" not in body


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_environment_selects_the_backend(backend, redis_url, tmp_path):
    env = {
        **os.environ,
        "MEMORY_BACKEND": backend,
        "REDIS_URL": redis_url,
        "SESSION_TTL_HOURS": "1.5",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
    }
    code = (
        "from persistent_memory import get_store; s = get_store(); "
        "print(s.backend.name, s.default_ttl_seconds); s.ping()"
    )
    result = subprocess.run(
        [sys.executable, "manage.py", "shell", "--no-imports", "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.split() == [backend, "5400"]


def test_runserver_with_debug_off_serves_the_static_files(tmp_path):
    """The README's runserver command, DEBUG off by default: the admin's and the API docs'
    static files still load (WhiteNoise), and errors are not Django's debug pages."""
    env = demo_env(DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}")
    with serve("runserver", env, tmp_path / "runserver.log") as server:
        docs = server.request("GET", "/api/docs/")
        assert docs.status == 200
        assets = re.findall(r'"(/static/[^"]+)"', docs.body.decode())
        assert assets, docs.body[:500]
        for path in [*assets, "/static/admin/css/base.css", "/static/admin/js/core.js"]:
            response = server.request("GET", path)
            assert response.status == 200, path
            assert len(response.body) > 100, path
        missing = server.request("GET", "/no-such-page/")
        assert missing.status == 404 and b"URLconf" not in missing.body  # not the debug 404
