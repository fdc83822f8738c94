"""leafpool.orm.django in a real Django project (tests/orm/django_project), run by Django's
own runner (``manage.py migrate`` on a fresh database, then ``manage.py test shop``) in a
subprocess against this session's real Redis and a fresh SQLite file or MariaDB database,
with Django's LTS (this venv, requirements/dev.txt) and its latest release
(``.venv-django-latest``: Python >= 3.12, requirements/django-latest.txt, made here once
and again only when the lock or pyproject.toml changes). Without a Python >= 3.12 the
latest-release runs skip locally and fail under CI=true.

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
# searched after PATH and pyenv (PYENV_ROOT or ~/.pyenv): where Python 3.12+ often is
FALLBACK_PYTHONS = ["/usr/bin/python3.12", "/usr/local/bin/python3.12",
                    "/usr/bin/python3.13", "/usr/local/bin/python3.13"]
MIN_TESTS = 28  # the project's suite: a run of fewer lost some on the way


def _python_at_least_312() -> str | None:
    """A Python >= 3.12 that runs (a pyenv shim for a version not selected does not)."""
    candidates = [shutil.which(f"python3.{minor}") for minor in (12, 13, 14)]
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    if pyenv.is_dir():
        candidates += [str(p) for p in sorted(pyenv.glob("3.1[2-9]*/bin/python3"))]
    for candidate in [*candidates, *FALLBACK_PYTHONS]:
        if not candidate or not Path(candidate).exists():
            continue
        try:
            done = subprocess.run(
                [candidate, "-c", "import sys, venv; print(sys.version_info >= (3, 12))"],
                capture_output=True, text=True, timeout=30)
        except OSError:
            continue
        if done.returncode == 0 and done.stdout.strip() == "True":
            return candidate
    return None


def _latest_python() -> str:
    """The latest-Django venv's python: the venv made (or kept) for the lock's hash."""
    want = hashlib.sha256(LATEST_LOCK.read_bytes()
                          + (ROOT / "pyproject.toml").read_bytes()).hexdigest()
    python = LATEST_VENV / "bin" / "python"
    stamp = LATEST_VENV / ".leafpool-django-latest.installed"
    if python.exists() and stamp.exists() and stamp.read_text().strip() == want:
        return str(python)
    base = _python_at_least_312()
    if base is None:
        services.unavailable("Django's latest release needs Python >= 3.12: none found on "
                             "PATH, in pyenv's versions or in " + ", ".join(FALLBACK_PYTHONS))
    shutil.rmtree(LATEST_VENV, ignore_errors=True)
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    for argv in ([base, "-m", "venv", str(LATEST_VENV)],
                 [*pip, "--require-hashes", "--no-deps", "-r", str(LATEST_LOCK)],
                 [*pip, "--no-deps", "-e", str(ROOT)]):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=ROOT)
        assert done.returncode == 0, f"{argv}: {done.stdout}{done.stderr}"
        if argv[0] == base:  # a venv git does not list (as Python 3.13's venv writes)
            (LATEST_VENV / ".gitignore").write_text("*\n")
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
