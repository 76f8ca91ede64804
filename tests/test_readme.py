"""The README's examples, and the docs' examples of the store, conversations, owners and
deployment, are true: each marked ``example:`` (tests/readme_blocks.py) is run here as
written, read from its file: the Python blocks in this
process on each backend, each ``# ->`` compared with what its statement returned; the
commands in a project folder of their own against demo server processes."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.cache import cache
from rest_framework.authtoken.models import Token

from persistent_memory import get_store
from tests import readme_blocks
from tests.conftest import _free_port, memory_settings_for
from tests.readme_blocks import promised, run_block, run_example, statement
from tests.servers import Server, project_folder, run_bash
from tests.test_outages import database_down  # noqa: F401 (a fixture)


def api_user() -> tuple[Any, str]:
    user = get_user_model().objects.create_superuser("admin", "admin@example.com", "change-me")
    return user, Token.objects.create(user=user).key


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_readme_curl_round_trip(live_server, transactional_db, store):
    user, token = api_user()
    enriched, stored, enriched_again = run_block(readme_blocks.example("readme-curl"), live_server.url, token)
    assert enriched["memory"]["status"] == "unchanged"
    assert stored["memory"] == {"status": "stored", "session_id": "chat-42", "answer_count": 1}
    assert enriched_again["memory"]["status"] == "enriched"
    assert enriched_again["question"]["metadata"]["memory_context"] == {
        "answer_count": 1,
        "last_answer": "In Paris.",
    }
    assert store.for_owner(f"user:{user.pk}").get("chat-42", "last_answer") == "In Paris."


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_readme_conversation_curl_session(live_server, transactional_db, store):
    """The two-turn chat with a tool call and a regenerated answer, and what its comments say."""
    user, token = api_user()
    block = readme_blocks.example("conversation-curl")
    answers = run_block(block, live_server.url, token)
    turn1, turn2, retry, thread, context, conversations = answers

    def seqs(body: dict[str, Any]) -> list[tuple[str, str | None, int]]:
        return [(m["id"], m["parent_id"], m["seq"]) for m in body["messages"]]

    assert turn1["head"] == "a1"
    assert seqs(turn1) == [
        ("sys", None, 1),
        ("q1", "sys", 2),
        ("call-1", "q1", 3),
        ("result-1", "call-1", 4),
        ("a1", "result-1", 5),
    ]
    first = turn1["messages"][0]
    assert (first["role"], first["content"], first["tokens"]) == ("system", "You are a travel assistant.", 9)
    assert turn1["messages"][2]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'
    assert (turn2["head"], seqs(turn2)) == ("a2", [("q2", "a1", 6), ("a2", "q2", 7)])
    assert (retry["head"], seqs(retry)) == ("a2-retry", [("a2-retry", "q2", 8)])
    ids = ["sys", "q1", "call-1", "result-1", "a1", "q2", "a2-retry"]
    assert [m["id"] for m in thread["messages"]] == ids
    assert context["truncated"] is True and context["tokens"] <= 50
    assert conversations["conversations"][0]["branch_count"] == 2
    # Every comment that shows a whole answer shows exactly what the server answered.
    promises = promised(block)
    assert len(promises) == len(answers)
    shown = [(promise, answer) for promise, answer in zip(promises, answers, strict=True) if promise]
    assert len(shown) == 2
    for promise, answer in shown:
        assert promise == answer
    # The old answer is kept, on its own branch.
    kept = store.for_owner(f"user:{user.pk}").get_messages("chat-7", leaf="a2")["messages"]
    assert [m["id"] for m in kept][-2:] == ["q2", "a2"]


def test_the_store_idempotency_and_lanes_examples(store, db):
    namespace: dict[str, Any] = {}
    run_example("store", namespace)
    assert store.get_history("chat-42")[-1]["op"] == "increment"
    run_example("idempotency", namespace)  # -> 2, -> 2 again
    assert store.get("chat-42", "turns") == 2  # applied once
    values = store.get_all("chat-42")
    lanes = run_example("lanes", namespace)
    question, enriched = statement(lanes, "question, outcome = lanes.enrich(")
    # The comments: every stored key is attached, "enriched"; the answer goes to the same session.
    assert question["metadata"]["memory_context"] == values and enriched["status"] == "enriched"
    answer, stored = statement(lanes, "answer, outcome = lanes.store(")
    assert answer["text"] == "In Paris."
    assert (stored["status"], stored["session_id"]) == ("stored", "chat-42")
    assert store.get("chat-42", "last_answer") == "In Paris." and store.get("chat-42", "answer_count") == 1


def test_the_conversations_example(store, db):
    namespace: dict[str, Any] = {}
    values = run_example("conversations", namespace)
    asked = namespace["asked"]
    assert (asked["conversation"], [m["content"] for m in asked["messages"]]) == (
        "default",
        ["What is the weather in Paris?"],
    )
    assert asked["head"] == asked["messages"][0]["id"]
    thread = values['store.get_messages("chat-7", limit=20)']
    assert [m["content"] for m in thread["messages"]] == ["What is the weather in Paris?", "18 C, sunny."]
    context = values['store.get_context("chat-7", max_tokens=4000)']
    assert context["messages"] == [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "18 C, sunny."},
    ]
    assert set(context) == {"conversation", "messages", "tokens", "truncated"}, context
    assert context["truncated"] is False and context["tokens"] > 0
    assert statement(values, "store.set_head(") == namespace["first"]


def test_the_rolling_summary_example(configure, db):
    """A chat past SUMMARIZE_AFTER_TOKENS, summarized once; then the README's call."""
    store = configure(CONTEXT_STRATEGY="rolling_summary", SUMMARIZER_WORKER=False).for_owner("user:42")
    store.add_messages("chat-7", [{"role": "system", "content": "You are a travel assistant."}])
    store.add_messages(
        "chat-7",
        [
            {"role": "user", "content": "Book a table in Paris! Two people, Friday at eight."},
            {"role": "assistant", "content": "Booked at Le Comptoir for Friday at 20:00."},
        ],
    )
    for day in range(1, 13):
        plans = " ".join(f"Stop {stop}: a museum, a park and a cafe by the river." for stop in range(20))
        store.add_messages(
            "chat-7",
            [
                {"role": "user", "content": f"What should we see on day {day}?"},
                {"role": "assistant", "content": f"Day {day}. {plans}"},
            ],
        )
    assert store.summarizer_worker.run_once().summarized == 1
    namespace = {"store": store}
    (window,) = run_example("rolling-summary", namespace).values()
    assert window["summary"].startswith("User: Book a table in Paris!\n")
    assert window["messages"][0] == {"role": "system", "content": "You are a travel assistant."}
    assert window["messages"][-1]["content"].startswith("Day 12.")
    assert (window["conversation"], window["truncated"], window["summary_state"]) == (
        "default",
        False,
        "healthy",
    )
    shown = readme_blocks.example("rolling-summary")
    assert f'"tokens": {window["tokens"]},' in shown
    assert set(window) == set(re.findall(r'"(\w+)":', shown))


