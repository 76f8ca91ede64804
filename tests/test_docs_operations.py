"""The Operations page (docs/operations.md) and the Security model page (docs/security.md)
say what the app does.

Operations: every management command has a section that lists every option its parser
takes, and its example runs as the page shows it, as a subprocess of the demo site on a
new SQLite database; the crontab's and the systemd units' command lines parse; the health
examples are what a demo server answers; the LOGGING example logs the line shown.

Security: the table "What a caller sees" holds over HTTP, for two users of the demo's API.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import load_command_class
from django.db import OperationalError
from rest_framework.test import APIClient

from tests import readme_blocks
from tests.conftest import _free_port, memory_settings_for
from tests.embeddings_server import embeddings_server
from tests.readme_blocks import ROOT, example, promised, run_block, run_example
from tests.servers import demo_env, prepare_database, project_folder, serve
from tests.servers import run_bash as bash

OPERATIONS = ROOT / "docs" / "operations.md"
SECURITY = ROOT / "docs" / "security.md"
COMMANDS = ROOT / "persistent_memory" / "management" / "commands"
#: The demo's Redis address in the examples; the tests use their own server instead.
SHARED_REDIS = "redis://127.0.0.1:6379/0"
#: Options Django gives every command (the page names them once, for all).
DJANGO_OPTIONS = {
    "help",
    "version",
    "verbosity",
    "settings",
    "pythonpath",
    "traceback",
    "no_color",
    "force_color",
    "skip_checks",
}

#: What the examples run after: one owner with a session holding a value and a session
#: holding a conversation (the extraction worker stopped, so that the examples' own
#: memory_extract is what extracts).
SEED = """
from persistent_memory import get_store
store = get_store()
store.extraction_worker.stop()
owned = store.for_owner("user:42")
owned.create_session("chat-1")
owned.put("chat-1", "city", "Paris")
owned.add_messages("chat-2", [
    {"role": "user", "content": "I prefer window seats."},
    {"role": "assistant", "content": "Noted."},
])
"""


# --- The page's parts -----------------------------------------------------------------


def command_names() -> list[str]:
    """Every management command the app ships (a file of the commands folder)."""
    return sorted(path.stem for path in COMMANDS.glob("*.py") if not path.stem.startswith("_"))


def command_sections() -> dict[str, str]:
    """The text of each ``### `name` `` section of the Operations page, by command name."""
    text = OPERATIONS.read_text()
    found: dict[str, str] = {}
    for match in re.finditer(r"^### `(\w+)`\n(.*?)(?=^##)", text + "\n## end", re.S | re.M):
        found[match.group(1)] = match.group(2)
    return found


def parser_for(name: str) -> Any:
    """The argument parser of the app's command ``name``."""
    return load_command_class("persistent_memory", name).create_parser("manage.py", name)


def console(block: str) -> list[tuple[str, str]]:
    """The ``$ command`` lines of a console example, each with the output shown."""
    runs: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            runs.append((line.removeprefix("$ "), []))
        else:
            runs[-1][1].append(line)
    return [(command, "\n".join(shown).strip()) for command, shown in runs]


# --- Every command has its section, with every option ----------------------------------


def test_every_command_has_a_section_with_every_option_and_an_example():
    sections = command_sections()
    names = command_names()
    assert len(names) >= 11
    assert sorted(sections) == names, "a command without its section, or a section without its command"
    table = OPERATIONS.read_text().split("### What every command shares")[0]
    for name in names:
        assert f"[`{name}`](#{name})" in table, f"{name} is missing from the commands table"
        section = sections[name]
        assert f"<!-- example: ops-{name.removeprefix('memory_').replace('_', '-')} -->" in section, name
        shared = OPERATIONS.read_text().split("### What every command shares")[1].split("###")[0]
        for action in parser_for(name)._actions:
            if action.dest in DJANGO_OPTIONS:
                continue
            if not action.option_strings:
                assert f"`{action.metavar}`" in section, f"{name}: the argument {action.metavar}"
                continue
            for option in action.option_strings:
                # The common options are explained once, above; each section names them too.
                assert f"`{option}" in section, f"{name}: {option} is not in its section"
                assert action.dest not in ("json", "owner", "session") or f"`{option}" in shared


# --- The examples, run on the demo site --------------------------------------------------


