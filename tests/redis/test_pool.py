"""The fenced Lua writes: a push or reserve append that must not happen writes nothing;
and the batch pop returns exactly what the list held."""

from __future__ import annotations

import asyncio

import pytest
import redis
import redis.asyncio as aioredis

from leafpool.core.errors import StaleWrite
from leafpool.redis import scripts
from leafpool.redis.lock import RefillLock
from leafpool.redis.pool import Pool, Range
from leafpool.redis.pool_async import AsyncPool


def _locked(pool: Pool, tag: str) -> RefillLock:
    lock = RefillLock(pool.redis, pool.tag(tag).lock, 10_000)
    assert lock.acquire()
    return lock


def _seed(pool: Pool, tag: str, lock: RefillLock, *ranges: Range) -> None:
    pool.register(tag, "segment", 0)
    for rng in ranges:
        pool.append_reserve(tag, lock.token, rng)


def test_push_moves_the_reserve_head_into_the_list(pool: Pool, r: redis.Redis) -> None:
    lock = _locked(pool, "t")
    _seed(pool, "t", lock, Range(1, 11), Range(11, 21))
    assert pool.push("t", lock.token, Range(1, 11), 4, 0) == 4
    assert r.lrange(pool.tag("t").ids, 0, -1) == [b"1", b"2", b"3", b"4"]
    assert r.lrange(pool.tag("t").reserve, 0, -1) == [b"5:11", b"11:21"]
    assert pool.push("t", lock.token, Range(5, 11), 6, 0) == 10
    assert r.lrange(pool.tag("t").reserve, 0, -1) == [b"11:21"]
    snap = pool.snapshot("t")
    assert snap.state["hwm"] == "10" and snap.int("pushed_total") == 10


def test_a_push_without_the_lock_is_refused(pool: Pool, r: redis.Redis) -> None:
    lock = _locked(pool, "t")
    _seed(pool, "t", lock, Range(1, 11))
    with pytest.raises(StaleWrite, match="lock is not held"):
        pool.push("t", b"someone-else", Range(1, 11), 5, 0)
    lock.release()
    with pytest.raises(StaleWrite, match="lock is not held"):
        pool.push("t", lock.token, Range(1, 11), 5, 0)
    assert r.llen(pool.tag("t").ids) == 0


def test_a_repeated_push_is_refused(pool: Pool, r: redis.Redis) -> None:
    lock = _locked(pool, "t")
    _seed(pool, "t", lock, Range(1, 11))
    pool.push("t", lock.token, Range(1, 11), 5, 0)
    with pytest.raises(StaleWrite, match="reserve head moved"):
        pool.push("t", lock.token, Range(1, 11), 5, 0)  # a retried task's stale view
    assert r.lrange(pool.tag("t").ids, 0, -1) == [b"1", b"2", b"3", b"4", b"5"]


def test_a_push_not_above_the_high_water_mark_is_refused(pool: Pool, r: redis.Redis) -> None:
    lock = _locked(pool, "t")
    _seed(pool, "t", lock, Range(1, 11))
    pool.push("t", lock.token, Range(1, 11), 10, 0)
    # someone wrote a stale range straight into the reserve (a restored backup, say)
    r.rpush(pool.tag("t").reserve, "5:8")
    with pytest.raises(StaleWrite, match="not above the tag's high-water mark"):
        pool.push("t", lock.token, Range(5, 8), 3, 0)
    assert r.llen(pool.tag("t").ids) == 10


def test_reserve_refuses_ranges_below_the_high_water_or_the_tail(pool: Pool) -> None:
    lock = _locked(pool, "t")
    _seed(pool, "t", lock, Range(1, 11))
    with pytest.raises(StaleWrite, match="below the end of the reserve"):
        pool.append_reserve("t", lock.token, Range(5, 20))
    pool.push("t", lock.token, Range(1, 11), 10, 0)
    with pytest.raises(StaleWrite, match="high-water"):
        pool.append_reserve("t", lock.token, Range(10, 20))
    with pytest.raises(StaleWrite, match="lock"):
        pool.append_reserve("t", b"other", Range(11, 20))
    assert pool.append_reserve("t", lock.token, Range(11, 20)) == 1


