"""``leafpool up``: the embedded default on one machine, for a first look.

SQLite (``LEAFPOOL_HOME/leafpool.sqlite3``), a local redis-server started with the shipped
``ops/redis/redis.conf`` when none answers at ``LEAFPOOL_REDIS_URL``, one Celery worker
and beat (as the standard ``celery -A workers`` commands, in child processes), and,
when installed, the HTTP service. A demo tag is registered and a few IDs are popped.
Ctrl-C stops everything that was started here.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

import redis

from leafpool.config import Settings, default_home
from leafpool.errors import BackendUnavailable, TagExists
from leafpool.runtime import Runtime

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
REDIS_CONF = ROOT / "ops" / "redis" / "redis.conf"


@dataclass
class Embedded:
    settings: Settings
    say: Callable[[str], None] = print
    children: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def home(self) -> Path:
        return default_home()

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        logs = self.home / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / f"{name}.log", "ab") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                    start_new_session=True)
        self.children.append(proc)
        self.say(f"  started {name} (pid {proc.pid}, log {logs / (name + '.log')})")
        return proc

    def ensure_redis(self) -> None:
        client = redis.Redis.from_url(self.settings.redis_url, socket_connect_timeout=1)
        with contextlib.suppress(redis.ConnectionError):
            client.ping()
            self.say(f"  redis answers at {self.settings.redis_url}")
            return
        url = urlparse(self.settings.redis_url)
        if url.hostname not in ("127.0.0.1", "localhost"):
            raise BackendUnavailable(f"redis: nothing answers at {self.settings.redis_url}")
        binary = shutil.which("redis-server")
        if binary is None:
            raise BackendUnavailable(
                "redis: redis-server is not installed; install it with "
                "`apt-get install redis-server` (Debian/Ubuntu) or point "
                "LEAFPOOL_REDIS_URL at a running Redis")
        data = self.home / "redis"
        data.mkdir(parents=True, exist_ok=True)
        self._spawn("redis", [binary, str(REDIS_CONF), "--port", str(url.port or 6379),
                              "--bind", "127.0.0.1", "--dir", str(data), "--daemonize", "no"])
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise BackendUnavailable("redis: started but not answering") from None
                time.sleep(0.1)  # polling for the server to accept connections

    def start_celery(self) -> None:
        celery = [sys.executable, "-m", "celery", "-A", "workers"]
        self._spawn("worker", [*celery, "worker", "--loglevel=INFO", "-c", "2"])
        self._spawn("beat", [*celery, "beat", "--loglevel=INFO",
                             "-s", str(self.home / "celerybeat-schedule")])

    def start_http(self) -> bool:
        if importlib.util.find_spec("leafpool.http") is None:
            return False
        self._spawn("http", [sys.executable, "-m", "leafpool.cli", "serve"])
        return True

    def demo_tags(self, rt: Runtime, tag: str, flake: str) -> None:
        rt.store.init_schema()
        with contextlib.suppress(TagExists):
            rt.store.add_tag(tag, step=1000, description="leafpool demo tag")
        with contextlib.suppress(TagExists):
            rt.store.add_snowflake_tag(flake, description="leafpool demo snowflake tag")
        now_ms = int(time.time() * 1000)
        rt.pool.register(tag, "segment", now_ms, table_step=1000)
        rt.pool.register(flake, "snowflake", now_ms)

    def stop(self) -> None:
        for proc in reversed(self.children):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in reversed(self.children):
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@contextlib.contextmanager
def embedded(settings: Settings, say: Callable[[str], None] = print) -> Iterator[Embedded]:
    env = Embedded(settings, say)
    try:
        yield env
    finally:
        say("stopping ...")
        env.stop()


def up(settings: Settings, tag: str = "demo", say: Callable[[str], None] = print,
       forever: bool = True) -> list[int]:
    """Bring up the embedded default, show IDs being served, wait for Ctrl-C."""
    if not settings.database_url.startswith("sqlite"):
        say(f"  using LEAFPOOL_DATABASE_URL={settings.database_url}")
    with embedded(settings, say) as env:
        env.ensure_redis()
        rt = Runtime(settings)
        flake = f"{tag}.flake"
        env.demo_tags(rt, tag, flake)
        env.start_celery()
        http = env.start_http()
        keys = [rt.pool.tag(tag).ids, rt.pool.tag(flake).ids]
        deadline = time.monotonic() + 60
        while min(rt.redis.llen(k) for k in keys) < 10:
            if time.monotonic() > deadline:
                raise BackendUnavailable(f"{tag}, {flake}: the pools were not filled within "
                                         f"60 s; see the logs under {env.home / 'logs'}")
            exited = [p for p in env.children if p.poll() is not None]
            if exited:
                raise BackendUnavailable(f"a child process exited (pid {exited[0].pid}); "
                                         f"see the logs under {env.home / 'logs'}")
            time.sleep(0.2)  # polling for the first refill
        from leafpool.client import Client

        client = Client(rt.redis, settings=settings)
        ids = client.next_ids(tag, 5)
        flakes = client.next_ids(flake, 3)
        port = urlparse(settings.redis_url).port or 6379
        say(f"\nIDs served from the segment pool '{tag}': {ids}")
        say(f"IDs served from the snowflake pool '{flake}': {flakes}\n")
        say(f"  redis-cli -p {port} LPOP 'leafpool:{{{tag}}}:ids'")
        say(f"  redis-cli -p {port} LPOP 'leafpool:{{{tag}}}:ids' 100")
        say(f"  leafpool pop {tag} -n 5     leafpool decode {flakes[0]}     leafpool status")
        if http:
            say(f"  curl http://{settings.http_host}:{settings.http_port}/api/segment/get/{tag}")
        say("\nCtrl-C stops everything started here.")
        if forever:
            wait_for_interrupt()
        return ids


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def wait_for_interrupt() -> None:
    """Block until Ctrl-C (SIGINT) or SIGTERM."""
    signal.signal(signal.SIGTERM, _interrupt)
    with contextlib.suppress(KeyboardInterrupt):
        threading.Event().wait()
