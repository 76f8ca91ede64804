"""docs/mcp.md holds: its tools table is the server's tools with their arguments, its two
client examples print what their ``# ->`` comments show when run as written (stdio on
the demo's ``manage.py memory_mcp``, HTTP on the demo's ASGI app under uvicorn with a real
token), and its errors table is what a tool call answers.

The demo runs on the embedded (memory) backend and a fresh SQLite database of the test's.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession

from persistent_memory.mcp.server import build_server
from tests import readme_blocks
from tests.servers import ROOT, demo_env, manage, serve
from tests.test_mcp import over_stdio, payload

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

PAGE = ROOT / "docs" / "mcp.md"
#: Where the HTTP example expects the site; the test's server is elsewhere.
EXAMPLE_URL = "http://127.0.0.1:8000"
#: A row of a Markdown table whose first cell is code: that code, and the other cells.
ROW = re.compile(r"^\| `([^`]+)` \| (.+) \|$")


def section(title: str) -> list[str]:
    """The lines of the page's section ``## title``, up to the next one."""
    lines = PAGE.read_text().splitlines()
    start = lines.index(f"## {title}") + 1
    end = next((i for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[start:end]


def table(title: str) -> list[tuple[str, list[str]]]:
    """The rows of the table in section ``title``: first cell's code, the other cells."""
    rows = [ROW.match(line) for line in section(title)]
    return [(row.group(1), [cell.strip() for cell in row.group(2).split(" | ")]) for row in rows if row]


def shown_argument(name: str, schema: dict[str, Any], required: list[str]) -> str:
    """How the page writes an argument: its name, or ``name=default`` (Python's spelling)."""
    if name in required:
        return name
    default = schema.get("default")
    return f"{name}={json.dumps(default) if isinstance(default, str) else repr(default)}"


def promised_lines(code: str) -> list[str]:
    """What a script's ``# -> `` comments say it prints, one line each, in order
    (``#     ...`` lines continue a comment)."""
    promises: list[str] = []
    continuing = False
    for line in code.splitlines():
        _, arrow, shown = line.partition("# -> ")
        if arrow:
            promises.append(shown.strip())
            continuing = True
        elif continuing and re.match(r"#\s{4,}\S", line.strip()):
            promises[-1] += " " + line.strip()[1:].strip()
        else:
            continuing = False
    return promises


def run_script(code: str, env: dict[str, str], tmp_path: Path) -> list[str]:
    """Run ``code`` as a script from the demo project's folder; the lines it printed."""
    script = tmp_path / "client.py"
    script.write_text(code)
    result = subprocess.run(
        [sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.splitlines()


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The demo's environment: the memory backend and a fresh SQLite database (its
    journal beside it, in the test's folder)."""
    return demo_env(DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}", MEMORY_BACKEND="memory")


def test_the_tools_table_is_the_servers_tools() -> None:
    """One row per tool the server registers, none more, with each tool's arguments in
    order, the optional ones with their defaults."""
    registered = {tool.name: tool for tool in anyio.run(build_server("user:1").list_tools)}
    rows = dict(table("The tools"))
    assert set(rows) == set(registered)
    for name, tool in registered.items():
        schema = tool.input_schema
        expected = [
            shown_argument(arg, arg_schema, schema.get("required", []))
            for arg, arg_schema in schema["properties"].items()
        ]
        arguments, description = rows[name]
        assert re.findall(r"`([^`]+)`", arguments) == expected, name
        assert description


#: Migrates the database and prints a user's primary key and API token.
ONE_USER = """
from django.contrib.auth import get_user_model
from django.core.management import call_command
from rest_framework.authtoken.models import Token
call_command("migrate", verbosity=0)
user = get_user_model().objects.create_user("ada", password="pw-for-tests")
print(user.pk, Token.objects.create(user=user).key)
"""


def test_the_stdio_client_example_and_the_errors_table(env: dict[str, str], tmp_path: Path) -> None:
    """The stdio example, as written, against ``manage.py memory_mcp`` of the demo; then
    each call of the errors table as another owner, who cannot touch user:42's memory."""
    manage(env, "migrate", "--verbosity", "0")
    code = readme_blocks.example("mcp-client-stdio")
    assert run_script(code, env, tmp_path) == promised_lines(code)

    rows = table("Errors")
    assert len(rows) >= 5

    async def calls(session: ClientSession) -> list[Any]:
        answers = []
        for call, _ in rows:
            tool, _, arguments = call.partition(" ")
            answers.append(await session.call_tool(tool, json.loads(arguments)))
        return answers

    for (call, [shown]), answer in zip(rows, over_stdio(env, "user:7", calls), strict=True):
        assert answer.is_error, call
        text = answer.content[0].text
        expected = re.fullmatch(r"`([^`]+)`(.*)", shown)
        assert expected, shown
        if expected.group(2):  # "(then the SDK's details)": the first line is shown
            assert text.startswith(expected.group(1) + "\n"), (call, text)
        else:
            assert text == expected.group(1), call

    # user:7's delete_memory of memory 1 answered memory_not_found, and left it to user:42.
    async def recent(session: ClientSession) -> Any:
        return payload(await session.call_tool("search_memories", {"query": "", "strategy": "recent"}))

    assert [(m["id"], m["owner"]) for m in over_stdio(env, "user:42", recent)] == [(1, "user:42")]


def test_the_http_client_example(env: dict[str, str], tmp_path: Path) -> None:
    """The HTTP example, as written but for the port, against the demo's ASGI app under
    uvicorn, with the API token of user 1 in ``MEMORY_TOKEN``."""
    pk, token = manage(env, "shell", "--no-imports", "-c", ONE_USER).split()[-2:]
    assert pk == "1"  # the example shows the owner user:1
    code = readme_blocks.example("mcp-client-http")
    assert code.count(EXAMPLE_URL) == 1 and "os.environ['MEMORY_TOKEN']" in code
    with serve("uvicorn", env, tmp_path / "uvicorn.log") as server:
        served = code.replace(EXAMPLE_URL, f"http://127.0.0.1:{server.port}")
        printed = run_script(served, {**env, "MEMORY_TOKEN": token}, tmp_path)
    assert printed == promised_lines(code)
