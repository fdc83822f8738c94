"""The segment refill protocol against real Redis and both segment stores."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis
from sqlalchemy import text

from leafpool.core.config import MAX_ID, Settings
from leafpool.core.errors import (
    BackendUnavailable,
    CounterBehind,
    SegmentExhausted,
    StaleWrite,
    UnknownTag,
)
from leafpool.redis.lock import RefillLock
from leafpool.redis.pool import Pool
from leafpool.refill.base import FAILED_HOLD_SECONDS, SourceUnavailable
from leafpool.segment.refiller import SegmentRefiller
from leafpool.segment.store import SegmentStore
from tests.support.clocks import FakeWallClock


@pytest.fixture
def clock() -> FakeWallClock:
    return FakeWallClock()


@pytest.fixture
def refiller(
    pool: Pool, store: SegmentStore, make_settings: Callable[..., Settings], clock: FakeWallClock
) -> SegmentRefiller:
    settings = make_settings(
        pool_floor=2000, pool_ceiling=50_000, chunk_size=300, pool_seconds=10, reserve_seconds=10
    )
    return SegmentRefiller(pool, store, settings, wall=clock)


def ids(r: redis.Redis, tag: str) -> list[int]:
    return [int(x) for x in r.lrange(f"leafpool:{{{tag}}}:ids", 0, -1)]


def test_first_refill_fills_the_list_to_the_floor_and_keeps_a_reserve(
    refiller: SegmentRefiller, store: SegmentStore, r: redis.Redis
) -> None:
    store.add_tag("order", step=1000)
    result = refiller.refill("order")
    assert result.pushed == 2000
    assert ids(r, "order") == list(range(1, 2001))
    snap = refiller.pool.snapshot("order")
    assert snap.reserve_size >= 2000
    assert snap.reserve[0].start == 2001
    assert snap.state["hwm"] == "2000"
    assert snap.int("max_id") == store.get_tag("order").max_id


def test_a_refill_above_low_water_pushes_nothing(
    refiller: SegmentRefiller, store: SegmentStore, r: redis.Redis
) -> None:
    store.add_tag("order", step=1000)
    refiller.refill("order")
    r.lpop("leafpool:{order}:ids", 500)  # 1500 left, low-water is 1000
    assert refiller.refill("order").pushed == 0
    r.lpop("leafpool:{order}:ids", 600)  # 900 left
    result = refiller.refill("order")
    assert result.length == result.target
    popped = [int(x) for x in r.lpop("leafpool:{order}:ids", 100_000)]
    assert popped == list(range(1101, 1101 + len(popped)))


def test_consumption_raises_the_target(
    refiller: SegmentRefiller, store: SegmentStore, r: redis.Redis, clock: FakeWallClock
) -> None:
    store.add_tag("order", step=1000)
    refiller.refill("order")
    r.lpop("leafpool:{order}:ids", 2000)
    clock.advance(1.0)  # 2,000 IDs/s for 10 pool seconds
    result = refiller.refill("order")
    assert result.target == 20_000
    assert result.length == 20_000
    assert refiller.pool.snapshot("order").float("rate") == pytest.approx(2000)


def _sizes(segments: list[str]) -> list[int]:
    return [int(b) - int(a) for a, b in (seg.split(":") for seg in segments)]


def test_a_new_tags_first_refill_takes_every_segment_at_the_table_step(
    refiller: SegmentRefiller, store: SegmentStore
) -> None:
    # back-to-back allocations inside one refill say nothing about how long a segment
    # lasts: no doubling (it once allocated 1,000 + 2,000 + 4,000 for a 2,000-ID pool)
    store.add_tag("order", step=1000)
    result = refiller.refill("order")
    assert _sizes(result.segments) == [1000] * 4  # 2,000 in the list + 2,000 reserved
    assert store.get_tag("order").max_id == 4001


def test_step_follows_how_long_each_consumed_segment_lasted(
    pool: Pool, store: SegmentStore, make_settings: Callable[..., Settings], clock: FakeWallClock
) -> None:
    settings = make_settings(
        pool_floor=10,
        pool_ceiling=10,
        chunk_size=10,
        reserve_seconds=1,
        outage_seconds=0,  # the reserve by the rate alone: the steps are what is judged
        step_grow_seconds=60,
        step_shrink_seconds=120,
    )
    refiller = SegmentRefiller(pool, store, settings, wall=clock)
    store.add_tag("order", step=10)
    assert _sizes(refiller.refill("order").segments) == [10, 10]

    def consume_all_over(seconds: float) -> list[int]:
        pool.redis.delete("leafpool:{order}:ids")  # every ready ID taken
        clock.advance(seconds)
        return _sizes(refiller.refill("order").segments)

    assert consume_all_over(30) == [20]  # a 10-ID segment lasted 30 s (< 60): double
    assert consume_all_over(30) == []  # half a 20-ID segment consumed: nothing to judge
    assert consume_all_over(30) == [20]  # the 20-ID segment lasted 60 s: keep
    assert consume_all_over(200) == []
    assert consume_all_over(200) == [10]  # lasted 400 s (> 120): halve
    assert consume_all_over(500) == [10]  # never below the table's step


def test_a_held_lock_skips_the_refill(refiller: SegmentRefiller, store: SegmentStore) -> None:
    store.add_tag("order", step=1000)
    other = RefillLock(refiller.pool.redis, "leafpool:{order}:lock", 10_000)
    assert other.acquire()
    assert refiller.refill("order").skipped == "locked"
    other.release()
    assert refiller.refill("order").pushed == 2000


def test_unknown_tag_raises(refiller: SegmentRefiller) -> None:
    with pytest.raises(UnknownTag):
        refiller.refill("nope")


def test_exhausted_tag_serves_what_it_has_then_fails_loudly(
    refiller: SegmentRefiller, store: SegmentStore, r: redis.Redis
) -> None:
    store.add_tag("edge", step=1000, start=MAX_ID - 1500)
    with pytest.raises(SegmentExhausted):
        refiller.refill("edge")
    popped = ids(r, "edge")
    assert popped == list(range(MAX_ID - 1500, MAX_ID - 500))
    snap = refiller.pool.snapshot("edge")
    assert "would pass 2**63 - 1" in snap.state["last_error"]
    assert snap.int("refill_failures") == 1


def test_database_down_keeps_serving_from_the_reserve(
    pool: Pool,
    store: SegmentStore,
    make_settings: Callable[..., Settings],
    clock: FakeWallClock,
    r: redis.Redis,
) -> None:
    # the reserve by the rate alone (the outage budget: tests/refill/test_outage.py)
    settings = make_settings(pool_floor=1000, pool_ceiling=1000, chunk_size=500,
                             reserve_seconds=1, outage_seconds=0)
    good = SegmentRefiller(pool, store, settings, wall=clock)
    store.add_tag("order", step=1000)
    good.refill("order")  # list 1000, reserve >= 1000
    reserve_before = pool.snapshot("order").reserve_size
    dead = SegmentStore.from_url("mysql+pymysql://u:p@127.0.0.1:1/none")
    broken = SegmentRefiller(pool, dead, settings, wall=clock)
    served: list[int] = []
    with pytest.raises(SourceUnavailable):  # bounded: the reserve is finite
        for _ in range(reserve_before // 1000 + 2):
            served += [int(x) for x in r.lpop("leafpool:{order}:ids", 10_000) or []]
            broken.refill("order")
    # while the database was down the whole reserve was served, in order
    served += [int(x) for x in r.lpop("leafpool:{order}:ids", 10_000) or []]
    assert served == list(range(1, 1001 + reserve_before))
    snap = pool.snapshot("order")
    assert "database" in snap.state["last_error"]
    assert snap.state["last_refill_result"] == "failed: SourceUnavailable"
    # the database is back: the next refill recovers on its own
    good.refill("order")
    popped = [int(x) for x in r.lpop("leafpool:{order}:ids", 10_000)]
    assert popped[0] > served[-1] and popped == list(range(popped[0], popped[0] + 1000))


def test_a_client_taking_from_the_reserve_does_not_break_the_refill(
    refiller: SegmentRefiller,
    store: SegmentStore,
    r: redis.Redis,
    make_settings: Callable[..., Settings],
) -> None:
    """Policy "reserve": a client's take moves the reserve head under a running refill;
    the refill reads the head again and carries on, and records no failure."""
    from leafpool.client import Client

    store.add_tag("order", step=1000)
    refiller.refill("order")
    r.delete("leafpool:{order}:ids")  # the list ran dry; the reserve starts at 2001
    client = Client(r, settings=make_settings(), policy="reserve", wait_seconds=0)
    taken: list[int] = []
    push_run = refiller.pool.push_run  # the refill's pushes, a run of chunks at a time

    def client_takes_first(*args: object, **kwargs: object) -> object:
        if not taken:
            taken.extend(client.next_ids("order", 5))
        return push_run(*args, **kwargs)  # type: ignore[arg-type]

    refiller.pool.push_run = client_takes_first  # type: ignore[method-assign,assignment]
    result = refiller.refill("order")
    assert taken == [2001, 2002, 2003, 2004, 2005]
    assert result.pushed == result.target and ids(r, "order")[0] == 2006
    snap = refiller.pool.snapshot("order")
    assert snap.int("refill_failures") == 0 and snap.state["last_refill_result"].startswith("ok")


def test_a_counter_that_went_back_under_live_keys_is_refused_without_advancing(
    refiller: SegmentRefiller, store: SegmentStore, r: redis.Redis, clock: FakeWallClock
) -> None:
    """With LEAFPOOL_COUNTER_BEHIND=refuse, a leaf_alloc row deleted and inserted again
    lower while the pool's keys still exist: every refill is refused at once, the database
    is not advanced, and status says why (the default heals it: test_heal.py)."""
    refiller = SegmentRefiller(refiller.pool, store, refiller.settings.model_copy(
        update={"counter_behind": "refuse"}), wall=clock)
    store.add_tag("pay", step=1000)
    refiller.refill("pay")
    with store.engine.begin() as conn:
        conn.execute(text("DELETE FROM leaf_alloc WHERE biz_tag = 'pay'"))
        conn.execute(text("INSERT INTO leaf_alloc(biz_tag, max_id, step) VALUES ('pay', 1, 1000)"))
    r.delete("leafpool:{pay}:ids", "leafpool:{pay}:reserve")
    for _ in range(2):
        with pytest.raises(CounterBehind, match="max_id=1 is below 4001"):
            refiller.refill("pay")
    assert store.get_tag("pay").max_id == 1
    snap = refiller.pool.snapshot("pay")
    assert snap.length == 0 and snap.int("refill_failures") == 2
    assert "SET max_id = 4001" in snap.state["last_error"]


def test_a_refill_of_a_tag_dropped_meanwhile_leaves_no_key_behind(
    refiller: SegmentRefiller, store: SegmentStore, r: redis.Redis
) -> None:
    """The tag sync drops a tag while its refill runs: the refill's writes are refused
    and its records are not written, so no stray state hash outlives the tag."""
    store.add_tag("order", step=1000)
    push_run = refiller.pool.push_run  # the refill's pushes, a run of chunks at a time

    def dropped_first(*args: object, **kwargs: object) -> object:
        refiller.pool.drop("order")
        return push_run(*args, **kwargs)  # type: ignore[arg-type]

    refiller.pool.push_run = dropped_first  # type: ignore[method-assign,assignment]
    with pytest.raises(StaleWrite):
        refiller.refill("order")
    assert r.keys("leafpool:{order}:*") == []
    refiller.pool.push_run = push_run  # type: ignore[method-assign]
    with pytest.raises(UnknownTag):  # not in leaf_alloc any more either
        store.remove_tag("order")
        refiller.refill("order")
    assert r.keys("leafpool:{order}:*") == []


# -- burst sizing and the reserve flag (docs/design.md §3.2, §3.7) ---------------------------


@pytest.mark.parametrize("burst_sizing,target", [(True, 50_000), (False, 15_700)])
def test_a_50x_jump_is_sized_by_the_consumption_since_the_last_refill(
    pool: Pool,
    store: SegmentStore,
    make_settings: Callable[..., Settings],
    clock: FakeWallClock,
    r: redis.Redis,
    burst_sizing: bool,
    target: int,
) -> None:
    """100 IDs/s for a while, then 5,000 IDs/s: with burst sizing the first refill after
    the jump sizes the pool for 5,000 IDs/s (10 pool seconds); the smoothed rate alone
    (the sizing before, LEAFPOOL_BURST_SIZING=false) for 1,570."""
    settings = make_settings(
        pool_floor=1000,
        pool_ceiling=1_000_000,
        chunk_size=10_000,
        pool_seconds=10,
        reserve_seconds=10,
        burst_sizing=burst_sizing,
    )
    refiller = SegmentRefiller(pool, store, settings, wall=clock)
    store.add_tag("order", step=1000)
    refiller.refill("order")
    for _ in range(5):  # 100 IDs/s, refilled every 10 s
        r.lpop("leafpool:{order}:ids", 1000)
        clock.advance(10)
        refiller.refill("order", force=True)
    assert refiller.pool.snapshot("order").int("target") == 1000
    r.lpop("leafpool:{order}:ids", 1000)  # the whole list in 0.2 s: 5,000 IDs/s
    clock.advance(0.2)
    result = refiller.refill("order", force=True)
    assert result.target == target and result.length == target


def test_the_refill_records_whether_it_left_the_reserve_short(
    pool: Pool,
    store: SegmentStore,
    make_settings: Callable[..., Settings],
    clock: FakeWallClock,
) -> None:
    settings = make_settings(pool_floor=1000, pool_ceiling=1000, reserve_seconds=1)
    store.add_tag("order", step=1000)
    SegmentRefiller(pool, store, settings, wall=clock).refill("order")
    assert pool.snapshot("order").state["reserve_due"] == "0"  # topped up
    dead = SegmentStore.from_url("mysql+pymysql://u:p@127.0.0.1:1/none")
    pool.redis.delete("leafpool:{order}:reserve", "leafpool:{order}:ids")
    with pytest.raises(BackendUnavailable):
        SegmentRefiller(pool, dead, settings, wall=clock).refill("order")
    assert pool.snapshot("order").state["reserve_due"] == "1"  # the sweep queues it again
    # ... after a short hold: until then no trigger queues another refill (Celery's retry
    # does), and not for the whole retry backoff (a retry lost with its worker would leave
    # the tag without a trigger that long)
    ttl = pool.redis.ttl("leafpool:{order}:queued")
    assert 0 < ttl <= FAILED_HOLD_SECONDS < settings.refill_retry_backoff_max


@pytest.mark.parametrize("burst_sizing", [True, False])
def test_a_burst_grows_the_step_allocation_by_allocation(
    pool: Pool,
    store: SegmentStore,
    make_settings: Callable[..., Settings],
    clock: FakeWallClock,
    r: redis.Redis,
    burst_sizing: bool,
) -> None:
    """5,000 IDs/s on a tag whose table step is 100: a segment lasts 0.02 s, so Leaf's
    rule would double the step at every segment update. With burst sizing each
    allocation of the refill doubles it (eight segments fill the list); before, the
    first allocation doubled it (the consumed segment's lifetime) and the others kept it."""
    settings = make_settings(
        pool_floor=1000,
        pool_ceiling=1_000_000,
        chunk_size=10_000,
        pool_seconds=10,
        reserve_seconds=1,
        outage_seconds=0,
        burst_sizing=burst_sizing,
    )
    refiller = SegmentRefiller(pool, store, settings, wall=clock)
    store.add_tag("order", step=100)
    assert set(_sizes(refiller.refill("order").segments)) == {100}  # rate unknown yet
    r.lpop("leafpool:{order}:ids", 1000)
    clock.advance(0.2)
    sizes = _sizes(refiller.refill("order").segments)
    if burst_sizing:
        assert sizes[:8] == [200 * 2**i for i in range(8)]
        assert len(sizes) <= 9
    else:
        assert set(sizes) == {200} and len(sizes) > 70
    popped = [int(x) for x in r.lpop("leafpool:{order}:ids", 100_000)]
    assert popped == list(range(1001, 1001 + len(popped)))  # contiguous, in order
