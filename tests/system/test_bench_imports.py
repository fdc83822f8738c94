"""``./dev bench`` on a fresh clone installs only ``.[bench,monitor]``, not the test tools
(pytest, mypy, ruff, ...): the benchmarks must import and run without them.

Building a venv with only those extras would download every dependency on each run.
Instead this test computes, from the installed packages' own metadata, which top-level
modules ``pip install -e .[bench,monitor]`` would *not* have installed (everything outside
the dependency closure of leafpool with those extras, and of pip), and runs the benchmarks
in a Python where importing any of them fails: a meta-path blocker in a ``sitecustomize``
on ``PYTHONPATH``, which the benchmarks' own child processes (the refiller role, uvicorn)
inherit. Importing every bench module catches a test-only import at the top of a module;
``python -m bench --smoke`` (every section with tiny sizes, seconds) catches one made
later, at run time.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.support import services
from tests.support.bench_smoke import Smoke, blocked_env, honest_blocked_modules

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return blocked_env(tmp_path_factory.mktemp("bench-site"), honest_blocked_modules())


def test_every_bench_module_imports_without_the_test_tools(bench_env: dict[str, str]) -> None:
    modules = sorted(f"bench.{p.stem}" for p in (ROOT / "bench").glob("*.py"))
    code = ("import importlib\n"
            "try:\n"
            "    import pytest\n"
            "except ModuleNotFoundError:\n"
            "    print('pytest is not importable')\n"
            f"for name in {modules!r}:\n"
            "    importlib.import_module(name)\n"
            "    print('imported', name)\n")
    done = subprocess.run([sys.executable, "-c", code], env=bench_env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "pytest is not importable"
    assert lines[1:] == [f"imported {name}" for name in modules]


#: ``python -m bench --smoke --only SECTION`` for every section, one test each, so that the
#: suite's workers share them out (the whole ``--smoke`` run in one test was the suite's
#: longest, about five minutes); with a title each must print, where it has a fixed one
SECTIONS = {
    "pools": ("IDs/s and latency per call", "MariaDB ticket server", "Refill and durability"),
    "replication": (), "tls": (), "snowflake": ("Snowflake generation",),
    "http": ("HTTP service",), "burst": (), "tags": (), "outage": (), "multidc": (),
    "galera": (), "orm": ("ORM inserts into MariaDB",), "failover": (), "pipeline": (),
    "nemesis": (),
}


def test_every_section_of_the_bench_is_run_here() -> None:
    """A section added to ``python -m bench --only``'s choices is smoke-tested too."""
    done = subprocess.run([sys.executable, "-m", "bench", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    flat = " ".join(done.stdout.split())
    choices = flat.split("--only {", 1)[1].split("}", 1)[0].split(",")
    assert set(choices) - {""} == set(SECTIONS), choices


@pytest.mark.slow
@pytest.mark.timeout(600)  # a section, beside the suite's other workers
@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_the_benchmarks_run_without_the_test_tools(bench_smoke: Callable[[str], Smoke],
                                                   section: str) -> None:
    """The section's run in the environment of ``bench_env`` (tests/support/bench_smoke.py:
    the session's one run of it, which tests/test_first_hour.py reads too)."""
    for binary in ("redis-server", "mariadbd"):
        if shutil.which(binary) is None and not Path(f"/usr/sbin/{binary}").exists():
            services.missing(binary)
    done = bench_smoke(section)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    for title in SECTIONS[section]:
        assert title in done.stdout, title
