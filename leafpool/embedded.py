"""``leafpool up``: the embedded default on one machine, for a first look.

SQLite (``LEAFPOOL_HOME/leafpool.sqlite3``), a local redis-server started with the shipped
``ops/redis/redis.conf`` when none answers at ``LEAFPOOL_REDIS_URL``, one Celery worker
and beat (as the standard ``celery -A workers`` commands, in child processes), and,
when installed, the HTTP service. A demo tag is registered and a few IDs are popped.
Ctrl-C stops everything that was started here.

No child outlives ``leafpool up``, whatever signals arrive:

- SIGINT, SIGTERM and SIGHUP only *ask* for the stop (a flag, polled by the main thread;
  no exception is raised from a signal handler), and any further signal while starting
  or stopping is ignored: the stop runs once, to its end. It stops the worker, beat and
  the HTTP service first (SIGTERM to each one's process group, which holds the worker's
  pool processes, SIGKILL after ``STOP_SECONDS``), then redis-server (SIGTERM, so it
  closes its append-only file, SIGKILL after ``REDIS_STOP_SECONDS``).
- if ``leafpool up`` dies without stopping (SIGKILL, a crash), the kernel signals each
  child (:mod:`leafpool.children`): redis-server gets SIGTERM (it shuts down cleanly on
  its own), the worker, beat and the HTTP service get SIGKILL (a refill cut short is a
  crash the refill protocol is built for; the worker's pool processes carry Celery's own
  parent-death SIGKILL).

Each child runs in its own session, so the terminal's Ctrl-C reaches only
``leafpool up``, which stops the children in order.
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
from types import FrameType
from urllib.parse import urlparse

from leafpool.children import die_with_parent
from leafpool.core.config import Settings, default_home, hide_password
from leafpool.core.errors import BackendUnavailable, TagExists
from leafpool.redis.connect import answers, connect
from leafpool.redis.register import register
from leafpool.runtime import Runtime

log = logging.getLogger(__name__)

ROOT = Path(__file__).resolve().parent.parent
REDIS_CONF = ROOT / "ops" / "redis" / "redis.conf"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: Celery's warning to a worker started as root, silenced in the worker ``up`` starts: the
#: hazard it guards (C_FORCE_ROOT) is pickle, and leafpool's workers accept JSON only
#: (workers/application.py); every child of ``up`` runs as whoever runs it
CELERY_ROOT_WARNING = "ignore:You're running the worker with superuser privileges"
STOP_SECONDS = 15.0  # worker, beat, HTTP: SIGTERM, then SIGKILL to the process group
REDIS_STOP_SECONDS = 30.0  # redis-server: SIGTERM (closes its AOF), then SIGKILL
POLL_SECONDS = 0.1


class Interrupted(Exception):
    """A stop was asked for (SIGINT, SIGTERM or SIGHUP) while starting."""


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    keeps_data: bool  # redis-server: stopped last, and only with SIGTERM first


@dataclass
class Embedded:
    settings: Settings
    say: Callable[[str], None] = print
    children: list[Child] = field(default_factory=list)
    stop_requested: int = 0  # the first stop signal received, 0 for none
    stopping: bool = False

    @property
    def home(self) -> Path:
        return default_home()

    # -- signals ------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Only a flag: raising here (KeyboardInterrupt) could land anywhere, inside the
        # stop too, and skip it. Later signals change nothing.
        if not self.stop_requested:
            self.stop_requested = signum

    def install_signal_handlers(self) -> None:
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._on_signal)

    def check(self) -> None:
        """Raise :class:`Interrupted` if a stop was asked for (while starting)."""
        if self.stop_requested:
            raise Interrupted(signal.Signals(self.stop_requested).name)

    def pause(self, seconds: float) -> None:
        """Sleep while starting, interrupted by a stop signal."""
        deadline = time.monotonic() + seconds
        while True:
            self.check()
            left = deadline - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(left, POLL_SECONDS))

    def wait_for_stop(self) -> None:
        """Block until a stop signal arrives."""
        while not self.stop_requested:
            time.sleep(POLL_SECONDS)  # polling the flag the signal handler sets

    # -- children -----------------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str], keeps_data: bool = False,
               env: dict[str, str] | None = None) -> Child:
        self.check()
        logs = self.home / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        # SIGTERM lets redis-server close its append-only file; the others are stateless
        # or crash-safe, and SIGKILL cannot be ignored or delayed
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("leafpool up starts its children from the main thread only "
                               "(their parent-death signal fires when the forking thread ends)")
        lifeline = die_with_parent(signal.SIGTERM if keeps_data else signal.SIGKILL)
        with open(logs / f"{name}.log", "ab") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                    env=env, start_new_session=True, preexec_fn=lifeline)
        child = Child(name, proc, keeps_data)
        self.children.append(child)
        self.say(f"  started {name} (pid {proc.pid}, log {logs / (name + '.log')})")
        return child

    def exited(self) -> list[Child]:
        return [c for c in self.children if c.proc.poll() is not None]

    def ensure_redis(self) -> None:
        client = connect(self.settings.redis_url, timeout=1.0)
        if answers(client):
            self.say(f"  redis answers at {hide_password(self.settings.redis_url)}")
            return
        url = urlparse(self.settings.redis_url)
        if url.hostname not in ("127.0.0.1", "localhost"):
            raise BackendUnavailable(
                f"redis: nothing answers at {hide_password(self.settings.redis_url)}")
        binary = shutil.which("redis-server")
        if binary is None:
            raise BackendUnavailable(
                "redis: redis-server is not installed; install it with "
                "`apt-get install redis-server` (Debian/Ubuntu) or point "
                "LEAFPOOL_REDIS_URL at a running Redis")
        data = self.home / "redis"
        data.mkdir(parents=True, exist_ok=True)
        log_file = self.home / "logs" / "redis.log"
        log_start = log_file.stat().st_size if log_file.exists() else 0
        server = self._spawn("redis", [binary, str(REDIS_CONF), "--port", str(url.port or 6379),
                                       "--bind", "127.0.0.1", "--dir", str(data),
                                       "--daemonize", "no"], keeps_data=True)
        deadline = time.monotonic() + 20
        while not answers(client):
            if server.proc.poll() is not None:
                raise BackendUnavailable(
                    f"redis: redis-server exited with code {server.proc.returncode}; "
                    f"see {self.home / 'logs' / 'redis.log'}")
            if time.monotonic() > deadline:
                raise BackendUnavailable("redis: started but not answering")
            self.pause(0.1)  # polling for the server to accept connections
        for warning in redis_warnings(log_file, log_start):
            self.say(f"  redis-server warns (its log): {warning}")

    def start_celery(self) -> None:
        celery = [sys.executable, "-m", "celery", "-A", "workers"]
        warnings = ",".join(w for w in (os.environ.get("PYTHONWARNINGS"), CELERY_ROOT_WARNING)
                            if w)
        self._spawn("worker", [*celery, "worker", "--loglevel=INFO", "-c", "2"],
                    env={**os.environ, "PYTHONWARNINGS": warnings})
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
        register(rt.pool, tag, "segment", 1000)
        register(rt.pool, flake, "snowflake")

    # -- stop ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop every child, once. Idempotent; signals arriving meanwhile only set the flag
        (the handler never raises), so nothing can cut it short."""
        if self.stopping:
            return
        self.stopping = True
        self.stop_requested = self.stop_requested or signal.SIGTERM
        stateless = [c for c in reversed(self.children) if not c.keeps_data]
        _terminate(stateless, STOP_SECONDS)
        _terminate([c for c in self.children if c.keeps_data], REDIS_STOP_SECONDS)


