"""Coalesced single-ID requests (leafpool/redis/coalesce.py, AsyncClient.next_id_coalesced, the
HTTP service) against a real Redis: concurrent requests of one tag share one
``LPOP tag n``; every request gets its ID from a pop issued after it arrived, so a request
that starts after another's response has arrived gets a larger ID, across clients (G2);
a batch is handed out in arrival order; a short pop sends the requests left without an
ID down the empty-pool policy as before; a cancelled request takes no ID or leaves a gap,
and no ID is handed out twice or lost."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx
import pytest
import redis

from leafpool.client import AsyncClient
from leafpool.core.config import Settings, load_settings
from leafpool.core.errors import BackendUnavailable, PoolEmpty, ReplicasBehind, UnknownTag
from leafpool.http import create_app
from leafpool.redis.coalesce import Coalescer
from leafpool.redis.pool import Pool
from leafpool.status import tag_status
from tests.support.http_helpers import fill, llen

if TYPE_CHECKING:
    from tests.support.topology_fixtures import Topologies

pytest_plugins = ["tests.support.topology_fixtures"]

TAG = "order"


def lpop_calls(r: redis.Redis) -> int:
    stats = r.info("commandstats").get("cmdstat_lpop")
    return int(stats["calls"]) if stats else 0


@dataclass(frozen=True)
class Taken:
    """One request: when it started and when its answer arrived (one event loop's
    clock, so the order of these instants is exact), and the ID it got."""

    start: float
    end: float
    id: int


def order_violations(taken: Sequence[Taken]) -> list[tuple[Taken, Taken]]:
    """Pairs (a, b) where b started after a's answer arrived but got a smaller ID."""
    by_end = sorted(taken, key=lambda t: t.end)
    out: list[tuple[Taken, Taken]] = []
    for b in taken:
        for a in by_end:
            if a.end >= b.start:
                break
            if a.id >= b.id:
                out.append((a, b))
    return out


class Gate:
    """Wraps a real ``pop_many``: the calls numbered in ``hold`` (1: the first) wait for
    ``release(k)`` before they are sent, so a test holds a pop 'in flight' while it
    queues or cancels requests."""

    def __init__(
        self, pop_many: Callable[[str, int], Awaitable[list[int]]], hold: Sequence[int] = (1,)
    ) -> None:
        self._pop_many = pop_many
        self.calls: list[int] = []  # the count of each pop, in order
        self.held = {k: asyncio.Event() for k in hold}
        self._open = {k: asyncio.Event() for k in hold}

    def release(self, k: int = 1) -> None:
        self._open[k].set()

    async def __call__(self, tag: str, count: int) -> list[int]:
        self.calls.append(count)
        k = len(self.calls)
        if k in self.held:
            self.held[k].set()
            await self._open[k].wait()
        return await self._pop_many(tag, count)


async def settle() -> None:
    """Let every ready task run until each waits on I/O or an event."""
    for _ in range(5):
        await asyncio.sleep(0)


# -- the order across clients ---------------------------------------------------------


class SurplusCoalescer(Coalescer):
    """The unsafe variant: pops more than it is asked and keeps the rest for later takes
    (a take then gets an ID from a pop issued before it arrived)."""

    def __init__(self, pop_many: Callable[[str, int], Awaitable[list[int]]]) -> None:
        super().__init__(pop_many, 16)
        self.kept: list[int] = []

    async def take(self, tag: str) -> int | None:
        if not self.kept:
            self.kept = await self._pop_many(tag, 16)
        return self.kept.pop(0) if self.kept else None


async def _alternate(first: AsyncClient, second: AsyncClient, rounds: int) -> list[Taken]:
    """Requests one after another, alternating between two clients."""
    loop = asyncio.get_running_loop()
    out = []
    for i in range(rounds):
        client = first if i % 2 == 0 else second
        start = loop.time()
        got = await client.next_id_coalesced(TAG)
        out.append(Taken(start, loop.time(), got))
    return out


