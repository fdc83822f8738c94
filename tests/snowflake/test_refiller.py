"""Snowflake pools without a reserve (LEAFPOOL_SNOWFLAKE_RESERVE_SECONDS=0): refills from a
leased generator, fenced by the tag's lock and high-water ID, with clock trouble recorded
and the pool left serving."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

from leafpool.core.config import Settings
from leafpool.core.errors import ClockMovedBackwards, StaleWrite, UnknownTag
from leafpool.core.snowflake_layout import decode
from leafpool.redis.pool import Pool
from leafpool.snowflake.refiller import SnowflakeRefiller
from leafpool.snowflake.registry import LeasedGenerator, open_registry
from tests.support.clocks import FakeMsClock

NOW_MS = 1_767_000_000_000


def make(pool: Pool, settings: Settings, worker: int, ms: FakeMsClock, cache: str
         ) -> SnowflakeRefiller:
    s = settings.model_copy(update={"snowflake_local_map": str(worker),
                                    "snowflake_cache_dir": cache})
    registry = open_registry(s, f"host:node:{worker}", clock=ms, sleep=ms.sleep,
                             background=False)
    gen = LeasedGenerator(registry, s, clock=ms, sleep=ms.sleep)
    gen.start()
    return SnowflakeRefiller(pool, gen, s, wall=lambda: ms() / 1000, sleep=ms.sleep)


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    """Without a reserve: batches generated at the refill and pushed as they are (the
    reserve: tests/snowflake/test_reserve.py)."""
    return make_settings(snowflake_mode="local", pool_floor=3000, pool_ceiling=50_000,
                         chunk_size=1000, snowflake_reserve_seconds=0)


def pop_all(r: redis.Redis, tag: str) -> list[int]:
    return [int(x) for x in r.lpop(f"leafpool:{{{tag}}}:ids", 1_000_000) or []]


def test_a_refill_fills_the_pool_with_increasing_ids_of_its_worker(
    pool: Pool, settings: Settings, r: redis.Redis, tmp_path: object
) -> None:
    pool.register("flake", "snowflake", 0)
    ms = FakeMsClock(NOW_MS)
    refiller = make(pool, settings, 7, ms, str(tmp_path))
    result = refiller.refill("flake")
    assert result.pushed == 3000 and result.worker_id == 7
    ids = pop_all(r, "flake")
    assert len(ids) == 3000 and ids == sorted(set(ids))
    assert {decode(i).worker_id for i in ids} == {7}
    assert all(decode(i).timestamp_ms >= NOW_MS for i in ids)
    state = pool.snapshot("flake").state
    assert state["worker_ids"] == "7"
    assert state["lease_state"].startswith("held (local")
    assert state["hwm"] == str(ids[-1])
    # Leaf's epoch (2010) + 2^41 ms runs out in 2080: about 54 years after NOW_MS (2025)
    assert 53 < float(state["time_bits_years_left"]) < 55


def test_workers_taking_turns_keep_one_pool_increasing_and_unique(
    pool: Pool, settings: Settings, r: redis.Redis, tmp_path: object
) -> None:
    pool.register("flake", "snowflake", 0)
    ahead, behind = FakeMsClock(NOW_MS + 400), FakeMsClock(NOW_MS)
    a = make(pool, settings, 1, ahead, str(tmp_path))
    b = make(pool, settings, 2, behind, str(tmp_path))
    seen: list[int] = []
    for refiller in (a, b, a, b):
        refiller.refill("flake", force=True)
        seen += pop_all(r, "flake")
    assert seen == sorted(set(seen))
    assert behind.now > NOW_MS + 400  # b waited for its clock to pass a's IDs
    assert pool.snapshot("flake").state["worker_ids"] == "2,1"


def test_a_worker_far_behind_the_pool_pushes_nothing(
    pool: Pool, settings: Settings, r: redis.Redis, tmp_path: object
) -> None:
    pool.register("flake", "snowflake", 0)
    a = make(pool, settings, 1, FakeMsClock(NOW_MS + 60_000), str(tmp_path))
    b = make(pool, settings, 2, FakeMsClock(NOW_MS), str(tmp_path))
    a.refill("flake")
    before = pop_all(r, "flake")
    with pytest.raises(StaleWrite, match="behind the tag's high-water ID"):
        b.refill("flake")
    assert pop_all(r, "flake") == []
    assert pool.snapshot("flake").state["hwm"] == str(before[-1])


def test_clock_moved_backwards_is_recorded_and_the_pool_keeps_serving(
    pool: Pool, settings: Settings, r: redis.Redis, tmp_path: object
) -> None:
    pool.register("flake", "snowflake", 0)
    ms = FakeMsClock(NOW_MS)
    refiller = make(pool, settings, 3, ms, str(tmp_path))
    refiller.refill("flake")
    r.lpop("leafpool:{flake}:ids", 2000)  # 1,000 left, below low-water
    ms.now -= 10_000  # NTP stepped the clock back 10 s
    with pytest.raises(ClockMovedBackwards):
        refiller.refill("flake")
    state = pool.snapshot("flake").state
    assert state["backwards_events"] == "1"
    assert int(state["last_backwards_offset_ms"]) >= 10_000
    assert r.llen("leafpool:{flake}:ids") == 1000  # still serving what it holds


def test_unknown_and_segment_tags_are_not_refilled(
    pool: Pool, settings: Settings, tmp_path: object
) -> None:
    refiller = make(pool, settings, 4, FakeMsClock(NOW_MS), str(tmp_path))
    with pytest.raises(UnknownTag):
        refiller.refill("nope")
    pool.register("seg", "segment", 0)
    assert refiller.refill("seg").skipped == "mode is segment"


