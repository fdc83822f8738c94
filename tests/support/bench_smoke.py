"""``python -m bench --smoke --only SECTION``, run once per test session and read by every
test that checks its output (a pytest plugin: tests/conftest.py loads it).

tests/system/test_bench_imports.py runs each section without the test tools, and
tests/test_first_hour.py reads the pools, outage and tls sections' output for what a reader
sees; each run costs a minute or more of a loaded machine, and the same run answers both. The
run is made in the environment of ``./dev bench`` on a fresh clone: the modules its extras
do not install blocked (:func:`blocked_env`), and 200 columns, so that rich's tables keep a
row on one line.

Under pytest-xdist the workers share the runs: the first test to ask for a section runs it
under a lock (a file in the run's base temporary directory, which every worker shares) and
keeps its output there; a test asking meanwhile, on another worker, waits for it and reads
it. The controller removes the directory at the end of the session.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
EXTRAS = frozenset({"bench", "monitor"})  # what `./dev bench` installs (see ./dev)
SHARED = "bench-smoke"  # in the run's base temporary directory
TIMEOUT_S = 540

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


def honest_blocked_modules() -> set[str]:
    """:func:`blocked_modules`, checked: the simulation is honest only if it removes the
    test tools and keeps the runtime."""
    blocked = blocked_modules()
    assert {"pytest", "_pytest", "mypy"} <= blocked
    assert not {"redis", "celery", "leafpool", "uvicorn", "httpx", "snowflake"} & blocked
    return blocked


def blocked_env(site: Path, blocked: set[str]) -> dict[str, str]:
    """This process's environment (no LEAFPOOL_* setting) with a ``sitecustomize`` in
    ``site`` on ``PYTHONPATH`` that makes importing any of ``blocked`` fail, in every
    Python process started with it and their children (the refiller role, uvicorn)."""
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(BLOCKER.format(blocked=sorted(blocked)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEAFPOOL_")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT)])
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


@dataclass(frozen=True)
class Smoke:
    """One ``python -m bench --smoke --only SECTION`` run."""

    section: str
    returncode: int
    stdout: str
    stderr: str


def run_smoke(section: str, env: dict[str, str]) -> Smoke:
    done = subprocess.run([sys.executable, "-m", "bench", "--smoke", "--only", section],
                          env={**env, "COLUMNS": "200"}, cwd=ROOT, capture_output=True,
                          text=True, timeout=TIMEOUT_S)
    return Smoke(section, done.returncode, done.stdout, done.stderr)


def shared_run(shared: Path, section: str, env: Callable[[], dict[str, str]]) -> Smoke:
    """The section's run kept in ``shared``: made here (under the section's lock) unless a
    test of this session made it already, or is making it (then waited for)."""
    shared.mkdir(parents=True, exist_ok=True)
    kept = shared / f"{section}.json"
    with open(shared / f"{section}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, raised or not
        if kept.exists():
            return Smoke(**json.loads(kept.read_text()))
        smoke = run_smoke(section, env())
        kept.write_text(json.dumps(asdict(smoke)))
        return smoke


def _shared_dir(config: pytest.Config) -> Path:
    """The run's base temporary directory: under xdist, the one holding each worker's."""
    base = config._tmp_path_factory.getbasetemp()  # type: ignore[attr-defined]
    if hasattr(config, "workerinput"):
        base = base.parent
    return Path(base) / SHARED


@pytest.fixture(scope="session")
def bench_smoke(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
                ) -> Callable[[str], Smoke]:
    """``bench_smoke(section)``: the session's run of that section (made on first use)."""
    envs: list[dict[str, str]] = []

    def env() -> dict[str, str]:
        if not envs:
            envs.append(blocked_env(tmp_path_factory.mktemp("bench-site"),
                                    honest_blocked_modules()))
        return envs[0]

    shared = _shared_dir(request.config)
    return lambda section: shared_run(shared, section, env)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The controller (or the only process) removes the kept runs once every test ran."""
    if not hasattr(session.config, "workerinput"):
        factory = getattr(session.config, "_tmp_path_factory", None)
        if factory is not None and getattr(factory, "_basetemp", None) is not None:
            shutil.rmtree(_shared_dir(session.config), ignore_errors=True)
