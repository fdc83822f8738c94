"""Servers for the benchmarks: the same launchers the tests use (loopback, free ports,
throwaway data directories), from ``tests/servers.py``, which does not import pytest (the
``bench`` extra does not install it)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from tests import servers
from tests.servers import free_port, wait_until

__all__ = ["free_port", "mariadb", "redis", "wait_until"]


@contextmanager
def redis(*extra: str) -> Iterator[servers.Server]:
    server = servers.redis_server(extra_args=list(extra))
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def mariadb() -> Iterator[servers.Server]:
    server = servers.mariadb_server()
    try:
        yield server
    finally:
        server.stop()
