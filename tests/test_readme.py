"""The README's curl examples work as written against the demo site."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token

README = Path(__file__).resolve().parent.parent / "README.md"


def curl_block(marker: str = "readme-curl") -> str:
    """The bash block after ``<!-- {marker}`` in the README."""
    text = README.read_text()
    return text.split(f"<!-- {marker}:")[1].split("```bash\n", 1)[1].split("```", 1)[0]


def run_block(block: str, url: str, token: str) -> list[Any]:
    """Run ``block`` against the live server at ``url``; each curl's JSON answer, in order."""
    script = block.replace("http://127.0.0.1:8000", url)
    # Each curl prints one JSON object; put them on lines of their own.
    script = script.replace("curl -s ", "echo; curl -s ")
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        env={**os.environ, "TOKEN": token},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return [json.loads(line) for line in result.stdout.split("\n") if line.strip()]


def promised(block: str) -> list[Any]:
    """What each curl's ``# -> ...`` comment promises, in the order of the curls: the JSON
    where the comment is JSON, else None (it abbreviates, or there is no comment)."""
    promises: list[Any] = []
    for command in block.split("\ncurl -s ")[1:]:
        lines = [line for line in command.splitlines() if line.startswith("#")]
        shown: list[str] = []
        for line in lines:
            if line.startswith("# -> "):
                shown = [line.removeprefix("# -> ")]
            elif shown and re.match(r"#\s{4,}\S", line):
                shown.append(line[1:].strip())
        try:
            promises.append(json.loads(" ".join(shown)) if shown else None)
        except ValueError:
            promises.append(None)
    return promises


def api_user() -> tuple[Any, str]:
    user = get_user_model().objects.create_superuser("admin", "admin@example.com", "change-me")
    return user, Token.objects.create(user=user).key


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_readme_curl_round_trip(live_server, transactional_db, store):
    user, token = api_user()
    enriched, stored, enriched_again = run_block(curl_block(), live_server.url, token)
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
    block = curl_block("readme-conversation-curl")
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
