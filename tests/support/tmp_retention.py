"""A pytest plugin (tests/conftest.py loads it): after a run with failures, only the failed
tests' own ``tmp_path`` stays in pytest's temporary folder.

pyproject's ``tmp_path_retention_policy = "failed"`` removes a passing test's ``tmp_path`` at
once, but once any test failed pytest keeps its whole base directory: every directory the
fixtures shared through ``tmp_path_factory.mktemp`` (a CA's private keys, compose files,
ACL files) stayed behind, from tests that passed. This removes them, and anything else
there but a failed test's ``tmp_path``, when the session ends."""

from __future__ import annotations

import shutil
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

_FAILED: set[Path] = set()  # the tmp_path of each failed test


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed:
        path = getattr(item, "funcargs", {}).get("tmp_path")
        if isinstance(path, Path):
            _FAILED.add(path)
    return report


@pytest.fixture(scope="session", autouse=True)
def _only_failed_tests_keep_temporary_directories(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[None]:
    """Set up first, so torn down last: after every other fixture stopped using its
    directory."""
    yield
    policy = request.config.getini("tmp_path_retention_policy")
    if policy != "failed" or request.session.testsfailed == 0:
        return  # pytest removes the whole base directory itself, or keeps all by choice
    for entry in tmp_path_factory.getbasetemp().iterdir():
        if entry.is_dir() and not entry.is_symlink() and entry not in _FAILED:
            shutil.rmtree(entry, ignore_errors=True)
