"""Lost replies (docs/design.md §7.2, §3.1): a fault-injecting proxy (tests/support/
faultproxy.py) in front of the real redis-server runs a chosen command and closes the
client's socket instead of returning the reply. Each test states the outcome (held, a
counted gap, refused) and that no ID is handed out twice."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import random
import socket
import sys
import threading
import time
from pathlib import Path

import pytest
import redis

from leafpool.client import AsyncClient, Client
from leafpool.core.config import Settings, load_settings
from leafpool.core.errors import BackendUnavailable, ReplyLost
from leafpool.redis import scripts
from leafpool.redis.connect import connect
from leafpool.redis.lock import RefillLock
from leafpool.redis.pool import Pool, Range
from leafpool.redis.pool_common import register_scripts
from leafpool.segment.refiller import SegmentRefiller
from leafpool.segment.store import SegmentStore
from tests.support import services
from tests.support.faultproxy import FaultProxy
from tests.support.processes import Proc, leafpool_env

TAG = "order"
N = 1000


def _settings(proxy: FaultProxy, sqlite_url: str, **overrides: object) -> Settings:
    values: dict[str, object] = {"redis_url": proxy.url(), "database_url": sqlite_url,
                                 "empty_policy": "raise", "pool_floor": 100,
                                 "pool_ceiling": 100}
    values.update(overrides)
    return load_settings(**values)


def _sha(name: str) -> bytes:
    return hashlib.sha1(scripts.source(name).encode()).hexdigest().encode()


def _script(name: str) -> tuple[str, object]:
    return "EVALSHA", lambda args: args[0] == _sha(name)


def _loaded(r: redis.Redis) -> None:
    """Every script in Redis's cache: a rule on EVALSHA then meets the call that runs,
    not a NOSCRIPT refusal."""
    for script in register_scripts(r).values():
        r.script_load(script.script)
    for name in ("lock_acquire", "lock_extend", "lock_release"):
        r.script_load(scripts.source(name))


def _filled(r: redis.Redis, n: int = N) -> Pool:
    """IDs 1..n in the tag's list, pushed the way a refiller does."""
    pool = Pool(r)
    pool.register(TAG, "segment", 0)
    lock = RefillLock(r, pool.tag(TAG).lock, 10_000)
    assert lock.acquire()
    pool.append_reserve(TAG, lock.token, Range(1, n + 1))
    pool.push(TAG, lock.token, Range(1, n + 1), n, 0)
    lock.release()
    return pool


def _counts(r: redis.Redis) -> dict[str, int]:
    state = {k.decode(): v.decode() for k, v in r.hgetall(f"leafpool:{{{TAG}}}:state").items()}
    hits = {k.decode(): v.decode() for k, v in r.hgetall(f"leafpool:{{{TAG}}}:hits").items()}
    return {"pushed": int(state.get("pushed_total", 0)), "gaps": int(hits.get("gaps", 0)),
            "lost": int(hits.get("lost_replies", 0)),
            "ready": int(r.llen(f"leafpool:{{{TAG}}}:ids"))}


# -- the refill lock ------------------------------------------------------------------------


def _refiller(proxy: FaultProxy, sqlite_url: str) -> tuple[SegmentRefiller, Pool]:
    store = SegmentStore.from_url(sqlite_url)
    store.init_schema()
    store.add_tag(TAG, step=1000)
    pool = Pool(connect(_settings(proxy, sqlite_url)))
    return SegmentRefiller(pool, store, _settings(proxy, sqlite_url)), pool


def test_a_lost_reply_to_the_lock_acquire_leaves_the_lock_ours_and_the_refill_goes_on(
    proxy: FaultProxy, sqlite_url: str, r: redis.Redis
) -> None:
    """Redis took the lock, the reply was lost: the repeated acquire finds its own nonce
    (held), the refill fills the pool at once; redis-py's Lock reported "locked" here and
    the tag paused for the lock's TTL."""
    refiller, pool = _refiller(proxy, sqlite_url)
    _loaded(r)
    command, match = _script("lock_acquire")
    rule = proxy.drop_reply(command, match)
    started = time.monotonic()
    result = refiller.refill(TAG)
    took = time.monotonic() - started
    assert rule.fired.is_set()
    assert not result.skipped and result.pushed == 100, result
    assert r.exists(pool.tag(TAG).lock) == 0  # released at the end
    ids = [int(i) for i in r.lrange(pool.tag(TAG).ids, 0, -1)]
    assert ids == list(range(1, 101))
    print(f"lost lock reply: the refill completed {took * 1000:.0f} ms after it started")


