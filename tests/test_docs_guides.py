"""The newcomer's pages of the site (docs/quickstart.md and the guides) say what happens:
the quickstart's Python example on each backend, and its commands run as a newcomer
would, in a project folder of their own against a demo server process; and the ways
docs/install.md gives an app's own users their API access.

The guides' other examples are run where the code they show is tested
(tests/test_readme.py, tests/test_memories.py, the OpenAI summarizer and extractor tests).
"""

from __future__ import annotations

import shlex
import shutil
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from persistent_memory import get_store
from persistent_memory.memories import memories_for
from persistent_memory.store import MemoryStore
from tests import readme_blocks
from tests.conftest import memory_settings_for
from tests.servers import project_folder, run_bash
from tests.test_readme import bash, runserver, serving

#: The demo's install, as in the README (the suite's own environment has what it installs,
#: and a test cannot reach the package index).
INSTALL = 'python -m pip install -e ".[demo]"\n'


def test_the_quickstart_python_example(store: MemoryStore, db: Any) -> None:
    """Run statement by statement on each backend, every ``# ->`` as shown."""
    values = readme_blocks.run_example("quickstart-python", {})
    assert store.get_all("first-chat") == {"city": "Paris"}
    window = readme_blocks.statement(values, "window = store.get_context(")
    assert window["conversation"] == "default" and 0 < window["tokens"] <= 1000
    (memory,) = memories_for("user:42").list()[1]
    assert (memory["key"], memory["type"], memory["source"]) == ("travel.seat", "factual", "api")


def shell(code: str, env: dict[str, str], cwd: Path) -> str:
    """``python manage.py shell -c code`` in ``cwd``; its standard output."""
    return run_bash(f"python manage.py shell --no-imports -c {shlex.quote(code)}", env, cwd).stdout


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_the_quickstart_commands_on_the_demo_site(tmp_path: Path) -> None:
    """The quickstart top to bottom on the demo's defaults (memory backend, SQLite): the
    install, the Python example in a shell, what a second process finds of it, the server,
    the token and the two curl commands, each answer as its comment shows."""
    install = readme_blocks.example("quickstart-install")
    venv, pip, migrate = install.splitlines(keepends=True)
    env = {key: value for key, value in project_folder(tmp_path).items() if key != "VIRTUAL_ENV"}
    # The virtualenv's line, in a folder of its own: the shell that runs it is in it.
    (tmp_path / "venv").mkdir()
    prefix = bash(venv + 'python -c "import sys; print(sys.prefix)"\n', env, tmp_path / "venv")
    assert Path(prefix.strip()) == tmp_path / "venv" / ".venv"
    assert pip == INSTALL
    bash(migrate, env, tmp_path)

    shell(readme_blocks.example("quickstart-python"), env, tmp_path)
    # "The next process on the same database finds them there."
    found = shell(
        "from persistent_memory import get_store; from persistent_memory.memories import memories_for; "
        "store = get_store(); print(store.get('first-chat', 'city')); "
        "print(len(store.get_messages('first-chat')['messages'])); "
        "print(memories_for('user:42').list()[0])",
        env,
        tmp_path,
    )
    assert found.split() == ["Paris", "2", "1"]

    serve = readme_blocks.example("quickstart-serve")
    with serving(runserver(serve), env, tmp_path, tmp_path / "demo.log") as server:
        token_block = readme_blocks.example("quickstart-token")
        token = bash(token_block + 'echo "$TOKEN"\n', env, tmp_path).split()[-1]
        url = f"http://127.0.0.1:{server.port}"
        curl = readme_blocks.example("quickstart-curl")
        added, window = readme_blocks.run_block(curl, url, token)
        assert added["head"] == added["messages"][-1]["id"]
        assert [(m["seq"], m["role"]) for m in added["messages"]] == [(1, "user"), (2, "assistant")]
        assert all(m["tokens"] > 0 for m in added["messages"])
        assert readme_blocks.promised(curl) == [None, window]
        # The API's session is the admin's own: the shell's first-chat is not among them.
        listed = server.request("GET", "/api/memory/sessions/", token=token).json()
        assert [row["session_id"] for row in listed["results"]] == ["trip"]


def test_the_install_pages_token_view_and_session_csrf(
    settings: Any, db: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/install.md's "Tokens for your own users": the ``obtain_auth_token`` line appended
    to a URLconf (the demo's) answers a user's token for their username and password, that
    token works on the API as the user's own owner, and a session caller's unsafe request
    needs the CSRF header."""
    from django.contrib.auth import get_user_model
    from django.test import Client
    from rest_framework.authtoken.models import Token

    import memory_site.urls

    settings.PERSISTENT_MEMORY = memory_settings_for("memory")
    source = Path(memory_site.urls.__file__).read_text()
    urlconf = types.ModuleType("docs_install_urls")
    appended = source + "\n" + readme_blocks.example("obtain-auth-token")
    exec(compile(appended, "urls.py", "exec"), urlconf.__dict__)  # noqa: S102 (the page's own line)
    monkeypatch.setitem(sys.modules, urlconf.__name__, urlconf)
    settings.ROOT_URLCONF = urlconf.__name__

    user = get_user_model().objects.create_user("ada", password="a-long-passphrase")
    client = Client()
    refused = client.post(
        "/api/token/", {"username": "ada", "password": "wrong"}, content_type="application/json"
    )
    assert refused.status_code == 400
    answered = client.post(
        "/api/token/", {"username": "ada", "password": "a-long-passphrase"}, content_type="application/json"
    )
    assert answered.status_code == 200, answered.content
    token = answered.json()["token"]
    # The view's token is the one get_or_create gives the user (the page's other way).
    assert Token.objects.get_or_create(user=user) == (Token.objects.get(key=token), False)
    created = client.post(
        "/api/memory/sessions/",
        {"session_id": "chat-1"},
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Token {token}",
    )
    assert created.status_code == 201, created.content
    assert get_store().for_owner(f"user:{user.pk}").list_sessions() == ["chat-1"]

    # The session of a user logged in with Django's login: CSRF on unsafe methods.
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(user)
    assert browser.get("/api/memory/sessions/").status_code == 200
    no_header = browser.post(
        "/api/memory/sessions/", {"session_id": "chat-2"}, content_type="application/json"
    )
    assert no_header.status_code == 403, no_header.content
    browser.get("/admin/login/")  # any page that renders a form sets the csrftoken cookie
    csrf = browser.cookies["csrftoken"].value
    with_header = browser.post(
        "/api/memory/sessions/",
        {"session_id": "chat-2"},
        content_type="application/json",
        HTTP_X_CSRFTOKEN=csrf,
    )
    assert with_header.status_code == 201, with_header.content
