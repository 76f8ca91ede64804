"""The fenced code blocks of the README and of the documentation site (docs/), found by
the marker comment before each, and a way to run a Python block statement by statement so that
what each ``# ->`` comment promises can be compared with what the statement returned.

A marker is the HTML comment on the last non-blank line before a block:
``<!-- example: NAME -->`` (a test reads the block by name and runs it) or ``<!-- not-run:
REASON -->`` (a command no test can run: a fresh machine's install, a crontab)."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"


def pages() -> list[Path]:
    """The README and every page of the documentation site."""
    return [README, *sorted(DOCS.rglob("*.md"))]


FENCE = re.compile(r"^( *)```(\w*)\s*$")
MARKER = re.compile(r"^\s*<!--\s*([\w-]+):\s*(.*?)\s*-->\s*$")


@dataclass
class Block:
    """One fenced block: its language, its text (the list item's indent removed), the
    line its fence opens on, and its marker's tag and value (``None`` when it has none)."""

    path: Path
    line: int
    language: str
    text: str
    tag: str | None
    value: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks(path: Path = README) -> list[Block]:
    """Every fenced block of the Markdown file at ``path``, in order."""
    lines = path.read_text().splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening or not opening.group(2):
            index += 1
            continue
        indent, language = opening.groups()
        end = index + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        assert end < len(lines), f"{path.name}:{index + 1}: a fence that is never closed"
        body = [line.removeprefix(indent) for line in lines[index + 1 : end]]
        before = next((line for line in reversed(lines[:index]) if line.strip()), "")
        marker = MARKER.match(before)
        tag, value = marker.groups() if marker else (None, "")
        found.append(Block(path, index + 1, language, "\n".join(body) + "\n", tag, value))
        index = end + 1
    return found


def marked(tag: str, value: str) -> Block:
    """The one block of the README or the docs marked ``<!-- TAG: VALUE -->``."""
    named = [block for path in pages() for block in blocks(path) if (block.tag, block.value) == (tag, value)]
    assert len(named) == 1, f"one block marked '{tag}: {value}' in the docs, found {len(named)}"
    return named[0]


def example(name: str) -> str:
    """The text of the one block marked ``<!-- example: NAME -->`` in the README or the docs."""
    return marked("example", name).text


@dataclass
class Outcome:
    """A top-level statement of a Python block: its source, what it evaluated to (an
    expression statement), and what its ``# ->`` comment says, if it has one."""

    source: str
    value: Any = None
    promise: str | None = None


def run_python(text: str, namespace: dict[str, Any]) -> list[Outcome]:
    """Run ``text`` one top-level statement at a time in ``namespace``; each statement's outcome.

    A promise is a ``# -> ...`` comment on a statement's last line, or on the comment lines
    right after it (``#     ...`` lines continue it)."""
    lines = text.splitlines()
    outcomes: list[Outcome] = []
    for statement in ast.parse(text).body:
        source = "\n".join(lines[statement.lineno - 1 : statement.end_lineno])
        outcome = Outcome(source)
        if isinstance(statement, ast.Expr):
            code = compile(ast.Expression(statement.value), "README.md", "eval")
            outcome.value = eval(code, namespace)  # noqa: S307 (the README's own example)
        else:
            exec(compile(ast.Module([statement], []), "README.md", "exec"), namespace)  # noqa: S102
            if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
                # What was assigned: a name's value, or a tuple of them.
                outcome.value = eval(ast.unparse(statement.targets[0]), namespace)  # noqa: S307
        outcome.promise = _promise(lines, statement.end_lineno)
        outcomes.append(outcome)
    return outcomes


def _promise(lines: list[str], last: int) -> str | None:
    """The ``# -> `` text of the statement ending on line ``last`` (1-based)."""
    _, _, trailing = lines[last - 1].partition("  # -> ")
    shown = [trailing] if trailing else []
    for line in lines[last:]:
        stripped = line.strip()
        if not shown and stripped.startswith("# -> "):
            shown = [stripped.removeprefix("# -> ")]
        elif shown and re.match(r"#\s{4,}\S", stripped):
            shown.append(stripped[1:].strip())
        else:
            break
    return " ".join(shown) if shown else None


def literal(promise: str) -> Any:
    """The Python literal a promise starts with (``1, atomic`` -> 1; JSON's true, false and
    null read as Python's); ``...`` inside stands for whatever is there. Raises ValueError
    when no prefix of the promise is a literal."""
    text = re.sub(r"\btrue\b", "True", re.sub(r"\bfalse\b", "False", re.sub(r"\bnull\b", "None", promise)))
    # ``{"a": 1, ...}``: a dict shown in part, its other keys under "...".
    text = text.replace(", ...}", ', "...": ...}')
    for end in range(len(text), 0, -1):
        if end < len(text) and text[end] not in ",;( " or text[:end].rstrip().endswith(","):
            continue
        try:
            return ast.literal_eval(text[:end].strip())
        except (ValueError, SyntaxError):
            continue
    raise ValueError(f"no literal in {promise!r}")


def matches(promised: Any, value: Any) -> bool:
    """``value`` is what ``promised`` shows: equal, where ``...`` stands for anything (a
    list ending in ``...`` for more items of the kind shown)."""
    if promised is Ellipsis:
        return True
    if isinstance(promised, dict):
        if not isinstance(value, dict):
            return False
        shown = {key: item for key, item in promised.items() if key != "..."}
        keys_match = shown.keys() <= value.keys() if "..." in promised else shown.keys() == value.keys()
        return keys_match and all(matches(item, value[key]) for key, item in shown.items())
    if isinstance(promised, list | tuple):
        if not isinstance(value, list | tuple):
            return False
        if promised and promised[-1] is Ellipsis:
            head = promised[:-1]
            return len(value) >= len(head) and all(matches(p, v) for p, v in zip(head, value, strict=False))
        return len(promised) == len(value) and all(
            matches(p, v) for p, v in zip(promised, value, strict=True)
        )
    return promised == value and type(promised) is type(value)


def check_promises(outcomes: list[Outcome]) -> dict[str, Any]:
    """Assert each ``# ->`` that shows a literal; every statement's value, by its code
    (the source up to its comment; the last of statements written alike)."""
    for outcome in outcomes:
        if outcome.promise is None:
            continue
        try:
            shown = literal(outcome.promise)
        except ValueError:
            continue
        assert matches(shown, outcome.value), (
            f"{outcome.source}\n  README: {outcome.promise}\n  returned: {outcome.value!r}"
        )
    return {outcome.source.split("  #")[0].strip(): outcome.value for outcome in outcomes}


def statement(values: dict[str, Any], start: str) -> Any:
    """The value of the one statement whose code starts with ``start``."""
    (found,) = [value for code, value in values.items() if code.startswith(start)]
    return found


def run_example(name: str, namespace: dict[str, Any]) -> dict[str, Any]:
    """Run the Python example ``name`` in ``namespace``, asserting its promises; its values."""
    return check_promises(run_python(example(name), namespace))


def run_block(block: str, url: str, token: str) -> list[Any]:
    """Run the curl commands of ``block`` (written for http://127.0.0.1:8000 with ``$TOKEN``)
    against the live server at ``url``; each curl's JSON answer, in order."""
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
    for command in ("\n" + block).split("\ncurl -s ")[1:]:
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
