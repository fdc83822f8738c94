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

import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.support import services

ROOT = Path(__file__).resolve().parents[2]
EXTRAS = frozenset({"bench", "monitor"})  # what `./dev bench` installs (see ./dev)

BLOCKER = '''
import sys

BLOCKED = frozenset({blocked!r})


class NotInstalledByTheBenchExtra:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(
                f"No module named {{name!r}} (./dev bench does not install it)", name=name)
        return None


sys.meta_path.insert(0, NotInstalledByTheBenchExtra())
'''


def installed_by(project: str, extras: frozenset[str]) -> set[str]:
    """Canonical names of the installed distributions that ``pip install project[extras]``
    pulls in (the project itself, its requirements under those extras, recursively)."""
    found: set[str] = set()
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = [(project, extras)]
    while todo:
        name, wanted = todo.pop()
        if (canonicalize_name(name), wanted) in seen:
            continue
        seen.add((canonicalize_name(name), wanted))
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # not installed here: it cannot be imported by mistake either
        found.add(canonicalize_name(dist.metadata["Name"]))
        for raw in dist.requires or []:
            req = Requirement(raw)
            if req.marker is None or any(req.marker.evaluate({"extra": extra})
                                         for extra in wanted | {""}):
                todo.append((req.name, frozenset(req.extras)))
    return found


def blocked_modules() -> set[str]:
    """Top-level modules installed here that ``./dev bench`` would not install."""
    allowed = installed_by("leafpool", EXTRAS) | installed_by("pip", frozenset())
    return {module for module, dists in metadata.packages_distributions().items()
            if not any(canonicalize_name(d) in allowed for d in dists)}


@pytest.fixture(scope="module")
def bench_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    blocked = blocked_modules()
    # the simulation is honest only if it removes the test tools and keeps the runtime
    assert {"pytest", "_pytest", "mypy"} <= blocked
    assert not {"redis", "celery", "leafpool", "uvicorn", "httpx", "snowflake"} & blocked
    site = tmp_path_factory.mktemp("bench-site")
    (site / "sitecustomize.py").write_text(BLOCKER.format(blocked=sorted(blocked)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEAFPOOL_")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT)])
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


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
def test_the_benchmarks_run_without_the_test_tools(bench_env: dict[str, str],
                                                   section: str) -> None:
    for binary in ("redis-server", "mariadbd"):
        if shutil.which(binary) is None and not Path(f"/usr/sbin/{binary}").exists():
            services.missing(binary)
    done = subprocess.run([sys.executable, "-m", "bench", "--smoke", "--only", section],
                          env=bench_env, cwd=ROOT, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    for title in SECTIONS[section]:
        assert title in done.stdout, title
