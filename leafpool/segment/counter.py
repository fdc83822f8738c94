"""The steps of one allocation from ``leaf_alloc`` inside its transaction: the row read
with its lock held to the end of the transaction (:func:`lock_row`), the first ID the
tag may still hand out (its floor, :func:`lowest`), and the one write: Leaf's advance by
the step, from the floor when the row is below it (the heal) (docs/design.md §3.4, §7.3).

No other writer of the row (a refiller, a Leaf server, an operator, a tag removal) can
change it between the read and the write, so what was decided on the read stands.
:class:`~leafpool.segment.store.SegmentStore` runs them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, case, func, select

from leafpool.core.config import MAX_ID
from leafpool.core.errors import OutsideDcSlot, SegmentExhausted, UnknownTag
from leafpool.database.engine import leaf_alloc

FIRST_ID = 1  # IDs start at 1: a Leaf client reads 0 (and below) as a failure result

#: mode own (docs/design.md §12.3): DC k's counters live in ``[k x 2^50, (k + 1) x 2^50)``,
#: fixed whatever the DC count (DC 0's slot starts at 0: a single site's counters are DC
#: 0's already)
SLOT_BITS = 50
SLOT_SIZE = 1 << SLOT_BITS


@dataclass(frozen=True)
class DcSlot:
    """DC ``dc_id``'s slot of the ID space in mode own: ``[start, end)``."""

    dc_id: int

    @property
    def start(self) -> int:
        return self.dc_id * SLOT_SIZE

    @property
    def end(self) -> int:
        return min((self.dc_id + 1) * SLOT_SIZE, MAX_ID)

    @property
    def first(self) -> int:
        """Where a new tag begins: the slot's start + the usual first ID (1)."""
        return self.start + FIRST_ID

    def __str__(self) -> str:
        return f"DC {self.dc_id}'s slot [{self.start}, {self.end})"

    def lowest(self) -> Lowest:
        return Lowest(self.first, f"{self} starts there (LEAFPOOL_DC_SEGMENTS=own)")

    def check_counter(self, tag: str, max_id: int) -> None:
        """A counter in another DC's slot is refused, never moved (:class:`OutsideDcSlot`):
        above this slot, or below it in a slot other than DC 0's. One in DC 0's slot below
        this one (a row inserted by hand, a single site's database) is moved up by the heal
        (docs/design.md §12.3 says why)."""
        if self.start <= max_id <= self.end or max_id < SLOT_SIZE:
            return
        owner = (max_id - 1) >> SLOT_BITS
        raise OutsideDcSlot(
            tag, self.dc_id, self.start, self.end, max_id,
            f"the counter is in DC {owner}'s slot: this database is DC {owner}'s, or shared "
            f"with it by mistake (each DC in mode own needs a database of its own; check "
            f"LEAFPOOL_DATABASE_URL and LEAFPOOL_DC_ID={self.dc_id}). Never moved down "
            "automatically: IDs above it may have been handed out")

    def check_fits(self, tag: str, max_id: int, start: int, step: int) -> None:
        """The range ``[start, start + step)`` is inside the slot, or
        :class:`OutsideDcSlot` (nothing handed out past the slot's end)."""
        if self.start <= start and start + step <= self.end:
            return
        left = max(0, self.end - start)
        raise OutsideDcSlot(
            tag, self.dc_id, self.start, self.end, max_id,
            f"a step of {step} from {start} would pass the slot's end ({left} IDs left in "
            "the slot); the tag has used up its DC's slot")


def own_slot(dc_segments: str, dc_id: int) -> DcSlot | None:
    """The DC's slot in mode own (``LEAFPOOL_DC_SEGMENTS=own``); None in mode shared
    (one database, one counter: nothing to keep apart)."""
    return DcSlot(dc_id) if dc_segments == "own" else None


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


