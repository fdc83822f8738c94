"""A replicated database under load, for real on loopback (issue 19, item 6;
docs/design.md §7.3, §7.4): MariaDB with an asynchronous replica, and a 3-node Galera
cluster (tests/support/mariadb_topologies.py). Clients pop a tag through leafpool's
client while a refiller refills it (tests/support/id_load.py); the Galera test also
allocates another tag straight from the store in two threads.

(a) The primary is SIGKILLed after advances its replica never received (the replica's IO
thread stopped); the replica is promoted and the refiller restarted on a
LEAFPOOL_DATABASE_URL naming it: the pool keeps serving, the counter found behind the
pool's mark is healed, no ID is handed out twice.

(b) The Galera node in use is SIGKILLed: the store moves to the next host of the URL,
nothing is handed out twice, no committed allocation is lost (no counter behind, no heal)
and every ID handed out comes from a committed allocation, whatever the outcome of the
commits the kill cut.

Each prints the pauses it measured (``-s`` shows them)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from itertools import pairwise

import pytest
from sqlalchemy import text

from leafpool.core.config import Settings, load_settings
from leafpool.core.errors import BackendUnavailable
from leafpool.redis.connect import connect
from leafpool.redis.pool import Pool
from leafpool.segment.store import SegmentStore
from tests.support import mariadb_topologies as mt
from tests.support import services
from tests.support.id_load import Load, Record, RecordingStore
from tests.support.servers import NotInstalled

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

TAG, DIRECT = "order", "direct"


@pytest.fixture
def replicated() -> Iterator[mt.AsyncReplicated]:
    try:
        top = mt.async_replicated()
    except NotInstalled as exc:
        services.missing(exc.what)
    yield top
    top.stop()


@pytest.fixture(scope="module")
def galera() -> Iterator[mt.Galera]:
    if os.geteuid() != 0:
        services.unavailable(f"Galera nodes run as {mt.GALERA_USER} (the rsync SST): "
                             "starting them needs root")
    try:
        top = mt.galera(3)
    except NotInstalled as exc:
        services.missing(exc.what)
    yield top
    top.stop()


def _max_id(node: mt.DbNode, tag: str) -> int:
    return int(node.value(f"SELECT max_id FROM leafpool.leaf_alloc WHERE biz_tag = '{tag}'"))


def _settings(redis_url: str, database_url: str, size: int, step: int) -> Settings:
    """A list of ``size`` IDs (low-water half of it), a reserve of as many, a fixed step."""
    return load_settings(redis_url=redis_url, database_url=database_url, pool_floor=size,
                         pool_ceiling=size, reserve_seconds=1, outage_seconds=0,
                         max_step=step)


def _check(record: Record) -> None:
    """No ID twice; every ID from a committed allocation; no two allocations overlap."""
    assert record.handed_out()
    assert record.duplicates() == 0
    assert record.outside(TAG) == []
    assert record.overlapping() == []


def test_async_replica_promoted_after_the_primary_died_with_advances_it_never_sent(
    replicated: mt.AsyncReplicated, redis_url: str
) -> None:
    step = 500
    primary, replica = replicated.primary, replicated.replica
    record = Record()
    store = RecordingStore.open(primary.url, record)
    store.init_schema()
    store.add_tag(TAG, step=step)
    settings = _settings(redis_url, primary.url, 8_000, step)
    load = Load(settings, store, TAG, clients=2, batch=10, pace_s=0.005).start()
    try:
        load.wait_until(lambda: len(record.allocations) >= 20 and len(record.pops) >= 50,
                        60, "the pool filled and served")
        replicated.wait_caught_up()
        replicated.stop_io()  # from now on the primary's advances stay on it
        sent = _max_id(replica, TAG)
        load.wait_until(lambda: _max_id(primary, TAG) >= sent + 3 * step, 60,
                        "three advances the replica did not receive")
        killed = load.now()
        primary.kill()
        replicated.promote()
        promoted = load.now()
        store_r = RecordingStore.open(replica.url, record)
        load.use(_settings(redis_url, replica.url, 8_000, step), store_r)
        load.wait_until(lambda: record.first_allocation_after(promoted) is not None, 60,
                        "an allocation from the promoted replica")
        resumed = load.now()
        served = len(record.pops)
        load.wait_until(lambda: len(record.pops) >= served + 100, 60, "pops after it")
    finally:
        load.stop()
    lost = [s for t, s in record.allocations if t < killed and s.end > sent]
    assert len(lost) >= 3  # advances the promoted replica never had
    _check(record)
    assert record.empty == []  # the pool kept serving
    with connect(settings) as redis_client:
        pool_state = Pool(redis_client).snapshot(TAG)
    assert pool_state.int("heals") >= 1
    assert _max_id(replica, TAG) >= pool_state.floor  # healed: at or above the pool's mark
    print(f"\nasync replica: killed -> promoted {promoted - killed:.2f} s, "
          f"-> first allocation from the replica {resumed - killed:.2f} s "
          f"(refiller restarted {record.first_allocation_after(promoted):.2f} s after the "
          f"promotion); longest pause between pops {record.longest_pop_gap():.3f} s; "
          f"{len(record.handed_out())} IDs handed out, 0 duplicates; "
          f"{pool_state.int('heals')} heal(s)")


def test_nodes_not_fit_for_writes_are_passed_over(galera: mt.Galera) -> None:
    """A read_only node and a node isolated from the cluster (outside the primary
    component: wsrep_ready OFF) are passed over; a node isolated while in use is left at
    its next statement."""
    first, second, third = galera.nodes
    store = SegmentStore.from_url(galera.url())
    first.query("SET GLOBAL read_only = ON")  # (read_only is each node's own)
    try:
        store.init_schema()
        assert _port(store) == second.port
    finally:
        first.query("SET GLOBAL read_only = OFF")
    second.query("SET GLOBAL wsrep_provider_options = 'gmcast.isolate = 1'")
    try:
        galera.wait_ready(second, False)
        with pytest.raises(BackendUnavailable, match="1047"):
            store.list_tags()  # on the connection to the isolated node: refused
        assert _port(store) == third.port  # that connection was dropped, the next moved
    finally:
        second.query("SET GLOBAL wsrep_provider_options = 'gmcast.isolate = 0'")
    galera.wait_synced()
    store.engine.dispose()


def _port(store: SegmentStore) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(text("SELECT @@port")).scalar_one())


def test_galera_node_in_use_sigkilled_under_load(galera: mt.Galera, redis_url: str) -> None:
    galera.wait_synced()
    record = Record()
    url = galera.url()
    store = RecordingStore.open(url, record)
    store.init_schema()
    store.add_tag(TAG, step=1_000)
    store.add_tag(DIRECT, step=10)
    settings = _settings(redis_url, url, 40_000, 1_000)
    load = Load(settings, store, TAG, clients=2, batch=10, pace_s=0.01,
                direct_tag=DIRECT, allocators=2).start()
    try:
        load.wait_until(lambda: len(record.ranges(TAG)) >= 60 and len(record.pops) >= 50,
                        60, "the pool filled and served")
        in_use = galera.node_on(_port(store))
        killed = load.now()
        in_use.kill()
        load.wait_until(lambda: record.first_allocation_after(killed, DIRECT) is not None
                        and record.first_allocation_after(killed, TAG) is not None, 60,
                        "allocations after the kill")
        served = len(record.pops)
        load.wait_until(lambda: len(record.pops) >= served + 100, 60, "pops after it")
    finally:
        load.stop()
    moved_to = _port(store)
    assert moved_to != in_use.port and galera.node_on(moved_to).alive()
    _check(record)
    assert [t - killed for t in record.empty] == []  # the pool kept serving
    assert not [f for f in record.failures if "CounterBehind" in f[2]], record.failures
    with connect(settings) as redis_client:
        pool_state = Pool(redis_client).snapshot(TAG)
    assert pool_state.int("heals") == 0  # a synchronous cluster loses no committed advance
    direct = record.ranges(DIRECT)
    gaps = sum(b.start - a.end for a, b in pairwise(direct))
    alloc_pause = record.first_allocation_after(killed, DIRECT) or 0.0
    print(f"\ngalera: node :{in_use.port} SIGKILLed, store moved to :{moved_to}; first "
          f"allocation after the kill {alloc_pause:.2f} s (direct), "
          f"{record.first_allocation_after(killed, TAG):.2f} s (refiller); longest pause "
          f"between pops {record.longest_pop_gap():.3f} s; {len(record.handed_out())} IDs "
          f"handed out, 0 duplicates; {len(direct)} direct allocations, {gaps} IDs of gaps "
          f"between them; failures {len(record.failures)}")