def test_a_lost_reply_to_the_release_leaves_the_lock_free(
    proxy: FaultProxy, sqlite_url: str, r: redis.Redis
) -> None:
    refiller, pool = _refiller(proxy, sqlite_url)
    _loaded(r)
    command, match = _script("lock_release")
    rule = proxy.drop_reply(command, match)
    assert refiller.refill(TAG).pushed == 100
    assert rule.fired.is_set()
    assert r.exists(pool.tag(TAG).lock) == 0  # the repeat found it free
    r.delete(pool.tag(TAG).ids)
    again = refiller.refill(TAG)
    assert not again.skipped and again.pushed == 100


# -- pops -----------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 10])
def test_a_pop_whose_reply_was_lost_is_a_counted_gap_never_a_repeat(
    proxy: FaultProxy, sqlite_url: str, r: redis.Redis, n: int
) -> None:
    """``LPOP`` and ``LPOP n``: Redis popped, the reply was lost. The client raises
    ReplyLost; the popped IDs are never handed out and are counted in ``gaps``; the next
    pop hands out the IDs after them, and pushed = handed out + gaps + ready."""
    _filled(r)
    client = Client(settings=_settings(proxy, sqlite_url))
    assert client.next_id(TAG) == 1
    rule = proxy.drop_reply("LPOP")
    with pytest.raises(ReplyLost):
        client.next_id(TAG) if n == 1 else client.next_ids(TAG, n)
    assert rule.fired.is_set()
    after = client.next_ids(TAG, 5)
    assert after == list(range(2 + n, 7 + n))  # 2..1+n are the gap, never handed out
    counts = _counts(r)
    assert counts["gaps"] == n and counts["lost"] == 1
    assert counts["pushed"] == 1 + 5 + counts["gaps"] + counts["ready"]
    client.close()


def test_a_pop_that_never_left_takes_nothing_and_counts_nothing(
    proxy: FaultProxy, sqlite_url: str, r: redis.Redis
) -> None:
    """No connection (the proxy gone): BackendUnavailable, not ReplyLost; no gap."""
    _filled(r)
    client = Client(settings=_settings(proxy, sqlite_url))
    proxy.stop()
    with pytest.raises(BackendUnavailable) as raised:
        client.next_id(TAG)
    assert not isinstance(raised.value, ReplyLost)
    assert _counts(r) == {"pushed": N, "gaps": 0, "lost": 0, "ready": N}
    client.close()


def test_a_pop_cut_off_before_redis_got_it_is_counted_as_an_upper_bound(
    proxy: FaultProxy, sqlite_url: str, r: redis.Redis
) -> None:
    """The connection closed after the pop left the client but before Redis had it: the
    client cannot tell this from a lost reply, so it counts the ID (``lost_replies`` says
    how many such counts there are): pushed <= handed out + gaps + ready <= pushed + lost."""
    _filled(r)
    client = Client(settings=_settings(proxy, sqlite_url))
    assert client.next_id(TAG) == 1
    rule = proxy.reset_before("LPOP")
    with pytest.raises(ReplyLost):
        client.next_id(TAG)
    assert rule.fired.is_set()
    assert client.next_id(TAG) == 2  # nothing was taken: the next ID is the next one
    c = _counts(r)
    assert c["gaps"] == 1 and c["lost"] == 1
    assert c["pushed"] <= 2 + c["gaps"] + c["ready"] <= c["pushed"] + c["lost"]
    client.close()


def test_a_lost_reply_to_a_pop_and_its_wait_is_a_counted_gap(
    proxy: FaultProxy, sqlite_url: str, r: redis.Redis
) -> None:
    """``[LPOP n, WAIT]`` in one round trip (replica-acknowledged pops): the WAIT's reply
    lost after the pop ran: the batch is a gap, counted."""
    _filled(r)
    pool = Pool(connect(proxy.url()))
    pool.acks, pool.ack_wait_ms = 1, 10  # WAIT 1 10 (no replica: it would say 0 anyway)
    rule = proxy.drop_reply("WAIT")
    with pytest.raises(ReplyLost):
        pool.pop_many(TAG, 7)
    assert rule.fired.is_set()
    assert _counts(r)["gaps"] == 7 and r.lindex(pool.tag(TAG).ids, 0) == b"8"


