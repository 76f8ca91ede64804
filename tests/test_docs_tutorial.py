"""The tutorial (docs/tutorial.md) followed end to end, as a reader would, in a project
folder fresh from ``django-admin startproject``: its settings, view and URLs written as
the page gives them, its commands run by bash, its server run by runserver, and its
model a local server speaking OpenAI's chat-completions protocol (tests/chat_server.py)
where the page says OpenAI's or Ollama's URL. Every answer is compared with what the
page shows; what the model was sent is read from the stand-in.

The two ``pip install`` lines cannot reach a package index here: their extras are
checked against pyproject.toml, and this environment has what they install (the app
itself is the checkout's, on ``PYTHONPATH``)."""

from __future__ import annotations

import http.cookiejar
import json
import os
import re
import shlex
import sqlite3
import sys
import tomllib
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from persistent_memory.models import LongTermMemory, MemoryConversation, MemoryMessage, MemorySession
from tests import readme_blocks
from tests.chat_server import ChatServer, Reply, chat_server
from tests.readme_blocks import ROOT
from tests.servers import run_bash
from tests.test_readme import runserver, serving, wait_for

pytest.importorskip("agents")

#: The scripted replies of the model, one per chat turn, in the order the page sends them.
REPLIES = [
    "Lisbon in May is lovely: warm days, long evenings and few crowds yet. Tell me what you "
    "like, and I will plan the week around it.",
    "Noted: small hotels with a garden. The Alfama and Principe Real have several, quiet and "
    "close to the sights.",
    "Start with the Alfama: the castle, the cathedral and the view from Santa Luzia. Then "
    "take tram 28 down to the Baixa for dinner.",
    "Go to Belem: the Jeronimos monastery, the tower and the pasteis de nata. Walk back along "
    "the river past the MAAT.",
    "The Miradouro da Senhora do Monte, above the Graca, has the best view at sunset. Come "
    "early: it fills up.",
    "The Casa do Conto is a small hotel with a garden near the Boavista. It is quiet and ten "
    "minutes from the old town.",
    "The Quinta do Rio, across the Douro in Gaia, has a garden on the river. It is small and "
    "quiet, and ten minutes by foot from the Ribeira.",
]


def project_env(folder: Path) -> dict[str, str]:
    """The environment of the reader's shell: this interpreter as ``python`` and
    ``django-admin`` (the virtualenv's), the checkout's app, and nothing of a model's."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    for name, command in [("python", ""), ("django-admin", " -m django")]:
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)}{command} "$@"\n')
        script.chmod(0o755)
    read = ("DJANGO_SETTINGS_MODULE", "DATABASE_URL", "REDIS_URL", "MEMORY_BACKEND", "DJANGO_DEBUG")
    env = {
        key: value for key, value in os.environ.items() if key not in read and not key.startswith("OPENAI")
    }
    return {**env, "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}", "PYTHONPATH": str(ROOT)}


def model_env(env: dict[str, str], model_url: str) -> dict[str, str]:
    """``env`` with the model's variables as the page exports them, its URL the stand-in's."""
    exported = dict(
        re.findall(r"(\w+)=(\S+)", readme_blocks.example("tutorial-model").removeprefix("export "))
    )
    assert exported.keys() == {"OPENAI_BASE_URL", "OPENAI_API_KEY", "CHAT_MODEL"}
    return {**env, **exported, "OPENAI_BASE_URL": model_url}


def test_the_install_lines_name_extras_that_bring_what_the_page_imports():
    venv, install = readme_blocks.example("tutorial-install").splitlines()
    assert venv == readme_blocks.example("venv").strip()  # the README's, run by the quickstart's test
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for line, package in [
        (install, "openai"),
        (readme_blocks.example("tutorial-agents-install"), "openai-agents"),
    ]:
        extra = re.fullmatch(
            r'python -m pip install "path/to/django-persistent-memory\[([\w-]+)\]"', line.strip()
        )
        assert extra, line
        assert any(requirement.startswith(f"{package}>") for requirement in extras[extra.group(1)]), line


def chat_answers(block: str, env: dict[str, str], cwd: Path, port: int) -> list[dict[str, Any]]:
    """The page's ``tutorial-token`` block, then ``block``, against the server on ``port``:
    each JSON answer, in order."""
    script = readme_blocks.example("tutorial-token") + block
    output = run_bash(script.replace("127.0.0.1:8000", f"127.0.0.1:{port}"), env, cwd).stdout
    return [json.loads(line) for line in output.splitlines() if line.strip()]


def shown(block: str) -> dict[str, Any]:
    """What a block's last ``# ->`` comment shows, its "..." standing for any value."""
    comment = " ".join(line.lstrip("# ->").strip() for line in block.splitlines() if line.startswith("#"))
    return json.loads(re.sub(r'"\.\.\."|\.\.\.', "null", comment.replace("\\n...", "")))


