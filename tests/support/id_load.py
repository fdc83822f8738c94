"""Load on segment tags across a database failover, for the tests and the benchmarks:
clients popping one tag through leafpool's :class:`~leafpool.client.Client`, a refiller
refilling it in a loop (as the worker does, one refill at a time), and threads
allocating another tag straight from :meth:`SegmentStore.allocate`. Every ID handed out,
every range a committed allocation returned and every failure is recorded with its
time, so a test can check that no ID was handed out twice, that every ID handed out comes
from a committed allocation, and measure the pauses.

Like the other modules of ``tests/support`` that start things, this one does not import
pytest (the benchmarks use it too). Waits are bounded polling; the clients' and
allocators' pacing only shapes the load.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from sqlalchemy import Engine

from leafpool.client import Client
from leafpool.core.config import Settings
from leafpool.core.errors import LeafpoolError, PoolEmpty
from leafpool.redis.connect import connect
from leafpool.redis.pool import Pool
from leafpool.segment.refiller import SegmentRefiller
from leafpool.segment.step import StepRule
from leafpool.segment.store import Segment, SegmentStore


@dataclass
class Record:
    """What happened under load, each entry with its ``time.monotonic()``."""

    pops: list[tuple[float, list[int]]] = field(default_factory=list)
    empty: list[float] = field(default_factory=list)  # PoolEmpty raised to a client
    allocations: list[tuple[float, Segment]] = field(default_factory=list)
    failures: list[tuple[float, str, str]] = field(default_factory=list)  # (t, who, error)
    refills: list[tuple[float, int]] = field(default_factory=list)  # (t, IDs pushed)

    def handed_out(self) -> list[int]:
        return [i for _, ids in self.pops for i in ids]

    def duplicates(self) -> int:
        ids = self.handed_out()
        return len(ids) - len(set(ids))

    def ranges(self, tag: str) -> list[Segment]:
        return sorted((s for _, s in self.allocations if s.tag == tag), key=lambda s: s.start)

    def overlapping(self) -> list[tuple[Segment, Segment]]:
        """Pairs of committed allocations of one tag that share IDs (G3: none)."""
        out = []
        for tag in {s.tag for _, s in self.allocations}:
            ranges = self.ranges(tag)
            out += [(a, b) for a, b in pairwise(ranges) if b.start < a.end]
        return out

    def outside(self, tag: str) -> list[int]:
        """IDs handed out that no committed allocation of ``tag`` returned."""
        ranges = self.ranges(tag)
        starts = [s.start for s in ranges]
        out = []
        for i in self.handed_out():
            k = bisect.bisect_right(starts, i) - 1
            if k < 0 or i >= ranges[k].end:
                out.append(i)
        return out

    def first_allocation_after(self, t: float, tag: str | None = None) -> float | None:
        """Seconds from ``t`` to the first allocation committed after it."""
        after = [at for at, s in self.allocations if at > t and tag in (None, s.tag)]
        return min(after) - t if after else None

    def longest_pop_gap(self) -> float:
        times = sorted(t for t, _ in self.pops)
        return max((b - a for a, b in pairwise(times)), default=0.0)


class RecordingStore(SegmentStore):
    """A store that records every range its :meth:`allocate` returned (committed)."""

    def __init__(self, engine: Engine, record: Record) -> None:
        super().__init__(engine)
        self.record = record

    @classmethod
    def open(cls, url: str, record: Record) -> RecordingStore:
        return cls(SegmentStore.from_url(url).engine, record)

    def allocate(self, tag: str, rule: StepRule | None = None, floor: int = 0,
                 heal: bool = False) -> Segment:
        segment = super().allocate(tag, rule, floor, heal)
        self.record.allocations.append((time.monotonic(), segment))
        return segment


class Load:
    """Threads loading ``tag`` (clients and a refiller) and ``direct_tag`` (allocators)."""

    def __init__(self, settings: Settings, store: RecordingStore, tag: str, *,
                 clients: int = 2, batch: int = 10, pace_s: float = 0.01,
                 direct_tag: str | None = None, allocators: int = 0,
                 allocator_pace_s: float = 0.005, refill_every_s: float = 0.01) -> None:
        self.settings = settings
        self.store = store
        self.record = store.record
        self.tag = tag
        self.direct_tag = direct_tag
        self._stop = threading.Event()
        self._redis = connect(settings)
        self._threads = [threading.Thread(target=self._client, args=(batch, pace_s),
                                          name=f"load-client-{i}") for i in range(clients)]
        self._threads.append(threading.Thread(target=self._refiller, args=(refill_every_s,),
                                              name="load-refiller"))
        self._threads += [threading.Thread(target=self._allocator, args=(allocator_pace_s,),
                                           name=f"load-allocator-{i}")
                          for i in range(allocators if direct_tag else 0)]

    def start(self, timeout: float = 60.0) -> Load:
        """The refiller (and the allocators) first; the clients once a refill filled the
        pool, so that an empty pool seen by a client is one the load emptied."""
        clients = [t for t in self._threads if t.name.startswith("load-client")]
        for t in self._threads:
            if t not in clients:
                t.start()
        self.wait_until(lambda: bool(self.record.refills), timeout, "the first refill")
        for t in clients:
            t.start()
        return self

    def use(self, settings: Settings, store: RecordingStore) -> None:
        """The refiller and the allocators restarted on another database."""
        self.settings, self.store = settings, store

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=60)
        self._redis.close()

    @staticmethod
    def now() -> float:
        """The clock of every record (``time.monotonic()``)."""
        return time.monotonic()

    def wait_until(self, check: Callable[[], bool], timeout: float, what: str) -> float:
        """Bounded polling for a state the product must reach; seconds it took."""
        started = time.monotonic()
        while not check():
            if time.monotonic() - started > timeout:
                raise TimeoutError(f"{what}: not after {timeout}s; failures: "
                                   f"{self.record.failures[-3:]}")
            time.sleep(0.02)
        return time.monotonic() - started

    def _failed(self, who: str, exc: BaseException) -> None:
        self.record.failures.append((time.monotonic(), who, f"{type(exc).__name__}: {exc}"))

    def _client(self, batch: int, pace_s: float) -> None:
        client = Client(self._redis, settings=self.settings, policy="raise")
        while not self._stop.is_set():
            try:
                ids = client.next_ids(self.tag, batch)
            except PoolEmpty as exc:
                ids = list(exc.partial)
                self.record.empty.append(time.monotonic())
            except LeafpoolError as exc:
                self._failed("client", exc)
                ids = []
            if ids:
                self.record.pops.append((time.monotonic(), ids))
            self._stop.wait(pace_s)

    def _refiller(self, every_s: float) -> None:
        current: tuple[Any, SegmentRefiller] | None = None
        while not self._stop.is_set():
            if current is None or current[0] is not self.store:
                current = (self.store, SegmentRefiller(Pool(self._redis), self.store,
                                                       self.settings))
            try:
                result = current[1].refill(self.tag)
                self.record.refills.append((time.monotonic(), result.pushed))
            except LeafpoolError as exc:
                self._failed("refiller", exc)
            self._stop.wait(every_s)

    def _allocator(self, pace_s: float) -> None:
        assert self.direct_tag is not None
        floor = 1
        while not self._stop.is_set():
            try:  # no heal: a counter found behind here is a failure of the database
                floor = self.store.allocate(self.direct_tag, floor=floor).end
            except LeafpoolError as exc:
                self._failed("allocator", exc)
            self._stop.wait(pace_s)