def test_a_lost_reply_to_a_blocking_pop_is_a_counted_gap(
    proxy: FaultProxy, sqlite_url: str, r: redis.Redis
) -> None:
    pool = Pool(connect(proxy.url()))
    pool.register(TAG, "segment", 0)
    rule = proxy.drop_reply("BLPOP")
    raised: list[BaseException] = []

    def wait() -> None:
        try:
            pool.wait_pop(TAG, 10)
        except ReplyLost as exc:
            raised.append(exc)

    waiter = threading.Thread(target=wait)
    waiter.start()
    services.wait_until(lambda: int(r.info("clients")["blocked_clients"]) == 1, 10,
                        "the BLPOP waiting")
    r.rpush(pool.tag(TAG).ids, 41, 42)
    waiter.join(10)
    assert rule.fired.is_set() and len(raised) == 1
    assert _counts(r)["gaps"] == 1 and r.lrange(pool.tag(TAG).ids, 0, -1) == [b"42"]


# -- the write scripts ----------------------------------------------------------------------


def _locked(r: redis.Redis, pool: Pool) -> RefillLock:
    pool.register(TAG, "segment", 0)
    lock = RefillLock(r, pool.tag(TAG).lock, 30_000)
    assert lock.acquire()
    return lock


@pytest.mark.parametrize(("script", "first"), [("push_range", 1), ("push_ids", 2**62)])
def test_a_push_repeated_after_a_lost_reply_lands_once(
    proxy: FaultProxy, r: redis.Redis, script: str, first: int
) -> None:
    pool = Pool(connect(proxy.url()))
    lock = _locked(r, pool)
    pool.append_reserve(TAG, lock.token, Range(first, first + 2000))
    _loaded(r)
    command, match = _script(script)  # below 2^53 the IDs are generated in Redis
    rule = proxy.drop_reply(command, match)
    assert pool.push(TAG, lock.token, Range(first, first + 2000), 1000, 0) == 1000
    assert rule.fired.is_set()  # the first try's
    assert [int(i) for i in r.lrange(pool.tag(TAG).ids, 0, -1)] == \
        list(range(first, first + 1000))
    assert r.lrange(pool.tag(TAG).reserve, 0, -1) == [f"{first + 1000}:{first + 2000}".encode()]
    assert _counts(r)["pushed"] == 1000


def test_a_run_of_chunks_repeated_after_a_lost_reply_lands_each_chunk_once(
    proxy: FaultProxy, r: redis.Redis
) -> None:
    """The pipeline of a refill's chunks whose reply was lost: sent again from the
    high-water mark, so each chunk lands once."""
    pool = Pool(connect(proxy.url()))
    lock = _locked(r, pool)
    pool.append_reserve(TAG, lock.token, Range(1, 301))
    pool.append_reserve(TAG, lock.token, Range(2**62, 2**62 + 100))
    _loaded(r)
    command, match = _script("push_range")
    rule = proxy.drop_reply(command, match)
    chunks = [(Range(1, 301), 100), (Range(101, 301), 200), (Range(2**62, 2**62 + 100), 50)]
    run = pool.push_run(TAG, lock.token, chunks, 0)
    assert rule.fired.is_set()
    assert (run.landed, run.pushed, run.length, run.code) == (3, 350, 350, 0)
    assert [int(i) for i in r.lrange(pool.tag(TAG).ids, 0, -1)] == \
        [*range(1, 301), *range(2**62, 2**62 + 50)]
    assert r.lrange(pool.tag(TAG).reserve, 0, -1) == [f"{2**62 + 50}:{2**62 + 100}".encode()]
    assert _counts(r)["pushed"] == 350


def test_a_reserve_append_repeated_after_a_lost_reply_lands_once(
    proxy: FaultProxy, r: redis.Redis
) -> None:
    pool = Pool(connect(proxy.url()))
    lock = _locked(r, pool)
    _loaded(r)
    command, match = _script("append_reserve")
    rule = proxy.drop_reply(command, match)
    assert pool.append_reserve(TAG, lock.token, Range(1, 1001), max_id=1001) == 1
    assert rule.fired.is_set()
    assert r.lrange(pool.tag(TAG).reserve, 0, -1) == [b"1:1001"]