def lowest(floor: int, retired: int, stored: Stored | None,
           slot: DcSlot | None = None) -> Lowest:
    """The largest of 1 (in mode own: the DC's slot's first ID), a removed tag's mark,
    the caller's ``floor`` (the pool's mark) and one above what the guard read; on a tie
    the first named."""
    candidates = [slot.lowest() if slot is not None else Lowest(FIRST_ID, "IDs start at 1"),
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


def lock_row(conn: Connection, tag: str) -> Row:
    """The tag's row, locked until the transaction ends: ``SELECT ... FOR UPDATE`` on
    MySQL/MariaDB (every other writer of the row waits for it). SQLite has no row locks
    and its driver begins a transaction only at the first write, so there a write that
    changes nothing comes first: it begins the transaction and takes the database's
    write lock (another writer waits, ``busy_timeout``), and the read after it sees the
    last commit."""
    if conn.dialect.name == "sqlite":
        conn.execute(leaf_alloc.update().where(leaf_alloc.c.biz_tag == tag)
                     .values(max_id=leaf_alloc.c.max_id))
    row = conn.execute(
        select(leaf_alloc.c.max_id, leaf_alloc.c.step).where(leaf_alloc.c.biz_tag == tag)
        .with_for_update()
    ).first()
    if row is None:
        raise UnknownTag(tag)
    return Row(int(row.max_id), int(row.step))


def advance(conn: Connection, tag: str, start: int, step: int) -> int:
    """The allocation's write on the row :func:`lock_row` locked: ``max_id`` set to
    ``start + step`` (``start``: the row's ``max_id``, or the floor it is healed up to);
    the new ``max_id``. One that would pass 2**63 - 1 raises :class:`SegmentExhausted`
    and writes nothing."""
    check_advance(tag, start, step)
    conn.execute(
        leaf_alloc.update().where(leaf_alloc.c.biz_tag == tag)
        .values(max_id=start + step, update_time=func.current_timestamp()))
    return start + step


def check_advance(tag: str, start: int, step: int) -> None:
    """:class:`SegmentExhausted` when an advance by ``step`` from ``start`` would pass
    2**63 - 1 (checked before anything is written)."""
    if start > MAX_ID - step:
        raise SegmentExhausted(tag, start, step)


#: the many-row statements look the rows up by the primary key (``biz_tag``): a scan of
#: the table (the optimizer's choice for a small one) locks every row it reads, and two
#: batches of disjoint tags deadlocked on each other's rows
_BY_KEY = "FORCE INDEX (PRIMARY)"


def lock_rows(conn: Connection, tags: Sequence[str]) -> dict[str, Row]:
    """:func:`lock_row` for many tags in one statement (a tag without a row is left
    out): the rows are locked in the primary key's order, the tags' sorted order, so two
    transactions locking overlapping sets wait for each other and never deadlock."""
    if not tags:
        return {}
    names = sorted(tags)
    if conn.dialect.name == "sqlite":
        conn.execute(leaf_alloc.update().where(leaf_alloc.c.biz_tag.in_(names))
                     .values(max_id=leaf_alloc.c.max_id))
    rows = conn.execute(
        select(leaf_alloc.c.biz_tag, leaf_alloc.c.max_id, leaf_alloc.c.step)
        .with_hint(leaf_alloc, _BY_KEY, "mysql").with_hint(leaf_alloc, _BY_KEY, "mariadb")
        .where(leaf_alloc.c.biz_tag.in_(names)).order_by(leaf_alloc.c.biz_tag)
        .with_for_update()
    ).all()
    return {r.biz_tag: Row(int(r.max_id), int(r.step)) for r in rows}


def advance_many(conn: Connection, advances: Sequence[tuple[str, int, int]]) -> None:
    """:func:`advance` for many rows :func:`lock_rows` locked, ``(tag, start, step)``
    each (each checked by :func:`check_advance` before anything is written), in one
    ``UPDATE``: each row's ``max_id`` set to its ``start + step``."""
    for tag, start, step in advances:
        check_advance(tag, start, step)
    if not advances:
        return
    new = {tag: start + step for tag, start, step in advances}
    conn.execute(
        leaf_alloc.update().with_hint(_BY_KEY, dialect_name="mysql")
        .with_hint(_BY_KEY, dialect_name="mariadb")
        .where(leaf_alloc.c.biz_tag.in_(sorted(new)))
        .values(max_id=case(new, value=leaf_alloc.c.biz_tag),
                update_time=func.current_timestamp()))
