"""The previous release, reached from the repository's own history (docs/reference/
compatibility.md): its version and commit are recorded here, since tags may not survive
into a CI clone. :func:`previous_release` extracts its tree with ``git archive`` into a
directory of the caller's; its code runs with ``PYTHONPATH`` pointing there, on the same
virtualenv (the previous release's dependencies are a subset of the current ones:
``pyproject.toml`` at that commit; :func:`dependencies_served` checks it).

A clone without the commit (a shallow one, or a tree without ``.git``) skips the tests
that need it, saying so, under ``CI=true`` too: the history is the repository's, not a
service ``./dev test`` can install (fetch it: ``git fetch --unshallow``)."""

from __future__ import annotations

import io
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.services import ROOT

#: (version, full commit) of the release before the current code: tagged ``v<version>``
PREVIOUS = ("0.1.0", "f6366e69f7cf6c88260fff75592ce3bdd8322512")


@dataclass(frozen=True)
class Release:
    version: str
    commit: str
    tree: Path  # the release's sources: leafpool/, workers/, pyproject.toml

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """``base`` with the release's code first on the path (its ``leafpool``, its
        ``workers``), and nothing of the current checkout's."""
        return {**base, "PYTHONPATH": str(self.tree), "PYTHONSAFEPATH": "1"}


def commit_present(commit: str) -> bool:
    try:
        done = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e",
                               f"{commit}^{{commit}}"], capture_output=True)
    except FileNotFoundError:  # no git at all
        return False
    return done.returncode == 0


def previous_release(into: Path) -> Release:
    """The previous release's tree under ``into`` (skip, or fail under CI, without it)."""
    version, commit = PREVIOUS
    if not commit_present(commit):
        pytest.skip(f"the previous release {version} (commit {commit}) is not in this clone "
                    "(a shallow clone, or no .git? fetch the history: git fetch --unshallow)")
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit,
                              "leafpool", "workers", "pyproject.toml"],
                             capture_output=True, check=True).stdout
    tree = into / f"leafpool-{version}"
    tree.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(tree, filter="data")
    return Release(version, commit, tree)
