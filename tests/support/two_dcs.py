"""Two data centers on loopback, for the system tests and the bench (issue 31 items 3 and
5; docs/design.md §12): each DC is a redis-server of its own, a Celery worker with its
beat (``celery -A workers worker -B``, the shipped defaults but for what a caller sets)
started with the DC's ``LEAFPOOL_DC_ID`` and ``LEAFPOOL_DC_COUNT``, and clients popping
its pools with a plain ``LPOP`` (as an application in any language does) and recording
every call with its time.

What the DCs share, or do not, is the caller's: one database for both (mode shared, DC b
through a :class:`~tests.support.latency_proxy.LatencyProxy` that adds the WAN's latency
and can cut the link) or one each (mode own).

Like the other modules of ``tests/support`` that start things, this one does not import
pytest (the bench uses it). Waits are bounded polling (:func:`wait_for`); a popper's
schedule (first + k x interval) only shapes the load.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from itertools import pairwise
from pathlib import Path

import redis

from leafpool.redis.pool import Pool, Snapshot
from tests.support import servers
from tests.support.nemesis_checker import duplicates, inversions
from tests.support.nemesis_history import Call
from tests.support.processes import Proc, leafpool_env


def wait_for(check: Callable[[], bool], timeout: float, what: str,
             detail: Callable[[], str] | None = None, interval: float = 0.02) -> float:
    """Poll ``check`` until it holds, at most ``timeout`` s; the seconds it took. A
    timeout raises naming ``what`` and the ``detail`` of the state it was in."""
    started = time.monotonic()
    while True:
        if check():
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            more = f"; {detail()}" if detail else ""
            raise TimeoutError(f"{what}: not within {timeout:g} s{more}")
        time.sleep(interval)


def with_port(url: str, port: int) -> str:
    """``url`` (``scheme://user:pass@host:port/db``) with another port: the same database
    reached through a proxy."""
    return re.sub(r"@([^:/@]+):\d+/", lambda m: f"@{m.group(1)}:{port}/", url, count=1)


class Popper:
    """One client of one DC: every ``interval`` s (on a schedule, first + k x interval)
    a plain ``LPOP key count`` of ``batch`` IDs, each call recorded with its start and
    end (:class:`~tests.support.nemesis_history.Call`), a call that found the list empty
    too (no IDs)."""

    def __init__(self, r: redis.Redis, key: str, tag: str, name: str, batch: int,
                 interval: float) -> None:
        self.r, self.key, self.tag, self.name = r, key, tag, name
        self.batch, self.interval = batch, interval
        self.calls: list[Call] = []
        self.errors: list[tuple[float, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"popper-{name}", daemon=True)

    def start(self) -> Popper:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        first = time.monotonic()
        k = 0
        while not self._stop.is_set():
            start = time.monotonic()
            try:
                got = self.r.lpop(self.key, self.batch)
            except redis.RedisError as exc:
                self.errors.append((start, f"{type(exc).__name__}: {exc}"))
                got = None
            ids = tuple(int(x) for x in got or ())  # type: ignore[union-attr]
            self.calls.append(Call(self.name, start, time.monotonic(), self.tag, "lpop",
                                   self.batch, ids))
            k += 1
            self._stop.wait(max(0.0, first + k * self.interval - time.monotonic()))

    # -- what it saw -------------------------------------------------------------------

    def served(self) -> list[Call]:
        return [c for c in self.calls if c.ids]

    def ids(self) -> list[int]:
        return [i for c in self.calls for i in c.ids]

    def last_served(self, before: float | None = None) -> float | None:
        """When the last call that got IDs (started before ``before``) ended."""
        ends = [c.end for c in self.calls if c.ids and (before is None or c.start < before)]
        return max(ends) if ends else None

    def first_empty_after(self, t: float) -> float | None:
        """When the first call that started after ``t`` found the list empty."""
        return next((c.start for c in list(self.calls) if c.start > t and not c.ids), None)

    def first_served_after(self, t: float) -> float | None:
        return next((c.end for c in list(self.calls) if c.start >= t and c.ids), None)

    def longest_pause(self, start: float, end: float) -> float:
        """The longest stretch between two calls that got IDs (or the window's ends)."""
        times = [start] + [c.end for c in list(self.calls) if c.ids and start <= c.end <= end]
        times.append(end)
        return max(b - a for a, b in pairwise(times))


@dataclass
class Dc:
    """One data center: its Redis, its worker (with beat) and its clients."""

    name: str
    dc_id: int
    dc_count: int
    database_url: str
    workdir: Path
    settings: dict[str, object] = field(default_factory=dict)
    redis_server: servers.Server | None = None
    worker: Proc | None = None
    r: redis.Redis | None = None
    pool: Pool | None = None
    poppers: list[Popper] = field(default_factory=list)

    @property
    def log(self) -> Path:
        return self.workdir / f"worker-{self.name}.log"

    @property
    def redis_url(self) -> str:
        assert self.redis_server is not None
        return self.redis_server.extra["url"]

    def start(self, concurrency: int = 2) -> Dc:
        """Its redis-server (the shipped config), then its worker with beat."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.redis_server = servers.redis_server()
        self.r = redis.Redis.from_url(self.redis_url)
        self.pool = Pool(self.r)
        settings: dict[str, object] = {
            "redis_url": self.redis_url, "database_url": self.database_url,
            "dc_id": self.dc_id, "dc_count": self.dc_count, **self.settings}
        env = leafpool_env(None, **settings)
        self.worker = Proc([sys.executable, "-m", "celery", "-A", "workers", "worker", "-B",
                            "--loglevel=INFO", "-c", str(concurrency), "-n",
                            f"dc{self.dc_id}-{self.name}@%h",
                            "-s", str(self.workdir / f"beat-{self.name}")], env, self.log)
        return self

    def snapshot(self, tag: str) -> Snapshot:
        assert self.pool is not None
        return self.pool.snapshot(tag)

    def state(self, tag: str) -> dict[str, str]:
        return dict(self.snapshot(tag).state)

    def key(self, tag: str) -> str:
        assert self.pool is not None
        return self.pool.tag(tag).ids

    def wait_filled(self, tag: str, at_least: int, timeout: float) -> float:
        assert self.r is not None
        r, key = self.r, self.key(tag)
        return wait_for(lambda: int(r.llen(key)) >= at_least, timeout,  # type: ignore[arg-type]
                        f"DC {self.name}: {tag}'s list holds {at_least} IDs",
                        lambda: self.describe(tag))

    def pop(self, tag: str, rate: float, clients: int = 1, per_second: int = 10) -> list[Popper]:
        """``clients`` poppers taking ``rate`` IDs/s between them, in ``per_second``
        calls a second each."""
        assert self.r is not None
        batch = max(1, round(rate / clients / per_second))
        new = [Popper(redis.Redis.from_url(self.redis_url), self.key(tag), tag,
                      f"{self.name}-{tag}-{i}", batch, 1.0 / per_second).start()
               for i in range(clients)]
        self.poppers += new
        return new

    def calls(self, tag: str) -> list[Call]:
        return [c for p in self.poppers if p.tag == tag for c in list(p.calls)]

    def ids(self, tag: str) -> list[int]:
        return [i for c in self.calls(tag) for i in c.ids]

    def inversions(self, tag: str) -> tuple[int, list[str]]:
        """G2 for this DC's pool: a call that began after another ended got only larger
        IDs, and each call's IDs increase (docs/design.md §2)."""
        return inversions(self.calls(tag))

    def describe(self, tag: str) -> str:
        """What a failed wait shows: the list, the reserve and the tag's state."""
        try:
            snap = self.snapshot(tag)
            state = {k: snap.state.get(k) for k in (
                "target", "low_water", "reserve_target", "rate", "peak_rate",
                "db_unreachable_ms", "last_error", "last_refill_result", "refill_failures")}
            return (f"DC {self.name}: list {snap.length}, reserve {snap.reserve_size} "
                    f"({len(snap.reserve)} ranges), state {state}")
        except (redis.RedisError, AssertionError) as exc:
            return f"DC {self.name}: Redis unreadable ({exc})"

    def log_tail(self, lines: int = 60) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return f"--- worker log of DC {self.name} (tail) ---\n" + "\n".join(
            text.splitlines()[-lines:])

    def stop_clients(self) -> None:
        for p in self.poppers:
            p.stop()
            p.r.close()

    def stop(self) -> None:
        self.stop_clients()
        if self.worker is not None:
            self.worker.kill()
        if self.r is not None:
            self.r.close()
        if self.redis_server is not None:
            self.redis_server.stop()


def shared_ids(*dcs_ids: list[int]) -> tuple[int, list[int]]:
    """IDs handed out more than once over every DC's clients (extra copies, examples)."""
    calls = [Call(f"dc{i}", 0.0, 0.0, "", "lpop", len(ids), tuple(ids))
             for i, ids in enumerate(dcs_ids)]
    return duplicates(calls)


#: a Celery worker's log line for one allocation (leafpool/segment/refiller.py)
ALLOCATION = re.compile(
    r"\[[^\]]*?/(?P<proc>[\w-]+)\][^\n]*?(?P<tag>[\w.-]+): segment \[(?P<start>\d+), "
    r"(?P<end>\d+)\) step (?P<step>\d+) from the database in (?P<ms>[0-9.]+) ms")
#: Celery's line for a task that ended (its process, the task, the seconds it took)
SUCCEEDED = re.compile(
    r"\[[^\]]*?/(?P<proc>[\w-]+)\][^\n]*?Task leafpool\.refill_segment\[[^\]]+\] "
    r"succeeded in (?P<s>[0-9.]+)s")


#: the time at the head of a worker's log line (the worker's local time)
STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}):")


def allocations_after(log: Path, tag: str, wall: float) -> list[tuple[float, float]]:
    """From a worker's log: the allocations of ``tag`` that started after ``wall``
    (seconds since the epoch), each as (when it started, its seconds)."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        m, stamp = ALLOCATION.search(line), STAMP.match(line)
        if m and stamp and m["tag"] == tag:
            ended = datetime.strptime(stamp[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            took = float(m["ms"]) / 1000
            if ended - took >= wall:
                out.append((ended - took, took))
    return out


def refill_times(log: Path, tag: str) -> tuple[list[float], list[float]]:
    """From a worker's log: every allocation's milliseconds, and the milliseconds of each
    whole refill task that allocated (its process logged an allocation of ``tag`` since
    its previous task ended)."""
    allocations: list[float] = []
    refills: list[float] = []
    allocated: set[str] = set()
    for line in log.read_text(errors="replace").splitlines():
        m = ALLOCATION.search(line)
        if m and m["tag"] == tag:
            allocations.append(float(m["ms"]))
            allocated.add(m["proc"])
            continue
        m = SUCCEEDED.search(line)
        if m:
            if m["proc"] in allocated:
                refills.append(float(m["s"]) * 1000)
            allocated.discard(m["proc"])
    return allocations, refills
