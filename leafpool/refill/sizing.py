"""The pool sizing rule, as pure functions (docs/design.md §3.2): how many ready IDs
a pool should hold for a consumption rate, how that rate is measured and smoothed,
when a pool has outgrown its target, and how much a segment tag keeps allocated in its
reserve to ride through a database outage at its recent peak rate."""

from __future__ import annotations

import math


def pool_target(rate: float, seconds: float, floor: int, ceiling: int) -> int:
    """How many ready IDs a pool should hold: ``rate x seconds`` within the bounds."""
    want = math.ceil(rate * seconds) if rate > 0 else 0
    return max(floor, min(ceiling, want))


# -- the outage budget (docs/design.md §3.2) ------------------------------------------------

#: the recent peak rate halves every this many seconds once demand falls below it (a
#: decaying maximum): an hour after a peak of 3,000 IDs/s the reserve is still sized for
#: 1,500 IDs/s, a day later for the current rate
PEAK_HALF_LIFE_SECONDS = 3600.0


def decayed_peak(previous: float, elapsed: float, rate: float,
                 half_life: float = PEAK_HALF_LIFE_SECONDS) -> float:
    """The recent peak rate: the larger of ``rate`` (measured now) and the previous peak
    halved every ``half_life`` seconds of the ``elapsed`` since it was recorded."""
    if previous > 0 and elapsed > 0:
        previous *= 0.5 ** (elapsed / half_life)
    return max(rate, previous, 0.0)


def reserve_target(rate: float, peak: float, reserve_seconds: float, outage_seconds: float,
                   floor: int, ceiling: int, latency: float = 0.0) -> int:
    """IDs a segment tag keeps allocated in its reserve: ``rate x reserve_seconds`` (the
    top-up margin at the rate the pool is sized by) or, when larger, ``peak x
    outage_seconds``: the recent peak demand for the length of a database outage the
    pool must ride through, or twice :func:`latency_cover` of the measured allocation
    ``latency`` (seconds): a reserve is topped up once it is below half its target, and
    that half must last while the top-up's allocations cross the WAN. Ranges cost Redis
    a few bytes each, not per ID, so this grows the IDs held, not Redis memory; within
    ``floor`` and ``ceiling``."""
    want = max(rate * reserve_seconds, peak * outage_seconds,
               2 * math.ceil(latency_cover(rate, latency)))
    return pool_target(want, 1.0, floor, ceiling)


# -- the allocation's latency (docs/design.md §3.2, §12.2) ----------------------------------

#: how many measured allocation latencies the list's low-water mark and the reserve's
#: top-up margin must last at the sizing rate. The refill queued at the crossing must
#: finish before the list runs dry, and when the reserve is short it waits for: 1. its
#: allocation (the measured latency: a transaction's round trips to the database); 2. a
#: new connection's handshakes when the pooled one was dropped (TCP, MySQL greeting and
#: authentication: about as many round trips again); 3. another writer holding the
#: row's lock (in mode shared every DC allocates from the one row: one allocation in
#: flight ahead of it); 4. the tail: the value is a smoothed mean and a WAN's slow
#: round trips run to twice it. Each is one latency.
ALLOC_LATENCY_FACTOR = 4.0
#: the smoothed latency follows a slower allocation at once by half the difference and
#: a faster one by a tenth: a WAN's latency is remembered through a few quick allocations
#: (a connection already open), and one slow outlier only half counts
LATENCY_RISE = 0.5
LATENCY_FALL = 0.1


def smooth_latency(previous: float, sample: float, rise: float = LATENCY_RISE,
                   fall: float = LATENCY_FALL) -> float:
    """The allocation latency kept in the tag's state (``alloc_ms``): the first sample as
    it is, then a step of ``rise`` toward a slower sample and ``fall`` toward a faster."""
    if sample < 0:
        return max(previous, 0.0)
    if previous <= 0:
        return sample
    alpha = rise if sample > previous else fall
    return previous + alpha * (sample - previous)


def latency_cover(rate: float, latency: float, factor: float = ALLOC_LATENCY_FACTOR) -> float:
    """IDs consumed at ``rate`` while a refill waits for the database: ``rate x latency
    x factor`` (``latency`` in seconds)."""
    return max(rate, 0.0) * max(latency, 0.0) * factor


def list_seconds(pool_seconds: float, latency: float, low_water_ratio: float,
                 factor: float = ALLOC_LATENCY_FACTOR) -> float:
    """The seconds of demand the list is sized for: ``pool_seconds``, or more when the
    allocation ``latency`` (seconds) asks it: the low-water mark (``low_water_ratio`` of
    the target) then holds ``latency x factor`` of demand. A local database (a few ms)
    changes nothing: 4 x 5 ms / 0.5 is 40 ms against the default 30 s."""
    return max(pool_seconds, max(latency, 0.0) * factor / low_water_ratio)