def test_the_health_signal_example(configure, db):
    """The receiver pages once the summarizer is degraded (here after one failure)."""
    from tests.test_summaries_health import chat, health_settings

    store = configure(**health_settings("raise", SUMMARIZER_RETRY_ATTEMPTS=1))
    alerts: list[str] = []
    namespace: dict[str, Any] = {"alert": alerts.append}
    run_example("health-signal", namespace)
    from persistent_memory.conversations.signals import summarizer_health_changed

    try:
        chat(store, 6)
        store.summarizer_worker.run_once()
        assert store.summarizer_worker.health.record()["state"] == "degraded"
        assert alerts == ["Summaries degraded: RuntimeError: model overloaded"]
    finally:
        summarizer_health_changed.disconnect(namespace["page_on_degraded"])


def test_the_tenant_example(store, settings, db, monkeypatch):
    """The middleware and the resolver as the README writes them, over HTTP: the owner is
    the header's tenant and the user; without a tenant the request fails closed."""
    from rest_framework.test import APIClient

    namespace: dict[str, Any] = {}
    run_example("tenant-middleware", namespace)
    middleware = types.ModuleType("myproject.middleware")
    middleware.TenantFromHeader = namespace["TenantFromHeader"]
    monkeypatch.setitem(sys.modules, "myproject", types.ModuleType("myproject"))
    monkeypatch.setitem(sys.modules, "myproject.middleware", middleware)
    first, *added = namespace["MIDDLEWARE"]
    assert first is Ellipsis  # "...": the project's own middleware
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, *added]
    settings.PERSISTENT_MEMORY = {**settings.PERSISTENT_MEMORY, **namespace["PERSISTENT_MEMORY"]}
    user, token = api_user()
    client = APIClient(HTTP_AUTHORIZATION=f"Token {token}")
    created = client.post(
        "/api/memory/sessions/", {"session_id": "chat-1"}, format="json", HTTP_X_TENANT="acme"
    )
    assert created.status_code == 201, created.content
    assert get_store().for_owner(f"tenant:acme/user:{user.pk}").list_sessions() == ["chat-1"]
    refused = client.get("/api/memory/sessions/")
    assert (refused.status_code, refused.json()["code"]) == (403, "owner_required")


