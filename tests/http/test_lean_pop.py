"""The asyncio pool's lean pop (leafpool/redis/pop_lean.py: its own kept
connections, the ``LPOP`` packed once per key, written without a task around the write)
keeps the send-once rules of every pop (docs/design.md §7.2), against a real Redis behind
the fault proxy: a lost reply raises ReplyLost and counts what the pop may have taken; a
pop cancelled once sent counts its IDs; a pop that never left counts nothing; an error
reply is raised and takes nothing; and the connection serves the next pop."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis

from leafpool.core.errors import BackendUnavailable, LeafpoolError, ReplyLost
from leafpool.redis.connect import connect_async
from leafpool.redis.pool_async import AsyncPool
from leafpool.redis.pop_lean import LEAN_IDLE
from tests.support.faultproxy import FaultProxy
from tests.support.http_helpers import fill

TAG = "order"


def _hits(r: redis.Redis) -> dict[str, int]:
    raw: dict[bytes, bytes] = r.hgetall(f"leafpool:{{{TAG}}}:hits")  # type: ignore[assignment]
    return {k.decode(): int(v) for k, v in raw.items()}


def _kept(pool: AsyncPool) -> list[Any]:
    """The connections the lean pop keeps between pops."""
    assert pool._lean is not None
    return pool._lean.idle


async def _counted(pool: AsyncPool) -> None:
    """The gap counts run in tasks of their own: until they are done."""
    while pool._counting:
        await asyncio.gather(*list(pool._counting), return_exceptions=True)


@pytest.mark.parametrize("n", [1, 10])
def test_a_lost_reply_is_a_counted_gap_never_a_repeat(
    proxy: FaultProxy, r: redis.Redis, n: int
) -> None:
    fill(r, TAG, list(range(1, 101)))

    async def run() -> list[int]:
        pool = AsyncPool(connect_async(proxy.url()))
        assert pool._lean is not None
        assert await pool.pop_many(TAG, 1) == [1]
        rule = proxy.drop_reply("LPOP")
        with pytest.raises(ReplyLost):
            await pool.pop_many(TAG, n)
        assert rule.fired.is_set()
        await _counted(pool)
        after = await pool.pop_many(TAG, 3)  # a new connection: the dropped one is closed
        await pool.redis.aclose()
        return after

    assert asyncio.run(run()) == [2 + n, 3 + n, 4 + n]  # 2..1+n: the gap, never handed out
    assert _hits(r) == {"gaps": n, "lost_replies": 1}


def test_a_pop_cancelled_once_sent_counts_its_ids(proxy: FaultProxy, r: redis.Redis) -> None:
    fill(r, TAG, list(range(1, 101)))

    async def run() -> list[int]:
        pool = AsyncPool(connect_async(proxy.url()))
        assert await pool.pop_many(TAG, 1) == [1]
        held = proxy.delay_reply("LPOP", 2.0)
        task = asyncio.create_task(pool.pop_many(TAG, 5))
        deadline = time.monotonic() + 10
        while not held.fired.is_set():  # bounded polling: the pop reached Redis
            assert time.monotonic() < deadline, "the pop did not reach Redis"
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await _counted(pool)
        after = await pool.pop_many(TAG, 1)
        await pool.redis.aclose()
        return after

    assert asyncio.run(run()) == [7]  # 2..6 popped for the cancelled pop: counted
    assert _hits(r) == {"gaps": 5, "lost_replies": 1}


def test_a_pop_that_never_left_counts_nothing(proxy: FaultProxy, r: redis.Redis) -> None:
    fill(r, TAG, list(range(1, 11)))

    async def run() -> None:
        pool = AsyncPool(connect_async(proxy.url()))
        proxy.stop()
        with pytest.raises(BackendUnavailable) as raised:
            await pool.pop_many(TAG, 3)
        assert not isinstance(raised.value, ReplyLost)
        await _counted(pool)
        await pool.redis.aclose()

    asyncio.run(run())
    assert _hits(r) == {}
    assert r.llen(f"leafpool:{{{TAG}}}:ids") == 10


def test_an_error_reply_is_raised_takes_nothing_and_the_connection_serves_on(
    redis_url: str, r: redis.Redis
) -> None:
    fill(r, TAG, [])
    key = f"leafpool:{{{TAG}}}:ids"
    r.set(key, "not a list")

    async def run() -> list[int]:
        pool = AsyncPool(connect_async(redis_url))
        with pytest.raises(LeafpoolError, match="WRONGTYPE") as raised:
            await pool.pop_many(TAG, 2)
        assert not isinstance(raised.value, ReplyLost)
        assert len(_kept(pool)) == 1 and _kept(pool)[0].is_connected  # kept, still open
        r.delete(key)
        r.rpush(key, 1, 2, 3)
        got = await pool.pop_many(TAG, 2)
        assert len(_kept(pool)) == 1
        await pool.redis.aclose()
        return got

    assert asyncio.run(run()) == [1, 2]
    assert _hits(r) == {}


def test_concurrent_pops_keep_at_most_lean_idle_connections_from_the_pool(
    redis_url: str, r: redis.Redis
) -> None:
    """30 pops at once: each ID once; afterwards the lean pop keeps at most LEAN_IDLE
    connections checked out of the client's pool (the others went back), so the pool's
    max_connections still serves every other command."""
    fill(r, TAG, list(range(1, 61)))

    async def run() -> tuple[list[int], int, int]:
        pool = AsyncPool(connect_async(redis_url))
        got = await asyncio.gather(*(pool.pop_many(TAG, 2) for _ in range(30)))
        in_use = len(pool.redis.connection_pool._in_use_connections)
        kept = len(_kept(pool))
        await pool.redis.aclose()
        return [i for ids in got for i in ids], in_use, kept

    ids, in_use, kept = asyncio.run(run())
    assert sorted(ids) == list(range(1, 61))
    assert kept == in_use == LEAN_IDLE
