"""docker-compose.yml's snowflake-worker keeps its worker ID across
``docker compose up --force-recreate`` (issue 20, item 4). No Docker engine here: the
service's command and environment, as ``docker-compose config`` resolves them, run as a
process whose hostname is new each time (a UTS namespace with a hostname of its own, as
a recreated container gets; Celery's ``%h`` reads it), with a fresh LEAFPOOL_HOME each
time (nothing kept in the container), the backends pointed at the test's ZooKeeper and
Redis. Each run holds worker 0, says so through the service's healthcheck, and a run
after a SIGKILLed one waits for the lease instead of generating beside it.
"""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.processes import Proc, leafpool_env
from tests.support.services import unavailable
from tests.support.zk_helpers import unique_name, wait_serving
from tests.system.test_compose import SECRETS, compose_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    config = compose_config(tmp_path_factory.mktemp("compose"), SECRETS)
    spec: dict[str, Any] = config["services"]["snowflake-worker"]
    return spec


def _in_uts_namespace() -> bool:
    if shutil.which("unshare") is None or os.geteuid() != 0:
        return False
    done = subprocess.run(["unshare", "--uts", "hostname", "x"], capture_output=True)
    return done.returncode == 0


def _env(spec: dict[str, Any], home: Path, zk_hosts: str, redis_url: str,
         hostname: str) -> dict[str, str]:
    """The service's environment, its backends replaced by the test's (a SQLite database:
    without compose's MySQL and its TLS)."""
    env = {k: str(v) for k, v in spec["environment"].items()
           if not k.startswith("LEAFPOOL_DATABASE_TLS")}
    env.update(LEAFPOOL_ZK_HOSTS=zk_hosts, LEAFPOOL_REDIS_URL=redis_url,
               LEAFPOOL_BROKER_URL=redis_url,
               LEAFPOOL_DATABASE_URL=f"sqlite:///{home / 'leafpool.sqlite3'}",
               LEAFPOOL_HOME=str(home), HOSTNAME=hostname)
    return leafpool_env(raw=env)


class Container:
    """One run of the service: its command in a UTS namespace named ``hostname``."""

    def __init__(self, spec: dict[str, Any], env: dict[str, str], hostname: str) -> None:
        command = [sys.executable if c == "celery" else c for c in spec["command"]]
        if command[0] == sys.executable:
            command.insert(1, "-m")
            command.insert(2, "celery")
        self.env, self.hostname = env, hostname
        self.proc = Proc(["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"',
                          hostname, *command], env)
        self.output: list[str] = []

    def wait_for(self, text: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.proc.lines.get(timeout=0.1)
            except queue.Empty:
                continue
            self.output.append(line)
            if text in line:
                return line
        raise TimeoutError(f"{text!r} not seen in {timeout}s: {self.output[-30:]}")

    def healthcheck(self, spec: dict[str, Any]) -> subprocess.CompletedProcess[str]:
        test = list(spec["healthcheck"]["test"])
        assert test[0] == "CMD" and test[1] == "leafpool", test
        return subprocess.run([sys.executable, "-m", "leafpool.cli", *test[2:]], env=self.env,
                              cwd=ROOT, capture_output=True, text=True, timeout=30)


def test_the_worker_id_is_kept_across_recreates(
    service: dict[str, Any], zk_hosts: str, redis_url: str, tmp_path: Path,
) -> None:
    if not _in_uts_namespace():
        unavailable("a UTS namespace (unshare --uts, as root) to give each run its hostname")
    wait_serving(zk_hosts)
    assert "--concurrency=1" in service["command"]
    name = unique_name()
    claims = []
    previous: Container | None = None
    for run, how in enumerate(["first", "stopped", "killed"]):
        hostname = f"{run:x}c9e1d2a3b4f{run}"  # a container ID, new at each recreate
        home = tmp_path / f"run{run}"
        env = _env(service, home, zk_hosts, redis_url, hostname)
        env.update(LEAFPOOL_SNOWFLAKE_NAME=name, LEAFPOOL_SNOWFLAKE_LEASE_SECONDS="2",
                   LEAFPOOL_SNOWFLAKE_RENEW_SECONDS="0.3")  # a short lease: a short test
        if previous is not None and how == "stopped":
            previous.proc.stop()  # compose's stop: SIGTERM, a clean release
        container = Container(service, env, hostname)
        if previous is not None and how == "killed":
            # the predecessor still holds the lease (a container killed, its session not
            # expired yet): the new one must wait, not generate beside it
            line = container.wait_for("worker ID not claimed", 30)
            assert "is leased by" in line
            previous.proc.kill()
        claimed = container.wait_for("claimed worker", 60)
        assert f"{hostname}:snowflake@{hostname}:0" in claimed  # the new hostname...
        claims.append(int(claimed.split("claimed worker ")[1].split()[0]))
        health = container.healthcheck(service)
        assert health.returncode == 0, health.stderr
        assert f"ready: {hostname}:snowflake@{hostname}:0: worker 0 (k8s" in health.stdout
        previous = container
    assert previous is not None
    previous.proc.stop()
    assert claims == [0, 0, 0]  # ...the same worker ID
