"""TagStatus: the one parsed shape of a tag's keys, read from a real Redis."""

from __future__ import annotations

from leafpool.redis.lock import RefillLock
from leafpool.redis.pool import Pool, Range
from leafpool.status import pool_status, tag_status


def test_a_segment_tags_state_is_parsed_once(pool: Pool) -> None:
    lock = RefillLock(pool.redis, pool.tag("order").lock, 10_000)
    assert lock.acquire()
    pool.register(
        "order",
        "segment",
        0,
        target=4000,
        low_water=2000,
        step=1000,
        max_id=3001,
        rate="100.5",
        last_refill_ms=1_700_000_000_000,
        last_alloc_ms="2.50",
        allocations=3,
        empty_hits=2,
    )
    pool.append_reserve("order", lock.token, Range(1, 1001))
    pool.append_reserve("order", lock.token, Range(1001, 3001))
    pool.push("order", lock.token, Range(1, 1001), 600, 0)
    st = tag_status(pool.snapshot("order"))
    assert (st.tag, st.mode, st.length, st.target, st.low_water) == (
        "order",
        "segment",
        600,
        4000,
        2000,
    )
    assert st.reserve == ["601:1001", "1001:3001"] and st.reserve_size == 2400
    assert (st.step, st.max_id, st.hwm, st.pushed_total) == (1000, 3001, "600", 600)
    assert st.seconds_left == (600 + 2400) / 100.5
    assert (st.last_refill_ms, st.last_alloc_ms, st.allocations, st.empty_hits) == (
        1_700_000_000_000,
        2.5,
        3,
        2,
    )
    assert st.locked and st.worker_ids == [] and st.time_bits_years_left is None


def test_a_snowflake_tags_fields_and_an_idle_tag(pool: Pool) -> None:
    pool.register(
        "sf",
        "snowflake",
        0,
        worker_ids="5,9",
        lease_state="held (zk)",
        backwards_events=1,
        last_backwards_offset_ms=7,
        time_bits_years_left="41.500",
    )
    pool.register("idle", "segment", 0)
    by_tag = {st.tag: st for st in pool_status(pool)}
    sf = by_tag["sf"]
    assert (sf.worker_ids, sf.lease_state, sf.backwards_events) == (["5", "9"], "held (zk)", 1)
    assert (sf.last_backwards_offset_ms, sf.time_bits_years_left) == (7, 41.5)
    idle = by_tag["idle"]
    assert (idle.rate, idle.seconds_left, idle.max_id, idle.last_refill_ms) == (
        0.0,
        None,
        None,
        None,
    )


def test_many_tags_read_in_chunks_equal_their_one_by_one_status(pool: Pool) -> None:
    """1,200 tags (three chunks of TAGS_PER_PIPELINE): each status equals the one read
    by the tag's own snapshot (a MULTI)."""
    from leafpool.redis.pool import TAGS_PER_PIPELINE

    lock = RefillLock(pool.redis, pool.tag("t0007").lock, 10_000)
    tags = [f"t{n:04d}" for n in range(1200)]
    assert len(tags) > 2 * TAGS_PER_PIPELINE
    pool.register_many(
        [
            (t, "segment" if n % 3 else "snowflake", n, {"step": n, "rate": "1.5"})
            for n, t in enumerate(tags)
        ]
    )
    assert lock.acquire()
    pool.append_reserve("t0007", lock.token, Range(1, 101), max_id=101)
    pool.push("t0007", lock.token, Range(1, 101), 40, 0)
    pool.redis.hincrby(pool.tag("t1199").state, "empty_hits", 1)  # counted before 0.2
    pool.redis.hincrby(pool.tag("t1199").hits, "empty_hits", 2)  # what clients count now
    many = pool_status(pool)
    assert [st.tag for st in many] == tags
    assert many == [tag_status(pool.snapshot(t)) for t in tags]
    assert (many[7].length, many[7].reserve, many[7].locked) == (40, ["41:101"], True)
    assert many[1199].empty_hits == 3 and many[3].mode == "snowflake"


def test_status_output_json_and_plain_table(pool: Pool) -> None:
    import dataclasses
    import json

    from leafpool.status import STATUS_COLUMNS, plain_table, status_json, status_row

    pool.register("sf", "snowflake", 0, worker_ids="5,9")
    pool.register("order", "segment", 0, step=10, last_error="database down", last_error_ms=1)
    statuses = pool_status(pool)
    assert json.loads(status_json(statuses)) == [dataclasses.asdict(st) for st in statuses]
    assert json.loads(status_json([])) == []
    lines = plain_table([status_row(st) for st in statuses]).splitlines()
    assert lines[0].split() == [c for c in STATUS_COLUMNS if " " not in c] + ["last", "error"]
    assert lines[1].startswith("order ") and "database down (" in lines[1]
    assert lines[2].startswith("sf ") and "w 5,9" in lines[2]

