"""What Flower shows of leafpool's tasks holds no password (issue 18, secrets): a real
``celery worker`` and Flower, as docker-compose.yml runs them (the worker role's URLs on a
redis-server loaded with ``leafpool redis acl --disable-default``, Flower behind basic
auth), every URL carrying a password the test knows; leafpool's tasks are sent as leafpool
sends them (and the sweep sends refills of its own) while their backends fail: the pools'
Redis closed, the database closed, a snowflake mode the database URL does not fit. The
args, kwargs, results, exceptions and tracebacks Flower holds, its workers' view and the
worker's log name none of the passwords. Also the compose health checks of Flower (no
auth needed) and of a worker (``inspect ping`` under the worker role)."""

from __future__ import annotations

import base64
import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from leafpool.core.config import load_settings
from leafpool.redis import acl
from leafpool.redis.connect import connect
from leafpool.redis.pool import Pool
from tests.support import services
from tests.support.processes import Proc, leafpool_env

pytestmark = pytest.mark.slow

#: every password the test hands out, told apart from anything else a page may hold
PASSWORDS = {role: f"Pw{role.capitalize()}7Q3xK" for role in acl.ROLES}
DB_PASSWORD = "PwDatabase9Z2v"
POOLS_PASSWORD = "PwPools4N8r"  # the pools' Redis, closed in the first part
FLOWER_AUTH = "flower:PwFlower5J6m"
SECRETS = [*PASSWORDS.values(), DB_PASSWORD, POOLS_PASSWORD, FLOWER_AUTH.split(":")[1]]
CELERY = [sys.executable, "-m", "celery", "-A", "workers"]
#: what each part sends, as leafpool sends it (task name, args)
SENT = [("leafpool.refill_segment", ["order"]), ("leafpool.refill_snowflake", ["sf"]),
        ("leafpool.refill_segments", [["a", "b"]]), ("leafpool.refill_snowflakes", [["c"]]),
        ("leafpool.sweep", []), ("leafpool.sync_tags", [])]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[services.Server]:
    home = tmp_path_factory.mktemp("flower-acl")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEAFPOOL_")}
    env.update({f"LEAFPOOL_ACL_{r.upper()}_PASSWORD": pw for r, pw in PASSWORDS.items()},
               LEAFPOOL_HOME=str(home), COLUMNS="80",
               LEAFPOOL_BROKER_URL="redis://127.0.0.1:6379/1")  # compose's broker database
    printed = subprocess.run([sys.executable, "-m", "leafpool.cli", "redis", "acl",
                              "--disable-default"], env=env, capture_output=True, text=True,
                             timeout=60, check=True)
    (home / "users.acl").write_text(printed.stdout)
    srv = services.redis_server(extra_args=["--aclfile", str(home / "users.acl")])
    yield srv
    srv.stop()


def _url(server: services.Server, role: str, db: int) -> str:
    return f"redis://leafpool-{role}:{PASSWORDS[role]}@127.0.0.1:{server.port}/{db}"


def _get(port: int, path: str, auth: bool = True) -> tuple[int, str]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if auth:
        token = base64.b64encode(FLOWER_AUTH.encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def _flower(server: services.Server, home: Path) -> tuple[Proc, int]:
    port = services.free_port()
    env = leafpool_env(home=home, redis_url=_url(server, "worker", 0),
                       broker_url=_url(server, "worker", 1),
                       raw={"FLOWER_BASIC_AUTH": FLOWER_AUTH})
    flower = Proc([*CELERY, "flower", f"--port={port}", "--address=127.0.0.1"], env,
                  home / "flower.log")
    return flower, port


def _send(env: dict[str, str]) -> list[str]:
    """The tasks of SENT, sent by leafpool's own task objects; their IDs."""
    code = ("import json, sys; from workers import tasks; from workers.application import app; "
            "print(json.dumps([app.tasks[n].apply_async(tuple(a)).id "
            "for n, a in json.loads(sys.argv[1])]))")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(SENT)], env=env,
                          cwd=services.ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    ids: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return ids


def _tasks(port: int) -> dict[str, dict[str, Any]]:
    status, body = _get(port, "/api/tasks")
    return json.loads(body) if status == 200 else {}