@pytest.mark.parametrize("start", [2**53 - 3, 2**53 - 1, 2**53, 2**53 + 1, 2**63 - 1001])
def test_ids_are_exact_over_the_signed_64_bit_range(
    pool: Pool, r: redis.Redis, start: int
) -> None:
    lock = _locked(pool, "t")
    end = min(start + 1000, 2**63)
    _seed(pool, "t", lock, Range(start, end))
    pool.push("t", lock.token, Range(start, end), 3, 0)
    pool.push("t", lock.token, Range(start + 3, end), end - start - 3, 0)
    popped = [int(x) for x in r.lpop(pool.tag("t").ids, 10_000)]
    assert popped == list(range(start, end))
    # the high-water comparison is exact too: start + 2 is below, end - 1 is the mark
    assert pool.snapshot("t").state["hwm"] == str(end - 1)
    r.rpush(pool.tag("t").reserve, f"{end - 1}:{end}")
    with pytest.raises(StaleWrite, match="high-water"):
        pool.push("t", lock.token, Range(end - 1, end), 1, 0)


def test_the_high_water_comparison_is_numeric_not_lexical(pool: Pool) -> None:
    lock = _locked(pool, "t")
    _seed(pool, "t", lock, Range(9, 10))
    pool.push("t", lock.token, Range(9, 10), 1, 0)
    pool.append_reserve("t", lock.token, Range(10, 12))  # "10" < "9" as text
    assert pool.push("t", lock.token, Range(10, 12), 2, 0) == 3  # 9, 10, 11


def test_take_reserve_only_while_the_list_is_empty(pool: Pool, r: redis.Redis) -> None:
    lock = _locked(pool, "t")
    _seed(pool, "t", lock, Range(1, 11))
    assert pool.take_reserve("t", Range(1, 11), 3) == [1, 2, 3]
    assert pool.snapshot("t").state["hwm"] == "3"
    assert pool.take_reserve("t", Range(1, 11), 3) == scripts.HEAD_MOVED
    pool.push("t", lock.token, Range(4, 11), 2, 0)
    assert r.lrange(pool.tag("t").ids, 0, -1) == [b"4", b"5"]
    assert pool.take_reserve("t", Range(6, 11), 1) == scripts.LIST_NOT_EMPTY


def test_drop_removes_every_key_of_the_tag(pool: Pool, r: redis.Redis) -> None:
    lock = _locked(pool, "t")
    _seed(pool, "t", lock, Range(1, 11))
    pool.push("t", lock.token, Range(1, 11), 5, 0)
    pool.drop("t")
    assert r.keys("leafpool:{t}:*") == []
    assert not pool.is_known("t")
    with pytest.raises(StaleWrite):
        pool.push("t", lock.token, Range(6, 11), 1, 0)


@pytest.mark.parametrize(
    "ids",
    [
        list(range(1_000, 1_100)),  # one contiguous run: read from its two ends
        [*range(1_000, 1_050), *range(5_000, 5_050)],  # across two segments
        [7, 9, 10, 11, 12, 13],  # a gap inside: same span as a 6-ID run would not have
        [2**63 - 3, 2**63 - 2, 2**63 - 1],  # 64-bit ends
        [(1 << 22) * 5 + 1, (1 << 22) * 5 + 2, (1 << 22) * 6],  # snowflake-like
        [42],
    ],
    ids=["run", "two-segments", "gap", "64-bit", "snowflake", "one"],
)
def test_a_batch_pop_returns_exactly_what_the_list_held(
    pool: Pool, r: redis.Redis, ids: list[int]
) -> None:
    pool.register("t", "segment", 0)
    r.rpush(pool.tag("t").ids, *ids)
    assert pool.pop_many("t", len(ids) + 5) == ids
    assert pool.pop_many("t", 5) == []


def test_the_asyncio_batch_pop_returns_exactly_what_the_list_held(
    r: redis.Redis, redis_url: str
) -> None:
    ids = [*range(10, 20), 25, *range(30, 40)]
    r.rpush("leafpool:{t}:ids", *ids)

    async def pops() -> tuple[list[int], list[int]]:
        client = aioredis.Redis.from_url(redis_url)
        try:
            apool = AsyncPool(client, "leafpool")
            return await apool.pop_many("t", 10), await apool.pop_many("t", 20)
        finally:
            await client.aclose()

    assert asyncio.run(pops()) == (ids[:10], ids[10:])
