"""A snowflake tag's reserve (issue 34, item 3; docs/design.md §8.7): the list holds the
pool's seconds of demand and is filled from a reserve of whole milliseconds pre-generated
for the reserve's seconds of the recent peak rate, so the pool serves with every refiller
paused; ranges pushed over by a refiller without a reserve (the previous release) are
dropped, ranges older than the reserve's seconds are replaced while the generator can
replace them, never while it cannot. Real Redis, the local and mysql registries, fake
clocks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from leafpool.client import Client
from leafpool.core.config import Settings
from leafpool.core.errors import PoolEmpty, WorkerIdUnavailable
from leafpool.core.snowflake_layout import IDS_PER_MS, decode
from leafpool.redis.pool import Pool, Range
from leafpool.snowflake.refiller import SnowflakeRefiller, list_seconds
from leafpool.snowflake.registry import LeasedGenerator, open_registry
from tests.support.clocks import FakeMsClock

NOW_MS = 1_767_000_000_000
TAG = "flake"
IDS = f"leafpool:{{{TAG}}}:ids"


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    """The list: 10 s of demand; the reserve: 60 s of the recent peak."""
    return make_settings(snowflake_mode="local", pool_floor=1000, pool_ceiling=1_000_000,
                         chunk_size=1000, pool_seconds=10, snowflake_reserve_seconds=60)


def make(pool: Pool, settings: Settings, worker: int, ms: FakeMsClock, cache: Path,
         **overrides: object) -> SnowflakeRefiller:
    s = settings.model_copy(update={"snowflake_local_map": str(worker),
                                    "snowflake_cache_dir": str(cache), **overrides})
    registry = open_registry(s, f"host:node:{worker}", clock=ms, sleep=ms.sleep,
                             monotonic=ms.monotonic, background=False)
    gen = LeasedGenerator(registry, s, clock=ms, sleep=ms.sleep)
    return SnowflakeRefiller(pool, gen, s, wall=lambda: ms() / 1000, sleep=ms.sleep)


def ids(r: redis.Redis) -> list[int]:
    return [int(x) for x in r.lrange(IDS, 0, -1)]


def expanded(reserve: list[Range]) -> list[int]:
    return [i for rng in reserve for i in range(rng.start, rng.end)]


def at_rate(pool: Pool, r: redis.Redis, refiller: SnowflakeRefiller, ms: FakeMsClock,
            rate: int, seconds: int) -> list[int]:
    """Clients take ``rate`` IDs a second for ``seconds``, a refill after each second."""
    taken: list[int] = []
    for _ in range(seconds):
        ms.advance(1_000)
        taken += [int(x) for x in r.lpop(IDS, rate) or []]
        refiller.refill(TAG)
    return taken


def test_the_list_is_filled_from_a_reserve_of_whole_milliseconds(
    pool: Pool, settings: Settings, r: redis.Redis, tmp_path: Path
) -> None:
    pool.register(TAG, "snowflake", 0)
    ms = FakeMsClock(NOW_MS)
    refiller = make(pool, settings, 7, ms, tmp_path)
    first = refiller.refill(TAG)
    assert first.pushed == 1000 and first.worker_id == 7  # the floor, from the reserve
    taken = at_rate(pool, r, refiller, ms, 2_000, 5)  # 2,000 IDs/s
    snap = pool.snapshot(TAG)
    assert list_seconds(settings) == 10 and snap.int("target") == 20_000
    assert int(snap.state["reserve_target"]) == 120_000  # 60 s of the peak, 2,000/s
    assert 120_000 <= snap.reserve_size < 120_000 + IDS_PER_MS
    for rng in snap.reserve:  # one millisecond of worker 7 each: a range of its IDs
        first_id, last_id = decode(rng.start), decode(rng.end - 1)
        assert (first_id.timestamp_ms, first_id.worker_id) == (last_id.timestamp_ms, 7)
        assert last_id.sequence == 4095
    assert len(snap.reserve) <= 31  # 120,000 IDs in 31 short strings, not 120,000 entries
    everything = taken + ids(r) + expanded(snap.reserve)
    assert everything == sorted(set(everything))  # list, then reserve: one increasing run


def test_every_refiller_paused_the_reserve_policy_serves_from_the_reserve(
    pool: Pool, settings: Settings, r: redis.Redis, tmp_path: Path, redis_url: str
) -> None:
    """Issue 34: with both workers paused 30-40 s the snowflake tag went dry while the
    segment tags, which have a reserve, kept serving. Now it has one too."""
    pool.register(TAG, "snowflake", 0)
    ms = FakeMsClock(NOW_MS)
    refiller = make(pool, settings, 3, ms, tmp_path)
    refiller.refill(TAG)
    taken = at_rate(pool, r, refiller, ms, 1_000, 3)
    held = r.llen(IDS) + pool.snapshot(TAG).reserve_size
    assert held >= 65_000  # 60 s of reserve at 1,000 IDs/s and what the list holds
    # every refiller paused from here on: 65 s of demand at 1,000 IDs/s, nothing refilled
    client = Client(pool.redis, settings=settings, policy="reserve", wait_seconds=0)
    for _ in range(65):
        taken += client.next_ids(TAG, 1_000)
    assert taken == sorted(set(taken)) and {decode(i).worker_id for i in taken} == {3}
    plain = Client(pool.redis, settings=settings, policy="raise")
    with pytest.raises(PoolEmpty):  # the list alone went dry after its 10 s
        plain.next_ids(TAG, 1)


def test_ranges_pushed_over_by_a_refiller_without_a_reserve_are_dropped(
    pool: Pool, settings: Settings, r: redis.Redis, tmp_path: Path
) -> None:
    """A rollout: a previous release's refiller (no reserve: it pushes fresh IDs, above
    the reserve's) refills the tag; the next refill with a reserve drops the ranges it
    can no longer push (a gap) and goes on above them."""
    pool.register(TAG, "snowflake", 0)
    ms = FakeMsClock(NOW_MS)
    current = make(pool, settings, 1, ms, tmp_path)
    previous = make(pool, settings, 2, ms, tmp_path).generator  # its generator
    current.refill(TAG)
    assert pool.snapshot(TAG).reserve
    served = [int(x) for x in r.lpop(IDS, 1000) or []]
    ms.advance(1_000)
    lock = pool.refill_lock(TAG, 30_000)
    assert lock.acquire()
    with lock:  # what the previous release's refill does: generate, push_fresh
        pool.push_fresh(TAG, lock.token, previous.next_batch(1500), int(ms()))
    served += [int(x) for x in r.lpop(IDS, 2000) or []]
    stale = pool.snapshot(TAG)
    assert stale.reserve and stale.reserve[0].start <= stale.int("hwm")
    ms.advance(1_000)
    current.refill(TAG)
    snap = pool.snapshot(TAG)
    assert snap.reserve and snap.reserve[0].start > stale.int("hwm")
    served += ids(r) + expanded(snap.reserve)
    assert served == sorted(set(served))
    assert {decode(i).worker_id for i in served} == {1, 2}


def test_ranges_older_than_the_reserve_are_replaced_while_the_lease_is_held(
    pool: Pool, settings: Settings, r: redis.Redis, tmp_path: Path
) -> None:
    pool.register(TAG, "snowflake", 0)
    ms = FakeMsClock(NOW_MS)
    refiller = make(pool, settings, 5, ms, tmp_path)
    refiller.refill(TAG)
    at_rate(pool, r, refiller, ms, 1_000, 2)
    before = pool.snapshot(TAG).reserve
    ms.advance(61_000)  # an idle minute: the reserve is older than its 60 s
    r.delete(IDS)  # clients took the list
    refiller.refill(TAG)
    after = pool.snapshot(TAG).reserve
    oldest = NOW_MS + 63_000 - 60_000
    assert after and min(decode(rng.start).timestamp_ms for rng in after) >= oldest
    assert after[0].start > before[-1].end  # the old ones dropped, fresh ones generated
    assert all(decode(i).timestamp_ms >= oldest for i in ids(r))


def test_without_the_lease_old_ranges_are_served_not_dropped(
    pool: Pool, make_settings: Callable[..., Settings], r: redis.Redis, tmp_path: Path,
    mysql_url: str
) -> None:
    """A holder that cannot generate (here fenced: its row taken over) keeps the pool
    serving from the reserve, old as it is: old IDs are better than none."""
    settings = make_settings(snowflake_mode="mysql", database_url=mysql_url, pool_floor=1000,
                             pool_seconds=10, snowflake_reserve_seconds=60,
                             snowflake_cache_dir=str(tmp_path / "cache"))
    pool.register(TAG, "snowflake", 0)
    ms = FakeMsClock(NOW_MS)
    registry = open_registry(settings, "host-a:w:0", clock=ms, sleep=ms.sleep,
                             monotonic=ms.monotonic, background=False)
    gen = LeasedGenerator(registry, settings, clock=ms, sleep=ms.sleep)
    refiller = SnowflakeRefiller(pool, gen, settings, wall=lambda: ms() / 1000, sleep=ms.sleep)
    refiller.refill(TAG)
    at_rate(pool, r, refiller, ms, 1_000, 2)
    before = pool.snapshot(TAG).reserve
    registry._fence("taken over (the test)")  # as a renew finding the row taken over
    ms.advance(61_000)
    served = [int(x) for x in r.lpop(IDS, 100_000) or []]
    with pytest.raises(WorkerIdUnavailable):  # the top-up needs the generator
        refiller.refill(TAG)
    snap = pool.snapshot(TAG)
    assert r.llen(IDS) == int(snap.state["target"])  # filled from the old reserve first
    assert snap.reserve[-1] == before[-1]  # nothing dropped
    assert snap.state["lease_state"].startswith("fenced")
    served += ids(r)
    assert served == sorted(set(served))
    registry.lease = None  # released by the test's end: nothing to give back
