"""Servers for the benchmarks: the same launchers the tests use (loopback, free ports,
throwaway data directories), from ``tests/support/servers.py``, which does not import pytest (the
``bench`` extra does not install it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from leafpool.children import die_with_parent
from tests.support import servers
from tests.support.servers import free_port, wait_until

__all__ = ["celery_worker", "free_port", "mariadb", "redis", "wait_until"]

ROOT = Path(__file__).resolve().parent.parent


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


@contextmanager
def celery_worker(env: dict[str, str], home: Path, name: str) -> Iterator[subprocess.Popen[bytes]]:
    """``celery -A workers worker -B -c 2``, killed with its children afterwards."""
    log = open(home / f"{name}.log", "ab")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "workers",
            "worker",
            "-B",
            "-c",
            "2",
            "--loglevel=WARNING",
            "-n",
            f"{name}@%h",
            "-s",
            str(home / f"{name}-beat"),
        ],
        env=env,
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=die_with_parent(signal.SIGKILL),
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:  # a warm shutdown first: the beat releases its lock
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
        log.close()
