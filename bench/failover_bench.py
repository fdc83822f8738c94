"""Failover benchmark (issue: a stale node promoted): what one fault at a time costs the
acknowledged pops of a Sentinel group, for each ``LEAFPOOL_POP_REPLICAS`` setting.

Topology: a master, two replicas and three sentinels on loopback, every data node from the
shipped ``ops/redis/redis.conf`` and the sentinels with the shipped
``ops/redis/sentinel.conf``'s timings and the ``SENTINEL DEBUG`` periods it says to set
(so the figures are those of what ships). A client thread pops 10 IDs every few
milliseconds through the sentinels (``Client.next_ids``) and records when each pop was
handed out. One fault per group (a fresh group each time, so the faults do not mix):

- the master paused shorter than down-after (no failover), and longer (a failover; the old
  master is continued afterwards and must rejoin as a replica);
- the master SIGKILLed and restarted from its data directory a few seconds later (as a
  supervisor restarts it);
- a replica paused; a replica SIGKILLed and restarted;
- a replica paused, then the master paused past down-after, both continued once Sentinel
  promoted the other replica (the paused replica missed the failover's reconfiguration).

For each: the longest time without a handed-out ID, and how long after the end of the
fault (the continue, the restart) pops were back: the *tail*, the part of the pause that
outlives its fault. ``1`` of two replicas (not safe under a sequence of faults, see
tests/system/test_stale_promotion.py) is measured beside ``all`` (every replica, the
shipped setting) so that the cost of the safe setting is read side by side.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rich.console import Console
from rich.table import Table

from leafpool.client import Client
from leafpool.core.config import load_settings
from leafpool.core.errors import LeafpoolError
from leafpool.redis.lock import RefillLock
from leafpool.redis.pool import Pool, Range
from tests.support import topologies as t
from tests.support.servers import ROOT

TAG = "order"
FILL = 400_000
BATCH = 10
SENTINEL_CONF = ROOT / "ops" / "redis" / "sentinel.conf"


def shipped_sentinel(name: str, default: int) -> int:
    """A timing of the shipped sentinel.conf (milliseconds)."""
    found = re.search(rf"^sentinel {name} \S+ (\d+)", SENTINEL_CONF.read_text(), re.M)
    return int(found.group(1)) if found else default


@dataclass(frozen=True)
class Sizes:
    short_pause_s: float  # below down-after
    long_pause_s: float  # above down-after: a failover
    restart_after_s: float  # a killed node's supervisor
    settle_s: float  # the longest wait for pops to come back after a fault
    settings: tuple[str, ...] = ("1", "all")
    faults: int = 6  # how many of the faults below (smoke: the first)


FULL = Sizes(short_pause_s=3.0, long_pause_s=10.0, restart_after_s=3.0, settle_s=90.0)
SMOKE = Sizes(short_pause_s=0.5, long_pause_s=0.5, restart_after_s=0.5, settle_s=20.0,
              settings=("all",), faults=1)


@dataclass
class Popper:
    """A client thread popping all the time; the times of the pops that handed IDs out."""

    client: Client
    served: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.client.next_ids(TAG, BATCH)
                self.served.append(time.monotonic())
            except LeafpoolError as exc:
                name = type(exc).__name__
                self.errors[name] = self.errors.get(name, 0) + 1
            time.sleep(0.005)

    def served_after(self, when: float) -> float | None:
        return next((s for s in self.served if s > when), None)


@dataclass
class Outcome:
    fault: str
    setting: str
    pause_s: float  # the longest time without a handed-out ID, from the fault on
    tail_s: float | None  # from the end of the fault to the first ID after it (None: none)
    errors: dict[str, int]


def _fill(group: t.SentinelGroup) -> None:
    with group.master.client() as r:
        pool = Pool(r)
        lock = RefillLock(r, pool.tag(TAG).lock, 60_000)
        assert lock.acquire()
        pool.register(TAG, "segment", 0)
        pool.append_reserve(TAG, lock.token, Range(1, FILL + 1))
        head = Range(1, FILL + 1)
        while head.size:
            n = min(10_000, head.size)
            pool.push(TAG, lock.token, head, n, 0)
            head = Range(head.start + n, head.end)
        lock.release()
    group.wait_synced()


def _longest_gap(served: list[float], since: float) -> float:
    times = [since, *(s for s in served if s > since)]
    return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


Fault = Callable[[t.SentinelGroup], float]  # injects the fault; returns when it ended


def master_paused(seconds: float) -> Fault:
    def fault(group: t.SentinelGroup) -> float:
        old = group.master
        old.pause()
        time.sleep(seconds)  # the fault's own length
        old.resume()
        return time.monotonic()
    return fault


def master_killed(restart_after: float) -> Fault:
    def fault(group: t.SentinelGroup) -> float:
        old = group.master
        old.kill()
        time.sleep(restart_after)
        old.restart()
        return time.monotonic()
    return fault


def replica_paused(seconds: float) -> Fault:
    def fault(group: t.SentinelGroup) -> float:
        replica = group.replicas[0]
        replica.pause()
        time.sleep(seconds)
        replica.resume()
        return time.monotonic()
    return fault


def replica_killed(restart_after: float) -> Fault:
    def fault(group: t.SentinelGroup) -> float:
        replica = group.replicas[0]
        replica.kill()
        time.sleep(restart_after)
        replica.restart()
        return time.monotonic()
    return fault


def replica_missed_failover(group: t.SentinelGroup) -> float:
    replica, master = group.replicas[0], group.master
    replica.pause()
    master.pause()
    group.wait_failover(master, timeout=60)
    master.resume()
    replica.resume()
    return time.monotonic()


def one(name: str, fault: Fault, setting: str, sizes: Sizes) -> Outcome:
    group = t.sentinel_group(
        2, 3, down_after_ms=shipped_sentinel("down-after-milliseconds", 5000),
        failover_timeout_ms=shipped_sentinel("failover-timeout", 60000),
        parallel_syncs=shipped_sentinel("parallel-syncs", 1),
        debug=t.shipped_sentinel_debug())
    try:
        _fill(group)
        sentinels = ",".join(f"{h}:{p}" for h, p in group.sentinel_addrs)
        settings = load_settings(
            redis_url="redis://sentinel-master/0", redis_sentinels=sentinels,
            redis_master_name=group.master_name, pop_replicas=setting, pop_wait_ms=100,
            empty_wait_seconds=0.2, empty_policy="raise")
        popper = Popper(Client(settings=settings))
        thread = threading.Thread(target=popper.run, daemon=True)
        thread.start()
        t._wait(lambda: None if popper.served else "no pop yet", 30, "first pop")
        started = time.monotonic()
        ended = fault(group)
        deadline = ended + sizes.settle_s
        while popper.served_after(ended) is None and time.monotonic() < deadline:
            time.sleep(0.05)  # bounded: pops come back, or the table says they did not
        back = popper.served_after(ended)
        time.sleep(1.0)  # a second of pops after the fault, so the gap is closed
        popper.stop.set()
        thread.join(10)
        popper.client.close()
        return Outcome(name, setting, _longest_gap(popper.served, started),
                       None if back is None else max(0.0, back - ended), popper.errors)
    finally:
        group.stop()


def main(console: Console, sizes: Sizes = FULL) -> list[Outcome]:
    down_after = shipped_sentinel("down-after-milliseconds", 5000) / 1000
    faults: list[tuple[str, Fault]] = [
        (f"master paused {sizes.short_pause_s:g} s (< down-after {down_after:g} s)",
         master_paused(sizes.short_pause_s)),
        (f"master paused {sizes.long_pause_s:g} s (failover)",
         master_paused(sizes.long_pause_s)),
        (f"master SIGKILLed, restarted after {sizes.restart_after_s:g} s",
         master_killed(sizes.restart_after_s)),
        (f"replica paused {sizes.long_pause_s:g} s", replica_paused(sizes.long_pause_s)),
        (f"replica SIGKILLed, restarted after {sizes.restart_after_s:g} s",
         replica_killed(sizes.restart_after_s)),
        ("replica paused, then the master past down-after; both continued after the "
         "failover", replica_missed_failover),
    ]
    outcomes = [one(name, fault, setting, sizes)
                for name, fault in faults[:sizes.faults] for setting in sizes.settings]
    table = Table(title="One fault at a time, Sentinel group of a master and 2 replicas "
                        "(shipped redis.conf and sentinel timings): acknowledged pops")
    for col in ("fault", "LEAFPOOL_POP_REPLICAS", "longest pause s",
                "back after the fault ended s", "client errors"):
        table.add_column(col)
    for o in outcomes:
        table.add_row(o.fault, o.setting, f"{o.pause_s:.1f}",
                      "never" if o.tail_s is None else f"{o.tail_s:.1f}",
                      ", ".join(f"{k} {v}" for k, v in sorted(o.errors.items())) or "-")
    console.print(table)
    return outcomes


if __name__ == "__main__":
    main(Console(width=200))
