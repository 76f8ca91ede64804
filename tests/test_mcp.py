"""MCP: one owner's tools over stdio (``manage.py memory_mcp``) and over streamable HTTP
(the demo's ASGI entry point under uvicorn), driven by the SDK's own client.

The servers are real processes on the suite's own redis-server and a database file of
the test's: what one owner's server writes is read back through the store here, and
another owner's server does not see it.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, MCPError, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from persistent_memory.mcp.server import build_server
from tests.servers import ROOT, demo_env, manage, serve

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

TOOLS = {
    "get_context",
    "add_messages",
    "list_conversations",
    "search_memories",
    "add_memory",
    "delete_memory",
}

#: Migrates the database of ``DATABASE_URL`` and prints two users' API tokens.
TWO_USERS = """
from django.contrib.auth import get_user_model
from django.core.management import call_command
from rest_framework.authtoken.models import Token
call_command("migrate", verbosity=0)
for name in ("ada", "bob"):
    user = get_user_model().objects.create_user(name, password="pw-for-tests")
    print(user.pk, Token.objects.create(user=user).key)
"""

Session = Callable[[ClientSession], Awaitable[Any]]


def payload(result: Any) -> Any:
    """A successful tool result's value (its structured content, unwrapped)."""
    assert not result.is_error, result.content
    value = result.structured_content
    if isinstance(value, dict) and set(value) == {"result"}:
        return value["result"]
    return value if value is not None else json.loads(result.content[0].text)


def error_text(result: Any) -> str:
    """A failed tool result's text (the SDK's isError result)."""
    assert result.is_error, result
    return result.content[0].text


@pytest.fixture
def env(tmp_path: Path, redis_url: str, redis_client: Any) -> dict[str, str]:
    """The demo's environment on the suite's Redis (clean) and a fresh database."""
    return demo_env(
        DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}", MEMORY_BACKEND="redis", REDIS_URL=redis_url
    )


@pytest.fixture
def users(env: dict[str, str]) -> dict[str, tuple[str, str]]:
    """Two users of the demo's database: name -> (owner, API token)."""
    lines = manage(env, "shell", "--no-imports", "-c", TWO_USERS).split("\n")
    rows = [line.split() for line in lines if line.strip()][-2:]
    return {name: (f"user:{pk}", token) for name, (pk, token) in zip(("ada", "bob"), rows, strict=True)}


