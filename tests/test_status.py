"""TagStatus: the one parsed shape of a tag's keys, read from a real Redis."""

from __future__ import annotations

from leafpool.lock import RefillLock
from leafpool.pool import Pool, Range
from leafpool.status import pool_status, tag_status


def test_a_segment_tags_state_is_parsed_once(pool: Pool) -> None:
    lock = RefillLock(pool.redis, pool.tag("order").lock, 10_000)
    assert lock.acquire()
    pool.register("order", "segment", 0, target=4000, low_water=2000, step=1000,
                  max_id=3001, rate="100.5", last_refill_ms=1_700_000_000_000,
                  last_alloc_ms="2.50", allocations=3, empty_hits=2)
    pool.append_reserve("order", lock.token, Range(1, 1001))
    pool.append_reserve("order", lock.token, Range(1001, 3001))
    pool.push("order", lock.token, Range(1, 1001), 600, 0)
    st = tag_status(pool.snapshot("order"))
    assert (st.tag, st.mode, st.length, st.target, st.low_water) == ("order", "segment",
                                                                     600, 4000, 2000)
    assert st.reserve == ["601:1001", "1001:3001"] and st.reserve_size == 2400
    assert (st.step, st.max_id, st.hwm, st.pushed_total) == (1000, 3001, "600", 600)
    assert st.seconds_left == (600 + 2400) / 100.5
    assert (st.last_refill_ms, st.last_alloc_ms, st.allocations, st.empty_hits) == (
        1_700_000_000_000, 2.5, 3, 2)
    assert st.locked and st.worker_ids == [] and st.time_bits_years_left is None


def test_a_snowflake_tags_fields_and_an_idle_tag(pool: Pool) -> None:
    pool.register("sf", "snowflake", 0, worker_ids="5,9", lease_state="held (zk)",
                  backwards_events=1, last_backwards_offset_ms=7,
                  time_bits_years_left="41.500")
    pool.register("idle", "segment", 0)
    by_tag = {st.tag: st for st in pool_status(pool)}
    sf = by_tag["sf"]
    assert (sf.worker_ids, sf.lease_state, sf.backwards_events) == (["5", "9"], "held (zk)", 1)
    assert (sf.last_backwards_offset_ms, sf.time_bits_years_left) == (7, 41.5)
    idle = by_tag["idle"]
    assert (idle.rate, idle.seconds_left, idle.max_id, idle.last_refill_ms) == (
        0.0, None, None, None)
