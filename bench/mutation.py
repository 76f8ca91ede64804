"""Mutation testing: mutate the modules that keep data durable and in place, and see which
faults the tests miss.

    python bench/mutation.py                 # every group, then write docs/mutation.md
    python bench/mutation.py journal layout  # the named groups only
    python bench/mutation.py --ci            # the groups marked ci; fail on a new survivor
    python bench/mutation.py --ci --fresh    # the same from scratch (CI: no earlier verdict kept)
    python bench/mutation.py --report        # rewrite docs/mutation.md from the last results

The groups, their modules and their tests are in pyproject.toml
(``[tool.persistent_memory.mutation.*]``); mutmut's own options in ``[tool.mutmut]``.
mutmut reads one configuration per directory, so each group runs in a copy of the checkout
of its own (``.mutation/<group>``, kept between runs: mutmut then re-runs only the
functions that changed). A mutant that survives must be explained in
``bench/mutation_survivors.toml`` (why it cannot change behaviour, or why no test can tell);
``--ci`` fails on any other survivor and on a group under ``KILL_RATE_FLOOR``.

mutmut changes code inside functions and methods only: module constants (``BUCKETS``, the
layout's tags) are pinned by tests of their values instead.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".mutation"
SURVIVORS = ROOT / "bench" / "mutation_survivors.toml"
REPORT = ROOT / "docs" / "mutation.md"
KILL_RATE_FLOOR = 0.90
# Statuses that mean a test noticed the mutant (a timeout: the mutant hung a test).
DETECTED = {"killed", "timeout", "caught by type check"}
_COPY_IGNORE = shutil.ignore_patterns(
    ".git",
    ".mutation",
    "mutants",
    "site",
    "__pycache__",
    "*.pyc",
    ".pytest_cache",
    ".ruff_cache",
    "*.egg-info",
    "test-artifacts",
    "*.sqlite3",
    "*.memory-journal",
    "local",
)


def _toml_value(value: object) -> str:
    # The options are strings, numbers, booleans and lists of those: JSON spells them as TOML does.
    return json.dumps(value)


def groups() -> tuple[dict, dict[str, dict]]:
    """mutmut's shared options, and the groups by name."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return config["tool"]["mutmut"], config["tool"]["persistent_memory"]["mutation"]


def group_pyproject(group: dict, mutmut: dict) -> str:
    """pyproject.toml with a ``[tool.mutmut]`` that names only ``group``'s modules and tests."""
    text = (ROOT / "pyproject.toml").read_text()
    # [tool.mutmut] is followed only by this project's group tables: cut from it to the end.
    text = text[: text.index("[tool.mutmut]")]
    options = dict(mutmut, only_mutate=group["modules"], pytest_add_cli_args_test_selection=group["tests"])
    # A group's own pytest options go to every run of its tests, each mutant's too (the
    # test selection only picks which tests cover which function).
    options["pytest_add_cli_args"] = [*mutmut.get("pytest_add_cli_args", []), *group.get("pytest_args", [])]
    return text + "[tool.mutmut]\n" + "".join(f"{key} = {_toml_value(v)}\n" for key, v in options.items())


def _copy_changed(source: str | Path, target: str | Path) -> None:
    """Copy ``source`` over ``target`` unless they are the same bytes, the copy dated now:
    mutmut makes a module's mutants again only when the module is newer than them, and a
    copy that kept the checkout's time (older than mutants made since) kept stale ones."""
    target = Path(target)
    data = Path(source).read_bytes()
    if not target.exists() or target.read_bytes() != data:
        target.write_bytes(data)


def _workspace(name: str, group: dict, mutmut: dict) -> Path:
    """A copy of the checkout of the group's own (mutmut reads the configuration in its cwd)."""
    work = WORK / name
    work.mkdir(parents=True, exist_ok=True)
    for entry in ROOT.iterdir():
        if entry.name in {".git", ".mutation", "mutants", "site"} or entry.name.endswith(".egg-info"):
            continue
        if entry.is_dir():
            shutil.copytree(
                entry, work / entry.name, ignore=_COPY_IGNORE, dirs_exist_ok=True, copy_function=_copy_changed
            )
        else:
            _copy_changed(entry, work / entry.name)
    (work / "pyproject.toml").write_text(group_pyproject(group, mutmut))
    return work


