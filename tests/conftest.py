"""Fixtures: real redis-server, MariaDB and ZooKeeper on loopback (see
tests/support/services.py), one of each per test session; every test gets clean data in
them. Every test also checks that each Redis command leafpool's code sent during it came
from the Redis layer (tests/support/redis_layer.py)."""

from __future__ import annotations

import itertools
import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlparse

import pytest
import redis

from leafpool.core.config import Settings, load_settings
from leafpool.redis.pool import Pool
from leafpool.segment.store import SegmentStore
from tests.support import redis_layer, services
from tests.support.faultproxy import FaultProxy
from tests.support.servers import NotInstalled
from tests.support.tls import Pki, make_pki

# after a run with failures, only the failed tests' tmp_path stays (not the fixtures'
# shared directories: a CA's keys, compose files)
pytest_plugins = ["tests.support.tmp_retention",
                  # the bench's smoke runs, one a section per session (bench_smoke)
                  "tests.support.bench_smoke"]

_db_counter = itertools.count()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules holding a ``slow`` test run first, the rest after, each module's tests
    kept together and in order: ``./dev test``'s workers (``--dist loadgroup``) take the
    tests in this order, and a long test taken last ended the run alone (the bench's
    sections, the system tests, collected after every other directory, ran in the last
    minutes while the other workers had finished)."""
    slow_modules = {item.nodeid.split("::", 1)[0] for item in items
                    if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.nodeid.split("::", 1)[0] not in slow_modules)


@pytest.fixture(autouse=True)
def _redis_commands_from_the_redis_layer() -> Iterator[None]:
    """Fails the test during which leafpool's code outside ``leafpool/redis/`` sent a
    Redis command (docs/design.md §0)."""
    recorder = redis_layer.install()
    recorder.take()
    yield
    outside = recorder.take()
    assert not outside, f"Redis commands sent from outside leafpool/redis/: {outside[:5]}"


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No LEAFPOOL_* setting from the developer's shell leaks into a test."""
    for name in list(os.environ):
        if name.startswith("LEAFPOOL_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("LEAFPOOL_HOME", str(tmp_path / "home"))


@pytest.fixture(scope="session")
def redis_server() -> Iterator[services.Server]:
    server = services.redis_server()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: services.Server) -> Iterator[str]:
    client = redis.Redis.from_url(redis_server.extra["url"])
    client.flushall()
    client.close()
    yield redis_server.extra["url"]


@pytest.fixture
def r(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture(scope="session")
def mariadb_server() -> Iterator[services.Server]:
    server = services.mariadb_server()
    yield server
    server.stop()


def _fresh_database(server: services.Server) -> str:
    name = f"lp_{os.getpid()}_{next(_db_counter)}"
    subprocess.run(
        [server.extra["client"], f"--socket={server.extra['socket']}", "-uroot", "-e",
         f"CREATE DATABASE {name}"], check=True, capture_output=True, timeout=30)
    return server.extra["url"].rsplit("/", 1)[0] + f"/{name}"


@pytest.fixture
def mysql_url(mariadb_server: services.Server) -> str:
    """A new, empty MariaDB database for this test."""
    return _fresh_database(mariadb_server)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'leafpool.sqlite3'}"


@pytest.fixture(params=["sqlite", "mysql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The contract suite runs against both segment stores."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'leafpool.sqlite3'}"
    server = request.getfixturevalue("mariadb_server")
    return _fresh_database(server)


@pytest.fixture
def store(database_url: str) -> Iterator[SegmentStore]:
    s = SegmentStore.from_url(database_url)
    s.init_schema()
    yield s
    s.engine.dispose()


@pytest.fixture
def make_settings(redis_url: str, tmp_path: Path) -> Callable[..., Settings]:
    def make(**overrides: object) -> Settings:
        values: dict[str, object] = {
            "redis_url": redis_url,
            "database_url": f"sqlite:///{tmp_path / 'leafpool.sqlite3'}",
        }
        values.update(overrides)
        return load_settings(**values)

    return make


@pytest.fixture
def pool(r: redis.Redis) -> Pool:
    return Pool(r, "leafpool")


@pytest.fixture(scope="session")
def zk_server() -> Iterator[services.Server]:
    server = services.zookeeper_server()
    yield server
    server.stop()


@pytest.fixture
def zk_hosts(zk_server: services.Server) -> str:
    return zk_server.extra["hosts"]


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A throwaway CA with server and client certificates (tests/support/tls.py)."""
    try:
        return make_pki(tmp_path_factory.mktemp("pki"))
    except NotInstalled as exc:
        services.missing(exc.what)


@pytest.fixture
def proxy(redis_url: str) -> Iterator[FaultProxy]:
    """A fault-injecting proxy (tests/support/faultproxy.py) in front of the session's
    redis-server; at the end, no protocol error and no thread of it left."""
    url = urlparse(redis_url)
    assert url.hostname and url.port
    p = FaultProxy(url.hostname, url.port).start()
    yield p
    p.stop()
    assert not p.errors
    assert not [t for t in threading.enumerate() if t.name.startswith(f"faultproxy-{p.port}-")]
