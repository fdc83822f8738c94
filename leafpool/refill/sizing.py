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
                   floor: int, ceiling: int) -> int:
    """IDs a segment tag keeps allocated in its reserve: ``rate x reserve_seconds`` (the
    top-up margin at the rate the pool is sized by) or, when larger, ``peak x
    outage_seconds``: the recent peak demand for the length of a database outage the
    pool must ride through. Ranges cost Redis a few bytes each, not per ID, so this
    grows the IDs held, not Redis memory; within ``floor`` and ``ceiling``."""
    want = max(rate * reserve_seconds, peak * outage_seconds)
    return pool_target(want, 1.0, floor, ceiling)


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