def test_the_throttling_example(settings, db, monkeypatch):
    """600 requests a minute per owner: the 601st within the minute answers 429 (the
    throttle's clock held still, so the minute does not depend on the machine's speed)."""
    from rest_framework.test import APIClient

    from persistent_memory.api.throttling import OwnerRateThrottle

    namespace: dict[str, Any] = {}
    run_example("throttling", namespace)
    settings.PERSISTENT_MEMORY = {**memory_settings_for("memory"), **namespace["PERSISTENT_MEMORY"]}
    monkeypatch.setattr(OwnerRateThrottle, "timer", lambda self: 1_000_000.0)
    cache.clear()
    _, token = api_user()
    client = APIClient(HTTP_AUTHORIZATION=f"Token {token}")
    answers = [client.get("/api/memory/sessions/").status_code for _ in range(600)]
    assert answers == [200] * 600
    throttled = client.get("/api/memory/sessions/")
    assert (throttled.status_code, throttled.json()["code"]) == (429, "throttled")
    assert int(throttled["Retry-After"]) > 0
    cache.clear()


def test_the_scaling_out_examples_work_on_a_real_cluster_and_sentinel(
    settings, redis_cluster_client, redis_cluster
):
    """Each settings dict of "Scaling out", pointed at our own servers (the addresses
    replaced; the password and database kept), passes the checks and stores and reads."""
    from persistent_memory import get_store
    from persistent_memory.checks import check_settings
    from tests.redis_topologies import SentinelServers

    text = readme_blocks.example("scaling-out")
    confs = []
    for part in text.split("\n\n# Sentinel:"):
        namespace: dict[str, Any] = {}
        readme_blocks.run_python(part if part.startswith("#") else "#" + part, namespace)
        confs.append(namespace["PERSISTENT_MEMORY"])
    cluster_conf, sentinel_conf = confs
    address = ":secret@10.0.0.5:7000"
    port = redis_cluster.url.rsplit(":", 1)[1].split("/")[0]
    sentinels = SentinelServers(password="secret")  # the example's password, on the data nodes
    sentinels.start()
    try:
        for conf in (
            {**cluster_conf, "REDIS_URL": cluster_conf["REDIS_URL"].replace(address, f"127.0.0.1:{port}")},
            {
                **sentinel_conf,
                "REDIS_SENTINELS": sentinels.sentinels,
                "REDIS_SENTINEL_SERVICE": sentinels.service,
            },
        ):
            settings.PERSISTENT_MEMORY = {**conf, "MIRROR_MODE": "off"}
            assert [m for m in check_settings() if m.is_serious()] == []
            store = get_store()
            store.create_session("example")
            store.put("example", "k", {"v": 1})
            assert store.get("example", "k") == {"v": 1}
    finally:
        sentinels.stop()