def smooth_rate(previous: float, consumed: int, elapsed: float, alpha: float) -> float:
    """Exponentially smoothed consumption rate (IDs/s)."""
    if elapsed <= 0:
        return previous
    instant = max(consumed, 0) / elapsed
    if previous <= 0:
        return instant
    return alpha * instant + (1 - alpha) * previous


# -- the rate now, as status reads it (a refill measures the rate only when it runs) --------

#: a rate a refill measured counts half after this many seconds; the mean consumption
#: since the measurement counts for the rest
RATE_HALF_LIFE_SECONDS = 10.0
#: fewer than one ID consumed per this many seconds since the measurement (none at all
#: included): the pool is idle, its rate 0
IDLE_SECONDS = 60.0


def rate_now(measured: float, consumed_since: int, elapsed: float,
             half_life: float = RATE_HALF_LIFE_SECONDS, idle: float = IDLE_SECONDS) -> float:
    """The consumption rate now, from the ``measured`` rate a refill recorded ``elapsed``
    seconds ago and the IDs consumed since: 0 once at least ``idle`` seconds passed with
    fewer than one ID consumed per ``idle`` seconds on average (``./dev up`` restarted an
    hour later pops a handful: idle still); else the mean since the measurement, with the
    measured rate weighted by how recent it is (its weight halves every ``half_life``). A
    pool nobody pops keeps no rate of a run long gone; a busy pool, refilled every few
    seconds, shows what it is measured at."""
    if elapsed <= 0:  # just measured (or the measuring host's clock is ahead)
        return max(measured, 0.0)
    consumed_since = max(consumed_since, 0)
    if elapsed >= idle and consumed_since * idle < elapsed:
        return 0.0
    weight: float = 0.5 ** (elapsed / half_life)
    return max(weight * measured + (1 - weight) * consumed_since / elapsed, 0.0)


# -- burst sizing (docs/design.md §3.2) -----------------------------------------------------

#: a drop watcher's recent rate counts for sizing this long after it was measured
HINT_FRESH_SECONDS = 5.0
#: a recent rate is measured over at least this long (a batch pop of 100 just after a
#: read is 100/s, not 100 per ms: an idle tag is not sized as a flood by one call; a
#: real burst of 50,000/s reads 5,000/s after 0.1 s, 30 s of which is 150,000 IDs), and
#: forgets samples older than the window
MIN_SPAN_SECONDS = 1.0
WINDOW_SECONDS = 2.0


def sizing_rate(smoothed: float, instant: float, hint: float = 0.0) -> float:
    """The rate a pool is sized by: the largest of the smoothed rate (slow to rise and to
    fall), the consumption since the last refill (``instant``: a jump shows in full at
    the first refill after it) and a drop watcher's recent rate (``hint``)."""
    return max(smoothed, instant, hint, 0.0)


def outgrown(rate: float, seconds: float, target: int, ceiling: int) -> bool:
    """A pool sized for less than half of what ``rate`` asks (``rate x seconds``) and
    not at its ceiling: the drop watcher queues a forced refill to resize it now rather
    than when the list next crosses its low-water mark (half a too-small pool later)."""
    return 0 < target < ceiling and rate * seconds >= 2 * target


def instant_rate(consumed: int, elapsed: float) -> float:
    """IDs/s consumed since the last refill's measurement (0 when no time passed)."""
    return max(consumed, 0) / elapsed if elapsed > 0 else 0.0


class RecentRate:
    """Consumption rate of one tag over the last :data:`WINDOW_SECONDS`, from the
    watcher's reads (``consumed`` = pushed_total - LLEN at a time). Samples closer than
    :data:`MIN_SPAN_SECONDS` to the newest count as that span, so two reads a few ms
    apart around one batch pop do not read as a flood."""

    def __init__(self) -> None:
        self._samples: list[tuple[float, int]] = []

    def add(self, now: float, consumed: int) -> float:
        """Record a sample; returns the rate over the window (0 with one sample)."""
        samples = self._samples
        if samples and consumed < samples[-1][1]:
            samples.clear()  # the counters went back (a restored or re-created tag)
        samples.append((now, consumed))
        while len(samples) > 2 and now - samples[1][0] >= WINDOW_SECONDS:
            samples.pop(0)
        if len(samples) < 2:
            return 0.0
        t0, c0 = samples[0]
        return (consumed - c0) / max(now - t0, MIN_SPAN_SECONDS)