def run_console(block: str, env: dict[str, str], cwd: Path, redis_url: str | None = None) -> None:
    """Run each command of a console example; its output is the one shown."""
    for command, shown in console(block):
        if redis_url is not None:
            assert command.count(SHARED_REDIS) == 1, command
            command = command.replace(SHARED_REDIS, redis_url)
        out = bash(command, env, cwd).stdout.strip()
        assert out == shown, f"{command}\n  page: {shown}\n  ran:  {out}"


def test_the_command_examples_on_the_demo_site(tmp_path, redis_url, redis_client):
    """The examples in the page's order, on one owner's two sessions: each prints what the
    page shows, and the memory backend's note goes to standard error."""
    env = project_folder(tmp_path)
    bash("python manage.py migrate -v0", env, tmp_path)
    bash(f"python manage.py shell --no-imports -c {shlex.quote(SEED)}", env, tmp_path)

    note = bash("python manage.py memory_sweep --dry-run", env, tmp_path).stderr
    assert example("ops-memory-note").strip() in note.splitlines()

    run_console(example("ops-sweep"), env, tmp_path)
    run_console(example("ops-summarize"), env, tmp_path)
    run_console(example("ops-mirror"), env, tmp_path)
    run_console(example("ops-extract"), env, tmp_path)
    # The memory extracted without an embedder is embedded once the demo has one.
    with embeddings_server() as server:
        with_embedder = {**env, "EMBEDDER_BASE_URL": server.url}
        run_console(example("ops-embed"), with_embedder, tmp_path)
        run_console(example("ops-consolidate"), with_embedder, tmp_path)
    run_console(example("ops-export"), env, tmp_path)
    assert len((tmp_path / "sessions.jsonl").read_text().splitlines()) == 2
    run_console(example("ops-import"), env, tmp_path)
    run_console(example("ops-export-memories"), env, tmp_path)
    memory = json.loads((tmp_path / "memories.jsonl").read_text())
    assert (memory["owner"], memory["content"]) == ("user:42", "I prefer window seats.")
    run_console(example("ops-import-memories"), env, tmp_path)
    run_console(example("ops-forget"), env, tmp_path)
    # Forgotten: user:7 holds nothing any more; user:42 still holds its sessions.
    left = bash("python manage.py memory_export --owner user:7", env, tmp_path).stdout
    assert left == ""
    assert len(bash("python manage.py memory_export --owner user:42", env, tmp_path).stdout.splitlines()) == 2

    # Redis: the two sessions imported there first, then the relayout's dry run.
    on_redis = {**env, "MEMORY_BACKEND": "redis", "REDIS_URL": redis_url}
    bash("python manage.py memory_import sessions.jsonl", on_redis, tmp_path)
    run_console(example("ops-relayout"), env, tmp_path, redis_url=redis_url)


def test_the_mcp_command_example(tmp_path):
    """The command as the page writes it serves the MCP tools over stdio."""
    import anyio
    from mcp import ClientSession, StdioServerParameters, stdio_client

    env = project_folder(tmp_path)
    bash("python manage.py migrate -v0", env, tmp_path)
    ((command, shown),) = console(example("ops-mcp"))
    assert shown == ""  # it prints nothing of its own: standard output is the protocol
    python, manage_py, *args = shlex.split(command)
    assert (python, manage_py) == ("python", "manage.py")
    params = StdioServerParameters(
        command=sys.executable, args=[str(tmp_path / "manage.py"), *args], env=env, cwd=str(tmp_path)
    )

    async def tools() -> set[str]:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            return {tool.name for tool in (await session.list_tools()).tools}

    names = anyio.run(tools)
    section = command_sections()["memory_mcp"]
    shown_tools = set(re.findall(r"`(\w+)`", section.split("Its tools are")[1].split("\n\n")[0]))
    assert shown_tools == names


# --- Scheduling: every command line is a real command with real options -----------------


def scheduled_commands() -> list[list[str]]:
    """The ``manage.py`` command lines of the page's crontab and systemd units, split."""
    lines: list[list[str]] = []
    for block in readme_blocks.blocks(OPERATIONS):
        if block.language == "cron":
            found = re.findall(r"python manage\.py ([^>\n]+?) >> ", block.text)
            assert len(found) == len(re.findall(r"^[^#\n]", block.text, re.M)) == 4
        elif block.language == "ini" and "ExecStart=" in block.text:
            found = re.findall(r"^ExecStart=\S+/python manage\.py (.+)$", block.text, re.M)
            assert len(found) == 1, block.text
        else:
            continue
        assert block.tag == "not-run", block.where
        lines += [shlex.split(line) for line in found]
    return lines


