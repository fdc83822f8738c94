"""The application client (sync and asyncio) against a real Redis."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest
import redis

from leafpool.client import AsyncClient, Client
from leafpool.core.config import Settings
from leafpool.core.errors import InvalidArgument, InvalidTag, PoolEmpty, UnknownTag
from leafpool.redis.lock import RefillLock
from leafpool.redis.pool import Pool, Range


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings(empty_wait_seconds=0.5)


def _fill(pool: Pool, tag: str, list_ids: Range | None, *reserve: Range) -> None:
    """Put IDs into a tag the way a refiller does (fenced writes)."""
    lock = RefillLock(pool.redis, pool.tag(tag).lock, 10_000)
    assert lock.acquire()
    pool.register(tag, "segment", 0)
    ranges = ([list_ids] if list_ids else []) + list(reserve)
    for rng in ranges:
        pool.append_reserve(tag, lock.token, rng)
    if list_ids:
        pool.push(tag, lock.token, list_ids, list_ids.size, 0)
    lock.release()


def test_next_id_and_next_ids_pop_in_order(pool: Pool, settings: Settings) -> None:
    _fill(pool, "order", Range(1, 201))
    client = Client(settings=settings)
    assert client.next_id("order") == 1
    assert client.next_ids("order", 100) == list(range(2, 102))
    assert isinstance(client.next_id("order"), int)


def test_unknown_tag_raises_never_a_sentinel(pool: Pool, settings: Settings) -> None:
    client = Client(settings=settings)
    with pytest.raises(UnknownTag):
        client.next_id("nope")
    with pytest.raises(UnknownTag):
        client.next_ids("nope", 5)


@pytest.mark.parametrize("n", [0, -1, 100_001, True])
def test_bad_counts_and_tags_are_refused(pool: Pool, settings: Settings, n: int) -> None:
    client = Client(settings=settings)
    with pytest.raises(InvalidArgument, match="n="):
        client.next_ids("order", n)
    with pytest.raises(InvalidTag):
        client.next_id("bad tag")


def test_raise_policy_counts_the_hit_and_asks_for_a_refill(
    pool: Pool, settings: Settings
) -> None:
    _fill(pool, "order", Range(1, 4))
    client = Client(settings=settings, policy="raise")
    with pytest.raises(PoolEmpty) as info:
        client.next_ids("order", 5)
    assert info.value.partial == [1, 2, 3]
    assert pool.snapshot("order").hits["empty_hits"] == "1"
    assert pool.take_wanted() == ["order"]


def test_wait_policy_gets_the_ids_a_refill_pushes(pool: Pool, settings: Settings) -> None:
    _fill(pool, "order", None)
    client = Client(settings=settings, policy="wait", wait_seconds=10)
    asked = threading.Event()

    def refiller() -> None:
        # waits until the client reported the empty pool, then pushes
        deadline_ok = asked.wait(10)
        assert deadline_ok
        _fill(pool, "order", Range(1, 11))

    original_want = client.pool.want

    def want(tag: str) -> None:
        original_want(tag)
        asked.set()

    client.pool.want = want  # type: ignore[method-assign]
    thread = threading.Thread(target=refiller)
    thread.start()
    assert client.next_ids("order", 3) == [1, 2, 3]
    thread.join()


def test_at_least_takes_what_one_pop_got_and_applies_the_policy_only_below_it(
    pool: Pool, settings: Settings
) -> None:
    _fill(pool, "order", Range(1, 6))
    client = Client(settings=settings, policy="wait", wait_seconds=0.2)
    assert client.next_ids("order", 10, at_least=3) == [1, 2, 3, 4, 5]  # no wait
    assert pool.snapshot("order").hits.get("empty_hits") is None
    with pytest.raises(PoolEmpty):
        client.next_ids("order", 10, at_least=1)
    for bad in (0, 11, True):
        with pytest.raises(InvalidArgument, match="at_least="):
            client.next_ids("order", 10, at_least=bad)

    async def run() -> list[int]:
        _fill(pool, "order", Range(6, 9))
        async_client = AsyncClient(settings=settings, policy="raise")
        try:
            return await async_client.next_ids("order", 10, at_least=2)
        finally:
            await async_client.aclose()

    assert asyncio.run(run()) == [6, 7, 8]


def test_wait_policy_gives_up_after_the_bound(pool: Pool, settings: Settings) -> None:
    _fill(pool, "order", None)
    client = Client(settings=settings, policy="wait", wait_seconds=0.2)
    with pytest.raises(PoolEmpty, match=r"after waiting 0\.200s"):
        client.next_id("order")


def test_reserve_policy_takes_from_the_reserve_in_order(
    pool: Pool, settings: Settings, r: redis.Redis
) -> None:
    _fill(pool, "order", Range(1, 3), Range(3, 6), Range(6, 100))
    client = Client(settings=settings, policy="reserve")
    assert client.next_ids("order", 7) == [1, 2, 3, 4, 5, 6, 7]
    assert client.next_id("order") == 8
    snap = pool.snapshot("order")
    assert snap.int("reserve_takes") == 6
    assert snap.state["hwm"] == "8"
    assert r.lrange("leafpool:{order}:reserve", 0, -1) == [b"9:100"]


def test_async_client_behaves_the_same(pool: Pool, settings: Settings) -> None:
    _fill(pool, "order", Range(1, 3), Range(3, 50))

    async def scenario() -> None:
        client = AsyncClient(settings=settings, policy="reserve")
        assert await client.next_id("order") == 1
        assert await client.next_ids("order", 4) == [2, 3, 4, 5]
        with pytest.raises(UnknownTag):
            await client.next_id("nope")
        raising = AsyncClient(settings=settings, policy="raise")
        with pytest.raises(PoolEmpty):
            await raising.next_id("order")
        waiting = AsyncClient(settings=settings, policy="wait", wait_seconds=0.1)
        with pytest.raises(PoolEmpty):
            await waiting.next_ids("order", 2)
        await client.aclose()
        await raising.aclose()
        await waiting.aclose()

    asyncio.run(scenario())
    assert pool.snapshot("order").hits["empty_hits"] == "3"


def test_an_unreachable_redis_is_backend_unavailable(
    make_settings: Callable[..., Settings],
) -> None:
    from leafpool.core.errors import BackendUnavailable

    client = Client(settings=make_settings(redis_url="redis://127.0.0.1:1/0"))
    with pytest.raises(BackendUnavailable, match="redis: order: LPOP"):
        client.next_id("order")
    with pytest.raises(BackendUnavailable, match="redis: order: LPOP"):
        client.next_ids("order", 10)


def _take_calls(r: redis.Redis) -> int:
    stats = r.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


def test_a_reserve_take_that_cannot_succeed_is_not_retried(
    pool: Pool, settings: Settings, r: redis.Redis
) -> None:
    """A refusal no retry can change (here: the head is not above the high-water mark)
    ends the take at once; the client waits for the refill and raises PoolEmpty."""
    _fill(pool, "order", None, Range(1, 100))
    r.hset("leafpool:{order}:state", "hwm", "500")
    client = Client(settings=settings, policy="reserve", wait_seconds=0.05)
    client.redis.ping()
    r.config_resetstat()
    with pytest.raises(PoolEmpty):
        client.next_id("order")
    assert _take_calls(r) <= 2  # one take (EVALSHA, once more after loading the script)
    assert r.lindex("leafpool:{order}:reserve", 0) == b"1:100"


def test_async_reserve_take_that_cannot_succeed_is_not_retried(
    pool: Pool, settings: Settings, r: redis.Redis
) -> None:
    _fill(pool, "order", None, Range(1, 100))
    r.hset("leafpool:{order}:state", "hwm", "500")

    async def main() -> None:
        client = AsyncClient(settings=settings, policy="reserve", wait_seconds=0.05)
        await client.redis.ping()
        r.config_resetstat()
        with pytest.raises(PoolEmpty):
            await client.next_id("order")
        await client.aclose()

    asyncio.run(main())
    assert _take_calls(r) <= 2
