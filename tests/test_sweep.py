"""The sweep that queues refills."""

from __future__ import annotations

import redis

from leafpool.pool import Pool
from leafpool.sweep import sweep


def test_sweep_queues_new_low_and_wanted_tags_once(pool: Pool, r: redis.Redis) -> None:
    pool.register("new", "segment", 0)
    pool.register("full", "segment", 0, low_water=2, target=4)
    r.rpush("leafpool:{full}:ids", 1, 2, 3)
    pool.register("low", "segment", 0, low_water=2, target=4)
    r.rpush("leafpool:{low}:ids", 1)
    assert sorted(sweep(pool, 30)) == [("low", "segment", False), ("new", "segment", False)]
    assert sweep(pool, 30) == []  # already queued
    pool.want("full")
    assert sweep(pool, 30) == [("full", "segment", True)]
    pool.clear_queued("low")
    assert sweep(pool, 30) == [("low", "segment", False)]


def test_sweep_skips_a_tag_being_refilled(pool: Pool, r: redis.Redis) -> None:
    pool.register("busy", "segment", 0)
    r.set("leafpool:{busy}:lock", "token")
    assert sweep(pool, 30) == []
