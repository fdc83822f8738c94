"""Leaf's dynamic step rule and the pool sizing rule, as pure functions.

Leaf (``SegmentIDGenImpl.updateSegmentFromDb``): when the previous segment lasted under
15 minutes the step doubles (up to 1,000,000); 15 to 30 minutes keeps it; over 30 minutes
halves it, never below the table's ``step``. The durations are settings.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from leafpool.config import MAX_STEP


def next_step(
    current: int,
    table_step: int,
    lasted_seconds: float | None,
    *,
    grow_below: float,
    shrink_above: float,
    cap: int,
) -> int:
    """The step for the next allocation.

    ``lasted_seconds`` is how long the previous segment lasted (None for the first
    allocation, which uses the table's step). The result is within
    ``[table_step, max(cap, table_step)]``.
    """
    floor = table_step
    if lasted_seconds is None or current <= 0:
        return floor
    step = max(current, floor)
    if lasted_seconds < grow_below:
        if step * 2 <= cap:
            step *= 2
    elif lasted_seconds >= shrink_above:
        step = max(step // 2, floor)
    return max(min(step, max(cap, floor)), floor)


def pool_target(rate: float, seconds: float, floor: int, ceiling: int) -> int:
    """How many ready IDs a pool should hold: ``rate x seconds`` within the bounds."""
    want = math.ceil(rate * seconds) if rate > 0 else 0
    return max(floor, min(ceiling, want))


def smooth_rate(previous: float, consumed: int, elapsed: float, alpha: float) -> float:
    """Exponentially smoothed consumption rate (IDs/s)."""
    if elapsed <= 0:
        return previous
    instant = max(consumed, 0) / elapsed
    if previous <= 0:
        return instant
    return alpha * instant + (1 - alpha) * previous


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


@dataclass(frozen=True)
class StepRule:
    """How the next segment's step is chosen: Leaf's rule applied to how long the last
    consumed segment lasted (``lasted_seconds``; None when no segment was consumed since
    the step last changed, which keeps the step). Plain data: the store applies it to the
    table's ``step`` read in the allocation's transaction."""

    current: int = 0
    lasted_seconds: float | None = None
    grow_below: float = 15 * 60
    shrink_above: float = 30 * 60
    cap: int = MAX_STEP

    def step(self, table_step: int) -> int:
        if self.current <= 0:
            return table_step
        if self.lasted_seconds is None:
            return max(min(self.current, max(self.cap, table_step)), table_step)
        return next_step(self.current, table_step, self.lasted_seconds,
                         grow_below=self.grow_below, shrink_above=self.shrink_above,
                         cap=self.cap)
