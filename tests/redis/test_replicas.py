"""Replica-acknowledged pops (LEAFPOOL_POP_REPLICAS) against a real master and replica on
loopback: without them a failover hands an acknowledged ID out again (the hazard, through
leafpool's own client); with them a pop the replica did not acknowledge is never handed
out, and nothing is handed out twice. The promotion is done by hand (``REPLICAOF NO ONE``,
what Sentinel sends), so which node is promoted and when is the test's choice."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import pytest

from leafpool.client import AsyncClient, Client
from leafpool.core.config import Settings, load_settings
from leafpool.core.errors import (
    BackendUnavailable,
    ConfigurationError,
    ReplicasBehind,
    StaleWrite,
)
from leafpool.housekeeping.sweep import sweep
from leafpool.redis import scripts
from leafpool.redis.connect import connect
from leafpool.redis.lock import RefillLock
from leafpool.redis.pool import Pool, Range
from leafpool.segment.refiller import SegmentRefiller
from leafpool.segment.store import SegmentStore
from leafpool.status import tag_status
from tests.support import services
from tests.support import topologies as t
from tests.support.processes import leafpool_env

if TYPE_CHECKING:
    from tests.support.topology_fixtures import Topologies

pytest_plugins = ["tests.support.topology_fixtures"]
pytestmark = pytest.mark.timeout(120)

TAG = "order"
N = 2000


def _fill(top: t.Replicated) -> None:
    """IDs 1..N in the pool the way a refiller puts them there, on every replica."""
    with top.master.client() as r:
        pool = Pool(r)
        lock = RefillLock(r, pool.tag(TAG).lock, 10_000)
        assert lock.acquire()
        pool.register(TAG, "segment", 0)
        pool.append_reserve(TAG, lock.token, Range(1, N + 1))
        pool.push(TAG, lock.token, Range(1, N + 1), N, 0)
        lock.release()
    top.wait_synced()


def _settings(node: t.Node, **overrides: object) -> Settings:
    values: dict[str, object] = {"redis_url": node.url, "empty_wait_seconds": 0.5,
                                 "pop_wait_ms": 200}
    values.update(overrides)
    return load_settings(**values)


def _fail_over(top: t.Replicated, replica: t.Node) -> None:
    top.master.kill()
    replica.resume()
    top.promote(replica)


def test_without_acknowledgements_a_failover_hands_an_id_out_again(
    topologies: Topologies,
) -> None:
    top = topologies.replicated(1)
    _fill(top)
    replica = top.replicas[0]
    client = Client(settings=_settings(top.master))
    top.stall(replica)
    assert client.next_id(TAG) == 1  # acknowledged by the master alone
    _fail_over(top, replica)
    again = Client(settings=_settings(replica))
    assert again.next_id(TAG) == 1, "the promoted replica hands the same ID out again"


def test_acknowledged_pops_are_dropped_while_the_replica_lags_and_never_repeat(
    topologies: Topologies,
) -> None:
    top = topologies.replicated(1)
    _fill(top)
    replica = top.replicas[0]
    client = Client(settings=_settings(top.master, pop_replicas="1"))
    handed_out = [*client.next_ids(TAG, 3), client.next_id(TAG)]
    assert handed_out == [1, 2, 3, 4]
    top.stall(replica)
    with pytest.raises(ReplicasBehind, match="0 of 1 replicas acknowledged"):
        client.next_id(TAG)  # retried until the empty-pool bound, each pop dropped
    status = tag_status(client.pool.snapshot(TAG))
    assert status.unacked_ids >= 1
    _fail_over(top, replica)
    after = Client(settings=_settings(replica)).next_ids(TAG, 10)
    assert not set(after) & set(handed_out), "an acknowledged ID was handed out again"
    assert after[0] == 5  # the dropped pops were never the promoted node's: they return


def test_the_asyncio_client_drops_unacknowledged_pops_too(topologies: Topologies) -> None:
    top = topologies.replicated(1)
    _fill(top)
    replica = top.replicas[0]

    async def run() -> tuple[list[int], int]:
        client = AsyncClient(settings=_settings(top.master, pop_replicas="all"))
        await client.start()
        first = await client.next_ids(TAG, 5)
        top.stall(replica)
        with pytest.raises(ReplicasBehind):
            await client.next_id(TAG)
        acks = client.pool.acks
        await client.aclose()
        return first, acks

    handed_out, acks = asyncio.run(run())
    assert handed_out == [1, 2, 3, 4, 5] and acks == 1
    _fail_over(top, replica)
    assert Client(settings=_settings(replica)).next_id(TAG) == 6


def test_a_requirement_the_master_cannot_meet_is_refused_at_start(
    topologies: Topologies,
) -> None:
    top = topologies.replicated(1)
    with pytest.raises(ConfigurationError, match=r"LEAFPOOL_POP_REPLICAS=2 .*the 1 replica"):
        Client(settings=_settings(top.master, pop_replicas="2"))
    assert Client(settings=_settings(top.master, pop_replicas="all")).pool.acks == 1
    cli = subprocess.run(
        [sys.executable, "-m", "leafpool.cli", "pop", TAG],
        env=leafpool_env(redis_url=top.master.url, pop_replicas="2"),
        capture_output=True, text=True, timeout=60)
    assert cli.returncode == 2 and "LEAFPOOL_POP_REPLICAS" in cli.stderr


def test_the_recipe_for_other_languages_with_redis_cli(topologies: Topologies) -> None:
    """README: pop, then ``WAIT n ms`` on the same connection; use the IDs only when the
    reply is at least n. redis-cli (not redis-py) sends both in one connection."""
    if shutil.which("redis-cli") is None:
        pytest.skip("redis-cli is not installed")
    top = topologies.replicated(2)
    _fill(top)

    def pop_then_wait() -> list[str]:
        done = subprocess.run(
            ["redis-cli", "-p", str(top.master.port)], timeout=30, check=True,
            input=f"LPOP leafpool:{{{TAG}}}:ids 2\nWAIT 2 200\n", capture_output=True,
            text=True)
        return done.stdout.split()

    assert pop_then_wait() == ["1", "2", "2"]  # two IDs, both replicas have them: use them
    top.stall(top.replicas[0])
    assert pop_then_wait() == ["3", "4", "1"]  # one of two: never use 3 and 4


def test_a_refill_notices_the_failover_and_goes_on_from_the_promoted_state(
    topologies: Topologies, sqlite_url: str, make_settings: Callable[..., Settings],
) -> None:
    from leafpool.segment.refiller import SegmentRefiller
    from leafpool.segment.store import SegmentStore

    top = topologies.replicated(1)
    store = SegmentStore.from_url(sqlite_url)
    store.init_schema()
    store.add_tag(TAG, step=1000)
    settings = make_settings(redis_url=top.master.url, database_url=sqlite_url)
    with top.master.client() as r:
        SegmentRefiller(Pool(r), store, settings).refill(TAG)
        handed_out = [int(x) for x in r.lpop(f"leafpool:{{{TAG}}}:ids", 10)]  # type: ignore[union-attr]
    top.wait_synced()
    replica = top.replicas[0]
    _fail_over(top, replica)
    with replica.client() as r:
        pool = Pool(r)
        SegmentRefiller(pool, store, settings).refill(TAG, force=True)
        st = tag_status(pool.snapshot(TAG))
        rest = [int(x) for x in r.lpop(f"leafpool:{{{TAG}}}:ids", 100_000) or []]
    assert st.failovers == 1 and st.last_failover_ms is not None
    assert st.redis_node.endswith(f":{replica.port}")
    assert not set(rest) & set(handed_out) and rest == sorted(rest)


def test_the_client_follows_a_sentinel_failover_with_acknowledged_pops(
    topologies: Topologies,
) -> None:
    """LEAFPOOL_REDIS_SENTINELS: the client asks the sentinels for the master and asks
    again after Sentinel promotes a replica; with two replicas, the promoted one still has
    a replica to acknowledge pops."""
    group = topologies.sentinel_group(2, 3)
    _fill(group)
    sentinels = ",".join(f"{h}:{p}" for h, p in group.sentinel_addrs)
    settings = load_settings(redis_url="redis://unused:6379/0", redis_sentinels=sentinels,
                             redis_master_name=group.master_name, pop_replicas="1",
                             pop_wait_ms=300, empty_wait_seconds=1)
    client = Client(settings=settings)
    first = client.next_ids(TAG, 3)

    async def async_pop() -> list[int]:  # the HTTP service's client, through the sentinels
        deadline = time.monotonic() + 30
        async_client = AsyncClient(settings=settings)
        try:
            while True:  # bounded: errors while the sentinels switch the master
                assert time.monotonic() < deadline, "asyncio pops did not resume within 30 s"
                with contextlib.suppress(BackendUnavailable):
                    return await async_client.next_ids(TAG, 3)
        finally:
            await async_client.aclose()

    assert asyncio.run(async_pop()) == [4, 5, 6]
    old = group.master
    old.kill()
    group.wait_failover(old)
    deadline = time.monotonic() + 30
    later: list[int] = []
    while not later:  # bounded: errors while the sentinels switch the master
        assert time.monotonic() < deadline, "pops did not resume within 30 s"
        with contextlib.suppress(BackendUnavailable):
            later = client.next_ids(TAG, 3)
    assert first == [1, 2, 3] and later[0] > 6
    after = asyncio.run(async_pop())
    assert after[0] > later[-1]


def test_the_http_service_answers_only_acknowledged_ids(topologies: Topologies) -> None:
    from starlette.testclient import TestClient

    from leafpool.http import create_app

    top = topologies.replicated(1)
    _fill(top)
    settings = _settings(top.master, pop_replicas="1")
    with TestClient(create_app(settings)) as http:
        ok = http.get(f"/api/segment/get/{TAG}")
        assert (ok.status_code, ok.text.strip()) == (200, "1")
        top.stall(top.replicas[0])
        refused = http.get(f"/api/segment/get/{TAG}")
        assert refused.status_code == 503, refused.text
        assert "replicas acknowledged" in refused.text
    with pytest.raises(ConfigurationError, match="LEAFPOOL_POP_REPLICAS"), \
            TestClient(create_app(_settings(top.master, pop_replicas="3"))):
        pass  # refused at start, not discovered request by request


def test_a_refill_lock_left_on_a_dead_master_is_taken_over_by_the_next_refill(
    topologies: Topologies, sqlite_url: str
) -> None:
    """A refill holds the tag's lock when the master dies; the promoted replica has the
    lock (replicated), and the holder's release went to the dead master. The next refill
    takes the lock over at once (it names the former master's replication ID) instead of
    waiting out its TTL, and the former holder's writes are refused on the new master."""
    top = topologies.replicated(1)
    store = SegmentStore.from_url(sqlite_url)
    store.init_schema()
    store.add_tag(TAG, step=1000)
    before = _settings(top.master, database_url=sqlite_url, pool_floor=100, pool_ceiling=100)
    pool = Pool(connect(before))
    assert SegmentRefiller(pool, store, before).refill(TAG).pushed == 100
    holder = pool.refill_lock(TAG, 30_000)
    assert holder.acquire()  # a refill under way when the master dies
    top.wait_synced()
    replica = top.replicas[0]
    top.master.kill()
    top.promote(replica)
    promoted = time.monotonic()
    after = _settings(replica, database_url=sqlite_url, pool_floor=100, pool_ceiling=100)
    new_pool = Pool(connect(after))
    assert new_pool.redis.pttl(new_pool.tag(TAG).lock) > 20_000  # the orphaned lock
    new_pool.redis.delete(new_pool.tag(TAG).ids)  # drained meanwhile
    # the sweep queues the refill that takes the lock over: the lock does not hold the tag
    assert sweep(new_pool, 30) == [(TAG, "segment", False)]
    result = SegmentRefiller(new_pool, store, after).refill(TAG)
    took = time.monotonic() - promoted
    assert not result.skipped and result.pushed == 100, result
    with pytest.raises(StaleWrite) as refused:
        new_pool.push(TAG, holder.token, Range(5000, 5010), 10, 0)
    assert refused.value.code == scripts.LOCK_LOST
    ids = [int(i) for i in new_pool.redis.lrange(new_pool.tag(TAG).ids, 0, -1)]
    assert ids == list(range(ids[0], ids[0] + 100)) and ids[0] > 100  # above all handed out
    print(f"failover with the lock held: the tag refilled {took * 1000:.0f} ms after the "
          "promotion")


def test_all_is_every_replica_the_sentinels_know_a_down_one_included(
    topologies: Topologies, caplog: pytest.LogCaptureFixture
) -> None:
    """``all`` is a fixed count (docs/design.md §7.1): a replica down when the client
    starts still counts, since Sentinel can promote it once it answers again. Pops are
    refused while it is away and served once it is back in sync; ``1`` of two is allowed,
    with a warning that names the hazard."""
    group = topologies.sentinel_group(2, 3)
    _fill(group)
    away = group.replicas[0]
    away.kill()
    group.wait_down(away)
    sentinels = ",".join(f"{h}:{p}" for h, p in group.sentinel_addrs)
    settings = load_settings(redis_url="redis://unused:6379/0", redis_sentinels=sentinels,
                             redis_master_name=group.master_name, pop_replicas="all",
                             pop_wait_ms=100, empty_wait_seconds=0.3)
    client = Client(settings=settings)
    assert client.pool.acks == 2
    assert "1 of the 2 replica(s) a pop needs are connected now" in caplog.text
    with pytest.raises(ReplicasBehind, match="1 of 2 replicas acknowledged"):
        client.next_id(TAG)

    async def async_acks() -> int:
        async_client = AsyncClient(settings=settings)
        await async_client.start()
        acks = async_client.pool.acks
        await async_client.aclose()
        return acks

    assert asyncio.run(async_acks()) == 2
    away.restart()
    group.wait_synced()

    def served() -> bool:
        try:
            return client.next_id(TAG) > 0
        except ReplicasBehind:  # its 0.3 s of 100 ms probes ended before the acknowledgement
            return False

    # pops are served again once the replica is back: polled (bounded), since on a loaded
    # machine the acknowledgement of the returning replica can take longer than the
    # client's 0.3 s empty-pool wait (seen once in a suite run in three processes)
    services.wait_until(served, 15, "a pop served with the replica back")
    caplog.clear()
    one = load_settings(redis_url="redis://unused:6379/0", redis_sentinels=sentinels,
                        redis_master_name=group.master_name, pop_replicas="1")
    assert Client(settings=one).pool.acks == 1
    assert "=1 of the 2 replicas the sentinels know: a replica that did not" in caplog.text
    three = load_settings(redis_url="redis://unused:6379/0", redis_sentinels=sentinels,
                          redis_master_name=group.master_name, pop_replicas="3")
    with pytest.raises(ConfigurationError, match=r"at most the 2 replica\(s\) the sentinels"):
        Client(settings=three)


def test_all_in_a_cluster_is_the_replicas_of_each_master(topologies: Topologies) -> None:
    """A failed replica still counts (CLUSTER NODES lists it): it can be promoted once it
    answers again."""
    top = topologies.cluster(3, 2)
    master = top.masters()[0]
    top.replicas_of(master)[0].kill()
    t._wait(lambda: None if master.info()["connected_slaves"] == 1 else "still 2", 10,
            "the master sees its replica gone")
    settings = load_settings(redis_url=top.url, redis_cluster=True, pop_replicas="all",
                             broker_url="redis://127.0.0.1:1/0")
    client = Client(settings=settings)
    assert client.pool.acks == 2
    client.close()


def test_while_a_replica_is_away_pops_are_refused_without_draining_the_pool(
    topologies: Topologies,
) -> None:
    """After a pop too few replicas acknowledged, the next attempts only ``WAIT`` (nothing
    popped) until the replicas have this connection's writes: a replica away for seconds
    costs the one dropped pop, not every attempt's IDs (the pool drained into gaps)."""
    top = topologies.replicated(1)
    _fill(top)
    replica = top.replicas[0]
    settings = _settings(top.master, pop_replicas="1", pop_wait_ms=100,
                         empty_wait_seconds=1.0)
    client = Client(settings=settings)
    top.stall(replica)
    for _ in range(3):
        with pytest.raises(ReplicasBehind):
            client.next_ids(TAG, 10)

    async def async_attempts() -> None:
        async_client = AsyncClient(settings=settings)
        await async_client.start()
        for _ in range(3):
            with pytest.raises(ReplicasBehind):
                await async_client.next_ids(TAG, 10)
        await async_client.aclose()

    asyncio.run(async_attempts())
    with top.master.client() as r:
        left = int(r.llen(f"leafpool:{{{TAG}}}:ids"))  # type: ignore[arg-type]
    status = tag_status(client.pool.snapshot(TAG))
    assert status.unacked_ids == 20, "each client's first pop only: 10 IDs each"
    assert left == N - 20
    replica.resume()
    top.wait_synced()
    assert client.next_ids(TAG, 10) == list(range(21, 31))


def test_a_connection_to_a_former_master_moves_to_the_promoted_one_within_seconds(
    topologies: Topologies,
) -> None:
    """A master paused past down-after and continued once Sentinel promoted another node
    answers again, as a master, until Sentinel demotes it (8 s or more later). redis-py
    asks the sentinels only when a connection opens, so a worker's open connection kept
    writing to it; leafpool's Sentinel clients ask at most every second
    (connect.MASTER_CHECK_SECONDS) and move."""
    group = topologies.sentinel_group(2, 3)
    sentinels = ",".join(f"{h}:{p}" for h, p in group.sentinel_addrs)
    settings = load_settings(redis_url="redis://unused:6379/0", redis_sentinels=sentinels,
                             redis_master_name=group.master_name)
    pool = Pool(connect(settings))
    pool.register(TAG, "segment", 0)
    old = group.master
    assert replicas_port(pool) == old.port
    old.pause()
    new = group.wait_failover(old)
    old.resume()
    resumed = time.monotonic()
    assert old.role() == "master", "the test needs the former master not yet demoted"
    t._wait(lambda: None if replicas_port(pool) == new.port else "still on the old master",
            5.0, "the pool's connection on the promoted master")
    print(f"moved to the promoted master {time.monotonic() - resumed:.1f} s after the "
          "former one was continued")


def replicas_port(pool: Pool) -> int:
    """The port of the node the pool's next command goes to (CLIENT INFO's laddr)."""
    from leafpool.redis import replicas

    return int(replicas.replication_id(pool.redis, pool.tag(TAG).ids)[1].rsplit(":", 1)[1])