@pytest.mark.parametrize("variant", ["coalescer", "surplus (unsafe)"])
def test_a_request_after_an_answer_gets_a_larger_id_across_clients(
    variant: str, make_settings: Callable[..., Settings], r: redis.Redis
) -> None:
    """Two clients (two service processes) taking turns: every ID is larger than the one
    answered before. The unsafe variant (surplus kept for later requests) breaks it, and
    the check sees it."""
    fill(r, TAG, list(range(1, 101)))

    async def run() -> list[Taken]:
        clients = [AsyncClient(settings=make_settings(), policy="raise") for _ in range(2)]
        for c in clients:
            c.coalesce(16)
            if variant != "coalescer":
                c._coalescer = SurplusCoalescer(c.pool.pop_many)
        try:
            return await _alternate(clients[0], clients[1], 6)
        finally:
            for c in clients:
                await c.aclose()

    taken = asyncio.run(run())
    if variant == "coalescer":
        assert [t.id for t in taken] == [1, 2, 3, 4, 5, 6]
        assert order_violations(taken) == []
    else:
        assert order_violations(taken), "the check must catch IDs popped before arrival"


def test_concurrent_requests_share_pops_and_keep_the_order_across_two_services(
    make_settings: Callable[..., Settings], r: redis.Redis
) -> None:
    """Two HTTP services (as two processes would be) and 24 connections each, every
    connection sending requests one after another: fewer LPOPs than requests, every ID
    handed out once, none lost, and no request that started after another's answer got
    a smaller ID."""
    per_conn, conns, total = 25, 24, 2 * 24 * 25
    fill(r, TAG, list(range(1, total + 101)))
    lpops_before = lpop_calls(r)

    async def run() -> list[Taken]:
        apps = [create_app(make_settings(http_coalesce_max=8)) for _ in range(2)]
        loop = asyncio.get_running_loop()
        taken: list[Taken] = []

        async def connection(http: httpx.AsyncClient) -> None:
            for _ in range(per_conn):
                start = loop.time()
                resp = await http.get(f"/api/segment/get/{TAG}")
                assert resp.status_code == 200, resp.text
                taken.append(Taken(start, loop.time(), int(resp.text)))

        clients = [
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")
            for app in apps
        ]
        try:
            await asyncio.gather(*(connection(h) for h in clients for _ in range(conns)))
        finally:
            for h, app in zip(clients, apps, strict=True):
                await h.aclose()
                await app.state.service.aclose()
        return taken

    taken = asyncio.run(run())
    assert order_violations(taken) == []
    ids = sorted(t.id for t in taken)
    assert ids == list(range(1, total + 1))  # each once, none lost
    assert llen(r, TAG) == 100
    pops = lpop_calls(r) - lpops_before
    assert pops < total, f"{pops} LPOPs for {total} requests: nothing was shared"


# -- one batch --------------------------------------------------------------------------


def test_requests_queued_behind_a_pop_share_the_next_one_in_arrival_order(
    make_settings: Callable[..., Settings], r: redis.Redis
) -> None:
    fill(r, TAG, list(range(1, 21)))

    async def run() -> tuple[int, list[int], list[int]]:
        client = AsyncClient(settings=make_settings(), policy="raise")
        gate = Gate(client.pool.pop_many)
        client.pool.pop_many = gate  # type: ignore[method-assign]
        client.coalesce(3, in_flight=1)
        try:
            first = asyncio.ensure_future(client.next_id_coalesced(TAG))
            await gate.held[1].wait()  # the first pop is in flight
            queued = []
            for _ in range(5):
                queued.append(asyncio.ensure_future(client.next_id_coalesced(TAG)))
                await settle()  # each request arrives after the previous one
            gate.release()
            return await first, list(await asyncio.gather(*queued)), gate.calls
        finally:
            await client.aclose()

    first, queued, calls = asyncio.run(run())
    assert first == 1
    assert queued == [2, 3, 4, 5, 6]  # in arrival order
    assert calls == [1, 3, 2]  # one pop for the first, then batches of at most 3


