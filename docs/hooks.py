"""MkDocs hooks: the settings reference, made from ``persistent_memory.conf``.

The values come from ``DEFAULTS`` and ``PROFILES`` themselves and each description from
the comment written above the key in ``conf.py``. The table is written into
``docs/settings.md`` (so the page reads on GitHub too) by ``python docs/hooks.py``; a
build whose page is not current fails (``mkdocs build --strict``), and so does
tests/test_docs.py. Not part of the site: ``exclude_docs`` in mkdocs.yml.
"""

from __future__ import annotations

import ast
import io
import json
import logging
import re
import sys
import tokenize
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "persistent_memory" / "conf.py"
SETTINGS_PAGE = ROOT / "docs" / "settings.md"
#: The lines around the generated table in the page.
BEGIN = (
    "<!-- settings-reference: made from persistent_memory/conf.py; `python docs/hooks.py` writes it again -->"
)
END = "<!-- /settings-reference -->"
log = logging.getLogger("mkdocs.hooks.settings_reference")
#: A Sphinx role of the code's docstrings (``:meth:`x```), as Markdown renders it.
SPHINX_ROLE = re.compile(r":(?:meth|class|mod|func|data|attr|exc|obj):<code>(~?)([^<]*)</code>")


def setting_comments(source: str) -> dict[str, str]:
    """Each ``DEFAULTS`` key's comment: the ``#`` lines right above it, then a comment at
    the end of its own line, joined into one paragraph."""
    comments: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
    tree = ast.parse(source)
    (defaults,) = [
        node.value
        for node in tree.body
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "DEFAULTS"
    ]
    found: dict[str, str] = {}
    for key in defaults.keys:
        line = key.lineno
        above: list[str] = []
        while line - 1 in comments:
            line -= 1
            above.insert(0, comments[line])
        trailing = [comments[key.lineno]] if key.lineno in comments else []
        found[key.value] = " ".join(above + trailing)
    return found


#: The reference's sections, in order, each with the prefixes and names of its settings:
#: a setting goes under the first that claims it (a test checks that none is left to
#: "Other", so a new setting needs a place here).
GROUPS: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = [
    ("Backend and Redis", ("REDIS_",), ("PROFILE", "BACKEND", "KEY_PREFIX")),
    ("Mirror and journal", (), ("MIRROR_MODE", "JOURNAL_DIR", "ADMIN_SYNC_LIMIT")),
    (
        "Sessions and their limits",
        ("SESSION_", "MAX_SESSION"),
        ("IDLE_TTL_REFRESH_ON_READ", "MAX_HISTORY", "AUTO_SUMMARIZE", "MAX_VALUE_BYTES", "MAX_JSON_DEPTH"),
    ),
    (
        "REST API",
        ("API_",),
        ("RUN_BINDING_TTL_SECONDS", "IDEMPOTENCY_TTL_SECONDS", "OWNER_RESOLVER", "MAX_BATCH")
        + ("MAX_REQUEST_BYTES", "RETRY_AFTER_SECONDS"),
    ),
    ("Rolling summaries", ("SUMMAR",), ("CONTEXT_STRATEGY", "SUMMARY_MAX_TOKENS", "CONTEXT_OVERFLOW")),
    (
        "Conversations",
        ("CONTEXT_",),
        ("TOKENIZER", "MAX_MESSAGES", "MAX_MESSAGE_BYTES", "RECORD_CONVERSATION"),
    ),
    ("Long-term memories", ("MEMORY_", "EMBEDDER"), ("INJECT_MEMORIES", "MESSAGE_EMBEDDINGS")),
    ("Background work", ("TASK_",), ()),
    ("MCP", ("MCP_",), ()),
    ("Other", ("",), ()),
]


def group_of(name: str) -> str:
    """The reference section of setting ``name``."""
    return next(title for title, prefixes, names in GROUPS if name in names or name.startswith(prefixes))


def _bytes(count: int) -> str:
    """``count`` bytes in binary units when it is a whole number of KiB: 2 MiB + 64 KiB."""
    mib, kib = divmod(count // 1024, 1024)
    parts = [f"{mib:,} MiB"] * bool(mib) + [f"{kib:,} KiB"] * bool(kib)
    return " + ".join(parts)


def shown(value: Any, name: str = "") -> str:
    """A default as the settings dict would spell it (sizes in bytes also in KiB/MiB)."""
    if name.endswith("_BYTES") and isinstance(value, int) and value and value % 1024 == 0:
        return f"`{value!r}` ({_bytes(value)})"
    if isinstance(value, str | int | float | bool) or value is None:
        return f"`{value!r}`"
    return f"`{json.dumps(value)}`" if value else f"`{value!r}`"


def settings_reference() -> str:
    """The Markdown of the reference: every key, its default, what each profile sets, and
    its comment."""
    sys.path.insert(0, str(ROOT))
    try:
        from persistent_memory.conf import DEFAULTS, PROFILES
    finally:
        sys.path.remove(str(ROOT))
    comments = setting_comments(CONF.read_text())
    sections: list[str] = []
    for title, _prefixes, _names in GROUPS:
        names = [name for name in DEFAULTS if group_of(name) == title]
        if not names:
            continue
        rows = [f"### {title}", "", "| Setting | Default | What it does |", "| --- | --- | --- |"]
        for name in names:
            presets = [
                f"`{profile}`: {shown(preset[name], name)}"
                for profile, preset in PROFILES.items()
                if name in preset
            ]
            profiles = f"<br>(profiles: {', '.join(presets)})" if presets else ""
            default = shown(DEFAULTS[name], name) + profiles
            description = comments[name].replace("|", "\\|")
            rows.append(f"| <a id='{name.lower()}'></a>`{name}` | {default} | {description} |")
        sections.append("\n".join(rows))
    return "\n\n".join(sections) + "\n"


def with_reference(page: str) -> str:
    """The settings page ``page`` with the current reference between its markers."""
    head, begin, rest = page.partition(BEGIN)
    _, end, tail = rest.partition(END)
    if not (begin and end):
        raise ValueError(f"docs/settings.md needs the lines {BEGIN!r} and {END!r}")
    return f"{head}{BEGIN}\n\n{settings_reference()}\n{END}{tail}"


def write_settings_page() -> bool:
    """Write the current reference into docs/settings.md; whether it changed."""
    page = SETTINGS_PAGE.read_text()
    current = with_reference(page)
    if current != page:
        SETTINGS_PAGE.write_text(current)
    return current != page


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:  # noqa: ARG001
    """MkDocs' hook: the settings page must hold the current reference (a warning, which
    fails ``--strict``, says how to write it)."""
    if BEGIN in markdown and with_reference(markdown) != markdown:
        log.warning("docs/settings.md: the settings reference is not current: run `python docs/hooks.py`")
    return markdown


def _role(match: re.Match[str]) -> str:
    """A role's target as code (``~a.b.C``: just ``C``, as Sphinx shows it)."""
    short, target = match.groups()
    return f"<code>{target.rsplit('.', 1)[-1] if short else target}</code>"


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:  # noqa: ARG001
    """MkDocs' hook: the docstrings' Sphinx roles read as plain code on the Python API page."""
    return SPHINX_ROLE.sub(_role, html)


if __name__ == "__main__":
    # `python docs/hooks.py` writes the page; with --check, exits 1 when it is not current.
    if "--check" in sys.argv[1:]:
        page = SETTINGS_PAGE.read_text()
        sys.exit(
            0 if with_reference(page) == page else "docs/settings.md is not current: run python docs/hooks.py"
        )
    print("docs/settings.md " + ("rewritten" if write_settings_page() else "already current"))
