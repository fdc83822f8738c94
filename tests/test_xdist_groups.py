"""``./dev test`` runs the suite in several processes (pytest-xdist, ``--dist loadgroup``),
and the container tests count on one worker running all of them: one test session at a
time holds the container store (tests/support/containers.py ``store_lock``).

pytest 9.2 silently stopped the grouping (pytest-xdist#1386: the tests of a group went
round-robin to every worker, and the container tests failed on the store's lock);
pyproject.toml keeps pytest below it. A lock that brings such a pytest back fails here,
naming the cause, not as container tests refused by the lock.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULE = """
import pytest

pytestmark = pytest.mark.xdist_group("together")


@pytest.mark.parametrize("i", range(6))
def test_one(i):
    pass
"""


def test_the_tests_of_a_group_run_on_one_worker(tmp_path: Path) -> None:
    for name in ("test_a.py", "test_b.py"):
        (tmp_path / name).write_text(MODULE)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # not the project's settings
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "3", "--dist", "loadgroup", "-v",
         "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:]
    ran = re.findall(r"^\[(gw\d+)\] \[\s*\d+%\] PASSED (\S+)", done.stdout, re.MULTILINE)
    assert len(ran) == 12, done.stdout[-3000:]
    assert len({worker for worker, _ in ran}) == 1, (
        f"one group ran on several workers: {sorted(set(ran))} (a pytest that breaks "
        "--dist loadgroup, pytest-xdist#1386?)")


def test_every_container_test_module_is_in_the_containers_group() -> None:
    users = [p for p in (ROOT / "tests").rglob("test_*.py")
             if 'pytest_plugins = ["tests.support.container_fixtures"]' in p.read_text()]
    assert users, "no module uses the container fixtures any more: update this test"
    for path in users:
        assert 'pytest.mark.xdist_group("containers")' in path.read_text(), path