def redis_warnings(log_file: Path, start: int) -> list[str]:
    """The warnings redis-server wrote to its log from byte ``start`` on (``# WARNING
    Memory overcommit must be enabled! ... run the command 'sysctl
    vm.overcommit_memory=1' ...``): ``up`` says them, each with what to do as Redis
    words it, where they would otherwise sit unseen in the log."""
    try:
        with open(log_file, "rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    return [line.split(" # WARNING ", 1)[1].strip() for line in text.splitlines()
            if " # WARNING " in line]


def _signal_group(child: Child, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.proc.pid, sig)


def _terminate(children: list[Child], seconds: float) -> None:
    """SIGTERM to each child's process group, wait up to ``seconds`` for all, SIGKILL to
    the groups of those still running; finally SIGKILL to every group, for members left
    after their leader exited (a worker's pool processes)."""
    for child in children:
        if child.proc.poll() is None:
            _signal_group(child, signal.SIGTERM)
    deadline = time.monotonic() + seconds
    for child in children:
        try:
            child.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.warning("%s (pid %d) still running %.0f s after SIGTERM: SIGKILL", child.name,
                        child.proc.pid, seconds)
            _signal_group(child, signal.SIGKILL)
            child.proc.wait()
    for child in children:
        _signal_group(child, signal.SIGKILL)


