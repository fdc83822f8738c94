"""The release is said the same everywhere: ``pyproject.toml``'s ``version``,
``leafpool.__version__`` (``leafpool/core/version.py``), ``CHANGELOG.md``'s newest release
heading and ``leafpool --version``; the previous release recorded for the mixed-version
test (tests/support/releases.py) is the CHANGELOG's next heading, and its tree says so."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import leafpool
from leafpool.core.version import __version__
from tests.support.releases import PREVIOUS, previous_release
from workers.resources import start_line

ROOT = Path(__file__).resolve().parents[1]
HEADING = re.compile(r"^## \[?(\d+\.\d+\.\d+)\]?(?: - (\d{4}-\d{2}-\d{2}))?\s*$", re.MULTILINE)


def _changelog_versions() -> list[str]:
    return [m.group(1) for m in HEADING.finditer((ROOT / "CHANGELOG.md").read_text())]


def test_pyproject_the_package_and_the_changelog_name_one_release() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", __version__), __version__
    assert project["version"] == __version__ == leafpool.__version__
    versions = _changelog_versions()
    assert versions, "CHANGELOG.md has no release heading (## X.Y.Z - YYYY-MM-DD)"
    assert versions[0] == __version__, (
        f"CHANGELOG.md's newest release is {versions[0]}, the code says {__version__}")


def test_the_previous_release_is_the_changelogs_next_heading_and_its_tree_says_it(
    tmp_path: Path,
) -> None:
    version, _ = PREVIOUS
    versions = _changelog_versions()
    assert versions[1:2] == [version], versions
    release = previous_release(tmp_path)
    said = re.search(r'^__version__ = "([^"]+)"',
                     (release.tree / "leafpool" / "__init__.py").read_text(), re.MULTILINE)
    assert said is not None and said.group(1) == version


def test_leafpool_version_prints_the_release_whatever_the_settings() -> None:
    """An operator asks a host which release it runs before anything else, settings that
    do not validate included."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEAFPOOL_")}
    for extra in ({}, {"LEAFPOOL_POOL_FLOOR": "many"}):
        done = subprocess.run([sys.executable, "-m", "leafpool.cli", "--version"],
                              env={**env, **extra}, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert done.stdout == f"leafpool {__version__}\n"
    # the check of the settings still runs for every command
    done = subprocess.run([sys.executable, "-m", "leafpool.cli", "status"],
                          env={**env, "LEAFPOOL_POOL_FLOOR": "many"}, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "pool_floor" in done.stderr.lower(), done.stderr


def test_the_worker_start_line_names_the_release_and_its_queues() -> None:
    line = start_line("celery@a", ["leafpool.segment", "leafpool.control"], "leafpool-broker:")
    assert line == (f"leafpool {__version__}: worker celery@a ready, reading leafpool.control, "
                    "leafpool.segment under the broker prefix 'leafpool-broker:'")
