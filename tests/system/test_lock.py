"""The locked install: requirements/dev.txt (what ``./dev test`` and ``./dev bench`` install)
and requirements/run.txt (``./dev up`` and the Dockerfile), written by ``./dev lock``.

Every entry is an exact version with hashes; every distribution that pyproject's
requirements need under those extras, followed through each package's own requirements,
is in the lock at a version inside every range asked for it (an override in
requirements/overrides.txt replaces the ranges of its distribution); run.txt's versions are
dev.txt's; and the venv the suite runs in holds the lock's versions."""

from __future__ import annotations

import importlib.metadata as md
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.support.processes import own_home

ROOT = Path(__file__).resolve().parents[2]
REQS = ROOT / "requirements"
LOCKS = {"dev.txt": ["monitor", "mysql8", "test", "bench"], "run.txt": ["monitor", "mysql8"]}
# the platform the locks are compiled for (./dev lock: --python-version 3.11, linux)
TARGET = {"python_version": "3.11", "python_full_version": "3.11.0", "sys_platform": "linux",
          "platform_system": "Linux", "os_name": "posix", "implementation_name": "cpython",
          "platform_python_implementation": "CPython", "platform_machine": "x86_64"}


@dataclass
class Pin:
    version: str
    hashes: list[str]


def read_lock(name: str) -> dict[str, Pin]:
    text = (REQS / name).read_text()
    pins: dict[str, Pin] = {}
    # an entry: "name==version \" then its "--hash=sha256:..." continuation lines
    for entry in re.split(r"\n(?=[^\s#])", text):
        first = entry.strip().splitlines()[0] if entry.strip() else ""
        if not first or first.startswith("#"):
            continue
        m = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;\\]+)", first)
        assert m, f"{name}: not an exact pin: {first!r}"
        pins[canonicalize_name(m[1])] = Pin(m[2], re.findall(r"--hash=sha256:([0-9a-f]{64})",
                                                             entry))
    return pins


def overrides() -> dict[str, Requirement]:
    lines = (REQS / "overrides.txt").read_text().splitlines()
    reqs = [Requirement(x) for x in lines if x.strip() and not x.startswith("#")]
    return {canonicalize_name(r.name): r for r in reqs}


def pyproject_requirements(extras: list[str]) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in extras:
        reqs += [Requirement(r) for r in project["optional-dependencies"][extra]]
    return reqs


def applies(req: Requirement, extra: str = "") -> bool:
    return req.marker is None or req.marker.evaluate({**TARGET, "extra": extra})


def closure(extras: list[str]) -> dict[str, list[Requirement]]:
    """Every distribution the extras need, with each requirement that asks for it: from
    pyproject, then through the installed packages' metadata (the venv the suite runs in)."""
    asked: dict[str, list[Requirement]] = {}
    todo = [(r, "") for r in pyproject_requirements(extras)]
    seen: set[tuple[str, str]] = set()
    while todo:
        req, via_extra = todo.pop()
        if not applies(req, via_extra):
            continue
        name = canonicalize_name(req.name)
        asked.setdefault(name, []).append(req)
        for extra in ["", *sorted(req.extras)]:
            if (name, extra) in seen:
                continue
            seen.add((name, extra))
            for sub in md.requires(name) or []:
                sub_req = Requirement(sub)
                if extra and not (sub_req.marker and "extra" in str(sub_req.marker)):
                    continue  # the extra adds only the requirements marked with it
                if not extra and sub_req.marker and "extra" in str(sub_req.marker):
                    continue
                todo.append((sub_req, extra))
    return asked


@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_every_entry_is_an_exact_version_with_hashes(lock: str) -> None:
    pins = read_lock(lock)
    assert len(pins) > (100 if lock == "dev.txt" else 40)
    assert [n for n, p in pins.items() if not p.hashes] == []
    assert all(Version(p.version) for p in pins.values())
    assert "./dev lock" in (REQS / lock).read_text().splitlines()[1]  # how to refresh it


@pytest.mark.parametrize("lock", sorted(LOCKS))
def test_the_lock_pins_what_pyproject_asks_for_within_its_ranges(lock: str) -> None:
    pins = read_lock(lock)
    over = overrides()
    direct = [r for r in pyproject_requirements(LOCKS[lock]) if applies(r)]
    assert "types-redis" not in {r.name for r in direct}  # python_version < '3.0': never
    for req in direct:
        name = canonicalize_name(req.name)
        assert name in pins, f"{lock}: {req} (pyproject) is not locked: run ./dev lock"
        assert req.specifier.contains(pins[name].version, prereleases=True), (
            f"{lock}: {name}=={pins[name].version} is outside pyproject's {req}: "
            "run ./dev lock")
    missing, outside = [], []
    needed = closure(LOCKS[lock])
    assert sorted(set(pins) - set(needed)) == [], f"{lock}: stale entries: run ./dev lock"
    for name, reqs in needed.items():
        if name not in pins:
            missing.append(name)
            continue
        for req in [over[name]] if name in over else reqs:
            if not req.specifier.contains(pins[name].version, prereleases=True):
                outside.append(f"{name}=={pins[name].version} vs {req}")
    assert missing == [] and outside == [], "run ./dev lock"


def test_the_runtime_lock_has_the_dev_locks_versions() -> None:
    """What ./dev up and the image install is what ./dev test tested."""
    dev, run = read_lock("dev.txt"), read_lock("run.txt")
    assert set(run) <= set(dev)
    assert {n: p.version for n, p in run.items() if dev[n].version != p.version} == {}
    assert {"flower", "cryptography", "celery", "redis"} <= set(run)
    assert not {"pytest", "checkov", "granian"} & set(run)


def test_this_venv_holds_the_locked_versions() -> None:
    if Path(sys.prefix).resolve() != (ROOT / ".venv").resolve():
        pytest.skip("not the project's .venv (./dev test installs the lock there)")
    differ = {}
    for name, pin in read_lock("dev.txt").items():
        try:
            version = md.version(name)
        except md.PackageNotFoundError:
            version = "missing"
        if version != pin.version:
            differ[name] = f"{version}, locked {pin.version}"
    assert differ == {}, "./dev test installs the lock"


def test_checkov_runs_beside_the_overridden_packaging(tmp_path: Path) -> None:
    """requirements/overrides.txt lifts checkov's packaging<24 cap: it still starts and
    checks a manifest."""
    assert "packaging" in overrides()
    checkov = Path(sys.executable).parent / "checkov"
    if not checkov.exists():
        pytest.skip("checkov is not installed in this venv")
    done = subprocess.run([str(checkov), "--version"], capture_output=True, text=True,
                          timeout=120, env=own_home(tmp_path / "home"))
    assert done.returncode == 0, done.stderr
    assert Version(done.stdout.strip()) == Version(read_lock("dev.txt")["checkov"].version)
    assert Version(md.version("packaging")) >= Version("24")
    pod = tmp_path / "pod.yaml"
    pod.write_text("apiVersion: v1\nkind: Pod\nmetadata:\n  name: x\nspec:\n  containers:\n"
                   "  - name: c\n    image: busybox:1.36\n")
    scan = subprocess.run([str(checkov), "-f", str(pod), "--framework", "kubernetes",
                           "--compact", "--quiet"], capture_output=True, text=True, timeout=300,
                          env=own_home(tmp_path / "home"))  # its caches: not in $HOME, /tmp
    assert scan.returncode == 1 and "CKV_K8S_" in scan.stdout, scan.stdout + scan.stderr