def test_the_exception_filter_example(settings):
    """With the README's line, a debug report shows neither the Redis password of the
    settings nor one in a local variable."""
    from django.views.debug import ExceptionReporter

    namespace: dict[str, Any] = {}
    run_example("exception-filter", namespace)
    settings.DEFAULT_EXCEPTION_REPORTER_FILTER = namespace["DEFAULT_EXCEPTION_REPORTER_FILTER"]
    password = secrets.token_hex(8)  # not in this file's source, which the report quotes
    settings.PERSISTENT_MEMORY = {"BACKEND": "redis", "REDIS_URL": f"redis://:{password}@127.0.0.1:1/0"}

    def connect(url: str) -> None:
        raise ConnectionError("Redis is not there")

    try:
        connect(settings.PERSISTENT_MEMORY["REDIS_URL"])
    except ConnectionError:
        report = ExceptionReporter(None, *sys.exc_info())
    text = report.get_traceback_text() + report.get_traceback_html()
    assert "127.0.0.1:1" in text and password not in text


# --- The commands, run as the README writes them, in a project folder of their own ---

#: The README's demo install (the app and its demo extra), which this suite's own
#: environment holds (requirements.txt, as .ci/run installs it, has that extra too):
#: reinstalling it under a running suite is no test's business.
INSTALL = 'python -m pip install -e ".[demo]" && '
SHARED_REDIS = "redis://127.0.0.1:6379/0"


def bash(script: str, env: dict[str, str], cwd: Path) -> str:
    """Run ``script`` as bash would, stopping at the first failure; its standard output."""
    return run_bash(script, env, cwd).stdout


def on_port(script: str, port: int) -> str:
    """``script``, whose last command is runserver, serving on ``port`` instead of 8000 (and
    without the autoreloader's second process)."""
    assert script.endswith("python manage.py runserver\n"), script
    return script.removesuffix("runserver\n") + f"runserver --noreload 127.0.0.1:{port}\n"


@contextmanager
def serving(command: Any, env: dict[str, str], cwd: Path, log_path: Path) -> Iterator[Server]:
    """The server ``command(port)`` starts (a list of arguments), until the block ends."""
    port = _free_port()
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            command(port), cwd=cwd, env=env, stdout=log, stderr=log, start_new_session=True
        )
    server = Server(port, log_path, process)
    try:
        deadline = time.monotonic() + 120  # a script may migrate first
        while True:
            assert process.poll() is None, f"the server exited:\n{server.log}"
            try:
                server.request("GET", "/api/memory/health/")
                break
            except OSError:
                assert time.monotonic() < deadline, f"the server did not start:\n{server.log}"
                time.sleep(0.2)
        yield server
    finally:
        os.killpg(process.pid, signal.SIGINT)  # the group it leads: bash and its runserver
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def runserver(script: str) -> Any:
    """The command that runs ``script``, whose last command is runserver, on a given port."""
    return lambda port: ["bash", "-c", on_port(script, port)]


