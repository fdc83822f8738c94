"""The shipped ACL file, ops/redis/users.acl: what ``leafpool redis acl --disable-default``
prints for the default prefixes and broker database with the placeholder passwords
``CHANGE-ME-<role>`` (so the file and the roles in leafpool/redis/acl.py never drift),
loaded by a real redis-server: the default user is off, each role's user logs in."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from leafpool.redis import acl
from tests.support import services

SHIPPED = services.ROOT / "ops" / "redis" / "users.acl"
PLACEHOLDERS = {role: f"CHANGE-ME-{role}" for role in acl.ROLES}


def _printed(home: Path) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEAFPOOL_")}
    env.update({f"LEAFPOOL_ACL_{role.upper()}_PASSWORD": pw for role, pw in PLACEHOLDERS.items()})
    env.update(LEAFPOOL_HOME=str(home), COLUMNS="80")
    done = subprocess.run([sys.executable, "-m", "leafpool.cli", "redis", "acl",
                           "--disable-default"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_shipped_file_is_what_the_command_prints_for_the_placeholders(
    tmp_path: Path,
) -> None:
    assert SHIPPED.read_text() == _printed(tmp_path / "home"), (
        "ops/redis/users.acl differs from `leafpool redis acl --disable-default` with "
        "LEAFPOOL_ACL_<ROLE>_PASSWORD=CHANGE-ME-<role>: print it again into the file")
    users = [line.split()[1] for line in SHIPPED.read_text().splitlines()]
    assert users == ["default", *(f"leafpool-{role}" for role in acl.ROLES)]
    assert {"leafpool-app", "leafpool-worker", "leafpool-monitor", "leafpool-http",
            "leafpool-admin"} <= set(users)


@pytest.fixture(scope="module")
def shipped_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[services.Server]:
    # a copy: ACL SAVE must never write into the shipped file
    path = tmp_path_factory.mktemp("acl-file") / "users.acl"
    shutil.copyfile(SHIPPED, path)
    server = services.redis_server(extra_args=["--aclfile", str(path)])
    yield server
    server.stop()


def _client(server: services.Server, **auth: str) -> redis.Redis:
    """A client that tries once (redis-py would retry a refused login with backoff)."""
    return redis.Redis(port=server.port, retry=Retry(NoBackoff(), 0), **auth)


def test_a_redis_server_loads_the_shipped_file(shipped_server: services.Server) -> None:
    # redis-server refuses to start on a line it cannot load: it started, so all loaded
    with pytest.raises(redis.AuthenticationError):  # the default user is off
        _client(shipped_server).ping()
    with pytest.raises(redis.AuthenticationError):
        _client(shipped_server, username="default", password="").ping()
    for role, password in PLACEHOLDERS.items():
        user = _client(shipped_server, username=f"leafpool-{role}", password=password)
        assert user.ping()
        user.close()
        with pytest.raises(redis.AuthenticationError):
            _client(shipped_server, username=f"leafpool-{role}", password=password + "x").ping()
