"""The docs' "Add it to your project" (docs/install.md), and the README's short form of
it, followed to the letter on a new project.

A project fresh from ``django-admin startproject`` gets the page's blocks appended
as they are written there (settings, urls, one deployment, Django's deployment
settings), then the README's commands run in its folder (migrate, a superuser, a
token, ``check --deploy``, which must find nothing). It is then served by runserver
on a free loopback port and called over HTTP with the token: enrich, store, enrich
again; ``manage.py spectacular`` writes the schema. The app comes from a wheel built
from the sources and installed on its own (``PYTHONPATH``), so a file missing from the
wheel fails here; its requirements are this environment's.
"""

from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from tests import readme_blocks
from tests.packaging import build_wheel, install_wheel
from tests.servers import run_bash, serve

#: Each deployment: the block of docs/install.md that picks it.
DEPLOYMENTS = ["embedded", "redis", "redis-cache"]
#: A TLS-terminating proxy's header (the README's SECURE_PROXY_SSL_HEADER).
HTTPS = {"X-Forwarded-Proto": "https"}


#: The blocks of docs/install.md, by what they are for.
BLOCKS = {
    "settings": "new-project-settings",
    "urls": "new-project-urls",
    "embedded": "new-project-embedded",
    "redis": "new-project-redis",
    "redis-cache": "new-project-redis-cache",
    "deploy": "new-project-deploy",
    "commands": "new-project-commands",
    "swagger-offline": "new-project-swagger-offline",
}


def readme_block(name: str) -> str:
    """The code block of docs/install.md marked ``<!-- example: new-project-NAME -->``."""
    return readme_blocks.example(BLOCKS[name])


@pytest.fixture(scope="module")
def app_path(tmp_path_factory) -> Path:
    """A folder holding the app as installed from its wheel, and nothing else."""
    folder = tmp_path_factory.mktemp("app")
    return install_wheel(build_wheel(folder), folder / "site")


def project_env(app_path: Path, **extra: str) -> dict[str, str]:
    """This environment less what points at the demo site, with the wheel's app first."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "REDIS_URL", "MEMORY_BACKEND", "DJANGO_DEBUG")
    }
    return {
        **env,
        "PYTHONPATH": str(app_path),
        # The README's commands say `python`: this interpreter.
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1,localhost",
        **extra,
    }


def new_project(folder: Path, env: dict[str, str], settings_blocks: list[str], urls_block: str) -> None:
    """``startproject``, then the docs' blocks appended to its settings and URLs."""
    folder.mkdir()
    subprocess.run(
        [sys.executable, "-m", "django", "startproject", "mysite", str(folder)],
        env=env,
        check=True,
        capture_output=True,
    )
    settings = folder / "mysite" / "settings.py"
    for block in settings_blocks:
        settings.write_text(settings.read_text() + "\n" + block)
    urls = folder / "mysite" / "urls.py"
    urls.write_text(urls.read_text() + "\n" + urls_block)


def run_readme_commands(folder: Path, env: dict[str, str], commands: str) -> tuple[str, str]:
    """The docs' commands in the project's folder: their output, and the token."""
    done = run_bash(commands + 'echo "token: $TOKEN"\n', env, folder)
    token = re.search(r"^token: (\w+)$", done.stdout, re.M)
    assert token and len(token.group(1)) == 40, done.stdout
    return done.stdout + done.stderr, token.group(1)