@contextlib.contextmanager
def embedded(settings: Settings, say: Callable[[str], None] = print) -> Iterator[Embedded]:
    env = Embedded(settings, say)
    env.install_signal_handlers()
    try:
        yield env
    except Interrupted as exc:
        say(f"{exc} received while starting")
    finally:
        say("stopping ...")
        env.stop()
        say("stopped")


def up(settings: Settings, tag: str = "demo", say: Callable[[str], None] = print,
       forever: bool = True) -> list[int]:
    """Bring up the embedded default, show IDs being served, wait for Ctrl-C (or SIGTERM,
    SIGHUP). Returns the first segment IDs served (none if stopped while starting)."""
    if not settings.database_url.startswith("sqlite"):
        say(f"  using LEAFPOOL_DATABASE_URL={hide_password(settings.database_url)}")
    ids: list[int] = []
    with embedded(settings, say) as env:
        env.ensure_redis()
        rt = Runtime(settings)
        flake = f"{tag}.flake"
        env.check()
        env.demo_tags(rt, tag, flake)
        env.start_celery()
        http = env.start_http()
        deadline = time.monotonic() + 60
        while min(rt.pool.lengths([tag, flake])) < 10:
            if time.monotonic() > deadline:
                raise BackendUnavailable(f"{tag}, {flake}: the pools were not filled within "
                                         f"60 s; see the logs under {env.home / 'logs'}")
            exited = env.exited()
            if exited:
                raise BackendUnavailable(f"{exited[0].name} exited (pid {exited[0].proc.pid}, "
                                         f"code {exited[0].proc.returncode}); see the logs "
                                         f"under {env.home / 'logs'}")
            env.pause(0.2)  # polling for the first refill
        from leafpool.client import Client

        client = Client(rt.redis, settings=settings)
        ids = client.next_ids(tag, 5)
        flakes = client.next_ids(flake, 3)
        port = urlparse(settings.redis_url).port or 6379
        say(f"\nIDs served from the segment pool '{tag}': {ids}")
        say(f"IDs served from the snowflake pool '{flake}': {flakes}\n")
        for line in try_lines(settings, tag, flakes[0], port, http):
            say(line)
        say("\nCtrl-C stops everything started here.")
        if forever:
            env.wait_for_stop()
    return ids


def cli_command() -> str:
    """How to type this process's ``leafpool`` in a shell started where it was: the bare name
    when it is on PATH, else its path (``.venv/bin/leafpool`` under ``./dev up``)."""
    here = os.path.realpath(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    on_path = shutil.which("leafpool")
    if not here.endswith("leafpool") or (on_path and os.path.realpath(on_path) == here):
        return "leafpool"
    relative = os.path.relpath(os.path.abspath(sys.argv[0]))
    return relative if not relative.startswith("..") else os.path.abspath(sys.argv[0])


def try_lines(settings: Settings, tag: str, flake: int, port: int, http: bool) -> list[str]:
    """The commands ``up`` suggests, each working as typed: redis-cli only where it is
    installed, the full path of ``leafpool`` when it is not on PATH, and the HTTP call with
    curl where there is curl, else with Python (a minimal Debian has no curl)."""
    lines = []
    if shutil.which("redis-cli"):
        lines += [f"  redis-cli -p {port} LPOP 'leafpool:{{{tag}}}:ids'",
                  f"  redis-cli -p {port} LPOP 'leafpool:{{{tag}}}:ids' 100"]
    cli = cli_command()
    lines += [f"  {cli} pop {tag} -n 5", f"  {cli} decode {flake}", f"  {cli} status"]
    if http:
        url = f"http://{settings.http_host}:{settings.http_port}/api/segment/get/{tag}"
        if shutil.which("curl"):
            lines.append(f"  curl {url}")
        else:
            python = "python3" if shutil.which("python3") else sys.executable
            lines.append(f"  {python} -c \"import urllib.request as u; "
                         f"print(u.urlopen('{url}').read().decode())\"")
    return lines
