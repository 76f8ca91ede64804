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

from persistent_memory.exceptions import InvalidOwner
from tests import readme_blocks
from tests.servers import demo_env, serve

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def counts(body: str) -> dict[str, int]:
    return {name: int(n) for name, n in re.findall(r'id="count-(\w+)">(\d+)<', body)}


def pre(body: str, element_id: str) -> str:
    return html.unescape(re.search(rf'<pre id="{element_id}">(.*?)</pre>', body, re.S).group(1))


def fill(store, owners: int, sessions: int, first: int = 0) -> None:
    """``sessions`` sessions of each of ``owners`` other owners, with a value each."""
    for number in range(first, first + owners):
        owned = store.for_owner(f"user:{9000 + number}")
        for index in range(sessions):
            owned.create_session(f"s{index}")
            owned.put(f"s{index}", "topic", "Paris")


def test_home_page_shows_a_visitor_nothing_of_any_owner_nor_where_the_store_is(client, store, db):
    store.create_session("unowned")
    store.put("unowned", "topic", "Paris")
    fill(store, owners=2, sessions=3)
    body = client.get("/").content.decode()
    assert f"<strong>{store.backend.name}</strong>" in body and "answers in" in body
    assert counts(body) == {} and "user:9000" not in body and "unowned" not in body
    assert 'id="sign-in"' in body
    location = store.backend.describe()
    if location != store.backend.name:  # Redis: its address
        assert location not in body and "127.0.0.1" not in body


def test_home_page_shows_a_signed_in_user_their_own_sessions(client, store, db):
    user = get_user_model().objects.create_user("alice", password="pw-for-tests")
    owned = store.for_owner(f"user:{user.pk}")
    owned.create_session("mine")
    owned.put("mine", "a", 1)
    owned.increment("mine", "b")
    fill(store, owners=2, sessions=3)
    client.force_login(user)
    body = client.get("/").content.decode()
    assert counts(body) == {"sessions": 1} and "<code>mine</code>" in body
    assert "<td>2</td><td>2</td>" in body  # its keys and history entries
    assert "user:9000" not in body and "<code>s0</code>" not in body
    if store.backend.describe() != store.backend.name:
        assert store.backend.describe() not in body  # staff only
    owned.delete_session("mine")
    assert counts(client.get("/").content.decode()) == {"sessions": 0}  # live, not cached
    staff = get_user_model().objects.create_user("ops", password="pw-for-tests", is_staff=True)
    client.force_login(staff)
    assert store.backend.describe() in client.get("/").content.decode()


class SessionsRead:
    """A spy on the store's backend: how many calls, and how many sessions they read."""

    def __init__(self, backend, monkeypatch) -> None:
        self.calls = 0
        self.sessions = 0
        for name in ("list_session_infos", "list_session_page", "list_sessions", "session_info"):
            method = getattr(backend, name)
            monkeypatch.setattr(backend, name, self.counting(method))

    def counting(self, method):
        def call(*args, **kwargs):
            self.calls += 1
            answer = method(*args, **kwargs)
            found = answer[1] if isinstance(answer, tuple) else answer
            self.sessions += len(found) if isinstance(found, list) else 1
            return answer

        return call


@pytest.mark.parametrize("signed_in", [False, True])
def test_home_page_costs_the_same_whatever_the_sessions_stored(client, configure, db, monkeypatch, signed_in):
    """The page is public: what it reads must not grow with the sessions of all owners
    (it walked every session of every owner per request before)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    store = configure(MAX_SESSIONS=5000)
    user = get_user_model().objects.create_user("alice", password="pw-for-tests")
    owned = store.for_owner(f"user:{user.pk}")
    for index in range(25):
        owned.create_session(f"mine-{index}")
    if signed_in:
        client.force_login(user)
    spy = SessionsRead(store.backend, monkeypatch)
    seen = []
    for owners, sessions, first in ((1, 10, 0), (10, 99, 1)):  # 10 other sessions, then 1,000
        fill(store, owners, sessions, first)
        spy.calls = spy.sessions = 0
        with CaptureQueriesContext(connection) as queries:
            assert client.get("/").status_code == 200
        seen.append((spy.calls, spy.sessions, len(queries)))
    assert seen[0] == seen[1]
    assert seen[0][1] <= 11  # a page of the user's own sessions at most (and one to know if more follow)


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
        "/admin/login/?next=/",
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


def test_home_page_reports_unreachable_redis(client, settings, db):
    settings.PERSISTENT_MEMORY = {"BACKEND": "redis", "REDIS_URL": "redis://:pw@127.0.0.1:1/0"}
    response = client.get("/")
    assert response.status_code == 200
    body = response.content.decode()
    assert "unavailable" in body and "127.0.0.1" not in body and "pw@" not in body  # a visitor
    staff = get_user_model().objects.create_user("ops", password="pw-for-tests", is_staff=True)
    client.force_login(staff)
    body = client.get("/").content.decode()
    assert "Unavailable" in body and "127.0.0.1:1" in body and "pw@" not in body  # the operator


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


def refuse_every_owner(request):
    raise InvalidOwner("Invalid owner: this resolver names no one.")


def test_home_page_answers_when_the_resolver_refuses_the_owner(client, store, db, settings):
    """An error of the store's other than an outage (here an owner the project's resolver
    refuses) is shown on the page, not a 500."""
    settings.PERSISTENT_MEMORY = {
        **settings.PERSISTENT_MEMORY,
        "OWNER_RESOLVER": f"{__name__}.refuse_every_owner",
    }
    user = get_user_model().objects.create_user("alice", password="pw-for-tests")
    client.force_login(user)
    response = client.get("/")
    assert response.status_code == 200
    assert "this resolver names no one" in response.content.decode()
