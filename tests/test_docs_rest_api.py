"""The REST API page (docs/rest-api.md) is true: its curl examples, run in page order
against one live server on each store backend, answer what their ``# ->`` comments show,
and together they call every endpoint of ``persistent_memory.api.urls`` with every
method its view accepts.

A comment that is JSON is compared exactly; one with ``...`` shows part of the answer
(``readme_blocks.literal`` and ``readme_blocks.matches``: the keys it shows, with their
values, and ``...`` for whatever is there). A curl written with ``-w ' %{http_code}\\n'``
prints its status after the body, and its comment ends with that status."""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pytest
from django.contrib.auth import get_user_model
from django.urls import URLPattern, resolve
from rest_framework.authtoken.models import Token

from memory_site import settings as demo_settings
from persistent_memory.api import urls as api_urls
from tests import readme_blocks
from tests.readme_blocks import DOCS

PAGE = DOCS / "rest-api.md"
#: Where the examples are written to send their requests.
DEMO = "http://127.0.0.1:8000"
API = "/api/memory/"
METHODS = ("get", "post", "put", "patch", "delete")
#: The page's curl examples, in page order.
EXAMPLES = (
    "rest-lanes",
    "rest-sessions",
    "rest-values",
    "rest-history",
    "rest-conversations",
    "rest-memories",
    "rest-owner",
    "rest-health",
    "rest-errors",
    "rest-idempotency",
    "rest-schema",
)
#: The demo site's settings that its answers show (the sessions' expiry).
DEMO_EXPIRY = ("SESSION_TTL_HOURS", "SESSION_IDLE_TTL_SECONDS")


@dataclass
class Curl:
    """One curl command of an example: the block it is in, its text (continuation lines
    joined), and what its comment promises (None when it has no ``# ->`` comment)."""

    example: str
    command: str
    promise: str | None

    @property
    def words(self) -> list[str]:
        return shlex.split(self.command)

    @property
    def method(self) -> str:
        """``-X METHOD``; else POST with a body, GET without (as curl does)."""
        words = self.words
        if "-X" in words:
            return words[words.index("-X") + 1].lower()
        return "post" if {"-d", "--data", "--data-binary"} & set(words) else "get"

    @property
    def path(self) -> str:
        (url,) = [word for word in self.words if word.startswith(DEMO)]
        return urlsplit(url).path

    @property
    def shown(self) -> tuple[str, int | None]:
        """The promised body's text, and the status shown after it (None: not shown)."""
        assert self.promise is not None
        found = re.fullmatch(r"(.*\S)\s+(\d{3})", self.promise)
        return (found.group(1), int(found.group(2))) if found else (self.promise, None)


def curls() -> list[Curl]:
    """Every curl of the page's ``rest-*`` examples, in page order."""
    found: list[Curl] = []
    for name in EXAMPLES:
        lines = readme_blocks.example(name).splitlines()
        index = 0
        while index < len(lines):
            if not lines[index].startswith("curl "):
                index += 1
                continue
            # The command's lines: up to its comment (a body may span lines inside its quotes).
            command = [lines[index]]
            index += 1
            while index < len(lines) and lines[index].strip() and not lines[index].startswith(("#", "curl ")):
                command.append(lines[index])
                index += 1
            shown: list[str] = []
            while index < len(lines) and lines[index].startswith("#"):
                line = lines[index]
                if not shown and line.startswith("# -> "):
                    shown = [line.removeprefix("# -> ")]
                elif shown and re.match(r"#\s{4,}\S", line):
                    shown.append(line[1:].strip())
                index += 1
            found.append(Curl(name, "\n".join(command), " ".join(shown) if shown else None))
    return found


def partial(text: str) -> Any:
    """A promise that abbreviates, read as ``readme_blocks.literal`` reads one (``...`` for
    anything; ``{"a": 1, ...}`` a dict shown in part), and ``{...}`` for any value too."""
    text = text.replace("{...}", "...")
    # literal() reads the longest literal the text starts with: here it must be the whole text.
    whole = re.sub(r"\bnull\b", "None", re.sub(r"\bfalse\b", "False", re.sub(r"\btrue\b", "True", text)))
    ast.literal_eval(whole.replace(", ...}", ', "...": ...}'))
    return readme_blocks.literal(text)


