"""The segment store contract, run against SQLite and a real MariaDB."""

from __future__ import annotations

import itertools
import threading

import pytest
from sqlalchemy import text

from leafpool.core.config import MAX_ID
from leafpool.core.errors import (
    BackendUnavailable,
    CounterBehind,
    InvalidArgument,
    InvalidTag,
    SegmentExhausted,
    TagExists,
    UnknownTag,
)
from leafpool.segment.step import StepRule
from leafpool.segment.store import SegmentStore


def test_init_schema_is_idempotent(store: SegmentStore) -> None:
    assert store.init_schema() is False


def test_a_row_inserted_by_hand_is_a_tag(store: SegmentStore) -> None:
    with store.engine.begin() as conn:
        conn.execute(text("insert into leaf_alloc(biz_tag, max_id, step, description) "
                          "values('leaf-segment-test', 1, 2000, 'Test leaf Segment Mode')"))
    assert [t.tag for t in store.list_tags()] == ["leaf-segment-test"]
    seg = store.allocate("leaf-segment-test")
    assert (seg.start, seg.end, seg.step) == (1, 2001, 2000)


def test_allocation_follows_leaf_range_rule(store: SegmentStore) -> None:
    store.add_tag("order", step=1000, start=1)
    first, second = store.allocate("order"), store.allocate("order")
    assert (first.start, first.end) == (1, 1001)
    assert (second.start, second.end) == (1001, 2001)
    assert store.get_tag("order").max_id == 2001


def test_allocation_takes_the_chosen_step(store: SegmentStore) -> None:
    store.add_tag("order", step=1000, start=100)
    seg = store.allocate("order", StepRule(current=2000, lasted_seconds=1.0))  # doubles
    assert (seg.start, seg.end, seg.step, seg.table_step) == (4100 - 4000, 4100, 4000, 1000)


def test_concurrent_allocations_never_overlap(store: SegmentStore) -> None:
    store.add_tag("order", step=10, start=1)
    ranges: list[tuple[int, int]] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(25):
            seg = store.allocate("order")
            with lock:
                ranges.append((seg.start, seg.end))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ranges.sort()
    assert len(ranges) == 100
    assert ranges[0][0] == 1 and ranges[-1][1] == 1001
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))


def test_allocation_near_the_64_bit_limit_is_exact_then_refused(store: SegmentStore) -> None:
    store.add_tag("edge", step=1000, start=MAX_ID - 2000)
    seg = store.allocate("edge")
    assert (seg.start, seg.end) == (MAX_ID - 2000, MAX_ID - 1000)
    seg = store.allocate("edge")
    assert seg.end == MAX_ID
    with pytest.raises(SegmentExhausted, match="would pass 2\\*\\*63 - 1"):
        store.allocate("edge")
    assert store.get_tag("edge").max_id == MAX_ID  # nothing written


def test_unknown_tag_allocation_raises(store: SegmentStore) -> None:
    with pytest.raises(UnknownTag):
        store.allocate("nope")


@pytest.mark.parametrize("kwargs,field", [
    ({"tag": "", "step": 10}, "tag"),
    ({"tag": "x" * 129, "step": 10}, "tag"),
    ({"tag": "a b", "step": 10}, "tag"),
    ({"tag": "ok", "step": 0}, "step"),
    ({"tag": "ok", "step": -5}, "step"),
    ({"tag": "ok", "step": 1_000_001}, "step"),
    ({"tag": "ok", "step": 10, "start": -1}, "start"),
    ({"tag": "ok", "step": 10, "start": MAX_ID}, "start"),
])
def test_bad_input_names_the_field_and_writes_nothing(
    store: SegmentStore, kwargs: dict[str, object], field: str
) -> None:
    with pytest.raises((InvalidArgument, InvalidTag)) as info:
        store.add_tag(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field
    assert store.list_tags() == []


def test_duplicate_tag_is_refused(store: SegmentStore) -> None:
    store.add_tag("order", step=10)
    with pytest.raises(TagExists):
        store.add_tag("order", step=20)
    assert store.get_tag("order").step == 10


def test_step_change_and_removal(store: SegmentStore) -> None:
    store.add_tag("order", step=10)
    store.set_step("order", 50)
    assert store.allocate("order").step == 50
    store.remove_tag("order")
    with pytest.raises(UnknownTag):
        store.get_tag("order")
    with pytest.raises(UnknownTag):
        store.set_step("order", 5)


def test_an_unreachable_database_is_backend_unavailable() -> None:
    dead = SegmentStore.from_url("mysql+pymysql://u:p@127.0.0.1:1/none")
    with pytest.raises(BackendUnavailable, match="database: order: allocate failed"):
        dead.allocate("order")


def test_ids_start_at_one(store: SegmentStore) -> None:
    with pytest.raises(InvalidArgument, match=r"start=0 .* >= 1"):
        store.add_tag("pay", step=10, start=0)
    with store.engine.begin() as conn:  # a Leaf user's hand-inserted row
        conn.execute(text("INSERT INTO leaf_alloc(biz_tag, max_id, step) VALUES ('pay', 0, 10)"))
    with pytest.raises(CounterBehind, match=r"max_id=0 is below 1,.*IDs start at 1"):
        store.allocate("pay")
    assert store.get_tag("pay").max_id == 0  # nothing allocated


def test_a_removed_tag_added_again_continues_above_what_it_handed_out(
    store: SegmentStore,
) -> None:
    store.add_tag("pay", step=10)
    assert store.allocate("pay").end == 11
    assert store.remove_tag("pay") == 11
    with pytest.raises(InvalidArgument, match=r"start=1 .*at least 11"):
        store.add_tag("pay", step=10, start=1)
    assert store.add_tag("pay", step=10).max_id == 11  # no --start: continues
    assert store.allocate("pay").start == 11


def test_a_hand_inserted_row_below_a_retired_mark_is_refused(store: SegmentStore) -> None:
    store.add_tag("pay", step=10)
    store.allocate("pay")
    store.remove_tag("pay", pool_mark=15)  # the pool's mark is kept when it is higher
    with store.engine.begin() as conn:
        conn.execute(text("INSERT INTO leaf_alloc(biz_tag, max_id, step) VALUES ('pay', 1, 10)"))
    with pytest.raises(CounterBehind, match=r"max_id=1 is below 15,.*SET max_id = 15"):
        store.allocate("pay")
    assert store.get_tag("pay").max_id == 1
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE leaf_alloc SET max_id = 15 WHERE biz_tag = 'pay'"))
    assert store.allocate("pay").start == 15


def test_the_pools_floor_refuses_a_counter_that_went_back(store: SegmentStore) -> None:
    store.add_tag("pay", step=10)
    with pytest.raises(CounterBehind, match="max_id=1 is below 500"):
        store.allocate("pay", floor=500)
    assert store.get_tag("pay").max_id == 1
