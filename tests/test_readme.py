"""The README's curl round trip works as written against the demo site."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from rest_framework.authtoken.models import Token

README = Path(__file__).resolve().parent.parent / "README.md"


def curl_block() -> str:
    text = README.read_text()
    return text.split("<!-- readme-curl")[1].split("```bash\n", 1)[1].split("```", 1)[0]


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_readme_curl_round_trip(live_server, transactional_db, store):
    user = get_user_model().objects.create_superuser("admin", "admin@example.com", "change-me")
    token = Token.objects.create(user=user).key
    script = curl_block().replace("http://127.0.0.1:8000", live_server.url)
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
    enriched, stored, enriched_again = [
        json.loads(line) for line in result.stdout.split("\n") if line.strip()
    ]
    assert enriched["memory"]["status"] == "unchanged"
    assert stored["memory"] == {"status": "stored", "session_id": "chat-42", "answer_count": 1}
    assert enriched_again["memory"]["status"] == "enriched"
    assert enriched_again["question"]["metadata"]["memory_context"] == {
        "answer_count": 1,
        "last_answer": "In Paris.",
    }
    assert store.for_owner(f"user:{user.pk}").get("chat-42", "last_answer") == "In Paris."
