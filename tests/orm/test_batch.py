"""IdBatches (leafpool/orm/batch.py) against a real Redis: a call's IDs in one pop, the
prefetch bound, increasing IDs, threads, a fork, and the empty-pool policy."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import threading
from collections.abc import Callable

import pytest
import redis

from leafpool.client import MAX_BATCH, AsyncClient, Client
from leafpool.core.config import Settings, get_settings
from leafpool.core.errors import InvalidArgument, InvalidTag, PoolEmpty, UnknownTag
from leafpool.orm.batch import AsyncIdBatches, IdBatches
from tests.support.http_helpers import fill, llen

TAG = "order"


def lpops(r: redis.Redis) -> int:
    """LPOP commands the server has run (a Redis round trip each)."""
    stats = r.info("commandstats")
    return int(stats.get("cmdstat_lpop", {}).get("calls", 0))


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings(empty_policy="raise")


def batches(settings: Settings, prefetch: int = 0, **client: object) -> IdBatches:
    return IdBatches(lambda: Client(settings=settings, **client),  # type: ignore[arg-type]
                     prefetch=prefetch)


def test_a_call_takes_its_ids_in_one_pop_and_holds_none(r: redis.Redis, settings: Settings
                                                        ) -> None:
    fill(r, TAG, list(range(1, 3001)))
    source = batches(settings)
    before = lpops(r)
    assert source.take(TAG, 1000) == list(range(1, 1001))
    assert source.take(TAG, 1) == [1001]
    assert source.take(TAG, 999) == list(range(1002, 2001))
    assert lpops(r) - before == 3
    assert source.held(TAG) == 0 and llen(r, TAG) == 1000


def test_a_prefetch_is_held_up_to_its_bound_and_handed_out_first(
        r: redis.Redis, settings: Settings) -> None:
    fill(r, TAG, list(range(1, 5001)))
    source = batches(settings, prefetch=10)
    before = lpops(r)
    assert source.take(TAG) == [1]
    assert source.held(TAG) == 10 and lpops(r) - before == 1
    assert [source.take(TAG)[0] for _ in range(10)] == list(range(2, 12))
    assert lpops(r) - before == 1  # the ten came from the process, not Redis
    got: list[int] = [11]
    rng = random.Random(7)
    for _ in range(200):
        got += source.take(TAG, rng.randint(1, 25))
        assert source.held(TAG) <= 10
    assert got == sorted(set(got)) and got[0] == 11


def test_more_than_one_pop_can_carry_is_taken_in_pops_of_the_most_a_pop_takes(
        r: redis.Redis, settings: Settings) -> None:
    n = MAX_BATCH + 5
    fill(r, TAG, list(range(1, n + 1)))
    source = batches(settings)
    before = lpops(r)
    assert source.take(TAG, n) == list(range(1, n + 1))
    assert lpops(r) - before == 2


def test_threads_get_distinct_ids_each_increasing(r: redis.Redis, settings: Settings) -> None:
    fill(r, TAG, list(range(1, 40_001)))
    source = batches(settings, prefetch=50)
    start = threading.Barrier(8)
    per_thread: list[list[int]] = [[] for _ in range(8)]

    def work(i: int) -> None:
        rng = random.Random(i)
        start.wait()
        for _ in range(150):
            per_thread[i].extend(source.take(TAG, rng.randint(1, 20)))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    everything = [i for ids in per_thread for i in ids]
    assert len(everything) == len(set(everything))
    assert all(ids == sorted(ids) for ids in per_thread)
    assert source.held(TAG) <= 50


def test_a_child_of_fork_never_uses_the_ids_its_parent_held(
        r: redis.Redis, settings: Settings) -> None:
    fill(r, TAG, list(range(1, 1001)))
    source = batches(settings, prefetch=20)
    assert source.take(TAG) == [1]  # the parent now holds 2..21
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: take from the same batcher, report, exit without pytest
        try:
            os.write(write, json.dumps(source.take(TAG, 5)).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = json.loads(pipe.read() or "null")
    os.waitpid(pid, 0)
    parent = source.take(TAG, 5)
    assert parent == [2, 3, 4, 5, 6]  # the held ones, the parent's alone
    assert child is not None and min(child) > 21  # popped fresh by the child
    assert not set(child) & set(parent)


def test_an_empty_pool_raises_and_keeps_what_it_got_within_the_bound(
        r: redis.Redis, settings: Settings) -> None:
    fill(r, TAG, [1, 2, 3])
    source = batches(settings, prefetch=2)
    with pytest.raises(PoolEmpty):
        source.take(TAG, 5)
    assert source.held(TAG) == 2  # 1 and 2 kept, 3 a gap
    r.rpush("leafpool:{order}:ids", *[str(i) for i in range(10, 20)])
    assert source.take(TAG, 4) == [1, 2, 10, 11]


def test_the_wait_policy_waits_for_the_refill(r: redis.Redis, settings: Settings) -> None:
    fill(r, TAG, [])
    source = batches(settings, policy="wait", wait_seconds=30.0)
    got: list[int] = []
    taker = threading.Thread(target=lambda: got.extend(source.take(TAG, 3)))
    taker.start()
    # the client signals that it wants the tag before it blocks: refill then
    for _ in range(3000):
        if r.sismember("leafpool:wanted", TAG):
            break
        threading.Event().wait(0.01)
    assert r.sismember("leafpool:wanted", TAG)
    r.rpush("leafpool:{order}:ids", "7", "8", "9")
    taker.join(30)
    assert got == [7, 8, 9]


def test_unknown_and_bad_tags_and_counts_are_refused(r: redis.Redis, settings: Settings
                                                     ) -> None:
    source = batches(settings)
    with pytest.raises(UnknownTag):
        source.take("nope")
    with pytest.raises(InvalidTag):
        source.take("bad tag")
    with pytest.raises(InvalidArgument, match="n="):
        source.take(TAG, 0)
    with pytest.raises(InvalidArgument, match="prefetch="):
        IdBatches(prefetch=-1)


def test_the_prefetch_default_is_the_setting_and_a_bound_is_logged(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("LEAFPOOL_ORM_PREFETCH", "7")
    get_settings.cache_clear()
    try:
        with caplog.at_level(logging.INFO, logger="leafpool.orm.batch"):
            assert IdBatches().prefetch == 7
            assert AsyncIdBatches().prefetch == 7
            assert IdBatches(prefetch=0).prefetch == 0  # no bound: nothing to say
    finally:
        get_settings.cache_clear()
    said = [rec.getMessage() for rec in caplog.records]
    assert said == [f"orm: up to 7 IDs of each tag are taken ahead and held by process "
                    f"{os.getpid()} (LEAFPOOL_ORM_PREFETCH); those held at exit are a gap"] * 2


def test_async_batches_take_in_one_pop_and_keep_the_bound(
        r: redis.Redis, settings: Settings) -> None:
    fill(r, TAG, list(range(1, 2001)))

    async def run() -> tuple[list[int], int, int]:
        source = AsyncIdBatches(lambda: AsyncClient(settings=settings), prefetch=5)
        before = lpops(r)
        got = await source.take(TAG, 500)
        got += [i for _ in range(5) for i in await source.take(TAG)]
        pops = lpops(r) - before
        results = await asyncio.gather(*(source.take(TAG, 3) for _ in range(50)))
        got += [i for ids in results for i in ids]
        held = source.held(TAG)
        await source.aclose()
        return got, pops, held

    got, pops, held = asyncio.run(run())
    assert got == list(range(1, 656)) and pops == 1 and held <= 5
