"""Leaf's dynamic step rule, as pure functions.

Leaf (``SegmentIDGenImpl.updateSegmentFromDb``): when the previous segment lasted under
15 minutes the step doubles (up to 1,000,000); 15 to 30 minutes keeps it; over 30 minutes
halves it, never below the table's ``step``. The durations are settings.
"""

from __future__ import annotations

from dataclasses import dataclass

from leafpool.core.config import MAX_STEP


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