def test_the_crontab_and_the_systemd_units_run_real_commands():
    lines = scheduled_commands()
    assert len(lines) == 4 + 3  # four cron lines; the mirror, the summarizer and the sweep services
    names = set(command_names())
    for name, *args in lines:
        assert name in names, name
        options = parser_for(name).parse_args(args)  # an unknown option or value fails here
        assert options.json or options.watch is not None, (name, args)
    watching = {name: args for name, *args in lines if "--watch" in args}
    assert watching["memory_mirror"][:2] == ["--watch", "5"]
    assert "--conversations" in watching["memory_summarize"]
    # The timer starts the sweep's one-shot service, named alike.
    units = {
        re.match(r"# /etc/systemd/system/(\S+)", block.text).group(1): block.text
        for block in readme_blocks.blocks(OPERATIONS)
        if block.language == "ini"
    }
    assert "OnUnitActiveSec=10min" in units["memory-sweep.timer"]
    assert "Type=oneshot" in units["memory-sweep.service"]
    assert "memory_sweep" in units["memory-sweep.service"]


# --- Health -----------------------------------------------------------------------------


def shape(value: Any) -> Any:
    """``value``'s keys, all the way down (what the page shows of an answer's structure)."""
    return {key: shape(item) for key, item in value.items()} if isinstance(value, dict) else None


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_the_health_examples_on_a_demo_server(tmp_path):
    """Anyone gets the status; a staff token gets every part, as the page shows them."""
    env = demo_env(DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}")
    token = prepare_database(env)
    with serve("runserver", env, tmp_path / "server.log") as server:
        url = f"http://127.0.0.1:{server.port}"
        block = example("ops-health")
        anyone, staff = run_block(block, url, token)
        assert promised(block)[0] == anyone == {"status": "ok"}
        shown = json.loads(example("ops-health-staff"))
        assert shape(staff) == shape(shown)

        def same(part: dict[str, Any], page: dict[str, Any]) -> None:
            for key, value in page.items():
                if key == "latency_ms":  # this machine's figure
                    assert isinstance(part[key], float)
                elif isinstance(value, dict):
                    same(part[key], value)
                else:
                    assert part[key] == value, (key, part[key], value)

        same(staff, shown)
        check = example("ops-health-check")
        (answer,) = run_block(check, url, token)
        assert answer == json.loads(check.split("# -> ")[1])
        # A bad token is no 401 here: the status alone.
        assert server.request("GET", "/api/memory/health/", token="not-a-token").json() == {"status": "ok"}


# --- Logs -------------------------------------------------------------------------------


def test_the_logging_example_logs_the_line_shown(settings, capsys, db):
    """The LOGGING dict, configured as Django does, and a call that finds the database
    down: the line on standard error is the page's, with the request id of the 503."""
    from django.utils.log import configure_logging

    namespace: dict[str, Any] = {}
    run_example("ops-logging", namespace)
    settings.PERSISTENT_MEMORY = memory_settings_for("memory")
    client = APIClient()
    client.force_authenticate(get_user_model()(pk=1, username="ada"))

    def database_gone(request: Any) -> str:
        raise OperationalError("connection refused")

    capsys.readouterr()
    configure_logging(settings.LOGGING_CONFIG, namespace["LOGGING"])
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr("persistent_memory.api.views.resolve_owner", database_gone)
            patch.setattr("persistent_memory.api.views.drop_dead_connections", lambda: False)
            response = client.get("/api/memory/sessions/")
        logged = capsys.readouterr().err.splitlines()
    finally:
        with capsys.disabled():  # the project's handlers on the real stderr, as before
            configure_logging(settings.LOGGING_CONFIG, settings.LOGGING)
    assert response.status_code == 503
    request_id = response.json()["request_id"]
    shown = example("ops-logging-line").strip()
    page_id = re.search(r"request ([0-9a-f]{32})\)$", shown, re.M).group(1)
    assert logged == shown.replace(page_id, request_id).splitlines()
    assert logging.getLogger("persistent_memory").handlers != []  # put back as it was


# --- Security: what a caller sees ----------------------------------------------------------


def security_table() -> dict[str, str]:
    """The rows of the table "What a caller sees": the case -> the answer, as written."""
    text = SECURITY.read_text().split("## What a caller sees")[1].split("\n## ")[0]
    rows = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    cells = [[cell.strip() for cell in line.strip().strip("|").split(" | ")] for line in rows[1:]]
    return {case: answer for case, answer in cells}


def client_for(user: Any) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture
def two_users(db):
    make = get_user_model().objects.create_user
    return make("ada", password="pw-for-tests"), make("bob", password="pw-for-tests")


