"""A rewound counter is healed (docs/design.md §7.3), on both segment stores: the
allocation moves ``leaf_alloc.max_id`` up to the first ID the tag may still hand out and
goes on from there; ``LEAFPOOL_COUNTER_BEHIND=refuse`` keeps the refusal. The races of a
heal with other writers of the row are in test_heal_races.py (MariaDB)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest
import redis
from sqlalchemy import text

from leafpool.core.config import MAX_ID, Settings
from leafpool.core.errors import ConfigurationError, CounterBehind, SegmentExhausted
from leafpool.metrics import make_registry, render
from leafpool.redis.pool import Pool
from leafpool.segment.refiller import SegmentRefiller
from leafpool.segment.store import SegmentStore
from leafpool.status import tag_status
from tests.support.clocks import FakeWallClock


def _set_max_id(store: SegmentStore, tag: str, max_id: int) -> None:
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE leaf_alloc SET max_id = :m WHERE biz_tag = :t"),
                      {"m": max_id, "t": tag})


def test_a_counter_moved_back_three_steps_is_healed_by_the_next_refill_and_no_id_repeats(
    pool: Pool, store: SegmentStore, make_settings: Callable[..., Settings],
    r: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """A failover to a replica that missed the last three advances: the row is 3 steps
    below what the pool already holds. The refill that next allocates heals it and the
    pool goes on; every ID popped before and after is new and in order."""
    clock = FakeWallClock()
    settings = make_settings(pool_floor=2000, pool_ceiling=50_000, chunk_size=300,
                             pool_seconds=10, reserve_seconds=10)
    refiller = SegmentRefiller(pool, store, settings, wall=clock)
    store.add_tag("order", step=1000)
    popped: list[int] = []
    while not popped or popped[-1] < 4000:
        clock.advance(1.0)
        refiller.refill("order", force=True)
        popped += [int(x) for x in r.lpop("leafpool:{order}:ids", 100_000) or []]
    snap = pool.snapshot("order")
    rewound = int(snap.state["hwm"]) + 1 - 3 * 1000  # 3 steps below IDs handed out
    _set_max_id(store, "order", rewound)

    caplog.set_level(logging.WARNING, logger="leafpool.segment.store")
    for _ in range(20):  # until the reserve is used up and a refill allocates
        clock.advance(1.0)
        refiller.refill("order", force=True)
        popped += [int(x) for x in r.lpop("leafpool:{order}:ids", 100_000) or []]
        if pool.snapshot("order").int("heals"):
            break
    floor_then = snap.int("max_id")  # the reserve's end: every ID below it was the pool's
    for _ in range(3):  # and it goes on from the healed value
        clock.advance(1.0)
        refiller.refill("order", force=True)
        popped += [int(x) for x in r.lpop("leafpool:{order}:ids", 100_000) or []]

    assert popped == sorted(set(popped)), "an ID was handed out twice or out of order"
    state = pool.snapshot("order").state
    assert state["heals"] == "1" and state["last_heal_ms"] == str(int(clock() * 1000) - 3000)
    assert state["last_heal"] == f"max_id {rewound} -> {floor_then}"
    assert store.get_tag("order").max_id == int(state["max_id"]) > floor_then
    shown = tag_status(pool.snapshot("order"))  # status, /cache and the metrics
    assert (shown.heals, shown.last_heal_ms) == (1, int(state["last_heal_ms"]))
    assert 'leafpool_db_heals_total{tag="order",mode="segment"} 1' in \
        render(make_registry(pool)).decode()
    warned = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.WARNING]
    assert len(warned) == 1 and warned[0].startswith("order: ") and \
        f"max_id={rewound}" in warned[0] and f"moved up to {floor_then}" in warned[0]


@pytest.mark.parametrize("case", ["pool mark", "retired mark", "first ID"])
def test_each_reason_a_counter_is_behind_is_healed_to_exactly_its_floor(
    store: SegmentStore, case: str
) -> None:
    """The pool's mark, a removed tag's mark (a row inserted again by hand below it: the
    heal does what ``tag add`` without ``--start`` does) and IDs starting at 1."""
    store.add_tag("pay", step=10)
    floor = 0
    if case == "pool mark":
        floor, expected = 500, 500
    elif case == "retired mark":
        store.allocate("pay")
        expected = store.remove_tag("pay", pool_mark=15)
        with store.engine.begin() as conn:
            conn.execute(text("INSERT INTO leaf_alloc(biz_tag, max_id, step) "
                              "VALUES ('pay', 1, 10)"))
    else:
        _set_max_id(store, "pay", 0)
        expected = 1
    read = store.get_tag("pay").max_id
    seg = store.allocate("pay", floor=floor, heal=True)
    assert (seg.start, seg.end, seg.healed_from) == (expected, expected + 10, read)
    assert store.get_tag("pay").max_id == expected + 10
    again = store.allocate("pay", floor=seg.end, heal=True)  # healed once, then plain
    assert (again.start, again.healed_from) == (expected + 10, None)


def test_under_refuse_the_counter_is_not_moved(store: SegmentStore) -> None:
    store.add_tag("pay", step=10)
    with pytest.raises(CounterBehind, match=r"max_id=1 is below 500,.*SET max_id = 500"):
        store.allocate("pay", floor=500, heal=False)
    assert store.get_tag("pay").max_id == 1


def test_a_heal_whose_advance_would_pass_2_63_writes_nothing(store: SegmentStore) -> None:
    """The heal and the advance are one transaction: an exhausted tag keeps its row."""
    store.add_tag("pay", step=10)
    with pytest.raises(SegmentExhausted):
        store.allocate("pay", floor=MAX_ID - 5, heal=True)
    assert store.get_tag("pay").max_id == 1


def test_the_setting_takes_heal_or_refuse(make_settings: Callable[..., Settings]) -> None:
    assert make_settings().counter_behind == "heal"
    assert make_settings(counter_behind="refuse").counter_behind == "refuse"
    with pytest.raises(ConfigurationError, match="LEAFPOOL_COUNTER_BEHIND='repair'"):
        make_settings(counter_behind="repair")