def over_stdio(env: dict[str, str], owner: str, body: Session) -> Any:
    """Run ``body`` with a client session on ``manage.py memory_mcp --owner owner``."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["manage.py", "memory_mcp", "--owner", owner],
        env=env,
        cwd=ROOT,
    )

    async def main() -> Any:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            return await body(session)

    return anyio.run(main)


def over_http(url: str, token: str | None, body: Session) -> Any:
    """Run ``body`` with a client session on the streamable HTTP endpoint at ``url``."""
    headers = {"Authorization": f"Token {token}"} if token else {}

    async def main() -> Any:
        async with (
            create_mcp_http_client(headers=headers) as http,
            streamable_http_client(url, http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            return await body(session)

    return anyio.run(main)


async def conversation_round(session: ClientSession) -> dict[str, Any]:
    """Every conversation tool once, and an error; what each answered."""
    listed = await session.list_tools()
    added = await session.call_tool(
        "add_messages",
        {
            "session_id": "chat-1",
            "messages": [
                {"role": "user", "content": "My name is Ada."},
                {"role": "assistant", "content": "Hello Ada."},
            ],
        },
    )
    context = await session.call_tool("get_context", {"session_id": "chat-1", "max_tokens": 1000})
    conversations = await session.call_tool("list_conversations", {"session_id": "chat-1"})
    missing = await session.call_tool("get_context", {"session_id": "no-such-session"})
    invalid = await session.call_tool(
        "add_messages", {"session_id": "bad id!", "messages": [{"role": "user", "content": "hi"}]}
    )
    empty = await session.call_tool("add_messages", {"session_id": "chat-1", "messages": []})
    return {
        "tools": {tool.name for tool in listed.tools},
        "added": payload(added),
        "context": payload(context),
        "conversations": payload(conversations),
        "missing": error_text(missing),
        "invalid": error_text(invalid),
        "empty": error_text(empty),
    }


async def read_context(session: ClientSession) -> Any:
    return await session.call_tool("get_context", {"session_id": "chat-1"})


async def memory_round(session: ClientSession) -> dict[str, Any]:
    """Every memory tool once, and an error; what each answered."""
    added = payload(
        await session.call_tool("add_memory", {"content": "Ada prefers tea to coffee.", "key": "drink"})
    )
    updated = payload(
        await session.call_tool(
            "add_memory",
            {"content": "Ada prefers green tea.", "key": "drink", "happened_at": "2024-06-01T12:00:00Z"},
        )
    )
    other = payload(
        await session.call_tool("add_memory", {"content": "Ada lives in London.", "type": "factual"})
    )
    found = payload(await session.call_tool("search_memories", {"query": "tea", "strategy": "keyword"}))
    said = {"query": "tea", "strategy": "keyword", "said_after": "2000-01-01T00:00:00Z"}
    since = payload(await session.call_tool("search_memories", said))
    before = payload(
        await session.call_tool(
            "search_memories", {**said, "said_after": None, "said_before": said["said_after"]}
        )
    )
    bad_time = error_text(await session.call_tool("search_memories", {**said, "said_after": "last May"}))
    # As of the first write's time (told to the millisecond: one more is still before the
    # update, a tool call later): what the drink memory said before the update.
    moment = datetime.fromisoformat(added["created_at"]) + timedelta(milliseconds=1)
    then = {"query": "tea", "strategy": "keyword", "as_of": moment.isoformat()}
    as_of = payload(await session.call_tool("search_memories", then))
    bad_as_of = error_text(await session.call_tool("search_memories", {**then, "as_of": "yesterday"}))
    deleted = payload(await session.call_tool("delete_memory", {"memory_id": other["id"]}))
    recent = payload(await session.call_tool("search_memories", {"query": "", "strategy": "recent"}))
    missing = error_text(await session.call_tool("delete_memory", {"memory_id": other["id"]}))
    bad_type = error_text(await session.call_tool("add_memory", {"content": "x", "type": "nonsense"}))
    return {
        "added": added,
        "updated": updated,
        "found": found,
        "deleted": deleted,
        "recent": recent,
        "missing": missing,
        "bad_type": bad_type,
        "since": since,
        "before": before,
        "bad_time": bad_time,
        "as_of": as_of,
        "bad_as_of": bad_as_of,
    }


async def memories_seen(session: ClientSession) -> Any:
    return payload(await session.call_tool("search_memories", {"query": "", "strategy": "recent"}))


def check_conversation_round(answers: dict[str, Any]) -> None:
    assert answers["tools"] == TOOLS
    assert [m["content"] for m in answers["added"]["messages"]] == ["My name is Ada.", "Hello Ada."]
    assert answers["context"]["messages"] == [
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": "Hello Ada."},
    ]
    assert answers["context"]["truncated"] is False
    [info] = answers["conversations"]
    assert info["conversation"] == "default"
    assert info["head"] == answers["added"]["head"]
    assert "session_not_found" in answers["missing"]
    assert "invalid_session_id" in answers["invalid"]
    assert "invalid_message" in answers["empty"]


def check_memory_round(answers: dict[str, Any]) -> None:
    assert answers["added"]["key"] == "drink"
    assert answers["added"]["source"] == "mcp"
    # The same key updated the memory: one row, the newer content.
    assert answers["updated"]["id"] == answers["added"]["id"]
    assert answers["updated"]["content"] == "Ada prefers green tea."
    assert [m["content"] for m in answers["found"]] == ["Ada prefers green tea."]
    assert "score" in answers["found"][0]
    assert [m["content"] for m in answers["recent"]] == ["Ada prefers green tea."]
    assert "memory_not_found" in answers["missing"]
    assert "invalid_memory" in answers["bad_type"]
    # Said since 2000: found; said before it: nothing; a time that is none: refused.
    assert [m["content"] for m in answers["since"]] == ["Ada prefers green tea."]
    assert answers["before"] == []
    assert "invalid_memory" in answers["bad_time"] and "said_after" in answers["bad_time"]
    # The update kept the old content as a version of the same memory, found as of then.
    assert answers["updated"]["happened_at"] == "2024-06-01T12:00:00Z"
    assert [(m["content"], m["superseded_by"]) for m in answers["as_of"]] == [
        ("Ada prefers tea to coffee.", answers["added"]["id"])
    ]
    assert "invalid_memory" in answers["bad_as_of"] and "as_of" in answers["bad_as_of"]


# The server itself, in this process ------------------------------------------------


def test_build_server_lists_the_tools_with_schemas() -> None:
    tools = {tool.name: tool for tool in anyio.run(build_server("user:1").list_tools)}
    assert set(tools) == TOOLS
    assert tools["add_messages"].input_schema["required"] == ["session_id", "messages"]
    assert tools["search_memories"].input_schema["properties"]["strategy"]["default"] == "hybrid"
    assert all(tool.description for tool in tools.values())


def test_build_server_leaves_the_root_logger_to_the_project() -> None:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    build_server("user:1")
    assert root.handlers == handlers
    assert root.level == level


def refuse_everyone(request: Any) -> None:
    """An OWNER_RESOLVER that resolves no owner."""
    return None


def asgi_scope(token: str | None, host: str = "127.0.0.1:8000") -> dict[str, Any]:
    headers = [(b"host", host.encode())]
    if token:
        headers.append((b"authorization", f"Token {token}".encode()))
    return {"type": "http", "method": "POST", "path": "/mcp/", "query_string": b"", "headers": headers}


# Transactional: the endpoint closes old connections, as a request does, outside any atomic block.
@pytest.mark.django_db(transaction=True)
def test_http_authentication_resolves_the_token_owner(settings: Any) -> None:
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from persistent_memory.mcp.http import Refused, _authenticate

    user = get_user_model().objects.create_user("ada", password="pw-for-tests")
    token = Token.objects.create(user=user).key
    assert _authenticate(asgi_scope(token)) == f"user:{user.pk}"
    with pytest.raises(Refused) as refused:
        _authenticate(asgi_scope(None))
    assert (refused.value.status, refused.value.code) == (401, "not_authenticated")
    user.is_active = False
    user.save()
    with pytest.raises(Refused) as refused:
        _authenticate(asgi_scope(token))
    assert (refused.value.status, refused.value.code) == (401, "authentication_failed")
    user.is_active = True
    user.save()
    # The API's resolver decides the owner: one that resolves none refuses the request.
    settings.PERSISTENT_MEMORY = {
        **getattr(settings, "PERSISTENT_MEMORY", {}),
        "OWNER_RESOLVER": ("tests.test_mcp.refuse_everyone"),
    }
    with pytest.raises(Refused) as refused:
        _authenticate(asgi_scope(token))
    assert (refused.value.status, refused.value.code) == (403, "owner_required")


def test_build_server_refuses_an_invalid_owner() -> None:
    from persistent_memory.exceptions import InvalidOwner

    with pytest.raises(InvalidOwner):
        build_server("bad owner ~")


# stdio -------------------------------------------------------------------------------


def test_stdio_conversation_tools_and_errors(env: dict[str, str], redis_store: Any) -> None:
    manage(env, "migrate", "--verbosity", "0")
    check_conversation_round(over_stdio(env, "user:1", conversation_round))
    # Written in the owner's namespace of the shared store, where the API finds it.
    stored = redis_store.for_owner("user:1").get_messages("chat-1")
    assert [m["content"] for m in stored["messages"]] == ["My name is Ada.", "Hello Ada."]
    assert redis_store.list_sessions() == []  # nothing in the unowned namespace


def test_stdio_owner_isolation(env: dict[str, str], redis_store: Any) -> None:
    manage(env, "migrate", "--verbosity", "0")
    redis_store.for_owner("user:1").add_messages("chat-1", [{"role": "user", "content": "secret"}])
    seen = over_stdio(env, "user:1", read_context)
    assert payload(seen)["messages"] == [{"role": "user", "content": "secret"}]
    unseen = over_stdio(env, "user:2", read_context)
    assert "session_not_found" in error_text(unseen)


def test_stdio_memory_tools_and_isolation(env: dict[str, str]) -> None:
    manage(env, "migrate", "--verbosity", "0")
    check_memory_round(over_stdio(env, "user:1", memory_round))
    assert [m["content"] for m in over_stdio(env, "user:1", memories_seen)] == ["Ada prefers green tea."]
    assert over_stdio(env, "user:2", memories_seen) == []


def test_stdio_command_refuses_an_invalid_owner(env: dict[str, str]) -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", "memory_mcp", "--owner", "bad owner"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode != 0 and "Invalid owner" in result.stderr
    assert "Invalid owner" in result.stderr


# streamable HTTP ---------------------------------------------------------------------


@pytest.fixture
def asgi_server(env: dict[str, str], users: Any, tmp_path: Path) -> Any:
    with serve("uvicorn", env, tmp_path / "uvicorn.log") as server:
        yield server


def test_http_conversation_tools_errors_and_isolation(asgi_server: Any, users: Any, redis_store: Any) -> None:
    url = f"http://127.0.0.1:{asgi_server.port}/mcp/"
    ada, ada_token = users["ada"]
    bob, bob_token = users["bob"]
    check_conversation_round(over_http(url, ada_token, conversation_round))
    stored = redis_store.for_owner(ada).get_messages("chat-1")
    assert len(stored["messages"]) == 2
    # Bob's token reaches Bob's namespace only: Ada's session is not there.
    assert "session_not_found" in error_text(over_http(url, bob_token, read_context))
    # And the path without its slash is the same endpoint.
    assert payload(over_http(url.rstrip("/"), ada_token, read_context))["messages"][0]["content"] == (
        "My name is Ada."
    )
    # The rest of the site is Django's as before.
    assert asgi_server.request("GET", "/api/memory/health/").status == 200


def test_http_needs_a_valid_token(asgi_server: Any) -> None:
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    }
    accept = {"Accept": "application/json, text/event-stream"}
    missing = asgi_server.request("POST", "/mcp/", initialize, headers=accept)
    assert missing.status == 401
    assert missing.json()["code"] == "not_authenticated"
    assert missing.headers["www-authenticate"] == "Token"
    wrong = asgi_server.request("POST", "/mcp/", initialize, token="not-a-token", headers=accept)
    assert wrong.status == 401
    assert wrong.json()["code"] == "authentication_failed"


def test_http_client_without_a_token_fails(asgi_server: Any) -> None:
    url = f"http://127.0.0.1:{asgi_server.port}/mcp/"
    # The SDK's client stops on the 401 with an MCP error (inside its task groups).
    with pytest.raises(ExceptionGroup) as raised:
        over_http(url, None, read_context)
    assert raised.group_contains(MCPError)
    assert '"POST /mcp/ HTTP/1.1" 401' in asgi_server.log


def test_http_refuses_a_host_not_allowed(asgi_server: Any, users: Any) -> None:
    _, token = users["ada"]
    refused = asgi_server.request("POST", "/mcp/", {}, token=token, headers={"Host": "evil.example"})
    assert refused.status == 400
    assert refused.json()["code"] == "disallowed_host"


def test_http_memory_tools_and_isolation(asgi_server: Any, users: Any) -> None:
    url = f"http://127.0.0.1:{asgi_server.port}/mcp/"
    answers = over_http(url, users["ada"][1], memory_round)
    check_memory_round(answers)
    assert over_http(url, users["bob"][1], memories_seen) == []

    # Bob cannot delete Ada's memory by its id: to him it does not exist.
    async def delete_adas(session: ClientSession) -> Any:
        return await session.call_tool("delete_memory", {"memory_id": answers["added"]["id"]})

    assert "memory_not_found" in error_text(over_http(url, users["bob"][1], delete_adas))
    assert [m["id"] for m in over_http(url, users["ada"][1], memories_seen)] == [answers["added"]["id"]]


def test_stdio_database_errors_are_tool_errors_and_the_server_goes_on(env: dict[str, str]) -> None:
    # No migrate: the memories' table is missing, as in a database that cannot be used.
    async def body(session: ClientSession) -> tuple[Any, Any]:
        failed = await session.call_tool("add_memory", {"content": "Ada prefers tea."})
        added = await session.call_tool(
            "add_messages", {"session_id": "chat-1", "messages": [{"role": "user", "content": "hi"}]}
        )
        return failed, added

    failed, added = over_stdio(env, "user:1", body)
    assert "database_unavailable" in error_text(failed)
    assert payload(added)["messages"][0]["content"] == "hi"


# Bounded servers: at most MCP_MAX_SERVERS owners' servers, least recently used evicted --


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_endpoint_evicts_the_least_recently_used_and_lets_busy_servers_finish(settings: Any) -> None:
    from persistent_memory.mcp.http import MCPEndpoint, Refused

    settings.PERSISTENT_MEMORY = {"MCP_MAX_SERVERS": 2, "MCP_SERVER_IDLE_SECONDS": None}
    endpoint = MCPEndpoint()

    async def main() -> None:
        with pytest.raises(Refused):  # no lifespan, no servers
            async with endpoint.serving("user:a"):
                pass
        async with endpoint.serve():
            async with endpoint.serving("user:a") as a:
                pass
            async with endpoint.serving("user:b") as b:
                async with endpoint.serving("user:a") as again:
                    assert again is a  # kept, now the most recently used
                async with endpoint.serving("user:c") as c:
                    # b was the least recently used (a was used since): evicted, though busy,
                    # it answers its request to the end.
                    assert endpoint.owners == ["user:a", "user:c"]
                    assert b.evicted and not b.stop.is_set() and endpoint.running == 3
            # Its last request done, b stops.
            await b.stopped.wait()
            assert endpoint.running == 2 and not a.stopped.is_set() and not c.stopped.is_set()
            async with endpoint.serving("user:d"):
                # a was the least recently used and idle: stopped before d started.
                assert a.stopped.is_set() and endpoint.owners == ["user:c", "user:d"]
                assert endpoint.running == 2
            async with endpoint.serving("user:b") as b2:
                assert b2 is not b and endpoint.owners == ["user:d", "user:b"] and endpoint.running == 2
        assert endpoint.running == 0

    anyio.run(main)


def test_endpoint_evicts_idle_servers(settings: Any) -> None:
    from persistent_memory.mcp.http import MCPEndpoint

    settings.PERSISTENT_MEMORY = {"MCP_MAX_SERVERS": 10, "MCP_SERVER_IDLE_SECONDS": 600}
    clock = Clock()
    endpoint = MCPEndpoint(clock=clock)
    endpoint.reap_every = 0.01  # the reaper looks often; the clock says who is idle

    async def main() -> None:
        async with endpoint.serve():
            async with endpoint.serving("user:a") as a:
                pass
            clock.now += 300
            async with endpoint.serving("user:b") as b:
                clock.now += 301  # a idle for 601 s; b busy all along
                with anyio.fail_after(10):
                    await a.stopped.wait()
                assert endpoint.owners == ["user:b"] and not b.evicted
            clock.now += 599
            assert await endpoint.evict_idle() == 0
            clock.now += 1
            assert await endpoint.evict_idle() == 1 and endpoint.owners == [] and endpoint.running == 0

    anyio.run(main)


#: Migrates the database of ``DATABASE_URL`` and prints the API tokens of users ``{names}``.
USERS = """
from django.contrib.auth import get_user_model
from django.core.management import call_command
from rest_framework.authtoken.models import Token
call_command("migrate", verbosity=0)
for name in {names!r}:
    user = get_user_model().objects.create_user(name, password="pw-for-tests")
    print(name, Token.objects.create(user=user).key)
