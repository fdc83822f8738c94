"""Leaf's dynamic step rule and the pool sizing rule, as pure functions.

Leaf (``SegmentIDGenImpl.updateSegmentFromDb``): when the previous segment lasted under
15 minutes the step doubles (up to 1,000,000); 15 to 30 minutes keeps it; over 30 minutes
halves it, never below the table's ``step``. The durations are settings.
"""

from __future__ import annotations

import math


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
