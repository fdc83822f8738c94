"""The nemesis's faults: what kinds there are, the seeded schedule, and injecting and
healing them on the deployment's processes.

A :class:`FaultKind` names a target role (``worker``, ``beat``, ``master``, ``replica``,
``db``, ``zk``, ``http``, and the links ``db-link`` and ``zk-link`` of
tests/support/nemesis_links.py: what :class:`Targets` resolves when the fault fires), an
:class:`Action` and a range of durations. The schedule (:func:`schedule`) is drawn from
the seed alone: when each fault fires, which kind, how long, and a number that picks the
target among the candidates at that moment (which node is the master then depends on the
run, as in Jepsen). Kinds are dealt from seeded shuffled decks, so that every kind comes
once before any comes twice: a short run covers them all.

Adding a kind: a :class:`FaultKind` with an existing action (a partition is the
:class:`Pause` of a link), or a new :class:`Action` (:class:`ClockBehind`, a worker's
clock set back) whose ``inject`` and ``heal`` do the work; a role the deployment does not
have yet needs a branch in its ``candidates``; :class:`~tests.support.nemesis.RunConfig`
says which kinds a run draws from.
"""

from __future__ import annotations

import itertools
import random
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Protocol

from tests.support.nemesis_history import EventLog
from tests.support.nemesis_procs import Managed, Supervisor


class Targets(Protocol):
    def candidates(self, role: str) -> list[Managed]:
        """The live processes a fault on ``role`` may hit now (``master``: the node the
        sentinels name; ``replica``: every other data node)."""
        ...


class Action(ABC):
    #: the fault ends when the supervisor has restarted the process (a kill), not when
    #: its duration is over
    ends_at_restart = False

    @abstractmethod
    def inject(self, target: Managed, supervisor: Supervisor) -> None: ...

    @abstractmethod
    def heal(self, target: Managed, supervisor: Supervisor) -> None: ...


class Kill(Action):
    """SIGKILL, the process held down for the fault's duration, then restarted by the
    supervisor after its own delay (the fault ends at that restart)."""

    ends_at_restart = True

    def inject(self, target: Managed, supervisor: Supervisor) -> None:
        supervisor.hold(target.name)
        target.killed_by_fault = True
        target.kill()

    def heal(self, target: Managed, supervisor: Supervisor) -> None:
        supervisor.release(target.name)


class Pause(Action):
    """SIGSTOP for the fault's duration, then SIGCONT."""

    def inject(self, target: Managed, supervisor: Supervisor) -> None:
        target.pause()

    def heal(self, target: Managed, supervisor: Supervisor) -> None:
        target.resume()


@dataclass(frozen=True)
class FaultKind:
    name: str
    role: str
    action: Action
    duration_s: tuple[float, float]


class ClockBehind(Action):
    """The worker restarted with its wall clock ``seconds`` behind (libfaketime: a machine
    whose clock was set back, a pod rescheduled onto a node whose clock lags) for the
    fault's duration, then restarted with the right clock (the fault ends at that restart).
    The offset is constant within each process: libfaketime cannot step the wall clock
    alone inside a running one (its monotonic clock would step too, which no real clock
    step does)."""

    ends_at_restart = True

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def inject(self, target: Managed, supervisor: Supervisor) -> None:
        self._restart(target, supervisor, -self.seconds)

    def heal(self, target: Managed, supervisor: Supervisor) -> None:
        self._restart(target, supervisor, 0.0)

    @staticmethod
    def _restart(target: Managed, supervisor: Supervisor, offset_s: float) -> None:
        """Killed, and started again at once with its clock ``offset_s`` off."""
        target.clock_offset_s = offset_s  # for its next starts
        KILL.inject(target, supervisor)
        supervisor.release(target.name)


KILL, PAUSE = Kill(), Pause()

#: the kinds a run draws from, by default all of them. Durations: a worker paused 5-40 s
#: (longer than a refill), the master paused 2-12 s (shorter and longer than the shipped
#: down-after of 5 s: with and without a failover) or killed for 3-12 s
KINDS: dict[str, FaultKind] = {k.name: k for k in [
    FaultKind("worker-kill", "worker", KILL, (0.0, 5.0)),
    FaultKind("worker-pause", "worker", PAUSE, (5.0, 40.0)),
    FaultKind("beat-kill", "beat", KILL, (0.0, 5.0)),
    FaultKind("beat-pause", "beat", PAUSE, (5.0, 40.0)),
    FaultKind("master-kill", "master", KILL, (3.0, 12.0)),
    FaultKind("master-pause", "master", PAUSE, (2.0, 12.0)),
    FaultKind("replica-kill", "replica", KILL, (3.0, 12.0)),
    FaultKind("replica-pause", "replica", PAUSE, (2.0, 15.0)),
    FaultKind("db-kill", "db", KILL, (5.0, 20.0)),
    FaultKind("db-pause", "db", PAUSE, (5.0, 20.0)),
]}
#: kinds that need a ZooKeeper in the deployment (snowflake mode zk)
ZK_KINDS: dict[str, FaultKind] = {k.name: k for k in [
    FaultKind("zk-kill", "zk", KILL, (3.0, 15.0)),
    FaultKind("zk-pause", "zk", PAUSE, (3.0, 15.0)),
]}
#: kinds that need the HTTP service in the deployment
HTTP_KINDS: dict[str, FaultKind] = {k.name: k for k in [
    FaultKind("http-kill", "http", KILL, (0.0, 3.0)),
]}
#: kinds that need the links of tests/support/nemesis_links.py (a worker's connections to
#: MariaDB, or to ZooKeeper in snowflake mode zk, through a relay the nemesis cuts; to
#: every Redis node and sentinel behind a fence the nemesis raises)
LINK_KINDS: dict[str, FaultKind] = {k.name: k for k in [
    FaultKind("db-partition", "db-link", PAUSE, (5.0, 20.0)),
    FaultKind("zk-partition", "zk-link", PAUSE, (3.0, 15.0)),
    FaultKind("redis-partition", "redis-link", PAUSE, (3.0, 15.0)),
]}
#: kinds that need libfaketime (Debian's faketime package: nemesis_procs.faketime_library):
#: a worker running 5 s behind, its snowflake cache file ahead of its clock
CLOCK_KINDS: dict[str, FaultKind] = {k.name: k for k in [
    FaultKind("worker-clock-back", "worker", ClockBehind(5.0), (10.0, 30.0)),
]}
#: kinds that fault a sentinel (two of the three: the run's listener reads the third):
#: killed (restarted from its rewritten config) or paused, alone or with a Redis fault
SENTINEL_KINDS: dict[str, FaultKind] = {k.name: k for k in [
    FaultKind("sentinel-kill", "sentinel", KILL, (3.0, 15.0)),
    FaultKind("sentinel-pause", "sentinel", PAUSE, (3.0, 20.0)),
]}
#: the kinds whose target is the Redis master: while one is in progress and no failover
#: completed, Redis itself cannot serve (the checker leaves those seconds out once)
MASTER_KINDS = frozenset({"master-kill", "master-pause"})


