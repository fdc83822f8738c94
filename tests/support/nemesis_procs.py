"""The processes a nemesis run manages, one interface for every kind (a Celery worker or
beat, the HTTP service, a Redis data node, MariaDB, ZooKeeper), and the supervisor that
restarts them as compose's ``restart: unless-stopped`` would.

Every process is started from the main thread, so that each gets its parent-death SIGKILL
(:mod:`leafpool.children`): the supervisor runs in the nemesis's main loop, not a thread.

A kill is SIGKILL of the whole process (a Celery worker with its pool processes); a pause
is SIGSTOP of its process group, a resume SIGCONT. A process that is not alive is started
again by :class:`Supervisor` after a short seeded delay, unless a fault holds it down
(a Redis node killed for 3-12 s); a Redis node restarts from its own data directory and
configuration file (its append-only file as of the kill), MariaDB from its data directory.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from pathlib import Path

from leafpool.children import die_with_parent
from tests.support.nemesis_history import EventLog
from tests.support.processes import Proc
from tests.support.servers import Server, port_open
from tests.support.topologies import Node


def faketime_library() -> Path:
    """libfaketime (Debian's faketime package), or :class:`FileNotFoundError`."""
    for path in sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1")):
        return path
    raise FileNotFoundError("libfaketime is not installed (Debian package faketime)")


class Managed(ABC):
    """One process of the deployment under the nemesis."""

    def __init__(self, name: str, role: str) -> None:
        self.name = name
        self.role = role  # worker, beat, http, redis, db, zk
        self.killed_by_fault = False  # the next exit is the nemesis's, not the process's
        self.starts = 1
        #: the wall clock of its next starts, in seconds from the machine's (libfaketime;
        #: CommandProcess only)
        self.clock_offset_s = 0.0

    @abstractmethod
    def alive(self) -> bool: ...

    @abstractmethod
    def pid(self) -> int | None: ...

    @abstractmethod
    def kill(self) -> None:
        """SIGKILL (a crash)."""

    @abstractmethod
    def start(self) -> None:
        """Start it again after it died (or was killed)."""

    @abstractmethod
    def stop(self) -> None:
        """For good, at the end of the run (works on a paused process)."""

    def exit_code(self) -> int | None:
        return None

    def pause(self) -> None:
        pid = self.pid()
        if pid is not None:
            os.killpg(pid, signal.SIGSTOP)

    def resume(self) -> None:
        pid = self.pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGCONT)

    def logs(self) -> list[Path]:
        return []


class CommandProcess(Managed):
    """A command (Celery worker or beat, ``leafpool serve``) run through :class:`Proc`;
    each start appends to the same log."""

    def __init__(self, name: str, role: str, argv: Sequence[str], env: dict[str, str],
                 log: Path) -> None:
        super().__init__(name, role)
        self.argv, self.env, self.log = list(argv), env, log
        self.proc = Proc(self.argv, env, log)

    def alive(self) -> bool:
        return self.proc.alive()

    def pid(self) -> int | None:
        return self.proc.proc.pid if self.alive() else None

    def exit_code(self) -> int | None:
        return self.proc.proc.poll()

    def kill(self) -> None:
        self.resume()  # a stopped process's children get the SIGKILL either way
        self.proc.kill()

    def start(self) -> None:
        env = self.env
        if self.clock_offset_s:
            env = {**env, "LD_PRELOAD": str(faketime_library()),
                   "FAKETIME": f"{self.clock_offset_s:+g}s"}
        with open(self.log, "a") as fh:
            fh.write(f"\n===== nemesis: start {self.starts + 1} at {time.time():.3f}"
                     f"{f' clock {self.clock_offset_s:+g} s' if self.clock_offset_s else ''}\n")
        self.proc = Proc(self.argv, env, self.log)
        self.starts += 1

    def stop(self) -> None:
        self.resume()
        self.proc.kill()

    def terminate(self, timeout: float = 30.0) -> None:
        """SIGTERM and wait (a client process ends its loop and flushes), then SIGKILL."""
        self.resume()
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.proc.wait(timeout=timeout)
        self.proc.kill()

    def logs(self) -> list[Path]:
        return [self.log]


class RedisProcess(Managed):
    """A Redis data node of the Sentinel group (tests/support/topologies.py)."""

    def __init__(self, node: Node) -> None:
        super().__init__(f"redis-{node.port}", "redis")
        self.node = node

    def alive(self) -> bool:
        return self.node.alive()

    def pid(self) -> int | None:
        return self.node.pid if self.alive() else None

    def exit_code(self) -> int | None:
        proc = self.node.server.proc
        return None if proc is None else proc.poll()

    def kill(self) -> None:
        self.node.kill()  # SIGKILL reaches a stopped process too

    def pause(self) -> None:
        self.node.pause()

    def resume(self) -> None:
        if self.node.paused():
            self.node.resume()

    def start(self) -> None:
        self.node.restart()
        self.starts += 1

    def stop(self) -> None:
        self.node.stop()

    def logs(self) -> list[Path]:
        return [self.node.log]


