"""When a failed refill is tried again (leafpool.refill.retry, docs/design.md §3.8): the
short bounded backoff only while the tag is below its low-water mark and its allocation
failed for want of the database, one retry chain per tag."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from leafpool.core.config import Settings
from leafpool.core.errors import BackendUnavailable
from leafpool.redis.pool import Level, Pool
from leafpool.refill import retry
from leafpool.refill.base import SourceUnavailable
from leafpool.segment.refiller import SegmentRefiller
from leafpool.segment.store import SegmentStore
from tests.support.services import free_port


def _level(length: int, low_water: int) -> Level:
    return Level("t", length, "segment", low_water, True, 1000)


def _source_down(requeued: bool = True) -> SourceUnavailable:
    exc = SourceUnavailable("database: t: allocate failed")
    exc.requeued = requeued
    return exc


def test_the_fast_backoff_doubles_from_a_quarter_second_to_one() -> None:
    assert [retry.fast_backoff(n) for n in range(6)] == [0.25, 0.5, 1.0, 1.0, 1.0, 1.0]
    assert retry.fast_backoff(10_000) == 1.0


def test_below_low_water_with_the_database_down_is_retried_fast() -> None:
    plan = retry.next_retry(_source_down(), _level(10, 100), 0, 30.0)
    assert plan == retry.Retry(0.25, True)
    assert retry.next_retry(_source_down(), _level(0, -1), 7, 30.0) == retry.Retry(1.0, True)


@pytest.mark.parametrize(("exc", "level"), [
    (_source_down(), _level(500, 100)),  # the list is above its low-water mark
    (_source_down(), None),  # the level could not be read (Redis down)
    (BackendUnavailable("redis: t: push: Connection refused"), _level(10, 100)),
])
def test_anything_else_keeps_celerys_growing_backoff(
    exc: BackendUnavailable, level: Level | None
) -> None:
    plans = [retry.next_retry(exc, level, n, 30.0, rand=lambda: 1.0) for n in range(7)]
    assert [p.seconds for p in plans if p] == [1, 2, 4, 8, 16, 30, 30]
    assert not any(p.fast for p in plans if p)


def test_a_failure_whose_tag_another_refill_was_queued_for_ends_its_chain() -> None:
    assert retry.next_retry(_source_down(requeued=False), _level(10, 100), 0, 30.0) is None


def test_the_failure_record_says_whether_it_queued_the_tag_itself(
    pool: Pool, store: SegmentStore, make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings(pool_floor=100, pool_ceiling=100, outage_seconds=0)
    store.add_tag("t", step=100)
    SegmentRefiller(pool, store, settings).refill("t")
    pool.redis.delete("leafpool:{t}:ids", "leafpool:{t}:reserve")
    dead = SegmentStore.from_url(f"mysql+pymysql://leafpool:x@127.0.0.1:{free_port()}/leafpool")
    try:
        down = SegmentRefiller(pool, dead, settings)
        with pytest.raises(SourceUnavailable) as first:
            down.refill("t")
        assert first.value.requeued  # nothing was queued: this chain retries
        assert pool.redis.ttl("leafpool:{t}:queued") >= 2  # longer than a fast step
        with pytest.raises(SourceUnavailable) as second:
            down.refill("t")  # the marker is still there: another refill is queued
        assert not second.value.requeued
        plan = retry.after_failure(pool, "t", first.value, 0, 30.0)
        assert plan == retry.Retry(0.25, True)
    finally:
        dead.engine.dispose()


def test_the_fast_step_is_shortened_across_a_wan_so_recovery_fits_in_2s() -> None:
    """A local database keeps the 1 s step; at 0.65 s an allocation (100 ms a round
    trip) the step is 0.25 s: with a new connection's 1.3 s the pool is back in 1.55 s."""
    assert retry.fast_step_max(0.005) == 1.0 and retry.fast_step_max(0.25) == 1.0
    assert retry.fast_step_max(0.4) == pytest.approx(0.7)
    assert retry.fast_step_max(0.65) == 0.25 and retry.fast_step_max(5.0) == 0.25
    assert [retry.fast_backoff(n, 0.4) for n in range(4)] == [0.25, 0.5, 0.7, 0.7]
    exc = _source_down()
    exc.latency = 0.65
    assert retry.next_retry(exc, _level(10, 100), 5, 30.0) == retry.Retry(0.25, True)
