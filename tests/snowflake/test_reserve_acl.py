"""A snowflake tag's reserve under the shipped Redis roles (leafpool/redis/acl.py): the
refiller's appends, pushes and trims (trim_reserve.lua) run under the worker role and
Redis denies nothing; the reserve's keys are a segment tag's (``P:{TAG}:reserve``), so no
role changes. The ACL server is tests/redis/test_acl.py's."""

from __future__ import annotations

from pathlib import Path

import redis

from leafpool.client import Client
from leafpool.core.config import load_settings
from leafpool.redis.connect import connect
from leafpool.redis.pool import Pool
from leafpool.snowflake.refiller import SnowflakeRefiller
from leafpool.snowflake.registry import LeasedGenerator, open_registry
from tests.redis.test_acl import _denials, _url, acl_server, root
from tests.support import services
from tests.support.clocks import FakeMsClock

__all__ = ["acl_server", "root"]  # the fixtures, from tests/redis/test_acl.py

TAG = "flake"


def test_the_reserve_is_kept_under_the_worker_role_and_redis_denies_nothing(
    acl_server: services.Server, root: redis.Redis, tmp_path: Path
) -> None:
    settings = load_settings(redis_url=_url(acl_server, "worker"), snowflake_mode="local",
                             snowflake_local_map="4", pool_floor=500, pool_seconds=5,
                             snowflake_reserve_seconds=60,
                             snowflake_cache_dir=str(tmp_path / "cache"))
    pool = Pool(connect(settings))
    pool.register(TAG, "snowflake", 0)
    ms = FakeMsClock(1_767_000_000_000)

    def refiller(reserve: float) -> SnowflakeRefiller:
        s = settings.model_copy(update={"snowflake_reserve_seconds": reserve})
        registry = open_registry(s, "host:node:0", clock=ms, sleep=ms.sleep,
                                 monotonic=ms.monotonic, background=False)
        gen = LeasedGenerator(registry, s, clock=ms, sleep=ms.sleep)
        return SnowflakeRefiller(pool, gen, s, wall=lambda: ms() / 1000, sleep=ms.sleep)

    with_reserve = refiller(60)
    assert with_reserve.refill(TAG).pushed == 500  # appends and pushes
    assert pool.snapshot(TAG).reserve
    got = [int(x) for x in root.lpop(f"leafpool:{{{TAG}}}:ids", 500) or []]
    taker = Client(connect(settings), settings=settings, policy="reserve", wait_seconds=0)
    got += taker.next_ids(TAG, 100)  # from the reserve: the list is dry
    with_reserve.generator.close()
    ms.advance(1_000)
    without = refiller(0)  # a refiller keeping no reserve drops it (trim_reserve.lua)
    without.refill(TAG)
    assert not pool.snapshot(TAG).reserve
    got += [int(x) for x in root.lpop(f"leafpool:{{{TAG}}}:ids", 10_000) or []]
    assert got == sorted(set(got))
    without.generator.close()
    assert _denials(root) == []