"""


def test_http_serves_more_owners_than_it_keeps_servers_for(env: dict[str, str], tmp_path: Path) -> None:
    """Five owners through a server that keeps two owners' servers (tests/settings_mcp.py):
    every answer is the caller's own, an evicted owner comes back to their memories, and
    at no time do more than two session managers run (the endpoint's debug log says)."""
    names = ["ann", "ben", "cat", "dan", "eve"]
    env = {**env, "DJANGO_SETTINGS_MODULE": "tests.settings_mcp", "MEMORY_LOG_LEVEL": "DEBUG"}
    lines = manage(env, "shell", "--no-imports", "-c", USERS.format(names=names))
    tokens = dict(line.split() for line in lines.splitlines() if line.strip())
    assert set(tokens) == set(names)

    async def note(session: ClientSession, name: str) -> Any:
        payload(await session.call_tool("add_memory", {"content": f"The name is {name}.", "key": "name"}))
        return await memories_seen(session)

    with serve("uvicorn", env, tmp_path / "uvicorn.log") as server:
        url = f"http://127.0.0.1:{server.port}/mcp/"
        for name in names:
            seen = over_http(url, tokens[name], lambda session, name=name: note(session, name))
            assert [m["content"] for m in seen] == [f"The name is {name}."]
        # The first owners' servers were evicted: they are built again, and see their own.
        for name in names[:2]:
            seen = over_http(url, tokens[name], memories_seen)
            assert [m["content"] for m in seen] == [f"The name is {name}."]
        log = server.log
    events = [
        (line.split("MCP server of ")[1].split()[0], line.split()[-3], int(line.split("(")[-1].split()[0]))
        for line in log.splitlines()
        if "MCP server of " in line and (" started (" in line or " stopped (" in line)
    ]
    started = [owner for owner, what, _ in events if what == "started"]
    assert len(started) == 7, log  # five owners, then two of them again
    assert max(running for _, _, running in events) == 2, events
    assert sum(1 for _, what, _ in events if what == "stopped") >= 5


def test_stdio_search_finds_by_meaning_with_an_embedder(tmp_path: Path) -> None:
    """With the demo's EMBEDDER_BASE_URL (the stand-in embeddings server), the MCP search
    tool finds a memory by meaning, and another owner's search finds nothing of it."""
    from tests.embeddings_server import embeddings_server

    python, question = "I prefer Python over Java for scripting.", "Which language should I use?"

    async def add_and_ask(session: ClientSession) -> Any:
        await session.call_tool("add_memory", {"content": python})
        return payload(await session.call_tool("search_memories", {"query": question}))

    async def ask(session: ClientSession) -> Any:
        return payload(await session.call_tool("search_memories", {"query": question}))

    with embeddings_server() as server:
        env = demo_env(DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}", EMBEDDER_BASE_URL=server.url)
        manage(env, "migrate", "--verbosity", "0")
        found = over_stdio(env, "user:1", add_and_ask)
        assert found[0]["content"] == python and found[0]["score_parts"]["keyword"] is None
        assert found[0]["score_parts"]["semantic"] > 0.5
        assert over_stdio(env, "user:2", ask) == []
        assert {r["body"]["model"] for r in server.requests} == {"nomic-embed-text"}
