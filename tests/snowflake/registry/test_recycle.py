"""Mode zk_recycle against a real ZooKeeper, what only it does: leases of 0..1023 as
ephemeral nodes, a restart preferring its previous worker ID, leases per worker ID (not
per identity), reclaim after the holder's session expires (its high-water carried to the
next holder), a lost lease node, a ZooKeeper outage ridden through on the lease, all 1024
taken. What every
mode does is in tests/snowflake/registry/test_contract.py."""

from __future__ import annotations

import json

import pytest

from leafpool.core.errors import BackendUnavailable, ClockMovedBackwards, WorkerIdUnavailable
from leafpool.core.snowflake_layout import decode, wall_clock_ms
from leafpool.snowflake.registry import LeasedGenerator
from tests.support import registries, services
from tests.support.clocks import FakeMsClock
from tests.support.mysql_proxy import MysqlProxy
from tests.support.registries import RecycleBackend
from tests.support.zk_helpers import (
    StateLog,
    expire_session,
    own_zk_fixture,
    raw_client,
)

zkr = registries.fixture("zk_recycle")


own_zk = own_zk_fixture()


def test_leases_are_ephemeral_nodes_and_the_mark_persists(zkr: RecycleBackend) -> None:
    a, b = zkr.open("host-a:w:0"), zkr.open("host-b:w:0")
    assert a.claim().worker_id == 0
    assert b.claim().worker_id == 1
    assert a.client is not None and a.session is not None
    stat = zkr.zk.exists(a.lease_path(0))
    assert stat is not None and stat.ephemeralOwner == a.client.client_id[0]
    assert zkr.data(a.lease_path(0))["identity"] == "host-a:w:0"
    assert a.deadline.lease_s == a.session.timeout_s  # the lease is the granted session
    target = wall_clock_ms() + 2_000
    a.record_high_water(target)
    assert zkr.data(a.hw_path(0))["token"] == a.token
    a.release(last_emitted_ms=target - 2_000)
    assert zkr.zk.exists(a.lease_path(0)) is None  # the lease is free again
    assert zkr.mark(a, 0) >= target - 2_000  # the mark outlives it


def test_restart_prefers_the_previous_worker_id(zkr: RecycleBackend) -> None:
    a, b = zkr.open("host-a:w:0"), zkr.open("host-b:w:0")
    assert (a.claim().worker_id, b.claim().worker_id) == (0, 1)
    b.release(last_emitted_ms=wall_clock_ms())
    a.release(last_emitted_ms=wall_clock_ms())
    assert zkr.open("host-b:w:0").claim().worker_id == 1  # 0 is free too: its cache file


def test_a_second_process_of_one_identity_gets_another_worker_id(zkr: RecycleBackend) -> None:
    """Leases are per worker ID: two live processes never share one, whatever their
    identities (the modes that hold an ID per identity refuse the second one)."""
    first = zkr.open("host-a:w:0").claim()
    second = zkr.open("host-a:w:0", cache="other-cache").claim()
    assert (first.worker_id, second.worker_id) == (0, 1)


def test_reclaim_after_session_expiry_starts_above_the_former_holder(zkr: RecycleBackend) -> None:
    t = wall_clock_ms()
    a = zkr.open("host-a:w:0", FakeMsClock(t))
    gen_a = LeasedGenerator(a, a.settings, clock=a.clock, sleep=a.sleep, window_ms=10_000)
    assert gen_a.start().worker_id == 0
    ids_a = gen_a.next_batch(3_000)
    assert a.high_water_ms == t + 10_000
    assert zkr.mark(a, 0) == t + 10_000  # beyond the lease's cover (7 s): as recorded
    assert a.client is not None
    states = StateLog(a.client)
    expire_session(a.client, zkr.hosts)  # the holder went silent: its lease expires
    states.wait_for("LOST")
    with pytest.raises(WorkerIdUnavailable) as err:  # fenced before anyone reclaims
        a.check()
    assert "session" in str(err.value)
    with pytest.raises(WorkerIdUnavailable):
        gen_a.next_batch(10)
    with pytest.raises(WorkerIdUnavailable):
        a.record_high_water(t + 20_000)

    early = zkr.open("host-b:w:0", FakeMsClock(t + 1_000))
    with pytest.raises(ClockMovedBackwards) as err2:  # behind the former holder's mark
        early.claim()
    assert err2.value.offset_ms == 9_000 and "recycle/hw/0000" in str(err2.value)
    assert zkr.zk.exists(early.lease_path(0)) is None  # the refused claim let go

    clock_b = FakeMsClock(t + 11_000)
    b = zkr.open("host-b:w:0", clock_b)
    gen_b = LeasedGenerator(b, b.settings, clock=clock_b, sleep=clock_b.sleep)
    lease = gen_b.start()
    assert (lease.worker_id, lease.last_timestamp_ms) == (0, t + 10_000)
    ids_b = gen_b.next_batch(3_000)
    assert decode(ids_b[0]).timestamp_ms > t + 10_000
    assert not set(ids_a) & set(ids_b)
    assert zkr.data(b.hw_path(0))["identity"] == "host-b:w:0"