def test_a_fresh_push_repeated_after_a_lost_reply_lands_once(
    proxy: FaultProxy, r: redis.Redis
) -> None:
    pool = Pool(connect(proxy.url()))
    pool.register(TAG, "snowflake", 0)
    lock = RefillLock(r, pool.tag(TAG).lock, 30_000)
    assert lock.acquire()
    _loaded(r)
    command, match = _script("push_fresh")
    rule = proxy.drop_reply(command, match)
    ids = [2**62 + i for i in range(0, 500, 3)]
    assert pool.push_fresh(TAG, lock.token, ids, 0) == len(ids)
    assert rule.fired.is_set()
    assert [int(i) for i in r.lrange(pool.tag(TAG).ids, 0, -1)] == ids


def test_a_reserve_take_whose_reply_was_lost_is_a_counted_gap(
    proxy: FaultProxy, r: redis.Redis
) -> None:
    """take_reserve is never repeated: the IDs it took are a gap; the next take goes on
    after them."""
    pool = Pool(connect(proxy.url()))
    lock = _locked(r, pool)
    pool.append_reserve(TAG, lock.token, Range(1, 101))
    lock.release()
    _loaded(r)
    command, match = _script("take_reserve")
    rule = proxy.drop_reply(command, match)
    with pytest.raises(ReplyLost):
        pool.take_reserve(TAG, Range(1, 101), 10)
    assert rule.fired.is_set()
    assert _counts(r)["gaps"] == 10
    assert pool.take_reserve(TAG, Range(11, 101), 5) == [11, 12, 13, 14, 15]


def test_a_counter_whose_reply_was_lost_is_not_counted_twice(
    proxy: FaultProxy, r: redis.Redis
) -> None:
    pool = Pool(connect(proxy.url()))
    pool.register(TAG, "segment", 0)
    _loaded(r)
    command, match = _script("record")
    rule = proxy.drop_reply(command, match)
    with pytest.raises(ReplyLost):
        pool.record(TAG, counts={"refills": 1})
    assert rule.fired.is_set()
    assert r.hget(pool.tag(TAG).state, "refills") == b"1"  # counted once, not twice


def test_a_drop_and_a_queued_marker_repeated_after_a_lost_reply(
    proxy: FaultProxy, r: redis.Redis
) -> None:
    pool = Pool(connect(proxy.url()))
    pool.register(TAG, "segment", 0)
    rule = proxy.drop_reply("SET", lambda args: b"queued" in args[0])
    assert pool.mark_queued(TAG, 30)  # ours: the repeat found our own token
    assert rule.fired.is_set() and r.ttl(pool.tag(TAG).queued) > 0
    assert not pool.mark_queued(TAG, 30)  # a second marker: someone (us) queued it
    _loaded(r)
    command, match = _script("drop")
    dropped = proxy.drop_reply(command, match)
    created = r.hget(pool.tag(TAG).state, "created_ms").decode()
    assert pool.drop(TAG, if_created_ms=created)
    assert dropped.fired.is_set()
    assert r.exists(*pool.tag(TAG).all()) == 0 and not r.sismember(pool.keys.tags, TAG)


# -- asyncio: cancelled requests and the coalesced path ------------------------------------


def test_coalesced_requests_cancelled_after_their_pop_are_counted_gaps(
    proxy: FaultProxy, sqlite_url: str, r: redis.Redis
) -> None:
    """100 rounds of 20 concurrent coalesced requests; every pop's reply is held 20 ms
    (the proxy), and in each round two requests are cancelled once the first pops reached
    Redis and two more once a batch pop did: every ID handed out is unique, and every ID
    popped and not handed out is counted: pushed = handed out + gaps + ready (the review
    saw 197 of 3,629 IDs lost uncounted)."""
    _filled(r, 20_000)
    rng = random.Random(7)
    held = proxy.delay_reply("LPOP", 0.02, times=10**9)

    async def reached(since: int, batch: bool) -> None:
        """Until a pop (``batch``: a pop for more than one queued request) sent after the
        ``since``-th one reached Redis: polling a state the pops must reach."""
        deadline = time.monotonic() + 10
        while not any(int(args[1]) > 1 or not batch for args in held.calls[since:]):
            assert time.monotonic() < deadline, "the pops did not reach Redis"
            await asyncio.sleep(0.001)

    async def rounds() -> list[int]:
        client = AsyncClient(settings=_settings(proxy, sqlite_url))
        client.coalesce(1024)
        got: list[int] = []
        for _ in range(100):
            base = len(held.calls)
            tasks = [asyncio.create_task(client.next_id_coalesced(TAG)) for _ in range(20)]
            await reached(base, batch=False)  # a request's own pop is in flight
            for task in rng.sample(tasks, 2):
                task.cancel()
            await reached(base, batch=True)  # a pop for the queued requests is in flight
            for task in rng.sample([x for x in tasks if not x.done()], 2):
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    got.append(await task)
        while client.pool._counting:  # the gap counts run in tasks of their own
            await asyncio.gather(*list(client.pool._counting), return_exceptions=True)
        await client.aclose()
        return got

    got = asyncio.run(rounds())
    assert len(got) == len(set(got)), "an ID was handed out twice"
    counts = _counts(r)
    assert counts["gaps"] > 0  # cancellations did cost IDs, and they were counted
    assert counts["pushed"] == len(got) + counts["gaps"] + counts["ready"]


