"""An allocation's decision on its locked row, and :meth:`SegmentStore.allocate_many`'s
transaction: the first segments of a batch of new tags in one (docs/design.md §4, the
batched first fill). One allocation (:meth:`SegmentStore.allocate`) and many make the
same decision (:func:`decide`) with the same steps of :mod:`leafpool.segment.counter`;
many read their rows, retired marks and guards in one statement each and write their
advances in one."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from sqlalchemy import Connection, Engine, Table, select

from leafpool.core.errors import CounterBehind, InvalidArgument, LeafpoolError, UnknownTag
from leafpool.database import schema
from leafpool.database.engine import retired_tag
from leafpool.database.guard import tag_guard
from leafpool.segment import counter
from leafpool.segment.step import StepRule
from leafpool.segment.values import Segment

log = logging.getLogger(__name__)

class SegmentStore(Protocol):
    """What :func:`allocate_many` uses of :class:`leafpool.segment.store.SegmentStore`
    (this module is below it)."""

    engine: Engine
    slot: counter.DcSlot | None
    _seen: set[str]

    def _monotonic(self) -> float: ...

    def _tx(self, what: str) -> AbstractContextManager[Connection]: ...

    def _ensure_own_tables(self, *tables: Table, what: str = ...) -> None: ...

    def _guard_reading(self, conn: Connection, tag: str) -> counter.Stored | None: ...


#: what an allocation decided: the row read, the tag's lowest ID, whether the row is
#: healed, the step, the new ``max_id`` (the write: from ``max_id - step``)
Decided = tuple[counter.Row, counter.Lowest, bool, int, int]


def step_of(tag: str, rule: StepRule | None, table_step: int) -> int:
    step = (rule or StepRule()).step(table_step)
    if step <= 0:
        raise InvalidArgument(f"{tag}: step", step, "a positive integer")
    return step


def decide(tag: str, row: counter.Row, retired: int, guard: Callable[[], counter.Stored | None],
           rule: StepRule | None, floor: int, heal: bool,
           slot: counter.DcSlot | None) -> Decided:
    """An allocation's checks on the locked ``row`` (``guard()``: the tag's guard
    reading, called only when needed); its write is the caller's: ``max_id`` from
    ``max_id - step`` to ``max_id`` (:func:`counter.advance`'s check made here)."""
    if slot is not None:  # another DC's counter: refused, never moved
        slot.check_counter(tag, row.max_id)
    # the pool has no mark (a new or wiped Redis): the guard is read
    stored = guard() if floor <= 0 else None
    low = counter.lowest(floor, retired, stored, slot)
    if row.max_id < low.value and floor > 0:  # and before a heal
        low = counter.lowest(floor, retired, guard(), slot)
    behind = row.max_id < low.value
    if behind and not heal:
        raise CounterBehind(tag, row.max_id, low.value, low.why)
    step = step_of(tag, rule, row.step)
    start = max(row.max_id, low.value)
    if slot is not None:
        slot.check_fits(tag, row.max_id, start, step)
    counter.check_advance(tag, start, step)
    return row, low, behind, step, start + step


def allocated(tag: str, done: Decided, took: float) -> Segment:
    """The segment of a committed allocation, logged."""
    row, low, behind, step, max_id = done
    if behind:
        log.warning("%s: leaf_alloc.max_id=%d was below %d, the first ID this tag "
                    "may still hand out (%s): healed, moved up to %d", tag,
                    row.max_id, low.value, low.why, low.value)
    log.debug("%s: allocated [%d, %d) step=%d in %.1f ms", tag, max_id - step,
              max_id, step, took)
    return Segment(tag, max_id - step, max_id, step, row.step, took,
                   row.max_id if behind else None)


def allocate_many(store: SegmentStore, requests: Sequence[tuple[str, StepRule | None, int, bool]]
                  ) -> dict[str, Segment | LeafpoolError]:
    """:meth:`SegmentStore.allocate_many` (its docstring says what it promises)."""
    tags = [tag for tag, _, _, _ in requests]
    if len(set(tags)) != len(tags):
        raise InvalidArgument("requests", tags, "each tag at most once")
    if not requests:
        return {}
    store._ensure_own_tables(retired_tag, what=f"{len(tags)} tags: allocate")
    started = store._monotonic()
    done: dict[str, Decided] = {}
    out: dict[str, Segment | LeafpoolError] = {}
    with store._tx(f"{len(tags)} tags ({min(tags)} .. {max(tags)}): allocate") as conn:
        # the reads of every tag at once: its row (locked), its retired mark, its guard
        rows = counter.lock_rows(conn, tags)
        marks = _retired_many(conn, tags)
        guarded = _guarded(store, conn, tags)
        for tag, rule, floor, heal in sorted(requests, key=lambda r: r[0]):
            try:
                row = rows.get(tag)
                if row is None:
                    raise UnknownTag(tag)
                done[tag] = decide(tag, row, marks.get(tag, 0),
                                   _guard_of(store, conn, tag, guarded), rule, floor, heal,
                                   store.slot)
            except LeafpoolError as exc:  # raised before the tag's one write
                out[tag] = exc
        # every tag's one write, in one statement
        counter.advance_many(conn, [(tag, d[4] - d[3], d[3]) for tag, d in done.items()])
    took = (store._monotonic() - started) * 1000 / len(requests)
    for tag, decided in done.items():
        out[tag] = allocated(tag, decided, took)
    return {tag: out[tag] for tag in tags}


def _retired_many(conn: Connection, tags: Sequence[str]) -> dict[str, int]:
    """The retired marks of many tags in one statement (a tag never removed: absent)."""
    rows = conn.execute(select(retired_tag.c.biz_tag, retired_tag.c.max_id)
                        .where(retired_tag.c.biz_tag.in_(sorted(tags)))).all()
    return {r.biz_tag: int(r.max_id) for r in rows}


def _guarded(store: SegmentStore, conn: Connection, tags: Sequence[str]) -> set[str] | None:
    """The tags among ``tags`` that have a guard, in one statement (None: the guard
    table is absent, a database from before guards: no tag has one)."""
    if tag_guard.name not in store._seen and \
            schema.probe(store.engine, tag_guard, "read the guards") == "absent":
        return None
    store._ensure_own_tables(tag_guard, what="read the guards")
    rows = conn.execute(select(tag_guard.c.biz_tag)
                        .where(tag_guard.c.biz_tag.in_(sorted(tags)))).all()
    return {r.biz_tag for r in rows}


def _guard_of(store: SegmentStore, conn: Connection, tag: str,
              guarded: set[str] | None) -> Callable[[], counter.Stored | None]:
    """None for a tag without a guard; a tag with one has it read as one allocation
    reads it."""
    if guarded is None or tag not in guarded:
        return lambda: None
    return lambda: store._guard_reading(conn, tag)
