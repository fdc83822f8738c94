"""``leafpool up`` (the README's first command, after installing): the embedded default
comes up, serves IDs from both modes, and whatever signals arrive (Ctrl-C, Ctrl-C again
while it stops, SIGINT to its process group, SIGTERM, SIGKILL of ``leafpool up``
itself) no process it started outlives it: redis-server, the worker and its pool
processes, beat and the HTTP service."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from tests.support import services
from tests.support.processes import Proc, leafpool_env, running

pytestmark = pytest.mark.slow

CHILDREN = ("redis", "worker", "beat", "http")


@dataclass
class Up:
    proc: Proc
    redis_port: int
    http_port: int
    children: dict[str, int]  # name -> pid, as `leafpool up` reported them
    tree: list[int]  # every process below `leafpool up` once it serves IDs
    logs: Path

    def send(self, sig: int, group: bool = False) -> None:
        if group:
            os.killpg(self.proc.proc.pid, sig)
        else:
            self.proc.proc.send_signal(sig)

    def assert_nothing_left(self) -> None:
        """Every process it started is gone (bounded polling: after SIGKILL of `leafpool up`
        the kernel signals its children, and they take a moment to exit) and the ports are
        closed."""
        services.wait_until(lambda: not [p for p in self.tree if running(p)], 60,
                            "every child of leafpool up gone")
        services.wait_until(lambda: not services.port_open(self.redis_port)
                            and not services.port_open(self.http_port), 10, "ports closed")
        # redis-server was stopped with SIGTERM (its append-only file closed), not killed
        assert "ready to exit" in (self.logs / "redis.log").read_text()


@pytest.fixture
def start_up(tmp_path: Path) -> Iterator[Callable[[], Up]]:
    """Start `leafpool up`; at teardown, even after a failure, nothing it started is left."""
    if shutil.which("redis-server") is None:
        services.missing("redis-server")
    started: list[Proc] = []

    def start() -> Up:
        port, http_port = services.free_port(), services.free_port()
        env = leafpool_env(home=tmp_path / "home", redis_url=f"redis://127.0.0.1:{port}/0",
                           http_port=http_port)
        proc = Proc([sys.executable, "-m", "leafpool.cli", "up"], env)
        started.append(proc)
        children = {}
        for name in CHILDREN:
            line = proc.wait_line(f"  started {name} (pid ", 60)
            children[name] = int(line.split("pid ")[1].split(",")[0])
        proc.wait_line("Ctrl-C stops everything", 120)
        tree = proc.tree()
        assert set(children.values()) <= set(tree)
        worker_pool = [p for p in tree if p not in children.values()]
        assert len(worker_pool) >= 2, tree  # `-c 2`: the prefork pool served the refills
        return Up(proc, port, http_port, children, tree, tmp_path / "home" / "logs")

    yield start
    for proc in started:
        proc.kill()


def test_up_serves_ids_and_stops_everything_on_ctrl_c(start_up: Callable[[], Up]) -> None:
    up = start_up()
    # the lines before "Ctrl-C stops everything" were consumed by the fixture: pop on
    r = redis.Redis(port=up.redis_port)
    assert int(r.lpop("leafpool:{demo}:ids")) == 6  # type: ignore[arg-type]
    services.wait_until(lambda: services.port_open(up.http_port), 30, "HTTP service")
    with urllib.request.urlopen(f"http://127.0.0.1:{up.http_port}/api/segment/get/demo",
                                timeout=10) as resp:
        assert int(resp.read()) > 6
    up.send(signal.SIGINT)
    assert up.proc.proc.wait(timeout=60) == 0
    for pid in up.children.values():  # every child was waited for: none is left running
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    up.assert_nothing_left()


@pytest.mark.parametrize("first, group", [
    (signal.SIGINT, False),  # Ctrl-C, then Ctrl-C again while it stops
    (signal.SIGINT, True),  # SIGINT to the whole process group, repeated
    (signal.SIGTERM, False),  # SIGTERM, then SIGINT and SIGTERM while it stops
], ids=["ctrl-c-twice", "process-group", "sigterm"])
def test_signals_while_stopping_do_not_cut_the_stop_short(
    start_up: Callable[[], Up], first: int, group: bool
) -> None:
    up = start_up()
    up.send(first, group)
    up.send(signal.SIGINT, group)  # in quick succession, as a user pressing twice
    up.proc.wait_line("stopping ...", 30)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGINT):  # while the children stop
        up.send(sig, group)
    assert up.proc.proc.wait(timeout=60) == 0
    up.assert_nothing_left()


def test_children_die_with_up_when_it_is_sigkilled(start_up: Callable[[], Up]) -> None:
    up = start_up()
    up.proc.proc.kill()  # SIGKILL to `leafpool up` alone: no stop runs
    up.proc.proc.wait(timeout=10)
    up.assert_nothing_left()


def test_ctrl_c_while_starting_stops_what_was_started(tmp_path: Path) -> None:
    if shutil.which("redis-server") is None:
        services.missing("redis-server")
    port, http_port = services.free_port(), services.free_port()
    env = leafpool_env(home=tmp_path / "home", redis_url=f"redis://127.0.0.1:{port}/0",
                       http_port=http_port)
    proc = Proc([sys.executable, "-m", "leafpool.cli", "up"], env)
    try:
        proc.wait_line("  started worker (pid ", 60)
        proc.proc.send_signal(signal.SIGINT)
        proc.wait_line("stopped", 60)
        assert proc.proc.wait(timeout=30) == 0
        started = [int(line.split("pid ")[1].split(",")[0]) for line in proc.seen
                   if line.startswith("  started ")]
        assert len(started) >= 2  # redis and the worker at least
        services.wait_until(lambda: not [p for p in started if running(p)], 30,
                            "children gone")
        assert not services.port_open(port)
    finally:
        proc.kill()


def test_proc_kill_leaves_no_descendant_behind(tmp_path: Path) -> None:
    """The tests' own helper: killing a child also kills what it started in sessions of
    its own (as `leafpool up` does), so a failed test leaves no process behind."""
    script = ("import subprocess, sys\n"
              "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'],"
              " start_new_session=True)\n"
              "print(p.pid, flush=True)\n"
              "import time; time.sleep(600)\n")
    proc = Proc([sys.executable, "-c", script], leafpool_env())
    grandchild = int(proc.wait_line("", 30))
    try:
        assert running(grandchild)
        proc.kill()
        services.wait_until(lambda: not running(grandchild), 10, "grandchild gone")
    finally:
        if running(grandchild):
            os.kill(grandchild, signal.SIGKILL)


def test_up_names_the_database_and_redis_urls_without_their_passwords(tmp_path: Path) -> None:
    """A MySQL URL and a Redis URL that is not this host's (127.0.0.2: loopback, but not
    one ``leafpool up`` starts a redis-server for): what ``up`` says, and the error it
    stops with, name both without their passwords."""
    from leafpool.core.config import load_settings
    from leafpool.core.errors import BackendUnavailable
    from leafpool.embedded import up

    said: list[str] = []
    settings = load_settings(database_url="mysql+pymysql://leaf:Db%2FS3cret@127.0.0.1:1/x",
                             redis_url="redis://u:R3d%40is@127.0.0.2:1/0")
    with pytest.raises(BackendUnavailable) as stopped:
        up(settings, say=said.append, forever=False)
    shown = "\n".join([*said, str(stopped.value)])
    assert "LEAFPOOL_DATABASE_URL=mysql+pymysql://leaf:***@127.0.0.1:1/x" in shown
    assert "redis://u:***@127.0.0.2:1/0" in shown
    assert "S3cret" not in shown and "R3d" not in shown