def test_up_to_in_flight_pops_go_at_once_then_requests_queue(
    make_settings: Callable[..., Settings], r: redis.Redis
) -> None:
    """Two pops may be under way: a lightly loaded service waits for no one; a third
    request queues and shares the next pop with those behind it."""
    fill(r, TAG, list(range(1, 21)))

    async def run() -> tuple[list[int], list[int]]:
        client = AsyncClient(settings=make_settings(), policy="raise")
        gate = Gate(client.pool.pop_many, hold=(1, 2))
        client.pool.pop_many = gate  # type: ignore[method-assign]
        client.coalesce(16, in_flight=2)
        try:
            a = asyncio.ensure_future(client.next_id_coalesced(TAG))
            b = asyncio.ensure_future(client.next_id_coalesced(TAG))
            await gate.held[2].wait()  # both pops under way, neither waited for the other
            queued = [asyncio.ensure_future(client.next_id_coalesced(TAG)) for _ in range(3)]
            await settle()
            assert gate.calls == [1, 1]
            gate.release(1)
            got = [await a, *await asyncio.gather(*queued)]
            gate.release(2)
            return [*got, await b], gate.calls
        finally:
            await client.aclose()

    got, calls = asyncio.run(run())
    assert calls == [1, 1, 3]
    assert got == [1, 2, 3, 4, 5]  # the queued three in arrival order; b's pop went last


@pytest.mark.parametrize("policy", ["raise", "wait", "reserve"])
def test_a_short_pop_sends_the_requests_left_over_down_the_empty_pool_policy(
    policy: str, make_settings: Callable[..., Settings], r: redis.Redis
) -> None:
    """Three IDs, six requests: the first three get them, in order; the other three
    each take the policy's path as an uncoalesced request does (counted empty hits,
    the sweep asked; raise: PoolEmpty; wait: the IDs a refill pushes)."""
    fill(r, TAG, [1, 2, 3])

    async def run() -> list[int | BaseException]:
        client = AsyncClient(settings=make_settings(empty_wait_seconds=10), policy=policy)
        gate = Gate(client.pool.pop_many)
        client.pool.pop_many = gate  # type: ignore[method-assign]
        client.coalesce(16, in_flight=1)
        try:
            first = asyncio.ensure_future(client.next_id_coalesced(TAG))
            await gate.held[1].wait()
            rest = [asyncio.ensure_future(client.next_id_coalesced(TAG)) for _ in range(5)]
            await settle()
            gate.release()
            if policy != "raise":
                # bounded polling for the state under test: the three left over are
                # blocked in BLPOP; then a refill pushes their IDs
                deadline = time.monotonic() + 10
                while sum(c.get("cmd") == "blpop" for c in r.client_list()) < 3:
                    assert time.monotonic() < deadline, "the requests never waited"
                    await asyncio.sleep(0.01)
                r.rpush(f"leafpool:{{{TAG}}}:ids", 4, 5, 6)
            return [await first, *await asyncio.gather(*rest, return_exceptions=True)]
        finally:
            await client.aclose()

    got = asyncio.run(run())
    assert got[:3] == [1, 2, 3]
    if policy == "raise":
        assert all(isinstance(e, PoolEmpty) for e in got[3:]), got
    else:
        assert sorted(got[3:]) == [4, 5, 6]  # type: ignore[type-var]
    assert r.hget(f"leafpool:{{{TAG}}}:hits", "empty_hits") == b"3"
    assert r.sismember("leafpool:wanted", TAG)
    assert llen(r, TAG) == 0


def test_cancelled_requests_take_no_id_or_leave_a_gap_never_a_repeat(
    make_settings: Callable[..., Settings], r: redis.Redis
) -> None:
    """A request cancelled while queued is left out of the next pop's count; one
    cancelled while its pop is in flight leaves its ID unused (a gap), given to no one."""
    fill(r, TAG, list(range(1, 21)))

    async def run() -> tuple[list[int], list[int], bool, bool]:
        client = AsyncClient(settings=make_settings(), policy="raise")
        gate = Gate(client.pool.pop_many, hold=(1, 2))
        client.pool.pop_many = gate  # type: ignore[method-assign]
        client.coalesce(16, in_flight=1)
        try:
            first = asyncio.ensure_future(client.next_id_coalesced(TAG))
            await gate.held[1].wait()
            queued = [asyncio.ensure_future(client.next_id_coalesced(TAG)) for _ in range(4)]
            await settle()
            queued[1].cancel()  # before its pop is issued
            gate.release(1)
            got_first = await first
            await gate.held[2].wait()  # the pop for the three left is in flight
            queued[2].cancel()  # while its pop is in flight
            await settle()
            gate.release(2)
            results = await asyncio.gather(*queued, return_exceptions=True)
            after = [await client.next_id_coalesced(TAG) for _ in range(2)]
            ok = [x for x in results if isinstance(x, int)]
            assert gate.calls[:2] == [1, 3]
            return [got_first, *ok], after, queued[1].cancelled(), queued[2].cancelled()
        finally:
            await client.aclose()

    handed, after, queued_cancelled, in_flight_cancelled = asyncio.run(run())
    assert queued_cancelled and in_flight_cancelled
    assert handed == [1, 2, 4]  # 3 went to the request cancelled in flight: a gap
    assert after == [5, 6]  # the queued one's cancellation took nothing
    assert len(set(handed + after)) == len(handed + after)