class SentinelProcess(RedisProcess):
    """A sentinel of the group, restarted from the config file it rewrote (it keeps the
    master it last knew, the replicas and the other sentinels), and given the
    ``SENTINEL DEBUG`` periods again once it answers, as compose's sentinel does at each
    start (``ops/redis/sentinel.conf``: they are not configuration directives)."""

    def __init__(self, node: Node, debug: Sequence[str]) -> None:
        super().__init__(node)
        self.name, self.role = f"sentinel-{node.port}", "sentinel"
        self.debug = list(debug)

    def start(self) -> None:
        super().start()
        if self.debug:
            self.node.command("SENTINEL", "DEBUG", *self.debug)


class ServerProcess(Managed):
    """A server of tests/support/servers.py (MariaDB, ZooKeeper), restarted on its own
    data directory and port without waiting for the port (the main loop goes on)."""

    def __init__(self, name: str, role: str, server: Server) -> None:
        super().__init__(name, role)
        self.server = server

    def alive(self) -> bool:
        return self.server.proc is not None and self.server.proc.poll() is None

    def pid(self) -> int | None:
        return self.server.proc.pid if self.alive() and self.server.proc else None

    def exit_code(self) -> int | None:
        return None if self.server.proc is None else self.server.proc.poll()

    def kill(self) -> None:
        self.resume()
        if self.server.proc is not None and self.server.proc.poll() is None:
            os.killpg(self.server.proc.pid, signal.SIGKILL)
            self.server.proc.wait(timeout=30)

    def start(self) -> None:
        with open(self.server.log, "ab") as log:
            self.server.proc = subprocess.Popen(
                self.server.argv, stdout=log, stderr=subprocess.STDOUT,
                cwd=self.server.datadir, start_new_session=True,
                preexec_fn=die_with_parent(signal.SIGKILL))
        self.starts += 1

    def ready(self) -> bool:
        return self.alive() and port_open(self.server.port)

    def stop(self) -> None:
        self.resume()
        self.server.stop()

    def logs(self) -> list[Path]:
        return [self.server.log]


class Supervisor:
    """Restarts a process that is not alive after a seeded delay (``delay_s``), unless a
    fault holds it down. Logs ``exited`` (with ``by``: the fault, or the process itself
    and its exit code), ``restart`` and ``restart-failed``; ``on_restart(name)`` tells the
    nemesis a killed process is back (the end of its kill fault)."""

    def __init__(self, procs: Sequence[Managed], events: EventLog, rng: random.Random,
                 delay_s: tuple[float, float] = (0.5, 2.0),
                 on_restart: Callable[[str], None] = lambda name: None) -> None:
        self.procs = list(procs)
        self.events = events
        self.rng = rng
        self.delay_s = delay_s
        self.on_restart = on_restart
        self.held: set[str] = set()
        self.due: dict[str, float] = {}
        self.noticed: set[str] = set()  # down, and said so in the event log
        self.restarts: dict[str, int] = {}

    def add(self, proc: Managed) -> None:
        self.procs.append(proc)

    def hold(self, name: str) -> None:
        self.held.add(name)

    def release(self, name: str) -> None:
        self.held.discard(name)

    def down(self) -> list[str]:
        return [p.name for p in self.procs if not p.alive()]

    def tick(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        for p in self.procs:
            if p.alive():
                continue
            if p.name not in self.noticed:
                self.noticed.add(p.name)
                by = "fault" if p.killed_by_fault else "itself"
                self.events.log("exited", proc=p.name, role=p.role, by=by,
                                rc=p.exit_code())
                p.killed_by_fault = False
            if p.name in self.held:
                continue
            if p.name not in self.due:
                self.due[p.name] = now + self.rng.uniform(*self.delay_s)
                continue
            if now < self.due[p.name]:
                continue
            try:
                p.start()
            except Exception as exc:  # a port taken meanwhile: try again later
                self.events.log("restart-failed", proc=p.name,
                                error=f"{type(exc).__name__}: {exc}"[:300])
                self.due[p.name] = now + self.rng.uniform(*self.delay_s)
                continue
            del self.due[p.name]
            self.noticed.discard(p.name)
            self.restarts[p.name] = self.restarts.get(p.name, 0) + 1
            self.events.log("restart", proc=p.name, role=p.role)
            self.on_restart(p.name)