def test_another_owners_session_is_a_session_that_does_not_exist(configure, two_users):
    """Bob asks for Ada's session: every answer is, byte for byte, the one he gets for a
    session nobody has (asked before Ada made it, and after she deleted it), on each backend."""
    configure()
    ada, bob = (client_for(user) for user in two_users)
    asks = [
        ("get", "/api/memory/sessions/chat-1/"),
        ("get", "/api/memory/sessions/chat-1/memory/"),
        ("get", "/api/memory/sessions/chat-1/memory/city/"),
        ("get", "/api/memory/sessions/chat-1/history/"),
        ("get", "/api/memory/sessions/chat-1/messages/"),
        ("delete", "/api/memory/sessions/chat-1/"),
    ]

    def answers() -> list[tuple[int, bytes]]:
        return [(r.status_code, r.content) for r in (getattr(bob, m)(path) for m, path in asks)]

    nobody = answers()
    created = ada.post("/api/memory/sessions/", {"session_id": "chat-1"}, format="json")
    assert created.status_code == 201
    assert (
        ada.put("/api/memory/sessions/chat-1/memory/city/", {"value": "Paris"}, format="json").status_code
        == 200
    )
    adas = answers()
    assert adas == nobody
    assert {status for status, _ in adas} == {404}
    assert json.loads(adas[0][1]) == {"detail": json.loads(adas[0][1])["detail"], "code": "session_not_found"}
    assert "404 `session_not_found`" in security_table()["Another owner's session"]
    # Bob's listing is his own; Ada's session is untouched.
    assert bob.get("/api/memory/sessions/").json()["results"] == []
    assert ada.get("/api/memory/sessions/chat-1/memory/city/").json()["value"] == "Paris"
    assert ada.delete("/api/memory/sessions/chat-1/").status_code in (200, 204)
    assert answers() == nobody


def test_another_owners_memory_is_a_memory_that_does_not_exist(settings, two_users):
    settings.PERSISTENT_MEMORY = memory_settings_for("memory")
    ada, bob = (client_for(user) for user in two_users)
    made = ada.post("/api/memory/memories/", {"content": "Prefers tea.", "key": "drink"}, format="json")
    assert made.status_code == 201, made.content
    path = f"/api/memory/memories/{made.json()['id']}/"
    adas = bob.get(path)
    assert (adas.status_code, adas.json()["code"]) == (404, "memory_not_found")
    assert ada.delete(path).status_code in (200, 204)
    assert (bob.get(path).status_code, bob.get(path).content) == (404, adas.content)
    assert "404 `memory_not_found`" in security_table()["Another owner's memory"]


def test_no_credentials_and_no_owner(settings, two_users):
    """No credentials: 401 from the demo's token authentication. A resolver that finds no
    owner: 403 owner_required, nothing read or written."""
    settings.PERSISTENT_MEMORY = memory_settings_for("memory")
    table = security_table()
    anonymous = APIClient().get("/api/memory/sessions/")
    assert (anonymous.status_code, anonymous.json()["code"]) == (401, "not_authenticated")
    assert "401 `not_authenticated`" in table["No credentials, or wrong ones"]
    wrong = APIClient(HTTP_AUTHORIZATION="Token not-a-token").get("/api/memory/sessions/")
    assert (wrong.status_code, wrong.json()["code"]) == (401, "authentication_failed")
    assert "`authentication_failed`" in table["No credentials, or wrong ones"]
    settings.PERSISTENT_MEMORY = memory_settings_for(
        "memory", OWNER_RESOLVER="persistent_memory.owners.resolvers.tenant_user_owner"
    )
    ada = client_for(two_users[0])
    refused = ada.post("/api/memory/sessions/", {"session_id": "chat-1"}, format="json")
    assert (refused.status_code, refused.json()["code"]) == (403, "owner_required")
    assert "403 `owner_required`" in table["The resolver finds no owner"]


def test_a_full_quota_is_the_owners_own_answer(settings, two_users):
    settings.PERSISTENT_MEMORY = memory_settings_for("memory", MAX_SESSIONS_PER_OWNER=1)
    ada, bob = (client_for(user) for user in two_users)
    assert ada.post("/api/memory/sessions/", {"session_id": "a"}, format="json").status_code == 201
    full = ada.post("/api/memory/sessions/", {"session_id": "b"}, format="json")
    assert (full.status_code, full.json()["code"]) == (507, "capacity_exceeded")
    assert bob.post("/api/memory/sessions/", {"session_id": "a"}, format="json").status_code == 201
    assert "507 `capacity_exceeded`" in security_table()["Over the owner's quota"]


