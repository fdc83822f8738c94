"""The steps of one allocation from ``leaf_alloc`` inside its transaction: the first ID
the tag may still hand out (its floor), the heal of a counter found below it (a
compare-and-set UPDATE), and Leaf's advance by the step (docs/design.md §3.4, §7.3).

:class:`~leafpool.segment.store.SegmentStore` runs them; a step that finds the row
changed under it raises :class:`Again`, the store rolls the transaction back and decides
again from a new read (a new transaction: InnoDB's REPEATABLE READ would show the same
snapshot to a read inside the old one).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, func, select

from leafpool.core.config import MAX_ID
from leafpool.core.errors import SegmentExhausted, UnknownTag
from leafpool.database.engine import leaf_alloc

FIRST_ID = 1  # IDs start at 1: a Leaf client reads 0 (and below) as a failure result


class Again(Exception):  # a signal to the store's loop, never raised out of it
    """Roll this transaction back and decide again; ``guard``: read the guard first."""

    def __init__(self, why: str, guard: bool = False) -> None:
        super().__init__(why)
        self.guard = guard


@dataclass(frozen=True)
class Stored:
    """What the tag's guard read: the largest ID the application stored (None: none)."""

    guard: str
    max_id: int | None


@dataclass(frozen=True)
class Lowest:
    """The first ID the tag may still hand out, and why."""

    value: int
    why: str


def lowest(floor: int, retired: int, stored: Stored | None) -> Lowest:
    """The largest of 1, a removed tag's mark, the caller's ``floor`` (the pool's mark)
    and one above what the guard read; on a tie the first named."""
    candidates = [Lowest(FIRST_ID, "IDs start at 1"),
                  Lowest(retired, "a removed tag of this name handed out IDs below it"),
                  Lowest(floor, "the pool already holds or handed out IDs below it")]
    if stored is not None and stored.max_id is not None:
        candidates.append(Lowest(stored.max_id + 1, f"the application stored IDs up to "
                                                    f"{stored.max_id}, guard {stored.guard}"))
    return max(candidates, key=lambda c: c.value)


@dataclass(frozen=True)
class Row:
    max_id: int
    step: int


def read_row(conn: Connection, tag: str) -> Row:
    row = conn.execute(
        select(leaf_alloc.c.max_id, leaf_alloc.c.step).where(leaf_alloc.c.biz_tag == tag)
    ).first()
    if row is None:
        raise UnknownTag(tag)
    return Row(int(row.max_id), int(row.step))


def move_up(conn: Connection, tag: str, read: int, to: int) -> bool:
    """The heal: ``max_id`` from the value ``read`` to ``to``, only while it still holds
    ``read`` (a value another writer put there since, higher or lower, is never
    overwritten: the caller decides again from it). True when it moved."""
    result = conn.execute(
        leaf_alloc.update()
        .where(leaf_alloc.c.biz_tag == tag, leaf_alloc.c.max_id == read)
        .values(max_id=to, update_time=func.current_timestamp()))
    return bool(result.rowcount)


def advance(conn: Connection, tag: str, read: int, step: int, lowest: int) -> int:
    """Leaf's allocation: ``max_id`` advanced by ``step`` and read back; the new
    ``max_id``. The row moved below ``lowest`` (or away) since it was ``read``:
    :class:`Again` (the caller's transaction rolls the advance back)."""
    result = conn.execute(
        leaf_alloc.update()
        .where(leaf_alloc.c.biz_tag == tag, leaf_alloc.c.max_id <= MAX_ID - step)
        .values(max_id=leaf_alloc.c.max_id + step, update_time=func.current_timestamp()))
    if result.rowcount == 0:
        if read <= MAX_ID - step:  # it fitted when read: changed or deleted since
            raise Again("the row changed since it was read")
        raise SegmentExhausted(tag, read, step)
    max_id = int(conn.execute(
        select(leaf_alloc.c.max_id).where(leaf_alloc.c.biz_tag == tag)).scalar_one())
    if max_id - step < lowest:
        raise Again(f"the row was moved to {max_id - step} since it was read")
    return max_id