@dataclass(frozen=True)
class FaultSpec:
    """One fault of the schedule: ``at`` seconds after the fault phase began."""

    at: float
    kind: str
    duration_s: float
    pick: int


def schedule(seed: int, phase_s: float, kinds: list[FaultKind],
             gap_s: tuple[float, float] = (6.0, 12.0)) -> list[FaultSpec]:
    """The faults of a phase of ``phase_s`` seconds, one every ``gap_s`` (overlapping
    when a fault lasts longer than the gap), drawn from ``seed`` alone."""
    rng = random.Random(seed)
    deck: list[FaultKind] = []
    specs = []
    at = rng.uniform(1.0, gap_s[0])
    while at < phase_s:
        if not deck:
            deck = list(kinds)
            rng.shuffle(deck)
        kind = deck.pop()
        specs.append(FaultSpec(round(at, 3), kind.name, round(rng.uniform(*kind.duration_s), 3),
                               rng.randrange(1 << 16)))
        at += rng.uniform(*gap_s)
    return specs


@dataclass
class OpenFault:
    id: int
    spec: FaultSpec
    kind: FaultKind
    target: Managed
    heal_at: float  # monotonic
    healed: bool = False


@dataclass
class Nemesis:
    """Fires the schedule's faults at their time and heals them; one :meth:`tick` per
    turn of the run's main loop (every process is started from the main thread)."""

    specs: list[FaultSpec]
    kinds: dict[str, FaultKind]
    targets: Targets
    supervisor: Supervisor
    events: EventLog
    started: float = field(default_factory=time.monotonic)  # monotonic start of the phase
    open: dict[int, OpenFault] = field(default_factory=dict)
    fired: list[FaultSpec] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _next: int = 0

    def busy(self, name: str) -> bool:
        return any(f.target.name == name for f in self.open.values())

    def tick(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        for fault in list(self.open.values()):
            if not fault.healed and now >= fault.heal_at:
                self._heal(fault)
        while self._next < len(self.specs) and \
                now >= self.started + self.specs[self._next].at:
            self._fire(self.specs[self._next], now)
            self._next += 1

    def _fire(self, spec: FaultSpec, now: float) -> None:
        kind = self.kinds[spec.kind]
        free = [t for t in self.targets.candidates(kind.role) if not self.busy(t.name)]
        if not free:
            self.events.log("skip", kind=spec.kind, at=spec.at,
                            why=f"no {kind.role} free (down or under another fault)")
            return
        target = free[spec.pick % len(free)]
        fault = OpenFault(next(self._ids), spec, kind, target, now + spec.duration_s)
        self.events.log("fault-start", id=fault.id, kind=spec.kind, target=target.name,
                        role=kind.role, duration=spec.duration_s, at=spec.at)
        try:
            kind.action.inject(target, self.supervisor)
        except Exception as exc:  # the target died meanwhile: the fault did not happen
            self.events.log("fault-end", id=fault.id, kind=spec.kind, target=target.name,
                            failed=f"{type(exc).__name__}: {exc}"[:300])
            self.supervisor.release(target.name)
            return
        self.fired.append(spec)
        self.open[fault.id] = fault

    def _heal(self, fault: OpenFault, cut: bool = False) -> None:
        fault.healed = True
        fault.kind.action.heal(fault.target, self.supervisor)
        if not fault.kind.action.ends_at_restart or fault.target.alive():
            self._close(fault, cut)

    def _close(self, fault: OpenFault, cut: bool = False) -> None:
        extra = {"cut": True} if cut else {}
        self.events.log("fault-end", id=fault.id, kind=fault.spec.kind,
                        target=fault.target.name, **extra)
        del self.open[fault.id]

    def on_restart(self, name: str) -> None:
        """The supervisor restarted ``name``: a kill fault on it is over."""
        for fault in list(self.open.values()):
            if fault.target.name == name and fault.healed:
                self._close(fault)

    def heal_all(self) -> None:
        """The end of the fault phase: every fault still in progress is healed now (a
        killed process is then restarted by the supervisor)."""
        for fault in list(self.open.values()):
            if not fault.healed:
                self._heal(fault, cut=True)

    def pending_restarts(self) -> list[str]:
        return [f.target.name for f in self.open.values()]