def test_a_lost_reply_to_a_coalesced_pop_counts_its_whole_batch(
    proxy: FaultProxy, sqlite_url: str, r: redis.Redis
) -> None:
    _filled(r)

    async def run() -> tuple[list[object], int]:
        client = AsyncClient(settings=_settings(proxy, sqlite_url))
        client.coalesce(1024, in_flight=1)
        assert await client.next_id_coalesced(TAG) == 1  # connected before the fault
        # a request's own pop is LPOP key 1 (held), the queue's is LPOP key 9 (dropped)
        rule = proxy.drop_reply("LPOP", lambda args: args[1] != b"1")
        held = proxy.delay_reply("LPOP", 0.5, lambda args: args[1] == b"1")
        first = asyncio.create_task(client.next_id_coalesced(TAG))  # pops alone, held
        deadline = time.monotonic() + 10
        while not held.fired.is_set():  # polling a state the pop must reach
            assert time.monotonic() < deadline, "the first pop did not reach Redis"
            await asyncio.sleep(0.005)
        rest = [asyncio.create_task(client.next_id_coalesced(TAG)) for _ in range(9)]
        results = await asyncio.gather(first, *rest, return_exceptions=True)
        assert rule.fired.is_set()
        while client.pool._counting:
            await asyncio.gather(*list(client.pool._counting), return_exceptions=True)
        await client.aclose()
        return list(results), 9

    results, batch = asyncio.run(run())
    assert results[0] == 2
    assert all(isinstance(x, ReplyLost) for x in results[1:])
    counts = _counts(r)
    assert counts["gaps"] == batch and counts["lost"] == 1
    assert r.lindex(f"leafpool:{{{TAG}}}:ids", 0) == str(3 + batch).encode()


# -- the HTTP service: a client gone after its pop -----------------------------------------


@pytest.mark.slow
def test_an_http_client_gone_after_its_pop_is_a_counted_gap(
    proxy: FaultProxy, sqlite_url: str, r: redis.Redis, tmp_path: Path
) -> None:
    """A request waits for a refill (BLPOP); its client hangs up; the ID that then comes
    is popped for nobody: never sent, counted in ``gaps``, and the next request gets the
    next ID."""
    pool = Pool(r)
    pool.register(TAG, "segment", 0)
    port = services.free_port()
    env = leafpool_env(home=tmp_path / "home", redis_url=proxy.url(), database_url=sqlite_url,
                       empty_wait_seconds=10, http_port=port, http_coalesce_max=0)
    serve = Proc([sys.executable, "-m", "leafpool.cli", "serve", "--port", str(port)], env)
    try:
        services.wait_until(lambda: services.port_open(port), 60, "leafpool serve listening")
        # the BLPOP's reply is held long enough for the server to see the hang-up first
        held = proxy.delay_reply("BLPOP", 1.0)
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        sock.sendall(f"GET /api/segment/get/{TAG} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        services.wait_until(lambda: int(r.info("clients")["blocked_clients"]) == 1, 30,
                            "the request waiting in BLPOP")
        sock.close()
        r.rpush(pool.tag(TAG).ids, 1, 2)
        services.wait_until(lambda: r.hget(pool.tag(TAG).hits, "gaps") == b"1", 30,
                            "the ID popped for the gone client counted")
        assert held.fired.is_set()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as again:
            again.sendall(f"GET /api/segment/get/{TAG} HTTP/1.1\r\nHost: x\r\n"
                          "Connection: close\r\n\r\n".encode())
            reply = b""
            while chunk := again.recv(4096):
                reply += chunk
        assert reply.startswith(b"HTTP/1.1 200") and reply.endswith(b"\r\n\r\n2")
    finally:
        serve.stop()
