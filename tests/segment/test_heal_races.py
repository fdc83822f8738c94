"""A heal racing other writers of the row, on MariaDB (docs/design.md §7.3): two
refillers healing at once, an operator or a Leaf server writing the row at the same
moment, a tag removal. The race is made, not hoped for: a third transaction holds the
row's lock (or is the other writer, uncommitted) until every contender is seen waiting
on it in ``INNODB_LOCK_WAITS``; each contender's read (a plain, non-locking read) has
then seen the old value and its write waits.

What a heal must never do: overwrite a value another writer put there since its read,
hand out a range twice, bring a removed row back or lose a retired mark."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import Connection, text

from leafpool.core.errors import UnknownTag
from leafpool.segment.store import Segment, SegmentStore
from tests.support import services

STEP = 100
FLOOR = 5_000  # the pool's mark: it holds or handed out every ID below
REWOUND = FLOOR - 3 * STEP


@pytest.fixture
def stores(mysql_url: str) -> Iterator[Callable[[], SegmentStore]]:
    """Stores on one MariaDB database, each with its own engine (its own connections, as
    two worker processes have)."""
    made: list[SegmentStore] = []

    def make() -> SegmentStore:
        made.append(SegmentStore.from_url(mysql_url))
        return made[-1]

    first = make()
    first.init_schema()
    first.add_tag("order", step=STEP)
    with first.engine.begin() as conn:
        conn.execute(text("UPDATE leaf_alloc SET max_id = :m WHERE biz_tag = 'order'"),
                     {"m": REWOUND})
    yield make
    for store in made:
        store.engine.dispose()


def _lock_waits(store: SegmentStore) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(text(
            "SELECT COUNT(*) FROM information_schema.INNODB_LOCK_WAITS")).scalar_one())


class Contender(threading.Thread):
    """Runs ``call`` and keeps what it returned or raised."""

    def __init__(self, call: Callable[[], object]) -> None:
        super().__init__(daemon=True)
        self.call = call
        self.result: object = None
        self.error: BaseException | None = None
        self.done = threading.Event()

    def run(self) -> None:
        try:
            self.result = self.call()
        except BaseException as exc:  # handed to the test thread
            self.error = exc
        finally:
            self.done.set()

    def outcome(self) -> object:
        assert self.done.wait(30), "the contender did not finish"
        if self.error is not None:
            return self.error
        return self.result


def _start_waiting(observer: SegmentStore, contenders: list[Contender]) -> None:
    """Start each contender and see it wait on the row's lock before the next starts
    (InnoDB refreshes INNODB_LOCK_WAITS at most every 100 ms: polled every 250)."""
    for n, contender in enumerate(contenders, 1):
        contender.start()
        services.wait_until(
            lambda n=n, c=contender: c.done.is_set() or _lock_waits(observer) >= n, 30,
            f"contender {n} waits on the row's lock", interval=0.25)
        assert not contender.done.is_set(), f"contender {n} did not wait: {contender.error}"


def _row(conn: Connection) -> int | None:
    value = conn.execute(text("SELECT max_id FROM leaf_alloc WHERE biz_tag = 'order'")
                         ).scalar_one_or_none()
    return None if value is None else int(value)


def test_two_refillers_healing_at_once_take_two_ranges_and_move_the_row_once(
    stores: Callable[[], SegmentStore],
) -> None:
    """Two refillers with the same pool mark (a refill lock taken over after a Redis
    failover while its holder still runs both read the same ``hwm``): both read the
    rewound row and try to heal it. One heal lands; the other's compare-and-set finds the
    row changed, reads again, finds it healed and allocates the next range."""
    observer, a, b = stores(), stores(), stores()
    blocker = observer.engine.connect()
    tx = blocker.begin()
    blocker.execute(text("SELECT max_id FROM leaf_alloc WHERE biz_tag = 'order' FOR UPDATE"))
    both = [Contender(lambda s=s: s.allocate("order", floor=FLOOR, heal=True))  # type: ignore[misc]
            for s in (a, b)]
    _start_waiting(observer, both)
    tx.rollback()  # the row unchanged: both heals now race for it
    blocker.close()
    segments = [c.outcome() for c in both]
    assert all(isinstance(s, Segment) for s in segments), segments
    got = sorted((s.start, s.end, s.healed_from) for s in segments  # type: ignore[union-attr]
                 )
    assert got == [(FLOOR, FLOOR + STEP, REWOUND), (FLOOR + STEP, FLOOR + 2 * STEP, None)]
    with observer.engine.connect() as conn:
        assert _row(conn) == FLOOR + 2 * STEP


@pytest.mark.parametrize("writer", ["operator moves it above the mark",
                                    "a Leaf server advances it, still below the mark"])
def test_a_write_of_the_row_at_the_same_moment_is_never_overwritten(
    stores: Callable[[], SegmentStore], writer: str
) -> None:
    """The other writer's UPDATE is made first and committed while the heal's
    compare-and-set waits for it: the compare-and-set finds another value than it read,
    so it changes nothing, and the allocation decides again from the new value. An
    operator's higher value is kept (never lowered to the mark); a Leaf server's advance
    that leaves it below the mark is healed from there."""
    observer, healer = stores(), stores()
    other = observer.engine.connect()
    tx = other.begin()
    if writer.startswith("operator"):
        written = FLOOR + 10 * STEP
        other.execute(text("UPDATE leaf_alloc SET max_id = :m WHERE biz_tag = 'order'"),
                      {"m": written})
    else:  # Leaf's own allocation statement
        written = REWOUND + STEP
        other.execute(text("UPDATE leaf_alloc SET max_id = max_id + step "
                           "WHERE biz_tag = 'order'"))
    heal = Contender(lambda: healer.allocate("order", floor=FLOOR, heal=True))
    _start_waiting(observer, [heal])
    tx.commit()
    other.close()
    seg = heal.outcome()
    assert isinstance(seg, Segment), seg
    with observer.engine.connect() as conn:
        row = _row(conn)
    if written >= FLOOR:
        assert (seg.start, seg.healed_from, row) == (written, None, written + STEP), \
            f"the operator's {written} was overwritten: row {row}, range {seg}"
    else:
        assert (seg.start, seg.healed_from, row) == (FLOOR, written, FLOOR + STEP)


@pytest.mark.parametrize("first", ["heal", "removal"])
def test_a_heal_racing_a_tag_removal_neither_brings_the_row_back_nor_loses_the_mark(
    stores: Callable[[], SegmentStore], first: str
) -> None:
    """``tag remove`` deletes the row and retires the mark (the larger of the row's
    max_id and the pool's mark) in one transaction. Whichever gets the row's lock first:
    the heal lands and the removal retires above it, or the removal lands and the heal's
    compare-and-set finds no row (an UPDATE never inserts) and the allocation ends with
    UnknownTag. Either way no row is left and the retired mark covers every range."""
    observer, healer, remover = stores(), stores(), stores()
    blocker = observer.engine.connect()
    tx = blocker.begin()
    blocker.execute(text("SELECT max_id FROM leaf_alloc WHERE biz_tag = 'order' FOR UPDATE"))
    heal = Contender(lambda: healer.allocate("order", floor=FLOOR, heal=True))
    removal = Contender(lambda: remover.remove_tag("order", pool_mark=FLOOR))
    _start_waiting(observer, [heal, removal] if first == "heal" else [removal, heal])
    tx.rollback()
    blocker.close()
    healed, retired = heal.outcome(), removal.outcome()
    with observer.engine.connect() as conn:
        assert _row(conn) is None, "the heal brought the removed row back"
    assert observer.retired_mark("order") == retired
    if first == "heal":  # InnoDB grants the row's lock in the order it was asked for
        assert isinstance(healed, Segment) and healed.healed_from == REWOUND, healed
        assert (healed.start, retired) == (FLOOR, FLOOR + STEP)
    else:
        assert isinstance(healed, UnknownTag), healed
        assert retired == FLOOR


def test_a_row_moved_down_under_an_allocation_is_healed_not_allocated_from(
    stores: Callable[[], SegmentStore],
) -> None:
    """The row is at the mark when the allocation reads it; an operator (or a failover)
    moves it back before the allocation's advance runs. Leaf's advance adds the step to
    whatever the row holds, so the range it read back starts below the mark: rolled back,
    and the allocation decides again from the new value (a heal)."""
    observer, allocator = stores(), stores()
    with observer.engine.begin() as conn:
        conn.execute(text("UPDATE leaf_alloc SET max_id = :m WHERE biz_tag = 'order'"),
                     {"m": FLOOR})
    other = observer.engine.connect()
    tx = other.begin()
    other.execute(text("UPDATE leaf_alloc SET max_id = :m WHERE biz_tag = 'order'"),
                  {"m": REWOUND})
    alloc = Contender(lambda: allocator.allocate("order", floor=FLOOR, heal=True))
    _start_waiting(observer, [alloc])
    tx.commit()
    other.close()
    seg = alloc.outcome()
    assert isinstance(seg, Segment), seg
    assert (seg.start, seg.healed_from) == (FLOOR, REWOUND), seg
    with observer.engine.connect() as conn:
        assert _row(conn) == FLOOR + STEP
