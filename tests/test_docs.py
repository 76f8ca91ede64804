"""The README and the documentation site (docs/, built with MkDocs) hold together: every
fenced block is run by a test or says why it cannot be, every relative link leads to a
file, the site builds with ``--strict`` (broken links and anchors fail it), and the
settings reference is made from ``conf.DEFAULTS``.

Each example's own test lives beside the code it shows (``tests/test_docs_*.py``,
``tests/test_readme.py`` and the feature tests); this file checks that one exists."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from persistent_memory.conf import DEFAULTS, PROFILES
from tests import readme_blocks
from tests.readme_blocks import ROOT

TESTS = ROOT / "tests"
#: ``[text](target)`` links and ``![alt](image)`` images of Markdown, outside code.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def test_every_block_is_marked_and_each_example_has_a_test():
    """A block with no marker fails here: each example is run by a test, or says why not."""
    tests = {path: path.read_text() for path in TESTS.glob("*.py")}
    names: list[str] = []
    for path in readme_blocks.pages():
        for block in readme_blocks.blocks(path):
            assert block.tag in ("example", "not-run"), (
                f"{block.where}: a ```{block.language} block needs <!-- example: NAME --> "
                "or <!-- not-run: REASON --> on the line before it"
            )
            if block.tag == "not-run":
                assert len(block.value.split()) >= 4, f"{block.where}: not-run needs its reason"
                continue
            names.append(block.value)
            # A test reads it by name: example("NAME"), run_example("NAME", ...), or a table
            # of names whose file reads them with example().
            runners = [p for p, text in tests.items() if f'"{block.value}"' in text and "example(" in text]
            assert runners, f"{block.where}: no test reads the example {block.value!r}"
    assert len(names) == len(set(names)), sorted(name for name in names if names.count(name) > 1)


def outside_code(text: str) -> str:
    """``text`` without its fenced blocks and inline code (whose brackets are not links)."""
    text = re.sub(r"^( *)```.*?^\1```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


@pytest.mark.parametrize("path", readme_blocks.pages(), ids=lambda path: str(path.relative_to(ROOT)))
def test_relative_links_lead_to_files(path):
    """Links to other pages and images resolve (MkDocs checks the site's anchors; the
    README, read on its own, is checked here too)."""
    for target in LINK.findall(outside_code(path.read_text())):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        assert (path.parent / target.split("#")[0]).resolve().exists(), f"{path.name}: {target}"


def settings_hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_settings_reference_has_every_setting_with_its_default_and_comment():
    hooks = settings_hooks()
    comments = hooks.setting_comments((ROOT / "persistent_memory" / "conf.py").read_text())
    assert list(comments) == list(DEFAULTS)
    missing = [name for name, comment in comments.items() if len(comment.split()) < 3]
    assert not missing, f"settings without a comment in conf.py: {missing}"
    table = hooks.settings_reference()
    rows = [line for line in table.splitlines() if line.startswith("| <a id=")]
    by_name = {re.search(r"`(\w+)`", row).group(1): row for row in rows}
    assert len(rows) == len(by_name) and by_name.keys() == DEFAULTS.keys()
    assert "| `1048576` (1 MiB) |" in by_name["MAX_VALUE_BYTES"]  # the value, not its source
    assert "`2162688` (2 MiB + 64 KiB)" in by_name["MAX_REQUEST_BYTES"]
    assert [name for name in DEFAULTS if hooks.group_of(name) == "Other"] == []  # each has its section
    assert table.count("### ") == len(hooks.GROUPS) - 1
    assert "`redis`: `24`" in by_name["SESSION_TTL_HOURS"]  # what a profile sets
    assert all(f"`{profile}`" in table for profile in PROFILES)
    # Written into the page, so that it reads on GitHub, and current: checked in a process
    # of its own (this suite's conftest changes a default).
    page = (ROOT / "docs" / "settings.md").read_text()
    assert hooks.BEGIN in page and by_name["MAX_VALUE_BYTES"] in page
    check = subprocess.run(
        [sys.executable, "docs/hooks.py", "--check"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert check.returncode == 0, check.stderr


def build_site(folder: Path) -> Path:
    """The documentation site built into ``folder`` with ``mkdocs build --strict``."""
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(folder)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
        timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    return folder


def test_the_site_builds_strictly(tmp_path):
    """``mkdocs build --strict``: a broken link or anchor, a page missing from the
    navigation or a docstring mkdocstrings cannot read fails it (CI runs it too)."""
    site = build_site(tmp_path / "site")
    settings_page = (site / "settings.html").read_text()  # the offline plugin's file names
    assert "<code>MAX_SESSION_BYTES</code>" in settings_page and "id='max_session_bytes'" in settings_page
    # Offline: no page asks a CDN for fonts or scripts; search's index ships as a script
    # (tests/test_docs_site_browser.py searches from disk).
    for page in site.rglob("*.html"):
        text = page.read_text()
        assert "fonts.googleapis.com" not in text and "unpkg.com" not in text, page
    assert (site / "search" / "search_index.js").exists()
    assert (site / "reference" / "python.html").exists()
    # The hooks run the build; they are no page of the site.
    assert not list(site.rglob("*.py")) and not list(site.rglob("__pycache__"))


def test_the_settings_reference_fails_the_build_when_stale(tmp_path):
    """A page whose table is not current is a warning, which fails ``--strict``."""
    hooks = settings_hooks()
    page = (ROOT / "docs" / "settings.md").read_text()
    stale = page.replace(hooks.settings_reference().splitlines()[0], "### Renamed", 1)
    current = hooks.with_reference(page)
    assert stale != page and hooks.with_reference(stale) == current
    with pytest.MonkeyPatch.context() as patch:
        warnings: list[str] = []
        patch.setattr(hooks.log, "warning", warnings.append)
        assert hooks.on_page_markdown(current, None, None, None) == current and warnings == []
        hooks.on_page_markdown(stale, None, None, None)
    assert warnings and "python docs/hooks.py" in warnings[0]


def extras_table() -> dict[str, str]:
    """docs/install.md's table of extras: each extra's name and what it says it adds."""
    text = (ROOT / "docs" / "install.md").read_text()
    rows = re.findall(
        r"^\| `([\w-]+)` \| (.+) \|$", text.split("| Extra | What it adds |", 1)[1].split("\n\n")[0], re.M
    )
    return dict(rows)


def test_the_extras_table_lists_every_extra_of_pyproject():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    table = extras_table()
    assert sorted(table) == sorted(extras)
    assert "store" in table["langgraph"] and "checkpointer" in table["langgraph"]


def test_the_sites_header_links_no_placeholder():
    """The header's repository link is the package's own address, or there is none."""
    import tomllib

    import yaml

    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    urls = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"].get("urls", {})
    repo = config.get("repo_url")
    assert repo is None or (repo in urls.values() and "example" not in repo), repo


def test_the_python_api_page_says_how_to_read_it_on_github():
    """Its ``:::`` lines are mkdocstrings' directives: the page says so before the first."""
    page = (ROOT / "docs" / "reference" / "python.md").read_text()
    before = page.split("\n::: ", 1)[0]
    assert "`:::`" in before and "mkdocstrings" in before, before


def test_the_small_settings_example_overrides_its_profile(settings):
    """The settings page's dict: the profile's preset under the keys it sets, the URL
    taking the place of the profile's localhost, and nothing for `check` to report."""
    from django.core.checks import run_checks

    from persistent_memory.backends.redis.topology import build_client
    from persistent_memory.conf import MemorySettings

    namespace: dict = {}
    exec(readme_blocks.example("settings-small"), namespace)  # noqa: S102 (the page's own example)
    conf = MemorySettings(namespace["PERSISTENT_MEMORY"])
    assert (conf.BACKEND, conf.SESSION_TTL_HOURS, conf.REDIS_HOST) == ("redis", 72, "localhost")
    connection = build_client(conf).connection_pool.connection_kwargs  # opens no connection
    assert (connection["host"], connection["port"], connection["password"], connection["db"]) == (
        "10.0.0.5",
        6379,
        "secret",
        0,
    )
    settings.PERSISTENT_MEMORY = namespace["PERSISTENT_MEMORY"]
    ours = [message for message in run_checks() if message.id.startswith("persistent_memory.")]
    assert ours == []
