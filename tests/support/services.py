"""Real servers for the tests (see tests/support/servers.py, which starts them and does not
import pytest): here a missing binary makes the tests that need it skip with the reason,
except under ``CI=true`` where it is a failure (CI must install what the tests need)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import pytest

from tests.support import servers
from tests.support.servers import (
    ROOT,
    ZK_CLASSPATH,
    NotInstalled,
    Server,
    free_port,
    port_open,
    wait_until,
)

__all__ = [
    "IN_CI",
    "ROOT",
    "ZK_CLASSPATH",
    "Server",
    "free_port",
    "mariadb_server",
    "missing",
    "port_open",
    "redis_server",
    "require_fuse",
    "unavailable",
    "wait_until",
    "zookeeper_server",
]

IN_CI = os.environ.get("CI", "").lower() == "true"


def missing(what: str) -> NoReturn:
    """Skip locally, fail under CI=true."""
    unavailable(str(NotInstalled(what)))


def unavailable(reason: str) -> NoReturn:
    """Skip locally with ``reason``, fail under CI=true (CI must provide it)."""
    if IN_CI:
        pytest.fail(reason)
    pytest.skip(reason)


def require_fuse() -> None:
    """The power-loss filesystem (tests/support/lazyfs.py) can be mounted here, or skip/fail."""
    from tests.support import lazyfs

    reason = lazyfs.fuse_missing()
    if reason is not None:
        unavailable(reason)


def redis_server(config: Path | None = None, extra_args: list[str] | None = None,
                 tls_args: Callable[[int], list[str]] | None = None) -> Server:
    """A redis-server on a free port; ``config`` defaults to the shipped ops/redis.conf."""
    try:
        return servers.redis_server(config, extra_args, tls_args)
    except NotInstalled as exc:
        missing(exc.what)


def mariadb_server(extra_args: list[str] | None = None) -> Server:
    try:
        return servers.mariadb_server(extra_args)
    except NotInstalled as exc:
        missing(exc.what)


def zookeeper_server(extra_cfg: str = "") -> Server:
    try:
        return servers.zookeeper_server(extra_cfg)
    except NotInstalled as exc:
        missing(exc.what)