# -- errors as before ---------------------------------------------------------------------


def test_unknown_tag_and_redis_down_reach_every_request_of_the_batch(
    make_settings: Callable[..., Settings], r: redis.Redis
) -> None:
    async def run() -> tuple[list[BaseException], list[BaseException]]:
        client = AsyncClient(settings=make_settings(), policy="wait", wait_seconds=0.2)
        client.coalesce(16, in_flight=1)
        down = AsyncClient(settings=make_settings(redis_url="redis://127.0.0.1:1/0"))
        down.coalesce(16)
        try:
            unknown = await asyncio.gather(
                *(client.next_id_coalesced("nope") for _ in range(8)), return_exceptions=True
            )
            failed = await asyncio.gather(
                *(down.next_id_coalesced(TAG) for _ in range(8)), return_exceptions=True
            )
            return list(unknown), list(failed)  # type: ignore[arg-type]
        finally:
            await client.aclose()
            await down.aclose()

    unknown, failed = asyncio.run(run())
    assert all(isinstance(e, UnknownTag) for e in unknown), unknown
    assert all(isinstance(e, BackendUnavailable) for e in failed), failed


def test_coalescing_off_is_one_lpop_per_request(
    make_settings: Callable[..., Settings], r: redis.Redis
) -> None:
    """LEAFPOOL_HTTP_COALESCE_MAX=0: the path before coalescing (the benchmark's
    baseline), one LPOP per request however many are concurrent."""
    fill(r, TAG, list(range(1, 201)))
    before = lpop_calls(r)

    async def run() -> list[int]:
        app = create_app(make_settings(http_coalesce_max=0))
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://test"
        ) as http:
            resps = await asyncio.gather(*(http.get(f"/api/segment/get/{TAG}") for _ in range(50)))
        await app.state.service.aclose()
        return sorted(int(x.text) for x in resps)

    assert asyncio.run(run()) == list(range(1, 51))
    assert lpop_calls(r) - before == 50


@pytest.mark.timeout(120)
def test_a_coalesced_pop_the_replica_did_not_acknowledge_is_dropped_for_every_request(
    topologies: Topologies,
) -> None:
    """LEAFPOOL_POP_REPLICAS=1: concurrent requests share acknowledged pops; while the
    replica lags every request of a batch is refused (each retried up to its own bound)
    and the batch's IDs are dropped, so the promoted replica hands out none twice."""
    top = topologies.replicated(1)
    replica = top.replicas[0]
    with top.master.client() as r:
        fill(r, TAG, list(range(1, 201)))
    top.wait_synced()
    settings = load_settings(
        redis_url=top.master.url, empty_wait_seconds=0.3, pop_wait_ms=100, pop_replicas="1"
    )

    async def run() -> tuple[list[int], list[object]]:
        client = AsyncClient(settings=settings)
        client.coalesce(16, in_flight=1)
        try:
            await client.start()
            handed = await asyncio.gather(*(client.next_id_coalesced(TAG) for _ in range(12)))
            top.stall(replica)
            refused = await asyncio.gather(
                *(client.next_id_coalesced(TAG) for _ in range(12)), return_exceptions=True
            )
            return list(handed), list(refused)
        finally:
            await client.aclose()

    handed, refused = asyncio.run(run())
    assert sorted(handed) == list(range(1, 13))
    assert all(isinstance(e, ReplicasBehind) for e in refused), refused
    with top.master.client() as r:
        assert tag_status(Pool(r).snapshot(TAG)).unacked_ids >= 1
    top.master.kill()
    replica.resume()
    top.promote(replica)
    with replica.client() as r:
        after = Pool(r).pop_many(TAG, 5)
    assert after == [13, 14, 15, 16, 17]  # the dropped pops never reached the replica
