"""A seeded, reproducible Jepsen-style run of combined faults against real processes on
127.0.0.1 (issue 28 item 1, issue 33 item 4): :func:`run` starts the deployment of
tests/support/nemesis_deploy.py, lets the clients take IDs all the time, fires the
seeded schedule of tests/support/nemesis_faults.py for ``fault_s`` seconds (a fault every
6-12 s by default, overlapping), then heals every fault and keeps the whole deployment
running for ``heal_s`` seconds more. A supervisor restarts whatever died (killed, or
exited by itself, as a Celery worker does on a broker failover) after a short seeded
delay. Every client call is in the run directory's history, every fault, restart and
Sentinel event in its event log (tests/support/nemesis_history.py); the checker
(tests/support/nemesis_checker.py) reads them.

The same seed gives the same schedule (times, kinds, durations, target picks); which node
is the master when a fault fires, and so what the fault hits, depends on the run.

Used by tests/system/test_nemesis.py (a short run) and ``python -m bench --only nemesis``
(long runs). No pytest here: a missing server raises
:class:`~tests.support.servers.NotInstalled`.
"""

from __future__ import annotations

import dataclasses
import json
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import redis

from leafpool.core.snowflake_layout import LEAF_EPOCH_MS
from tests.support.nemesis_deploy import DeployConfig, Deployment
from tests.support.nemesis_faults import (
    CLOCK_KINDS,
    HTTP_KINDS,
    KINDS,
    LINK_KINDS,
    SENTINEL_KINDS,
    ZK_KINDS,
    FaultKind,
    FaultSpec,
    Nemesis,
    schedule,
)
from tests.support.nemesis_history import (
    ACCOUNTING,
    EVENTS,
    HISTORY,
    META,
    EventLog,
    write_json,
)
from tests.support.nemesis_procs import Supervisor
from tests.support.topologies import Node

TICK_S = 0.05


@dataclass
class RunConfig:
    seed: int = 1
    fault_s: float = 60.0
    heal_s: float = 30.0
    #: the heal phase goes on (bounded) until every tag served again and the deployment
    #: is whole; after this many seconds it ends anyway and the checker says so
    heal_timeout_s: float = 120.0
    gap_s: tuple[float, float] = (6.0, 12.0)
    kinds: tuple[str, ...] = ()  # default: every kind the deployment has targets for
    pop_replicas: str = "all"
    snowflake_mode: str = "local"
    http: bool = False
    #: workers reach MariaDB (and ZooKeeper) through relays, and Redis behind fences
    #: (root and iptables): partitions
    links: bool = False
    clock: bool = False  # a worker's clock set back (libfaketime)
    sentinels: bool = False  # a sentinel killed or paused (two of the three)
    pace_s: float = 0.03  # per tag and client
    policies: tuple[str, ...] = ("wait", "wait", "reserve", "reserve")

    def fault_kinds(self) -> dict[str, FaultKind]:
        every = dict(KINDS)
        if self.snowflake_mode == "zk":
            every |= ZK_KINDS
        if self.http:
            every |= HTTP_KINDS
        if self.links:
            every["db-partition"] = LINK_KINDS["db-partition"]
            every["redis-partition"] = LINK_KINDS["redis-partition"]
            if self.snowflake_mode == "zk":
                every["zk-partition"] = LINK_KINDS["zk-partition"]
        if self.clock:
            every |= CLOCK_KINDS
        if self.sentinels:
            every |= SENTINEL_KINDS
        if not self.kinds:
            return every
        unknown = set(self.kinds) - set(every)
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {sorted(every)}")
        return {k: every[k] for k in self.kinds}


class SentinelListener:
    """Every event a sentinel publishes (``+sdown``, ``+odown``, ``+switch-master``,
    ``-failover-abort-no-good-slave``...) into the event log, from a thread (it starts
    no process). The nemesis never faults this sentinel (the sentinel kinds pick among the
    other two)."""

    def __init__(self, sentinel: Node, events: EventLog) -> None:
        self.sentinel = sentinel
        self.events = events
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sentinel-listener",
                                        daemon=True)

    def start(self) -> SentinelListener:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with self.sentinel.client(decode_responses=True, socket_timeout=None) as c:
                    pubsub = c.pubsub()
                    pubsub.psubscribe("*")
                    while not self._stop.is_set():
                        msg = pubsub.get_message(timeout=0.5)
                        if msg and msg["type"] == "pmessage":
                            self.events.log("sentinel", type=msg["channel"], data=msg["data"])
                    pubsub.close()
            except redis.RedisError as exc:
                self.events.log("listener-error", error=f"{type(exc).__name__}: {exc}")
                self._stop.wait(1.0)