def rows(database: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with sqlite3.connect(database) as connection:
        return connection.execute(sql, args).fetchall()


class Browser:
    """A staff member's browser on the server: logs in through the admin's form."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.cookies = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.cookies))

    def get(self, path: str) -> str:
        with self.opener.open(self.base + path, timeout=30) as response:
            return response.read().decode()

    def log_in(self, username: str, password: str) -> None:
        form = self.get("/admin/login/?next=/admin/")
        csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form).group(1)
        body = urllib.parse.urlencode(
            {"csrfmiddlewaretoken": csrf, "username": username, "password": password, "next": "/admin/"}
        ).encode()
        request = urllib.request.Request(self.base + "/admin/login/?next=/admin/", data=body)
        request.add_header("Referer", self.base + "/admin/login/")
        with self.opener.open(request, timeout=30) as response:
            assert "Log out" in response.read().decode() or response.url.endswith("/admin/")


def test_the_tutorial_end_to_end(tmp_path: Path) -> None:
    folder = tmp_path / "tutorial"
    folder.mkdir()
    with chat_server() as model:
        model.replies = [Reply(text) for text in REPLIES]
        follow_the_page(folder, project_env(tmp_path), model)


def follow_the_page(folder: Path, env: dict[str, str], model: ChatServer) -> None:
    """The page's steps in order: the server's terminal has the model's variables (step
    4), the other commands' shell has none (a ``manage.py`` command needs no key)."""
    # 1-2: the project, its app and the settings.
    run_bash(readme_blocks.example("tutorial-startproject"), env, folder)
    settings = folder / "chatbot" / "settings.py"
    settings.write_text(settings.read_text() + "\n" + readme_blocks.example("tutorial-settings"))
    # 3: the view and its URL.
    (folder / "chat" / "views.py").write_text(readme_blocks.example("tutorial-view"))
    urls = folder / "chatbot" / "urls.py"
    urls.write_text(urls.read_text() + "\n" + readme_blocks.example("tutorial-urls"))
    # 4: the tables, Ada, the server.
    run_bash(readme_blocks.example("tutorial-migrate"), env, folder)
    database = folder / "db.sqlite3"
    serve = readme_blocks.example("tutorial-serve")
    served = model_env(env, model.url)
    with serving(runserver(serve), served, folder, folder / "runserver.log") as server:
        port = server.port
        # 5: the first turn, as shown.
        first_block = readme_blocks.example("tutorial-first-turn")
        (first,) = chat_answers(first_block, env, folder, port)
        assert first == {**shown(first_block), "reply": REPLIES[0]}
        sent = model.requests[-1]["body"]
        assert sent["model"] == served["CHAT_MODEL"]
        assert sent["messages"] == [
            {"role": "system", "content": "You are a travel assistant. Answer in two sentences."},
            {"role": "user", "content": "Hello, I am planning a week in Lisbon in May."},
        ]

        # The more turns; before the last, the reader's pause in which the summarizer works.
        more = readme_blocks.example("tutorial-more-turns")
        commands = [line for line in more.splitlines() if line.startswith("chat ")]
        assert len(commands) == 4
        answers = chat_answers("\n".join(commands[:3]) + "\n", env, folder, port)
        assert [answer["reply"] for answer in answers] == REPLIES[1:4]
        conversations = MemoryConversation._meta.db_table
        wait_for(
            lambda: rows(database, f"SELECT summary FROM {conversations} WHERE summary != ''"),  # noqa: S608
            "the rolling summary",
        )
        # The fact, extracted by the worker from the second turn.
        memories = LongTermMemory._meta.db_table
        fact = "I prefer small hotels with a garden."
        wait_for(lambda: rows(database, f"SELECT 1 FROM {memories} WHERE content = ?", fact), "the fact")  # noqa: S608

        (sunset,) = chat_answers(commands[3] + "\n", env, folder, port)
        promised = shown(more)
        assert sunset["reply"] == REPLIES[4] and sunset["memories"] == promised["memories"] == []
        assert sunset["window"]["truncated"] is promised["window"]["truncated"] is False
        shown_summary = promised["window"]["summary"].split("\n")
        summary = sunset["window"]["summary"].split("\n")
        assert summary[0] == shown_summary[0] and summary[1].startswith("Assistant: ")
        assert summary[2] == shown_summary[2] == "User: " + fact
        # The model was sent the summary, then the turns after it: the summary's last user
        # line is the turn before the window's first.
        sent = model.requests[-1]["body"]["messages"]
        assert sent[1] == {
            "role": "system",
            "content": "Earlier in this chat: " + sunset["window"]["summary"],
        }
        assert sent[-1] == {"role": "user", "content": "Which of those places is best at sunset?"}
        assert "I am planning" not in json.dumps(sent[2:])

        # 6: a second conversation recalls the fact.
        second_block = readme_blocks.example("tutorial-second-chat")
        (second,) = chat_answers(second_block, env, folder, port)
        assert second == {**shown(second_block), "reply": REPLIES[5]}
        sent = model.requests[-1]["body"]["messages"]
        # The fact, then what the assistant said in the other chat, with its date.
        header, first_line, said = sent[1]["content"].split("\n")
        assert sent[1]["role"] == "system" and header.startswith("What you know about the user")
        assert first_line == f"- {fact}" and said.endswith(f" assistant: {REPLIES[1]}")

        # 7: the admin shows the chats, the transcript, the summary and the memory.
        browser = Browser(f"http://127.0.0.1:{port}")
        browser.log_in("ada", "change-me")
        sessions = MemorySession._meta.db_table
        wait_for(lambda: len(rows(database, f"SELECT 1 FROM {sessions}")) == 2, "the mirror")  # noqa: S608
        listed = browser.get("/admin/persistent_memory/memorysession/")
        assert "lisbon" in listed and "porto" in listed and "user:1" in listed
        (pk,) = rows(database, f"SELECT id FROM {sessions} WHERE session_id = 'lisbon'")[0]  # noqa: S608
        page = browser.get(f"/admin/persistent_memory/memorysession/{pk}/change/")
        assert "Which of those places is best at sunset?" in page and "rolling summary" in page
        assert fact in browser.get("/admin/persistent_memory/longtermmemory/")
        # The memory's page: its source, and the id of the message it came from.
        messages = MemoryMessage._meta.db_table
        ((told,),) = rows(database, f"SELECT message_id FROM {messages} WHERE content_text = ?", fact)  # noqa: S608
        ((memory_pk, source, source_messages),) = rows(
            database,
            f"SELECT id, source, source_messages FROM {memories} WHERE content = ?",  # noqa: S608
            fact,
        )
        assert (source, json.loads(source_messages)) == ("extraction", [told])
        memory_page = browser.get(f"/admin/persistent_memory/longtermmemory/{memory_pk}/change/")
        assert told in memory_page and re.search(r'class="readonly">\s*extraction\s*<', memory_page)

    # 8: the agent, on the same chat after a restart.
    (folder / "chat" / "agent.py").write_text(readme_blocks.example("tutorial-agent"))
    urls.write_text(urls.read_text() + "\n" + readme_blocks.example("tutorial-agent-urls"))
    with serving(runserver(serve), served, folder, folder / "restarted.log") as server:
        block = readme_blocks.example("tutorial-agent-turn")
        (answer,) = chat_answers(block, env, folder, server.port)
        assert answer == {**shown(block), "reply": REPLIES[6]}
    sent = model.requests[-1]["body"]["messages"]
    # Ada's fact, and what was said in her other chat; nothing of this one (the session has it).
    instructions, known = sent[0]["content"].split(
        "\nWhat you know about the user from earlier conversations:\n"
    )
    assert sent[0]["role"] == "system" and f"- {fact}" in known.split("\n")
    assert "Porto" not in known and "Casa do Conto" not in known
    assert [message["content"] for message in sent[1:]] == [
        "Can you suggest a hotel in Porto?",
        REPLIES[5],
        "Is there one with a garden by the river?",
    ]
    # The agent's turn is in the chat's conversation, after the view's (its answer as the
    # SDK gives it: content parts).
    thread = run_bash(
        "python manage.py shell --no-imports -c "
        + shlex.quote(
            "import json; from persistent_memory import get_store; "
            "print(json.dumps(get_store().for_owner('user:1').get_messages('porto')['messages']))"
        ),
        env,
        folder,
    ).stdout
    contents = [
        message["content"] if isinstance(message["content"], str) else message["content"][0]["text"]
        for message in json.loads(thread)
    ]
    assert contents == [
        "Can you suggest a hotel in Porto?",
        REPLIES[5],
        "Is there one with a garden by the river?",
        REPLIES[6],
    ]