def wait_for(condition: Any, what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_the_readmes_commands_on_the_demo_site(tmp_path, redis_url, redis_client, settings):
    """The README read top to bottom as a newcomer would run it: the demo site, a user and a
    token, the curl examples, the move to Redis, forgetting, the demo on Redis."""
    env = project_folder(tmp_path)
    demo = readme_blocks.example("demo-site")
    assert demo.startswith(INSTALL)
    with serving(runserver(demo.removeprefix(INSTALL)), env, tmp_path, tmp_path / "demo.log") as server:
        token = bash(readme_blocks.example("create-token") + 'echo "$TOKEN"\n', env, tmp_path).split()[-1]
        url = f"http://127.0.0.1:{server.port}"
        assert run_block(readme_blocks.example("readme-curl"), url, token)[1]["memory"]["answer_count"] == 1
        assert run_block(readme_blocks.example("conversation-curl"), url, token)[0]["head"] == "a1"

        # The mirror follows within a second: wait for it, as a reader between two commands does.
        def mirrored() -> bool:
            return server.request("GET", "/api/memory/owner/", token=token).json()["mirror_rows"] == 2

        wait_for(mirrored, "the mirror")
        moved = readme_blocks.example("export-import")
        assert moved.count(SHARED_REDIS) == 1
        bash(moved.replace(SHARED_REDIS, redis_url), env, tmp_path)
        assert len((tmp_path / "sessions.jsonl").read_text().splitlines()) == 2
        settings.PERSISTENT_MEMORY = memory_settings_for("redis", redis_url)
        assert sorted(get_store().for_owner("user:1").list_sessions()) == ["chat-42", "chat-7"]

        forget = readme_blocks.example("forget-curl")
        answers = run_block(forget, url, token)
        assert promised("\n" + forget) == answers
        assert run_block(forget, url, token)[2]["sessions"] == 0  # sent again: zeros

    on_redis = readme_blocks.example("demo-on-redis")
    assert on_redis.count(SHARED_REDIS) == 1
    with serving(
        runserver(on_redis.replace(SHARED_REDIS, redis_url)), env, tmp_path, tmp_path / "redis.log"
    ) as server:
        health = server.request("GET", "/api/memory/health/", token=token).json()
        assert health["backend"]["name"] == "redis"
        listed = server.request("GET", "/api/memory/sessions/", token=token).json()
        assert sorted(row["session_id"] for row in listed["results"]) == ["chat-42", "chat-7"]

    # Each command of the crontab, on the Redis deployment it is for.
    pages = readme_blocks.pages()
    (cron,) = [
        block.text for page in pages for block in readme_blocks.blocks(page) if block.language == "cron"
    ]
    commands = re.findall(r"cd /srv/app && (python manage\.py [\w -]+?) >> ", cron)
    assert len(commands) == len(re.findall(r"^[^#\n]", cron, re.M)) == 4
    on_redis_env = {**env, "MEMORY_BACKEND": "redis", "REDIS_URL": redis_url}
    for command in commands:
        assert isinstance(json.loads(bash(command, on_redis_env, tmp_path)), dict), command

    # The admin section's command: the same user, made again on this database once deleted.
    gone = "from django.contrib.auth.models import User; User.objects.filter(username='admin').delete()"
    bash(f'python manage.py shell --no-imports -c "{gone}"', env, tmp_path)
    bash(readme_blocks.example("admin-user"), env, tmp_path)
    check = "from django.contrib.auth.models import User; u = User.objects.get(username='admin'); "
    check += "print(u.is_superuser, u.check_password('change-me'))"
    assert bash(f'python manage.py shell --no-imports -c "{check}"', env, tmp_path).split() == [
        "True",
        "True",
    ]


def test_the_virtualenv_command(tmp_path):
    """The first command, in an empty folder: a virtualenv, active in the same shell."""
    venv = readme_blocks.example("venv")
    env = {key: value for key, value in os.environ.items() if key != "VIRTUAL_ENV"}
    prefix = bash(venv + 'python -c "import sys; print(sys.prefix)"\n', env, tmp_path)
    assert Path(prefix.strip()) == tmp_path / ".venv"


def test_the_mcp_examples(tmp_path, redis_url, redis_client):
    """A project whose asgi.py is the README's, on the suite's Redis; a desktop client
    started as its configuration says (paths: this interpreter and the project's
    manage.py) saves a memory for user:42, and a client given the project file's URL and
    header (the token of user 42) finds it over HTTP."""
    import anyio
    from mcp import ClientSession, StdioServerParameters, stdio_client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    env = {**project_folder(tmp_path), "MEMORY_BACKEND": "redis", "REDIS_URL": redis_url}
    desktop = json.loads(readme_blocks.example("mcp-stdio-config"))["mcpServers"]["memory"]
    http = json.loads(readme_blocks.example("mcp-http-config"))["mcpServers"]["memory"]
    token = http["headers"]["Authorization"].removeprefix("Token ")
    user = (
        "from django.contrib.auth import get_user_model; from rest_framework.authtoken.models import Token; "
        f"Token.objects.create(user=get_user_model().objects.create_user('ada', id=42), key='{token}')"
    )
    bash(f'python manage.py migrate -v0 && python manage.py shell --no-imports -c "{user}"', env, tmp_path)
    (tmp_path / "myproject").mkdir()
    (tmp_path / "myproject" / "__init__.py").write_text("")
    (tmp_path / "myproject" / "asgi.py").write_text(readme_blocks.example("mcp-asgi"))

    assert desktop["command"] == "/path/to/venv/bin/python"
    manage_py, *args = desktop["args"]
    assert manage_py == "/path/to/project/manage.py" and args == ["memory_mcp", "--owner", "user:42"]
    assert desktop["env"] == {"MEMORY_BACKEND": "redis", "REDIS_URL": SHARED_REDIS}
    params = StdioServerParameters(
        command=sys.executable,
        args=[str(tmp_path / "manage.py"), *args],
        env={**env, **desktop["env"], "REDIS_URL": redis_url},
    )

    async def save() -> Any:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            return await session.call_tool(
                "add_memory", {"content": "Prefers window seats.", "key": "travel.seat"}
            )

    saved = anyio.run(save)
    assert not saved.is_error, saved

    uvicorn = ["-m", "uvicorn", "--host", "127.0.0.1", "myproject.asgi:application"]
    with serving(
        lambda port: [sys.executable, *uvicorn, "--port", str(port)], env, tmp_path, tmp_path / "asgi.log"
    ) as server:
        assert http["type"] == "http" and http["url"] == "http://127.0.0.1:8000/mcp/"
        url = http["url"].replace("127.0.0.1:8000", f"127.0.0.1:{server.port}")

        async def find() -> Any:
            async with (
                create_mcp_http_client(headers=http["headers"]) as client,
                streamable_http_client(url, http_client=client) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                return await session.call_tool("search_memories", {"query": "", "strategy": "recent"})

        found = anyio.run(find)
        # The rest of the site is Django's, as before the wrapper.
        assert server.request("GET", "/api/memory/health/").json() == {"status": "ok"}
    assert not found.is_error, found
    from tests.test_mcp import payload

    assert [memory["content"] for memory in payload(found)] == ["Prefers window seats."]


def test_the_health_example_while_the_database_is_down(db, settings, redis_url, redis_client, database_down):  # noqa: F811
    """What staff see with the database down, on Redis with the deferred mirror: the
    README's answer, key for key, its statuses and codes as shown ("..." and the figures
    stand for this machine's)."""
    from django.db import connection
    from rest_framework.test import APIClient

    settings.PERSISTENT_MEMORY = memory_settings_for("redis", redis_url, MIRROR_MODE="deferred")
    staff = APIClient()
    staff.force_authenticate(get_user_model()(username="ops", is_staff=True))  # no database needed
    response = staff.get("/api/memory/health/")
    assert response.status_code == 503
    body, shown = response.json(), json.loads(readme_blocks.example("health-database-down"))

    def keys(value: Any) -> Any:
        return {key: keys(item) for key, item in value.items()} if isinstance(value, dict) else None

    assert keys(body) == keys(shown)
    assert body["backend"]["location"] == redis_url and shown["backend"]["location"] == SHARED_REDIS
    assert (body["database"]["vendor"], shown["database"]["vendor"]) == (connection.vendor, "postgresql")
    for part, key in [
        ("backend", "name"),
        ("backend", "status"),
        ("database", "alias"),
        ("database", "status"),
        ("database", "code"),
        ("mirror", "mode"),
        ("mirror", "status"),
    ]:
        assert body[part][key] == shown[part][key], (part, key)
    assert body["status"] == shown["status"] == "unavailable"
    # The suite's defaults: no rolling summaries, and the extraction worker off (conftest.py).
    assert (body["summarizer"], body["extraction"]) == (shown["summarizer"], shown["extraction"])