def _served_since(history: Path, t: float, tail: int = 256 * 1024) -> set[str]:
    """Tags some client got IDs for in a call that ended after ``t`` (the files' tails)."""
    tags: set[str] = set()
    for path in history.glob("*.jsonl"):
        with open(path, "rb") as fh:
            fh.seek(max(0, path.stat().st_size - tail))
            lines = fh.read().decode(errors="replace").splitlines()[1:]
        for line in lines:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if r["e"] >= t and r.get("ids"):
                tags.add(r["tag"])
    return tags


@dataclass
class Run:
    cfg: RunConfig
    run_dir: Path
    progress: Callable[[str], None] = print
    events: EventLog = field(init=False)

    def __post_init__(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.events = EventLog(self.run_dir / EVENTS)

    def go(self) -> Path:
        cfg = self.cfg
        kinds = cfg.fault_kinds()
        specs = schedule(cfg.seed, cfg.fault_s, list(kinds.values()), cfg.gap_s)
        dcfg = DeployConfig(self.run_dir, cfg.seed, cfg.pop_replicas,
                            snowflake_mode=cfg.snowflake_mode, http=cfg.http,
                            policies=cfg.policies, pace_s=cfg.pace_s, links=cfg.links)
        write_json(self.run_dir / META, {
            "config": dataclasses.asdict(cfg), "tags": dcfg.tags,
            "snowflake_epoch_ms": LEAF_EPOCH_MS,
            "schedule": [dataclasses.asdict(s) for s in specs]})
        dep = Deployment(dcfg)
        listener: SentinelListener | None = None
        try:
            self.progress(f"seed {cfg.seed}: starting the deployment")
            dep.start()
            assert dep.group is not None
            meta = json.loads((self.run_dir / META).read_text())
            meta["sentinel"] = dataclasses.asdict(dep.timings)
            meta["redis"] = {p.name: p.node.port for p in dep.redis}
            write_json(self.run_dir / META, meta)
            listener = SentinelListener(dep.group.sentinels[0], self.events).start()
            self._phases(dep, kinds, specs)
            dep.stop_clients()
            write_json(self.run_dir / ACCOUNTING, dep.accounting())
        finally:
            if listener is not None:
                listener.stop()
            self.events.close()
            dep.stop()
        return self.run_dir

    def _phases(self, dep: Deployment, kinds: dict[str, FaultKind],
                specs: list[FaultSpec]) -> None:
        cfg = self.cfg
        supervisor = Supervisor(dep.managed(), self.events, random.Random(cfg.seed + 1))
        nemesis = Nemesis(specs, kinds, dep, supervisor, self.events)
        supervisor.on_restart = nemesis.on_restart
        self.events.log("phase", phase="faults", faults=len(specs))
        self.progress(f"seed {cfg.seed}: {len(specs)} faults over {cfg.fault_s:.0f} s")
        nemesis.started = time.monotonic()
        end = nemesis.started + cfg.fault_s
        while time.monotonic() < end:
            nemesis.tick()
            supervisor.tick()
            time.sleep(TICK_S)
        nemesis.heal_all()
        heal_start = time.time()
        self.events.log("phase", phase="heal")
        self.progress(f"seed {cfg.seed}: healing")
        started = time.monotonic()
        whole_logged = False
        last_check = 0.0
        while True:
            supervisor.tick()
            nemesis.tick()
            now = time.monotonic()
            if now - last_check >= 1.0:
                last_check = now
                missing = self._unhealed(dep, heal_start)
                if missing is None and not whole_logged:
                    whole_logged = True
                    self.events.log("whole")
                if now - started >= cfg.heal_s and missing is None:
                    break
                if now - started >= cfg.heal_timeout_s:
                    self.events.log("heal-timeout", missing=missing)
                    break
            time.sleep(TICK_S)
        self.events.log("phase", phase="end")

    def _unhealed(self, dep: Deployment, since: float) -> str | None:
        try:
            missing = dep.unhealthy()
        except Exception as exc:
            missing = f"{type(exc).__name__}: {exc}"
        if missing is not None:
            return missing
        dry = set(dep.cfg.tags) - _served_since(self.run_dir / HISTORY, since)
        return f"not served since the heal: {sorted(dry)}" if dry else None


def run(cfg: RunConfig, run_dir: Path, progress: Callable[[str], None] = print) -> Path:
    """One run into ``run_dir`` (history, events, meta, accounting, logs)."""
    return Run(cfg, run_dir, progress).go()