def as_json(value: Any) -> Any:
    """``value`` with whole floats as ints: JSON has one kind of number, and a backend may
    answer ``604800.0`` where another answers ``604800``."""
    if isinstance(value, dict):
        return {key: as_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [as_json(item) for item in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def run(curl: Curl, url: str, tokens: dict[str, str]) -> tuple[Any, int | None]:
    """Run ``curl`` as written against ``url``; its JSON answer and the status it printed."""
    printed = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", curl.command.replace(DEMO, url)],
        env={**os.environ, **tokens},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    answer, end = json.JSONDecoder().raw_decode(printed)
    rest = printed[end:].strip()
    return as_json(answer), int(rest) if rest else None


def api_user() -> tuple[Any, str]:
    user = get_user_model().objects.create_superuser("admin", "admin@example.com", "change-me")
    return user, Token.objects.create(user=user).key


def test_the_page_has_these_examples():
    marked = [block.value for block in readme_blocks.blocks(PAGE) if block.tag == "example"]
    assert [name for name in marked if name.startswith("rest-")] == list(EXAMPLES)


def test_every_curl_has_its_answer_and_one_json_value():
    """Each curl shows what it answers, and prints one JSON value (and maybe its status)."""
    found = curls()
    assert len(found) > 30
    for curl in found:
        assert curl.command.startswith("curl -s "), curl.command
        assert curl.promise, f"{curl.example}: no '# ->' answer after\n{curl.command}"
        # A token with each, but where the path is open to all, and for the 401.
        token = '-H "Authorization: Token $' in curl.command
        unauthorized = curl.shown[1] == 401
        assert token or unauthorized or curl.path in (f"{API}health/", "/api/schema/"), curl.command
        assert not (token and unauthorized), curl.command
        if "-d" in curl.words:
            assert "Content-Type: application/json" in curl.command, curl.command
        written = "-w" in curl.words
        assert written == (curl.shown[1] is not None), (
            f"status shown only where curl prints it: {curl.command}"
        )


def view_methods(pattern: URLPattern) -> set[str]:
    """The methods the pattern's view answers: allowed and defined."""
    view = pattern.callback.view_class
    return {method for method in METHODS if method in view.http_method_names and hasattr(view, method)}


def test_every_endpoint_and_method_has_a_curl():
    called = {(resolve(curl.path).url_name, curl.method) for curl in curls() if curl.path.startswith(API)}
    called.discard(("not-found", "get"))  # the error example of a path without its slash
    expected = {
        (pattern.name, method)
        for pattern in api_urls.urlpatterns
        if pattern.name != "not-found"
        for method in view_methods(pattern)
    }
    assert expected - called == set(), "endpoints and methods the page has no curl for"
    assert called <= expected, called - expected


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_the_examples_answer_as_shown(
    live_server, transactional_db, django_db_reset_sequences, store, configure
):
    """Every example in page order against one server, on each backend, with the demo
    site's session expiry (the page shows its answers); ids start at 1 as in a fresh
    database."""
    configure(**{name: demo_settings.PERSISTENT_MEMORY[name] for name in DEMO_EXPIRY})
    _, token = api_user()
    # Another user: the owner scoping's example asks for a session of the first one.
    other = get_user_model().objects.create_user("guest", "guest@example.com", "change-me")
    tokens = {"TOKEN": token, "OTHER_TOKEN": Token.objects.create(user=other).key}
    wrong: list[str] = []
    for curl in curls():
        answer, status = run(curl, live_server.url, tokens)
        text, shown_status = curl.shown
        try:
            exact = as_json(json.loads(text))
        except ValueError:
            right = readme_blocks.matches(as_json(partial(text)), answer)
        else:
            right = exact == answer
        if not right or status != shown_status:
            wrong.append(
                f"{curl.example}: {curl.command}\n  shown:    {curl.promise}\n"
                f"  answered: {json.dumps(answer)}{'' if status is None else f' {status}'}"
            )
    assert not wrong, "\n\n".join(wrong)
