"""A MariaDB of a test module's own, to kill (SIGKILL) and stop (SIGSTOP) as an outage,
as tests/system/test_db_outage.py does: ``own_mariadb = own_mariadb_fixture()``. Each
test gets a new database on it (:func:`fresh_database`); a stopped server is continued
and a killed one started again before the next test and at the end."""

from __future__ import annotations

import itertools
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import services

_names = itertools.count()


def _own_mariadb() -> Iterator[services.Server]:
    if shutil.which("mariadbd") is None and shutil.which("mysqld") is None \
            and not Path("/usr/sbin/mariadbd").exists():
        services.missing("mariadb-server")
    db = services.mariadb_server()
    try:
        yield db
    finally:
        cont(db)
        db.stop()


def own_mariadb_fixture() -> Any:
    """A test module's MariaDB of its own (module scope)."""
    return pytest.fixture(_own_mariadb, scope="module")


def stop(db: services.Server) -> None:
    """SIGSTOP: the server keeps its port (the kernel accepts connections) and answers
    nothing, as a frozen VM or a blackholed link."""
    assert db.proc is not None
    os.killpg(db.proc.pid, signal.SIGSTOP)


def cont(db: services.Server) -> None:
    if db.proc is not None and db.proc.poll() is None:
        os.killpg(db.proc.pid, signal.SIGCONT)


def heal(db: services.Server) -> None:
    """Whatever the test did, the server runs and answers again."""
    cont(db)
    if db.proc is None or db.proc.poll() is not None:
        db.start(timeout=60)


def fresh_database(db: services.Server) -> str:
    """A new, empty database on ``db``; its URL."""
    heal(db)
    name = f"lp_own_{os.getpid()}_{next(_names)}"
    subprocess.run([db.extra["client"], f"--socket={db.extra['socket']}", "-uroot", "-e",
                    f"CREATE DATABASE {name}"], check=True, capture_output=True, timeout=60)
    return str(db.extra["url"]).rsplit("/", 1)[0] + f"/{name}"