def _results(work: Path) -> dict[str, str]:
    out = subprocess.run(
        [sys.executable, "-m", "mutmut", "results", "--all", "true"],
        cwd=work,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return dict(re.findall(r"^\s+(\S+): (.+)$", out, flags=re.M))


def _change(work: Path, mutant: str) -> str:
    """The mutant's changed lines, shortened, for the report."""
    out = subprocess.run(
        [sys.executable, "-m", "mutmut", "show", mutant], cwd=work, capture_output=True, text=True
    ).stdout
    diff = [line for line in out.splitlines() if line[:1] in "+-" and line[:3] not in ("---", "+++")]
    lines = [line[1:].strip() for line in diff]
    return " → ".join(f"`{line[:90]}`" for line in lines[:2])


def run_group(name: str, group: dict, mutmut: dict, children: int) -> None:
    """Run mutmut on the group in its copy; record how long it took when it checked every
    mutant (a later run re-checks only the functions that changed)."""
    work = _workspace(name, group, mutmut)
    from_scratch = not (work / "mutants").is_dir()
    started = time.monotonic()
    for attempt in (1, 2):
        done = subprocess.run(
            [sys.executable, "-m", "mutmut", "run", "--max-children", str(children)],
            cwd=work,
            capture_output=True,
            text=True,
        )
        if done.returncode == 0:
            break
        # mutmut keeps each verdict as it comes, so a second run goes on where the first
        # stopped: once (seen once in many runs) it quit near the end with no message.
        output = (done.stdout[-3000:] + done.stderr[-3000:]).strip()
        print(f"mutmut stopped on group {name} (attempt {attempt}):\n{output}", file=sys.stderr)
    else:
        raise SystemExit(f"mutmut failed on group {name} twice")
    if from_scratch:
        (work / "seconds").write_text(str(round(time.monotonic() - started)))


def collect(name: str) -> dict:
    """The group's last results by module: mutants, checked, detected, survivors' statuses."""
    work = WORK / name
    by_module: dict[str, dict] = {}
    if not (work / "mutants").is_dir():
        return {"seconds": None, "modules": by_module}
    for mutant, status in _results(work).items():
        module = mutant.split(".x_")[0].split(".xǁ")[0]
        entry = by_module.setdefault(module, {"total": 0, "checked": 0, "detected": 0, "survivors": {}})
        entry["total"] += 1
        if status == "not checked":
            continue
        entry["checked"] += 1
        if status in DETECTED:
            entry["detected"] += 1
        else:
            entry["survivors"][mutant] = status
    seconds = work / "seconds"
    return {"seconds": int(seconds.read_text()) if seconds.exists() else None, "modules": by_module}


def _rate(entry: dict) -> float:
    return entry["detected"] / entry["checked"] if entry["checked"] else 0.0


def _report(results: dict[str, dict], explained: dict[str, str]) -> str:
    lines = [
        "# Mutation testing",
        "",
        "What the tests catch of small deliberate faults in the code that keeps data durable and",
        "in place, measured with [mutmut](https://mutmut.readthedocs.io/) by",
        "`python bench/mutation.py` (see [Contributing](contributing.md#mutation-testing)).",
        "A mutant is one fault (an operator, a constant, a dropped argument) in one function;",
        "it is *killed* when a test of its group fails (or hangs) with it. The kill rate is of",
        "the mutants checked; *not checked* counts those the last run did not reach. *Minutes*:",
        "the group's last run from scratch, on the 2-core test machine while other work ran.",
        "",
        "| Group | Module | Mutants | Checked | Killed | Kill rate | Survivors | Not checked | Minutes |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, result in results.items():
        minutes = "" if result["seconds"] is None else f"{result['seconds'] / 60:.0f}"
        if not result["modules"]:
            lines.append(f"| {name} | not run to the end yet | | | | | | | |")
        for module, entry in sorted(result["modules"].items()):
            lines.append(
                f"| {name} | `{module}` | {entry['total']} | {entry['checked']} | {entry['detected']} "
                f"| {_rate(entry):.1%} | {len(entry['survivors'])} | {entry['total'] - entry['checked']} "
                f"| {minutes} |"
            )
    lines += ["", "## Every survivor, and why", ""]
    for name, result in results.items():
        for _module, entry in sorted(result["modules"].items()):
            for mutant, status in sorted(entry["survivors"].items()):
                why = explained.get(mutant, "**not explained**")
                lines.append(f"- `{mutant}` ({status}): {_change(WORK / name, mutant)}. {why}")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("groups", nargs="*", help="groups to run (default: all, or the ci ones with --ci)")
    parser.add_argument("--ci", action="store_true", help="the ci groups; fail on an unexplained survivor")
    parser.add_argument("--children", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="delete each group's copy first (mutmut keeps a verdict until its function changes)",
    )
    parser.add_argument(
        "--report", action="store_true", help="run nothing: write docs/mutation.md from the last results"
    )
    args = parser.parse_args()
    mutmut, configured = groups()
    names = args.groups or [n for n, g in configured.items() if g.get("ci") or not args.ci]
    unknown = set(names) - set(configured)
    if unknown:
        parser.error(f"unknown groups: {', '.join(sorted(unknown))} (known: {', '.join(configured)})")
    explained = tomllib.loads(SURVIVORS.read_text()) if SURVIVORS.exists() else {}
    if args.report:
        REPORT.write_text(_report({name: collect(name) for name in configured}, explained))
        return 0
    failed = []
    for name in names:
        if args.fresh:
            shutil.rmtree(WORK / name, ignore_errors=True)
        run_group(name, configured[name], mutmut, args.children)
        result = collect(name)
        for module, entry in sorted(result["modules"].items()):
            new = [m for m in entry["survivors"] if m not in explained]
            print(
                f"{name:18} {module:55} {entry['detected']:4}/{entry['checked']:<4} {_rate(entry):6.1%}"
                f"  {len(entry['survivors'])} survived, {len(new)} unexplained  ({result['seconds']} s)"
            )
            for mutant in new:
                print(f"    unexplained survivor: {mutant} {_change(WORK / name, mutant)}")
            if new or _rate(entry) < KILL_RATE_FLOOR or entry["checked"] < entry["total"]:
                failed.append(module)
    if not args.ci and not args.groups:
        REPORT.write_text(_report({name: collect(name) for name in configured}, explained))
    if args.ci and failed:
        print(
            f"Mutation check failed for: {', '.join(failed)}. Add a test that kills each unexplained "
            f"survivor, or explain it in {SURVIVORS.relative_to(ROOT)}.",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
