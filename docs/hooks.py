"""MkDocs hooks: the settings reference, made at build time from ``persistent_memory.conf``.

The values come from ``DEFAULTS`` and ``PROFILES`` themselves and each description from
the comment written above the key in ``conf.py``, so the page cannot drift from the code.
"""

from __future__ import annotations

import ast
import io
import json
import sys
import tokenize
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CONF = ROOT / "persistent_memory" / "conf.py"
MARKER = "<!-- settings-reference -->"


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


def shown(value: Any) -> str:
    """A default as the settings dict would spell it."""
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
    rows = ["| Setting | Default | What it does |", "| --- | --- | --- |"]
    for name, value in DEFAULTS.items():
        presets = [
            f"`{profile}`: {shown(preset[name])}" for profile, preset in PROFILES.items() if name in preset
        ]
        default = shown(value) + (f"<br>(profiles: {', '.join(presets)})" if presets else "")
        description = comments[name].replace("|", "\\|")
        rows.append(f"| <a id='{name.lower()}'></a>`{name}` | {default} | {description} |")
    return "\n".join(rows) + "\n"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:  # noqa: ARG001
    """MkDocs' hook: the settings page gets its table."""
    if MARKER in markdown:
        return markdown.replace(MARKER, settings_reference())
    return markdown