@pytest.mark.parametrize("deployment", DEPLOYMENTS)
def test_a_new_project_set_up_as_the_readme_says(deployment, app_path, tmp_path, request):
    extra: dict[str, str] = {}
    raw = None
    if deployment != "embedded":
        raw = request.getfixturevalue("redis_client")  # flushed
        extra["REDIS_URL"] = request.getfixturevalue("redis_url")
    env = project_env(app_path, **extra)
    folder = tmp_path / "project"
    blocks = [readme_block(name) for name in ("settings", deployment, "deploy")]
    new_project(folder, env, blocks, readme_block("urls"))

    output, token = run_readme_commands(folder, env, readme_block("commands"))
    assert "Applying persistent_memory.0001_mirror... OK" in output
    assert "Superuser created successfully." in output
    # check --deploy: nothing beyond the warning the embedded block silences, as it says.
    silenced = 1 if deployment == "embedded" else 0
    assert f"System check identified no issues ({silenced} silenced)." in output, output
    where = subprocess.run(
        [sys.executable, "-c", "import persistent_memory; print(persistent_memory.__file__)"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert where.stdout.startswith(str(app_path)), where.stdout  # the wheel's copy
    # The schema command works with the README's DEFAULT_SCHEMA_CLASS, warning about nothing.
    schema_file = tmp_path / "schema.yml"
    subprocess.run(
        [sys.executable, "manage.py", "spectacular", "--validate", "--fail-on-warn"]
        + ["--file", str(schema_file)],
        cwd=folder,
        env=env,
        capture_output=True,
        check=True,
    )
    assert "/api/memory/enrich/:" in schema_file.read_text()

    with serve("runserver", env, tmp_path / "runserver.log", cwd=folder) as server:

        def call(method: str, path: str, body=None, **headers: str):
            return server.request(method, path, body, headers={**HTTPS, **headers})

        auth = {"Authorization": f"Token {token}"}
        # Plain HTTP is sent to HTTPS; no token, no memory.
        assert server.request("GET", "/api/memory/sessions/").status == 301
        refused = call("POST", "/api/memory/enrich/", {"question": {"text": "hi"}})
        assert refused.status == 401 and refused.json()["code"] == "not_authenticated"

        question = {"text": "Where is the Louvre?", "metadata": {"session_id": "chat-42"}}
        first = call("POST", "/api/memory/enrich/", {"question": question, "run_id": "run-1"}, **auth)
        assert first.status == 200, first.body
        assert first.json()["memory"]["status"] == "unchanged"
        answer = {"answer": {"text": "In Paris."}, "run_id": "run-1"}
        stored = call("POST", "/api/memory/store/", answer, **auth)
        assert stored.status == 200, stored.body
        assert stored.json()["memory"] == {"status": "stored", "session_id": "chat-42", "answer_count": 1}
        again = call("POST", "/api/memory/enrich/", {"question": question}, **auth)
        assert again.json()["memory"]["status"] == "enriched"
        assert again.json()["question"]["metadata"]["memory_context"] == {
            "answer_count": 1,
            "last_answer": "In Paris.",
        }
        schema = call("GET", "/api/schema/?format=json", **auth)
        assert schema.status == 200 and "/api/memory/enrich/" in schema.json()["paths"]
        assert call("GET", "/api/docs/", **auth).status == 200
        assert call("GET", "/admin/login/").status == 200

    if raw is not None:
        # The memory went to this Redis, under the superuser's owner.
        assert raw.get("rr:memory:~o:user:1~chat-42:last_answer") == b'"In Paris."'
    else:
        assert (folder / "db.sqlite3.memory-journal").is_dir()  # the crash journal, beside SQLite


def test_a_new_project_set_up_as_the_readmes_short_form(app_path, tmp_path):
    """The README's "Add it to your project" (three blocks) on a new project, then the
    README's curl example against it: the short form is enough to serve the API."""
    env = project_env(app_path)
    folder = tmp_path / "project"
    short = [readme_blocks.example("readme-settings")]
    new_project(folder, env, short, readme_blocks.example("readme-urls"))
    _, token = run_readme_commands(folder, env, readme_blocks.example("readme-commands"))
    with serve("runserver", env, tmp_path / "runserver.log", cwd=folder) as server:
        url = f"http://127.0.0.1:{server.port}"
        enriched, stored, again = readme_blocks.run_block(readme_blocks.example("readme-curl"), url, token)
    assert enriched["memory"] == {"status": "unchanged", "session_id": "chat-42", "keys": []}
    assert stored["memory"] == {"status": "stored", "session_id": "chat-42", "answer_count": 1}
    assert again["question"]["metadata"]["memory_context"] == {"answer_count": 1, "last_answer": "In Paris."}


def test_a_new_projects_swagger_ui_is_served_offline(app_path, tmp_path):
    """docs/install.md's "Swagger UI offline" lines: the docs page names no other host,
    and each script, stylesheet and icon it names is served by the project itself."""
    env = project_env(app_path)
    folder = tmp_path / "project"
    blocks = [readme_block(name) for name in ("settings", "embedded", "swagger-offline")]
    new_project(folder, env, blocks, readme_block("urls"))
    run_readme_commands(folder, env, readme_block("commands"))  # DEBUG on: runserver serves static files
    with serve("runserver", env, tmp_path / "runserver.log", cwd=folder) as server:
        page = server.request("GET", "/api/docs/")
        assert page.status == 200, page.body
        html = page.body.decode()
        assets = re.findall(r'(?:src|href)="([^"]+\.(?:js|css|png))"', html)
        assert len(assets) >= 3, html  # the bundle, the preset, the stylesheet
        assert not [url for url in assets if "//" in url], assets  # no CDN
        for url in assets:
            assert server.request("GET", url).status == 200, url
