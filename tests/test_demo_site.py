"""The demo site: its landing page and its environment switches."""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token

from tests import readme_blocks
from tests.servers import demo_env, serve

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def counts(body: str) -> dict[str, int]:
    return {name: int(n) for name, n in re.findall(r'id="count-(\w+)">(\d+)<', body)}


def pre(body: str, element_id: str) -> str:
    return html.unescape(re.search(rf'<pre id="{element_id}">(.*?)</pre>', body, re.S).group(1))


def test_home_page_shows_the_backend_and_live_counts(client, store):
    store.create_session("visible")
    store.put("visible", "topic", "Paris")
    owned = store.for_owner("user:7")
    owned.create_session("mine")
    owned.put("mine", "a", 1)
    owned.increment("mine", "b")
    response = client.get("/")
    assert response.status_code == 200
    body = response.content.decode()
    assert store.backend.describe() in body and f"<strong>{store.backend.name}</strong>" in body
    assert "answers in" in body  # the backend's ping
    assert counts(body) == {"sessions": 2, "owners": 2, "keys": 3, "history": 3}
    store.delete_session("visible")
    assert counts(client.get("/").content.decode())["sessions"] == 1  # live, not cached


def test_home_page_says_what_to_do_next(client, store, db):
    body = client.get("/").content.decode()
    assert "Memory across sessions for LLM pipelines" in body
    readme = README.read_text()
    # The README's commands, exactly: the same user and token its curl examples use.
    for element_id in ("create-user", "create-token"):
        command = pre(body, element_id)
        assert f"\n{command}\n" in readme, command
    assert pre(body, "create-user").startswith(
        "DJANGO_SUPERUSER_PASSWORD=change-me python manage.py createsuperuser"
    )
    links = set(re.findall(r'href="(/[^"]*)"', body))
    assert {
        "/api/docs/",
        "/api/schema/",
        "/admin/",
        "/admin/persistent_memory/memorysession/",
        "/api/memory/health/",
    } == links
    for link in links:
        response = client.get(link)
        assert response.status_code in (200, 302), link  # the admin sends visitors to its login
        if response.status_code == 302:
            assert response["Location"].startswith("/admin/login/"), link


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_home_page_curl_works_as_shown(live_server, transactional_db, store):
    """The page's curl, pasted as it is, after its two commands (done here through the ORM)."""
    user = get_user_model().objects.create_superuser("admin", "admin@example.com", "change-me")
    token = Token.objects.create(user=user).key
    with urllib.request.urlopen(live_server.url + "/") as response:
        body = response.read().decode()
    script = html.unescape(re.search(r"<pre>(curl .*?)</pre>", body, re.S).group(1))
    assert live_server.url + "/api/memory/enrich/" in script
    (answer,) = readme_blocks.run_block(script, live_server.url, token)
    assert answer["memory"] == {"status": "unchanged", "session_id": "chat-42", "keys": []}
    assert store.for_owner(f"user:{user.pk}").list_sessions() == ["chat-42"]


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