def _run_part(server: services.Server, flower_port: int, home: Path,
              env: dict[str, str]) -> dict[str, dict[str, Any]]:
    """A worker under ``env``: the compose health check answers, SENT is sent, and every
    task reaches a final state in Flower; Flower's tasks."""
    hostname = socket.gethostname()
    worker = Proc([*CELERY, "worker", "-Q", "leafpool.segment,leafpool.snowflake,"
                   "leafpool.control", "-n", "segment@%h", "-c", "2", "--loglevel=INFO"],
                  env, home / "worker.log")
    try:
        check = [*CELERY, "inspect", "ping", "-d", f"segment@{hostname}", "--timeout", "5"]
        services.wait_until(lambda: subprocess.run(
            check, env=env, cwd=services.ROOT, capture_output=True, timeout=60
        ).returncode == 0, 60, "the worker's health check (inspect ping, worker role)")
        ids = _send(env)
        final = {"SUCCESS", "FAILURE"}
        services.wait_until(
            lambda: all(_tasks(flower_port).get(i, {}).get("state") in final for i in ids),
            90, "every task final in Flower")
        # the sweep's own refills, too
        services.wait_until(lambda: all(t.get("state") in final
                                        for t in _tasks(flower_port).values()), 60,
                            "the sweep's refills final in Flower")
        tasks = _tasks(flower_port)
        status, workers = _get(flower_port, "/api/workers?refresh=1")
        assert status == 200 and f"segment@{hostname}" in workers
        tasks["_workers"] = {"view": workers}
        log = (home / "worker.log").read_text()
        tasks["_log"] = {"view": log}
        return tasks
    finally:
        worker.stop()


def _failed(task: dict[str, Any]) -> bool:
    """The task failed, or (a batch) each of its tags did, with the error shown."""
    if task.get("state") == "FAILURE":
        return bool(task.get("exception")) and bool(task.get("traceback"))
    return "'failed': {'" in str(task.get("result")) and "'refilled': {}" in str(
        task.get("result"))


def _leaks(tasks: dict[str, dict[str, Any]]) -> list[str]:
    return [f"{tid}: {field} holds {secret!r}" for tid, task in tasks.items()
            for field, value in task.items() for secret in SECRETS if secret in str(value)]


def test_flower_shows_no_password_of_leafpools_tasks_and_asks_for_its_own(
    server: services.Server, tmp_path: Path
) -> None:
    flower, port = _flower(server, tmp_path / "flower-home")
    try:
        # compose's health check: Flower 2.2 answers /healthcheck without the basic auth
        services.wait_until(lambda: _get(port, "/healthcheck", auth=False) == (200, "OK"),
                            60, "Flower's /healthcheck")
        assert _get(port, "/api/tasks", auth=False)[0] == 401
        assert _get(port, "/", auth=False)[0] == 401
        assert _get(port, "/api/tasks")[0] == 200
        closed = services.free_port()
        # the first part: the pools' Redis and the database do not answer
        first = _run_part(server, port, tmp_path / "first", leafpool_env(
            home=tmp_path / "first",
            redis_url=f"redis://leafpool-worker:{POOLS_PASSWORD}@127.0.0.1:{closed}/0",
            broker_url=_url(server, "worker", 1),
            database_url=f"mysql+pymysql://leaf:{DB_PASSWORD}@127.0.0.1:{closed}/leaf",
            snowflake_mode="mysql", refill_retry_max=1, refill_retry_backoff_max=1))
        assert all(_failed(t) for t in first.values() if "state" in t), first  # as meant
        assert sum(1 for t in first.values() if "state" in t) == len(SENT)
        # the second: the pools answer (the sweep finds a tag due and sends its refill),
        # the database URL fits no snowflake mode mysql, and its file cannot be opened
        Pool(connect(load_settings(redis_url=_url(server, "admin", 0)))).register(
            "due", "segment", 0)
        second = _run_part(server, port, tmp_path / "second", leafpool_env(
            home=tmp_path / "second", redis_url=_url(server, "worker", 0),
            broker_url=_url(server, "worker", 1),
            database_url=f"sqlite://leaf:{DB_PASSWORD}@//{tmp_path}/missing/leafpool.db",
            snowflake_mode="mysql", refill_retry_max=1, refill_retry_backoff_max=1))
        names = {t.get("name") for t in second.values() if "args" in t}
        assert {name for name, _ in SENT} <= names
        due = [t for t in second.values() if "'due'" in str(t.get("args"))]
        assert due, "the sweep sent the due tag's refill"
        shown = [str(t.get("exception")) for t in second.values() if t.get("exception")]
        assert any("snowflake mode mysql" in text for text in shown), shown
    finally:
        flower.stop()
    leaks = _leaks(first) + _leaks(second)
    assert not leaks, "\n".join(leaks)
