"""``leafpool acl``, the same command as ``leafpool redis acl`` (issue 18 asked for the
short name), run as a real process: the same lines, ``--disable-default``, the broker's
database from its URL, and nothing printed when a password is missing."""

from __future__ import annotations

import os
import subprocess
import sys

from leafpool.cli_setup import DEFAULT_OFF
from leafpool.redis import acl

PASSWORDS = {f"LEAFPOOL_ACL_{role.upper()}_PASSWORD": f"pw-{role}" for role in acl.ROLES}


def _run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("LEAFPOOL_")}
    full.update({"LEAFPOOL_HOME": os.environ["LEAFPOOL_HOME"], "COLUMNS": "80", **env})
    return subprocess.run([sys.executable, "-m", "leafpool.cli", *args], env=full,
                          capture_output=True, text=True, timeout=60)


def test_leafpool_acl_prints_what_leafpool_redis_acl_prints() -> None:
    for extra in ([], ["--disable-default"], ["app", "worker", "--user-prefix", "lp-"]):
        short = _run("acl", *extra, env=PASSWORDS)
        long = _run("redis", "acl", *extra, env=PASSWORDS)
        assert short.returncode == long.returncode == 0, short.stderr
        assert short.stdout == long.stdout and short.stdout
    lines = _run("acl", env=PASSWORDS).stdout.splitlines()
    assert [line.split()[1] for line in lines] == [f"leafpool-{role}" for role in acl.ROLES]
    assert "The same as `leafpool redis acl`" in _run("--help", env={}).stdout


def test_disable_default_puts_the_default_user_off_first() -> None:
    lines = _run("acl", "--disable-default", env=PASSWORDS).stdout.splitlines()
    assert lines[0] == DEFAULT_OFF
    assert [line.split()[1] for line in lines[1:]] == [f"leafpool-{r}" for r in acl.ROLES]
    assert "default" not in _run("acl", env=PASSWORDS).stdout.split()


def test_the_broker_database_comes_from_the_url_path_without_its_query() -> None:
    printed = _run("acl", "worker", env={
        **PASSWORDS, "LEAFPOOL_BROKER_URL": "redis://u:p@127.0.0.1:6379/3?socket_timeout=5"})
    assert printed.returncode == 0, printed.stderr
    assert "&leafpool-broker:/3.celery.pidbox" in printed.stdout.split()


def test_a_missing_password_prints_no_line_and_names_the_variable() -> None:
    partial = {k: v for k, v in PASSWORDS.items() if "MONITOR" not in k}
    done = _run("acl", "--disable-default", env=partial)
    assert done.returncode == 2
    assert done.stdout == ""  # `leafpool acl > users.acl` leaves no half file to load
    assert "LEAFPOOL_ACL_MONITOR_PASSWORD" in done.stderr
