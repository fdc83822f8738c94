"""A model of Leaf's segment double buffer, fed the demand curve a burst scenario drives
and the database latencies leafpool's refills measured (``python -m bench --only
burst``, issue 30): pure Python, deterministic, no I/O.

What it models is Meituan's ``SegmentIDGenImpl`` and ``SegmentBuffer`` (leaf-core,
``com.sankuai.inf.leaf.segment``), as that source behaves:

- A tag's buffer holds two segments, the current one and the next. A get takes the
  current segment's next value; it starts loading the next segment asynchronously
  (one update thread per buffer: ``threadRunning``) when the next is not ready and the
  current segment's idle count (``max - value``) is below 90 % of its step, i.e. once
  10 % of it has been consumed.
- The load (``updateSegmentFromDb``) is one database transaction that advances
  ``leaf_alloc.max_id`` by the step; its duration is the only latency. The first load of
  a buffer (its init) and the second (no update timestamp yet) use the table's step; from
  the third on the step adapts to the time since the previous load ended (which, as the
  next load starts 10 % into a segment, is how long one segment lasted):
  under ``SEGMENT_DURATION`` (15 minutes) it doubles while the double stays within
  ``MAX_STEP`` (1,000,000); at or over twice that (30 minutes) it halves while the half
  stays at or above the table's step (``minStep``); in between it is kept. The update
  timestamp is set when the load ends.
- When the current segment is exhausted the get waits for a load in flight (in Leaf a
  spin of 10,000 rounds, then a 10 ms sleep) and switches to the next segment if it is
  ready. Leaf then answers an error (``EXCEPTION_ID_TWO_SEGMENTS_ARE_NULL``) when it is
  not; here the request waits until the load ends, as a leafpool client with the
  ``wait`` policy does, so that the count of requests that found no ID and the time
  without one compare like with like. A request that found no ID is an *empty pop*.
- Leaf keeps both segments in the server's memory: a restart loses what is left of the
  current segment and the next one if it was loaded (the counter in the database has
  moved past them).

Demand is a sequence of phases (seconds, IDs/s) served as calls of ``batch`` IDs evenly
spaced at ``rate / batch`` calls a second, as the benchmark's clients pop
``next_ids(batch)``. Latencies are used in the order given, cycling, one per load.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

#: Leaf's SegmentIDGenImpl constants
SEGMENT_DURATION_S = 15 * 60.0
MAX_STEP = 1_000_000
#: the next segment is loaded once the current one's idle count is below this share of its
#: step (10 % consumed)
LOAD_AT_IDLE = 0.9


@dataclass(frozen=True)
class Phase:
    seconds: float
    rate: float  # IDs/s


@dataclass
class LeafFigures:
    """What the model measured from ``step_at`` (the scenario's step) on."""

    empty_pops: int = 0  # calls that found no ID and waited for a load
    empty_s: float = 0.0  # seconds during which at least one call waited (union)
    waited_s: float = 0.0  # the calls' waits added up
    longest_wait_s: float = 0.0
    ready_s: float | None = None  # from the step until the buffer held `headroom_s` of demand
    loads: int = 0  # database loads started after the step
    step_at_end: int = 0
    held_at_end: int = 0  # what is left of the current segment + the next one if loaded
    lost_on_restart: int = 0  # = held_at_end: both segments live in the server's memory
    steps: list[int] = field(default_factory=list)  # each load's step, after the step


@dataclass
class _Segment:
    value: int = 0
    max: int = 0
    step: int = 0

    @property
    def idle(self) -> int:
        return self.max - self.value


@dataclass
class _Load:
    done: float
    step: int


class LeafBuffer:
    """One tag's SegmentBuffer with its update rule; ``now`` is seconds on any clock."""

    def __init__(self, table_step: int, latencies_s: Sequence[float]) -> None:
        if table_step < 1:
            raise ValueError(f"table_step: {table_step!r} is not allowed: an integer >= 1")
        if not latencies_s or any(not math.isfinite(x) or x < 0 for x in latencies_s):
            raise ValueError(f"latencies_s: {list(latencies_s)[:5]!r} is not allowed: "
                             "one or more finite numbers >= 0")
        self.table_step = table_step  # Leaf's minStep: leaf_alloc.step
        self.step = table_step  # buffer.step: the step of the last load
        self.update_ts: float | None = None  # None: Leaf's updateTimestamp == 0
        self.max_id = 0  # leaf_alloc.max_id
        self.current = _Segment()
        self.next: _Segment | None = None  # loaded and ready
        self.load: _Load | None = None  # in flight
        self.loads = 0
        self.steps: list[int] = []  # each load's step, as it started
        self._latency = itertools.cycle(latencies_s)

    # -- the database -------------------------------------------------------------------

    def _allocate(self, step: int) -> _Segment:
        self.max_id += step
        return _Segment(self.max_id - step, self.max_id, step)

    def init(self) -> None:
        """The buffer's first load (synchronous, on the first get): the table's step, no
        update timestamp."""
        self.current = self._allocate(self.table_step)

    def settle(self, rate: float, now: float) -> None:
        """The buffer as long service at ``rate`` leaves it: the step the rule settles on
        (doubled from the table's step while a segment lasts under 15 minutes), a full
        current segment of it, the previous load one segment's life before the next one
        starts (10 % into this segment)."""
        step = self.table_step
        while rate > 0 and step / rate < SEGMENT_DURATION_S and step * 2 <= MAX_STEP:
            step *= 2
        self.step = step
        self.current = self._allocate(step)
        life = step / rate if rate > 0 else 2 * SEGMENT_DURATION_S
        self.update_ts = now - LOAD_AT_IDLE * life

    def _next_step(self, now: float) -> int:
        if self.update_ts is None:
            return self.table_step
        duration = now - self.update_ts
        step = self.step
        if duration < SEGMENT_DURATION_S:
            if step * 2 <= MAX_STEP:
                step *= 2
        elif duration >= 2 * SEGMENT_DURATION_S and step // 2 >= self.table_step:
            step //= 2
        return step

    def _start_load(self, now: float) -> None:
        self.load = _Load(now + next(self._latency), self._next_step(now))
        self.loads += 1
        self.steps.append(self.load.step)

    def _finish_load(self) -> None:
        assert self.load is not None
        self.step = self.load.step
        self.next = self._allocate(self.step)
        self.update_ts = self.load.done
        self.load = None

    def advance(self, now: float) -> None:
        """Loads that ended by ``now`` are ready."""
        if self.load is not None and self.load.done <= now:
            self._finish_load()

    def held(self) -> int:
        return self.current.idle + (self.next.idle if self.next else 0)

    def take(self, n: int, now: float) -> float:
        """Take ``n`` IDs at ``now``; returns when the last one was handed out (later than
        ``now`` when the buffer ran dry and the call waited for a load)."""
        while True:
            self.advance(now)
            cur = self.current
            if (self.next is None and self.load is None
                    and cur.idle < LOAD_AT_IDLE * cur.step):
                self._start_load(now)
            if cur.idle > 0:
                k = min(n, cur.idle)
                cur.value += k
                n -= k
                if n == 0:
                    # the get after this one starts the load if this take crossed 10 %
                    return now
                continue
            if self.next is not None:
                self.current, self.next = self.next, None
                continue
            assert self.load is not None  # exhausted, nothing ready: one is in flight
            now = max(now, self.load.done)


def calls(phases: Sequence[Phase], batch: int) -> list[float]:
    """Call times: each phase's calls evenly spaced from its start."""
    out: list[float] = []
    t0 = 0.0
    for phase in phases:
        if phase.rate > 0:
            interval = batch / phase.rate
            count = int(phase.seconds / interval + 1e-9)
            out += [t0 + i * interval for i in range(count)]
        t0 += phase.seconds
    return out


def simulate(
    phases: Sequence[Phase],
    *,
    batch: int,
    table_step: int,
    latencies_s: Sequence[float],
    step_at: float,
    headroom_s: float,
    settled: bool = False,
) -> LeafFigures:
    """Run ``phases`` against one buffer; figures from ``step_at`` (seconds from the
    start) on. ``settled``: the buffer starts as long service at the first phase's rate
    leaves it (:meth:`LeafBuffer.settle`); otherwise it is new (its init at 0).
    ``headroom_s``: the buffer is *ready* once what it holds covers this many seconds of
    the demand after the step."""
    if batch < 1:
        raise ValueError(f"batch: {batch!r} is not allowed: an integer >= 1")
    buf = LeafBuffer(table_step, latencies_s)
    if settled and phases:
        buf.settle(phases[0].rate, 0.0)
    else:
        buf.init()
    new_rate = next((p.rate for p in _after(phases, step_at)), 0.0)
    figures = LeafFigures()
    loads_before: int | None = None
    free_at = 0.0  # when the call before was served: calls are served in order
    wait_from: float | None = None  # a run of waiting calls: the first one's arrival
    for t in calls(phases, batch):
        if t >= step_at and loads_before is None:
            loads_before = buf.loads
        served = buf.take(batch, max(t, free_at))
        if t >= step_at:
            if served > t:  # found no ID (or queued behind a call that found none)
                figures.empty_pops += 1
                figures.waited_s += served - t
                figures.longest_wait_s = max(figures.longest_wait_s, served - t)
                if wait_from is None:
                    wait_from = t
            elif wait_from is not None:  # the run ended when its last call was served
                figures.empty_s += free_at - wait_from
                wait_from = None
            if figures.ready_s is None and buf.held() >= headroom_s * new_rate:
                figures.ready_s = served - step_at
        free_at = served
    if wait_from is not None:
        figures.empty_s += free_at - wait_from
    if loads_before is None:
        loads_before = buf.loads
    figures.loads = buf.loads - loads_before
    figures.steps = buf.steps[loads_before:]
    end = sum(p.seconds for p in phases)
    buf.advance(end)
    figures.step_at_end = buf.step
    figures.held_at_end = figures.lost_on_restart = buf.held()
    return figures


def _after(phases: Sequence[Phase], at: float) -> list[Phase]:
    t0, out = 0.0, []
    for phase in phases:
        if t0 >= at - 1e-9:
            out.append(phase)
        t0 += phase.seconds
    return out
