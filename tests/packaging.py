"""The app as pip users get it: a wheel built from a clean copy of the sources, and a
folder it is installed into, for the packaging and new-project tests."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from email.message import Message
from email.parser import Parser
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: What a wheel is built from: the build reads nothing else. A copy, so that neither a
#: stale build/ folder nor files git ignores (caches, a local database) reach the wheel.
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "persistent_memory")


def build_wheel(folder: Path) -> Path:
    """Build the wheel in ``folder`` from a copy of the sources; its path."""
    source = folder / "source"
    for name in SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, source / name)
    dist = folder / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(source)],
        check=True,
        capture_output=True,
        text=True,
    )
    (wheel,) = dist.glob("django_persistent_memory-*.whl")
    return wheel


def install_wheel(wheel: Path, target: Path) -> Path:
    """Install ``wheel`` alone (no dependencies) into the folder ``target``, for PYTHONPATH."""
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(target)]
        + [str(wheel)],
        check=True,
        capture_output=True,
        text=True,
    )
    return target


def metadata(wheel: Path) -> Message:
    """The wheel's METADATA (name, requirements, classifiers, description)."""
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return Parser().parsestr(archive.read(name).decode())
