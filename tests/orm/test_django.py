"""leafpool.orm.django in a real Django project (tests/orm/django_project), run by Django's
own runner (``manage.py migrate`` on a fresh database, then ``manage.py test shop``) in a
subprocess against this session's real Redis and a fresh SQLite file or MariaDB database,
with Django's LTS (this venv, requirements/dev.txt) and its latest release
(``.venv-django-latest``: Python >= 3.12, requirements/django-latest.txt, made here once
and again only when the lock or pyproject.toml changes). The interpreter for that venv is
``LEAFPOOL_PYTHON312`` when set, else the first Python >= 3.12 found on PATH or in the usual
install places (:func:`newer_python`). Without one the latest-release runs skip, under
CI=true too: Debian 12 has Python 3.11 and no package of a newer one, so ``./dev test``
cannot install it (README, "Django")

The field's ``batches=`` argument needs no Django settings and is tested in this process."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from leafpool.client import Client
from leafpool.core.config import Settings
from leafpool.orm.batch import IdBatches
from tests.support import services
from tests.support.http_helpers import fill

ROOT = Path(__file__).resolve().parents[2]
PROJECT = Path(__file__).resolve().parent / "django_project"
LATEST_LOCK = ROOT / "requirements" / "django-latest.txt"
LATEST_VENV = ROOT / ".venv-django-latest"
VERSIONS = {"lts": "5.2.", "latest": "6.1."}
MIN_TESTS = 28  # the project's suite: a run of fewer lost some on the way
# one xdist worker runs them all (./dev test -n): the latest venv is made once, by one of them
pytestmark = pytest.mark.xdist_group("django")
#: a Python >= 3.12 named by hand (read here: the tests' own environment drops LEAFPOOL_*)
PYTHON312 = os.environ.get("LEAFPOOL_PYTHON312", "")
MINORS = range(12, 20)
#: where an interpreter is often installed besides PATH: a prefix's bin (make install,
#: /opt bundles) and a version manager's per-version trees under a hidden directory of
#: the home (``~/.NAME/versions/V/bin``, ``~/.NAME/installs/python/V/bin``, uv's)
PLACES = ["/usr/local/bin", "/usr/bin", "/opt/*/bin", "/opt/*/*/bin"]
HOME_PLACES = [".*/versions/*/bin", ".*/installs/python/*/bin", ".local/bin",
               ".local/share/uv/python/*/bin"]


def _runs_312(python: str) -> bool:
    """``python`` runs and is a Python >= 3.12 with venv (a version manager's shim for a
    version not selected exits with an error)."""
    try:
        done = subprocess.run(
            [python, "-c", "import sys, venv; print(sys.version_info >= (3, 12))"],
            capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and done.stdout.strip() == "True"


def _newest_first(directory: Path) -> list[tuple[int, str]]:
    """A sort key: numbers compared as numbers (3.13 after 3.9), the newest first."""
    return [(-int(part), "") if part.isdigit() else (0, part)
            for part in re.split(r"(\d+)", str(directory))]


def candidates(path: str, home: Path, places: list[str] = PLACES) -> list[str]:
    """Interpreters to try, in order: each PATH directory's ``python3.N`` (N >= 12), then
    ``python3``; then the same names in :data:`PLACES` and under ``home``'s
    :data:`HOME_PLACES`, newest version directory first."""
    names = [*(f"python3.{minor}" for minor in reversed(MINORS)), "python3"]
    dirs = [Path(d) for d in path.split(os.pathsep) if d]
    for pattern in places:
        dirs += sorted(Path("/").glob(pattern.lstrip("/")), key=_newest_first)
    for pattern in HOME_PLACES:
        dirs += sorted(home.glob(pattern), key=_newest_first)
    found: list[str] = []
    for directory in dirs:
        for name in names:
            exe = directory / name
            if exe.is_file() and os.access(exe, os.X_OK) and str(exe) not in found:
                found.append(str(exe))
    return found


def newer_python(path: str | None = None, home: Path | None = None,
                 named: str = PYTHON312, places: list[str] = PLACES) -> str | None:
    """A Python >= 3.12 that runs: ``named`` (LEAFPOOL_PYTHON312; one that is not fails
    the test: it was asked for), else the first of :func:`candidates`; None if none."""
    if named:
        assert _runs_312(named), f"LEAFPOOL_PYTHON312={named}: not a Python >= 3.12 that runs"
        return named
    tried: set[str] = set()
    for exe in candidates(os.environ.get("PATH", "") if path is None else path,
                          Path.home() if home is None else home, places):
        real = os.path.realpath(exe)
        if real not in tried and _runs_312(exe):
            return exe
        tried.add(real)
    return None


NO_PYTHON = ("Django's latest release needs Python >= 3.12: none found (Debian 12 has 3.11; "
             "set LEAFPOOL_PYTHON312 to one, or put it on PATH: README, \"Django\")")


def _latest_python(venv: Path = LATEST_VENV,
                   find: Callable[[], str | None] = newer_python) -> str:
    """The latest-Django venv's python: the venv made (or kept) for the lock's hash. No
    Python >= 3.12: a skip, under CI=true too (nothing ``./dev test`` may install on
    Debian 12 provides one)."""
    want = hashlib.sha256(LATEST_LOCK.read_bytes()
                          + (ROOT / "pyproject.toml").read_bytes()).hexdigest()
    python = venv / "bin" / "python"
    stamp = venv / ".leafpool-django-latest.installed"
    if python.exists() and stamp.exists() and stamp.read_text().strip() == want:
        return str(python)
    base = find()
    if base is None:
        pytest.skip(NO_PYTHON)
    shutil.rmtree(venv, ignore_errors=True)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    for argv in ([base, "-m", "venv", str(venv)],
                 [*pip, "--require-hashes", "--no-deps", "-r", str(LATEST_LOCK)],
                 [*pip, "--no-deps", "-e", str(ROOT)]):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=ROOT)
        assert done.returncode == 0, f"{argv}: {done.stdout}{done.stderr}"
        if argv[0] == base:  # a venv git does not list (as Python 3.13's venv writes)
            (venv / ".gitignore").write_text("*\n")
    stamp.write_text(want + "\n")
    return str(python)


@pytest.fixture(scope="session")
def latest_python() -> str:
    return _latest_python()


def _database(request: pytest.FixtureRequest, kind: str, tmp_path: Path) -> str:
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'shop.sqlite3'}"
    url: str = request.getfixturevalue("mysql_url")  # a fresh MariaDB database
    return url


def _run(python: str, env: dict[str, str], *args: str) -> str:
    done = subprocess.run([python, "manage.py", *args], cwd=PROJECT, env=env,
                          capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"manage.py {' '.join(args)} failed:\n{output[-20000:]}"
    return output


@pytest.mark.parametrize("db", ["sqlite", "mariadb"])
@pytest.mark.parametrize("django", ["lts", "latest"])
def test_the_django_project(django: str, db: str, redis_url: str, tmp_path: Path,
                            request: pytest.FixtureRequest) -> None:
    python = sys.executable if django == "lts" else request.getfixturevalue("latest_python")
    env = {
        **os.environ,
        "SHOP_DATABASE_URL": _database(request, db, tmp_path),
        "SHOP_REDIS_URL": redis_url,
        # what the suite's "no LEAFPOOL setting: the environment" test reads
        "LEAFPOOL_REDIS_URL": redis_url,
        "LEAFPOOL_EMPTY_POLICY": "raise",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    version = subprocess.run([python, "-c", "import django; print(django.get_version())"],
                             capture_output=True, text=True, timeout=60, env=env)
    assert version.stdout.startswith(VERSIONS[django]), version.stdout + version.stderr

    migrated = _run(python, env, "migrate", "--noinput")  # the fresh database itself
    assert re.search(r"Applying shop\.0001_initial\.\.\. OK", migrated), migrated

    out = _run(python, env, "test", "shop", "--noinput")  # makes its own test database
    ran = re.search(r"^Ran (\d+) tests? in", out, re.M)
    assert ran and int(ran.group(1)) >= MIN_TESTS, out
    assert re.search(r"^OK$", out, re.M), out  # no skip, no expected failure


# -- in this process: the field with batches= (no Django settings needed) --------------------

def test_batches_argument(r: redis.Redis, make_settings: Callable[..., Settings]) -> None:
    from leafpool.orm.django import LeafpoolIdField

    fill(r, "order", [5, 6, 7, 2**53 + 1])
    batches = IdBatches(lambda: Client(settings=make_settings(empty_policy="raise")),
                        prefetch=0)
    field = LeafpoolIdField(tag="order", batches=batches)
    assert field.take(2) == [5, 6]
    text = LeafpoolIdField(tag="order", as_string=True, batches=lambda: batches)
    assert text.take(2) == ["7", str(2**53 + 1)]
    assert "batches" not in field.deconstruct()[3]
    assert text.deconstruct()[3] == {"tag": "order", "as_string": True}


# -- finding a Python >= 3.12 (issue 27: Debian 12 has none, and the run must not fail) -----

def test_no_newer_python_is_a_skip_with_the_reason_under_ci_too(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(services, "IN_CI", True)
    with pytest.raises(pytest.skip.Exception, match="LEAFPOOL_PYTHON312"):
        _latest_python(venv=tmp_path / "venv", find=lambda: None)
    assert not (tmp_path / "venv").exists()


def _link(target: str, at: Path) -> Path:
    at.parent.mkdir(parents=True, exist_ok=True)
    at.symlink_to(os.path.realpath(target))
    return at


def test_the_search_on_a_bare_machine_finds_none(tmp_path: Path) -> None:
    """Only an interpreter below 3.12 and a shim that fails: none, whatever this machine has
    (its PATH, home and install places are not searched)."""
    bin_dir, home = tmp_path / "bin", tmp_path / "home"
    shim = bin_dir / f"python3.{MINORS[0]}"  # a shim for a version not selected
    bin_dir.mkdir()
    shim.write_text("#!/bin/sh\necho 'not selected' >&2\nexit 127\n")
    shim.chmod(0o755)
    old = _link(sys.executable, home / ".manager" / "versions" / "3.11.0" / "bin" / "python3")
    assert candidates(str(bin_dir), home, places=[]) == [str(shim), str(old)]
    if sys.version_info < (3, 12):
        assert newer_python(str(bin_dir), home, named="", places=[]) is None


def test_the_search_finds_a_newer_python_in_a_version_managers_tree(tmp_path: Path) -> None:
    """On PATH or under a hidden directory's versions/*/bin, as version managers install
    them, without naming any; LEAFPOOL_PYTHON312 first, and one that is not >= 3.12 fails."""
    found = newer_python(named="")
    if found is None:
        pytest.skip(NO_PYTHON)
    home = tmp_path / "home"
    _link(sys.executable, home / ".manager" / "versions" / "3.11.0" / "bin" / "python3")
    newer = _link(found, home / ".manager" / "versions" / "3.12.0" / "bin" / "python3")
    assert newer_python("", home, named="", places=[]) == str(newer)
    on_path = _link(found, tmp_path / "bin" / f"python3.{MINORS[0]}")
    assert newer_python(str(on_path.parent), home, named="", places=[]) == str(on_path)
    assert newer_python("", tmp_path / "nothing", named=found, places=[]) == found
    if sys.version_info < (3, 12):
        with pytest.raises(AssertionError, match="LEAFPOOL_PYTHON312"):
            newer_python("", home, named=sys.executable, places=[])