def test_a_lost_lease_node_fences(zkr: RecycleBackend) -> None:
    a = zkr.open("host-a:w:0")
    a.claim()
    zkr.zk.delete(a.lease_path(0))
    with pytest.raises(WorkerIdUnavailable) as err:
        a.record_high_water(wall_clock_ms() + 1_000)
    assert "lease node" in str(err.value)
    assert a.fenced is not None


def test_a_zookeeper_outage_shorter_than_the_lease_does_not_stop_generation(
    own_zk: services.Server, zkr: RecycleBackend
) -> None:
    """Issue 28: a ZooKeeper outage shorter than the lease causes no pause. The mark the
    holder's last renew wrote covers the lease (docs/design.md §8.3), so a SUSPENDED
    connection generates on from the cache file alone until the lease deadline, and a
    record beyond that mark is refused at once (it needs ZooKeeper); the same session
    comes back and the next call renews. On a fake clock: kazoo's own timers are real.

    The outage is ZooKeeper's host going away (every connection cut, new ones refused)
    and coming back, the server running on behind it: its length is the test's own. A
    killed server's restart is not: on a loaded machine the JVM answered kazoo only
    after kazoo's read timeout, the session (10 s) expired, and the outage was no longer
    shorter than the lease (the product fenced itself, rightly)."""
    host = MysqlProxy(own_zk.port, packets=False).open()
    clock = FakeMsClock(wall_clock_ms())
    reg = zkr.open("host-a:w:0", clock, zk_hosts=host.address,
                   snowflake_lease_seconds=10, snowflake_renew_seconds=0.5)
    gen = LeasedGenerator(reg, reg.settings, clock=clock, sleep=clock.sleep)
    lease = gen.start()
    ids = gen.next_batch(1_000)
    assert reg.client is not None
    states = StateLog(reg.client)
    hw = reg.hw_path(lease.worker_id)
    covered = own_mark(own_zk, hw)  # what the last write recorded: the lease covered
    try:
        host.close()
        states.wait_for("SUSPENDED", timeout=5)
        ids += gen.next_batch(1_000)  # at once, on the lease
        clock.advance(reg.deadline.fence_after_s * 1000 - 500)  # most of the lease later
        ids += gen.next_batch(1_000)
        assert reg.fenced is None
        assert covered >= clock.now + 1_000 >= decode(ids[-1]).timestamp_ms
        with pytest.raises(BackendUnavailable) as err:  # beyond the mark: not without ZK
            reg.record_high_water(covered + 1)
        assert "SUSPENDED" in str(err.value)
        assert decode(ids[-1]).timestamp_ms <= covered == reg.source_mark  # nothing written
        clock.advance(1_000)  # the deadline passed: self-fenced until a renew
        with pytest.raises(WorkerIdUnavailable) as err2:
            reg.check()
        assert "not renewed" in str(err2.value)
        with pytest.raises(BackendUnavailable):  # the call tries a renew: no ZooKeeper
            gen.next_batch(10)
    finally:
        host.open()
    try:
        # the same session comes back (before its timeout): the next call renews, goes on
        states.wait_for("SUSPENDED", "CONNECTED", timeout=15)
        assert reg.fenced is None
        ids += gen.next_batch(1_000)
        reg.check()
        assert ids == sorted(set(ids)) and {decode(i).worker_id for i in ids} == {lease.worker_id}
        assert own_mark(own_zk, hw) >= decode(ids[-1]).timestamp_ms
    finally:
        host.stop()


def own_mark(server: services.Server, path: str) -> int:
    with raw_client(server.extra["hosts"]) as client:
        return int(json.loads(client.get(path)[0])["timestamp"])


def test_all_1024_worker_ids_taken(zkr: RecycleBackend) -> None:
    probe = zkr.open("probe:w:0")
    zkr.zk.ensure_path(probe.lease_dir)
    for start in range(0, 1024, 256):
        tx = zkr.zk.transaction()
        for wid in range(start, start + 256):
            tx.create(probe.lease_path(wid), b"{}", ephemeral=True)
        assert all(isinstance(r, str) for r in tx.commit())
    with pytest.raises(WorkerIdUnavailable) as err:
        probe.claim()
    assert "all 1024 worker IDs of its range are leased" in str(err.value)
    zkr.zk.delete(probe.lease_path(517))
    assert probe.claim().worker_id == 517
    assert json.loads(probe.cache.path.read_text())["worker_id"] == 517
