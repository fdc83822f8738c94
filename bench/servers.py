"""Servers for the benchmarks: the same launchers the tests use (loopback, free ports,
throwaway data directories)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from tests import services


@contextmanager
def redis(*extra: str) -> Iterator[services.Server]:
    server = services.redis_server(extra_args=list(extra))
    try:
        yield server
    finally:
        server.stop()


@contextmanager
def mariadb() -> Iterator[services.Server]:
    server = services.mariadb_server()
    try:
        yield server
    finally:
        server.stop()