def test_over_the_rate_limit(settings, two_users, monkeypatch):
    from django.core.cache import cache

    from persistent_memory.api.throttling import OwnerRateThrottle

    settings.PERSISTENT_MEMORY = memory_settings_for(
        "memory",
        API_THROTTLE_CLASSES=["persistent_memory.api.throttling.OwnerRateThrottle"],
        API_THROTTLE_RATES={"persistent_memory": "2/min"},
    )
    monkeypatch.setattr(OwnerRateThrottle, "timer", lambda self: 1_000_000.0)  # one minute, held
    cache.clear()
    try:
        ada, bob = (client_for(user) for user in two_users)
        assert [ada.get("/api/memory/sessions/").status_code for _ in range(2)] == [200, 200]
        throttled = ada.post("/api/memory/sessions/", {"session_id": "late"}, format="json")
        assert (throttled.status_code, throttled.json()["code"]) == (429, "throttled")
        assert int(throttled["Retry-After"]) > 0
        assert ada.get("/api/memory/sessions/").status_code == 429
        assert bob.get("/api/memory/sessions/").status_code == 200  # a budget of its own
    finally:
        cache.clear()
    assert "429 `throttled`" in security_table()["Over the rate limit"]
    settings.PERSISTENT_MEMORY = memory_settings_for("memory")
    assert ada.get("/api/memory/sessions/").json()["results"] == []  # the refused POST wrote nothing


def test_an_unreachable_backend_shows_no_address_and_no_password(settings, two_users):
    """Redis gone: the caller reads a plain 503 with a request id; neither the address nor
    the password; staff read the address, still without the password, in health/."""
    password = "s3cret-redis-pw"
    port = _free_port()  # nothing listens there
    settings.PERSISTENT_MEMORY = {
        **memory_settings_for("redis", f"redis://:{password}@127.0.0.1:{port}/0"),
        "REDIS_SOCKET_TIMEOUT": 0.5,
    }
    ada = client_for(two_users[0])
    answer = ada.get("/api/memory/sessions/")
    body = answer.json()
    assert answer.status_code == 503 and body["code"] == "backend_unavailable"
    assert set(body) == {"detail", "code", "request_id"}
    assert answer["X-Request-ID"] == body["request_id"] and int(answer["Retry-After"]) > 0
    assert str(port) not in answer.content.decode() and password not in answer.content.decode()
    assert "503 `backend_unavailable`" in security_table()["The store unreachable"]
    health = APIClient().get("/api/memory/health/")
    assert (health.status_code, health.json()) == (503, {"status": "unavailable"})
    staff = get_user_model().objects.create_user("ops", is_staff=True)
    seen = client_for(staff).get("/api/memory/health/").json()
    assert f"127.0.0.1:{port}" in seen["backend"]["location"]
    assert password not in json.dumps(seen)


def test_a_bug_shows_no_traceback_and_no_internal_name(settings, two_users):
    settings.PERSISTENT_MEMORY = memory_settings_for("memory")
    ada = client_for(two_users[0])
    ada.raise_request_exception = False  # the exception is signalled, as to error trackers

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("internal_table_name at 10.0.0.5")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("persistent_memory.api.views.SessionPagination.paginate_sessions", broken)
        answer = ada.get("/api/memory/sessions/")
    body = answer.json()
    assert answer.status_code == 500
    assert body == {
        "detail": "A server error occurred.",
        "code": "server_error",
        "request_id": body["request_id"],
    }
    assert (
        "internal_table_name" not in answer.content.decode() and "RuntimeError" not in answer.content.decode()
    )
    assert "500 `server_error`" in security_table()["A bug in the server"]


def test_an_unknown_path_is_a_json_404(settings, two_users):
    settings.PERSISTENT_MEMORY = memory_settings_for("memory")
    answer = client_for(two_users[0]).get("/api/memory/no-such-thing/")
    assert (answer.status_code, answer.json()["code"]) == (404, "not_found")
    assert "404 `not_found`" in security_table()["A path the API does not have"]


def test_the_table_has_only_rows_these_tests_check():
    assert set(security_table()) == {
        "No credentials, or wrong ones",
        "The resolver finds no owner",
        "Another owner's session",
        "Another owner's memory",
        "Over the owner's quota",
        "Over the rate limit",
        "The store unreachable",
        "A bug in the server",
        "A path the API does not have",
    }
