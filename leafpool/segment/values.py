"""What the segment store takes and gives: a segment, a tag's row, and the checks of a
step and a first ID (:mod:`leafpool.segment.store`)."""

from __future__ import annotations

from dataclasses import dataclass

from leafpool.core.config import MAX_ID, MAX_STEP
from leafpool.core.errors import InvalidArgument
from leafpool.segment.counter import FIRST_ID


@dataclass(frozen=True)
class Segment:
    """A range ``[start, end)`` taken from the database by one ``max_id`` advance."""

    tag: str
    start: int
    end: int
    step: int
    table_step: int
    took_ms: float
    healed_from: int | None = None  # the max_id read, when this allocation healed it

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class TagRow:
    tag: str
    max_id: int
    step: int
    description: str | None


def validate_step(step: int, max_step: int = MAX_STEP) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or step <= 0 or step > max_step:
        raise InvalidArgument("step", step, f"an integer from 1 to {max_step:,}")
    return step


def validate_start(start: int, step: int) -> int:
    if isinstance(start, bool) or not isinstance(start, int) or start < FIRST_ID:
        raise InvalidArgument(
            "start", start,
            f"an integer >= {FIRST_ID} (the first ID handed out; Leaf clients read 0 as a "
            "failure)")
    if start > MAX_ID - step:
        raise InvalidArgument(
            "start", start, f"at most 2**63 - 1 - step = {MAX_ID - step} so one segment fits"
        )
    return start
