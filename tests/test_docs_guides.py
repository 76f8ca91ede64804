"""The newcomer's pages of the site (docs/quickstart.md and the guides) say what happens:
the quickstart's Python example on each backend, and its commands run as a newcomer
would, in a project folder of their own against a demo server process.

The guides' other examples are run where the code they show is tested
(tests/test_readme.py, tests/test_memories.py, the OpenAI summarizer and extractor tests).
"""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path
from typing import Any

import pytest

from persistent_memory.memories import memories_for
from persistent_memory.store import MemoryStore
from tests import readme_blocks
from tests.servers import project_folder, run_bash
from tests.test_readme import bash, runserver, serving

#: The install command the quickstart shares with the README (the suite's own environment
#: has what it installs, and a test cannot reach the package index).
INSTALL = "python -m pip install -r requirements.txt\n"


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
