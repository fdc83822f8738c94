"""Riding through a database outage (docs/design.md §3.2, §3.8), against real Redis and
both segment stores: the reserve holds the recent peak rate for LEAFPOOL_OUTAGE_SECONDS
while the list stays sized by LEAFPOOL_POOL_SECONDS; an allocation the database does not
answer is recorded as the time allocations started failing, and the first allocation
that succeeds clears it; a list left at 0 is marked dry."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

from leafpool.core.config import Settings
from leafpool.redis.pool import Pool
from leafpool.refill.base import SourceUnavailable
from leafpool.segment.refiller import SegmentRefiller
from leafpool.segment.store import SegmentStore
from tests.support.clocks import FakeWallClock
from tests.support.services import free_port


@pytest.fixture
def clock() -> FakeWallClock:
    return FakeWallClock()


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings(pool_floor=200, pool_ceiling=100_000, chunk_size=1000,
                         pool_seconds=10, reserve_seconds=5, outage_seconds=600)


def _consume(r: redis.Redis, tag: str, n: int) -> None:
    while n > 0:
        got = r.lpop(f"leafpool:{{{tag}}}:ids", min(n, 10_000)) or []
        assert got, "the list ran dry"
        n -= len(got)


def test_the_reserve_holds_the_peak_for_the_outage_and_the_list_only_its_seconds(
    pool: Pool, store: SegmentStore, settings: Settings, clock: FakeWallClock, r: redis.Redis
) -> None:
    store.add_tag("order", step=1000)
    refiller = SegmentRefiller(pool, store, settings, wall=clock)
    refiller.refill("order")
    for _ in range(3):  # 150 IDs/s, a refill every second
        _consume(r, "order", 150)
        clock.advance(1.0)
        refiller.refill("order", force=True)
    snap = pool.snapshot("order")
    peak = snap.float("peak_rate")
    assert peak == pytest.approx(150.0, rel=0.01)
    assert snap.int("target") == 1500  # the list: 10 s of 150 IDs/s
    assert snap.int("reserve_target") == round(peak * 600)  # the reserve: 600 s of it
    assert snap.reserve_size >= snap.int("reserve_target")  # one refill reached it
    # demand falls to 15 IDs/s: the list shrinks with it at once, the peak halves an hour
    for _ in range(4):
        _consume(r, "order", 150)
        clock.advance(10.0)
        refiller.refill("order", force=True)
    clock.advance(3600.0)
    _consume(r, "order", 15)
    refiller.refill("order", force=True)
    snap = pool.snapshot("order")
    assert snap.float("peak_rate") == pytest.approx(peak / 2, rel=0.02)
    assert snap.int("reserve_target") == pytest.approx(peak / 2 * 600, rel=0.02)


def test_a_database_that_does_not_answer_is_recorded_until_an_allocation_succeeds(
    pool: Pool, store: SegmentStore, settings: Settings, clock: FakeWallClock, r: redis.Redis
) -> None:
    small = settings.model_copy(update={"outage_seconds": 0.0, "reserve_seconds": 0.001})
    store.add_tag("order", step=100)
    up = SegmentRefiller(pool, store, small, wall=clock)
    up.refill("order")  # 200 IDs in the list, 200 in the reserve (the floors)
    dead = SegmentStore.from_url(f"mysql+pymysql://leafpool:x@127.0.0.1:{free_port()}/leafpool")
    down = SegmentRefiller(pool, dead, small, wall=clock)
    try:
        _consume(r, "order", 200)
        clock.advance(1.0)
        first = int(clock() * 1000)
        # the reserve's 200 IDs are pushed, then its top-up finds the database down
        with pytest.raises(SourceUnavailable, match="database"):
            down.refill("order")
        state = pool.snapshot("order").state
        assert state["db_unreachable_ms"] == str(first)
        assert state["last_refill_result"] == "failed: SourceUnavailable"
        assert r.llen("leafpool:{order}:ids") == 200 and "dry_since_ms" not in state
        _consume(r, "order", 200)  # a plain LPOP takes the last ID
        clock.advance(5.0)
        dry = int(clock() * 1000)
        with pytest.raises(SourceUnavailable):
            down.refill("order")
        state = pool.snapshot("order").state
        assert state["db_unreachable_ms"] == str(first)  # kept from the first failure
        assert state["dry_since_ms"] == str(dry)  # the refiller saw the list at 0
        clock.advance(1.0)
        result = up.refill("order")  # the database answers again
        assert result.segments and result.pushed > 0
        state = pool.snapshot("order").state
        assert state["db_unreachable_ms"] == "" and state["dry_since_ms"] == ""
        assert (state["last_dry_ms"], state["dry_events"]) == (str(dry), "1")
        assert state["dry_ms"] == "1000"
    finally:
        dead.engine.dispose()
