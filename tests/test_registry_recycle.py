"""Mode zk_recycle against a real ZooKeeper: leases of 0..1023, reclaim after the
holder's session expires (its high-water carried to the next holder), fencing of a
former holder, self-fencing on SUSPENDED/LOST and on a missed renew, all 1024 taken."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from leafpool.config import Settings, load_settings
from leafpool.errors import ClockMovedBackwards, ConfigurationError, WorkerIdUnavailable
from leafpool.registry import LeasedGenerator, open_registry
from leafpool.registry.recycle import RecycleRegistry
from leafpool.snowflake import decode, wall_clock_ms
from tests import services
from tests.clocks import FakeMsClock
from tests.zk_helpers import StateLog, expire_session, raw_client, unique_name, wait_serving

Factory = Callable[..., RecycleRegistry]


def _settings(hosts: str, name: str, tmp_path: Path, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "snowflake_mode": "zk_recycle", "zk_hosts": hosts, "snowflake_name": name,
        "snowflake_cache_dir": str(tmp_path / "cache"),
        "snowflake_lease_seconds": 6, "snowflake_renew_seconds": 1,
    }
    values.update(overrides)
    return load_settings(**values)


@pytest.fixture
def name() -> str:
    return unique_name()


@pytest.fixture
def make(zk_hosts: str, name: str, tmp_path: Path) -> Iterator[Factory]:
    made: list[RecycleRegistry] = []

    def factory(identity: str, clock: FakeMsClock | None = None, hosts: str = zk_hosts,
                cache: str = "cache", **kw: object) -> RecycleRegistry:
        settings = _settings(hosts, name, tmp_path, snowflake_cache_dir=str(tmp_path / cache))
        clock = clock or FakeMsClock(wall_clock_ms())
        reg = open_registry(settings, identity, clock=clock, sleep=clock.sleep,
                            monotonic=clock.monotonic, background=False, **kw)
        assert isinstance(reg, RecycleRegistry)
        made.append(reg)
        return reg

    yield factory
    for reg in made:
        reg.release()


@pytest.fixture
def zk_hosts(zk_server: services.Server) -> str:
    """The session's ZooKeeper, once it serves (its port opens before it does)."""
    wait_serving(zk_server.extra["hosts"])
    return zk_server.extra["hosts"]


@pytest.fixture(scope="module")
def own_zk() -> Iterator[services.Server]:
    """A ZooKeeper of its own for the test that kills it."""
    server = services.zookeeper_server()
    wait_serving(server.extra["hosts"])
    yield server
    server.stop()


def hw_of(hosts: str, reg: RecycleRegistry, worker_id: int) -> dict[str, Any]:
    with raw_client(hosts) as client:
        raw, _ = client.get(reg.hw_path(worker_id))
    return dict(json.loads(raw))


def test_leases_are_ephemeral_nodes_and_the_mark_persists(make: Factory,
                                                         zk_hosts: str) -> None:
    a, b = make("host-a:w:0"), make("host-b:w:0")
    assert a.claim().worker_id == 0
    assert b.claim().worker_id == 1
    assert a.client is not None
    with raw_client(zk_hosts) as client:
        stat = client.exists(a.lease_path(0))
        lease_data = json.loads(client.get(a.lease_path(0))[0])
    assert stat is not None and stat.ephemeralOwner == a.client.client_id[0]
    assert lease_data["identity"] == "host-a:w:0"
    target = wall_clock_ms() + 2_000
    a.record_high_water(target)
    assert hw_of(zk_hosts, a, 0)["timestamp"] == target
    assert json.loads(a.cache.path.read_text())["last_timestamp"] == target
    a.release(last_emitted_ms=target - 2_000)
    with raw_client(zk_hosts) as client:
        assert client.exists(a.lease_path(0)) is None  # the lease is free again
    assert hw_of(zk_hosts, a, 0)["timestamp"] >= target - 2_000  # the mark outlives it


def test_restart_prefers_the_previous_worker_id(make: Factory) -> None:
    make("host-a:w:0").claim()
    b = make("host-b:w:0")
    assert b.claim().worker_id == 1
    b.release(last_emitted_ms=wall_clock_ms())
    assert make("host-b:w:0").claim().worker_id == 1  # from its cache file


def test_reclaim_after_session_expiry_starts_above_the_former_holder(
        make: Factory, zk_hosts: str) -> None:
    t = wall_clock_ms()
    a = make("host-a:w:0", clock=FakeMsClock(t))
    gen_a = LeasedGenerator(a, a.settings, clock=a.clock, sleep=a.sleep, window_ms=5_000)
    assert gen_a.start().worker_id == 0
    ids_a = gen_a.next_batch(3_000)
    assert a.high_water_ms == t + 5_000
    assert a.client is not None
    states = StateLog(a.client)
    expire_session(a.client, zk_hosts)  # the holder went silent: its lease expires
    states.wait_for("LOST")
    with pytest.raises(WorkerIdUnavailable) as err:  # fenced before anyone reclaims
        a.check()
    assert "session" in str(err.value)
    with pytest.raises(WorkerIdUnavailable):
        gen_a.next_batch(10)
    with pytest.raises(WorkerIdUnavailable):
        a.record_high_water(t + 10_000)

    early = make("host-b:w:0", clock=FakeMsClock(t + 1_000))
    with pytest.raises(ClockMovedBackwards) as err2:  # behind the former holder's mark
        early.claim()
    assert err2.value.offset_ms == 4_000 and "recycle/hw/0000" in str(err2.value)
    with raw_client(zk_hosts) as client:
        assert client.exists(early.lease_path(0)) is None  # the refused claim let go

    clock_b = FakeMsClock(t + 6_000)
    b = make("host-b:w:0", clock=clock_b)
    gen_b = LeasedGenerator(b, b.settings, clock=clock_b, sleep=clock_b.sleep)
    lease = gen_b.start()
    assert (lease.worker_id, lease.last_timestamp_ms) == (0, t + 5_000)
    ids_b = gen_b.next_batch(3_000)
    assert decode(ids_b[0]).timestamp_ms > t + 5_000
    assert not set(ids_a) & set(ids_b)
    assert hw_of(zk_hosts, b, 0)["identity"] == "host-b:w:0"


def test_a_former_holders_late_write_is_refused(make: Factory, zk_hosts: str) -> None:
    a = make("host-a:w:0")
    a.claim()
    with raw_client(zk_hosts) as client:  # the next holder rewrote the mark (new version)
        _, stat = client.get(a.hw_path(0))
        client.set(a.hw_path(0), json.dumps({"timestamp": 1, "token": "b"}).encode(),
                   version=stat.version)
    with pytest.raises(WorkerIdUnavailable) as err:
        a.record_high_water(wall_clock_ms() + 1_000)
    assert "written by the next holder" in str(err.value)
    with pytest.raises(WorkerIdUnavailable):
        a.check()


def test_lost_lease_node_fences(make: Factory, zk_hosts: str) -> None:
    a = make("host-a:w:0")
    a.claim()
    with raw_client(zk_hosts) as client:
        client.delete(a.lease_path(0))
    with pytest.raises(WorkerIdUnavailable) as err:
        a.record_high_water(wall_clock_ms() + 1_000)
    assert "lease node" in str(err.value)


def test_missed_renew_self_fences_until_a_renew_succeeds(make: Factory) -> None:
    clock = FakeMsClock(wall_clock_ms())
    a = make("host-a:w:0", clock=clock)
    a.claim()
    a.check()
    assert a.deadline.fence_after_s == pytest.approx(a.session.timeout_s * 2 / 3)  # type: ignore[union-attr]
    clock.advance(a.deadline.fence_after_s * 1000 + 1)  # no renew for 2/3 of the session
    with pytest.raises(WorkerIdUnavailable) as err:
        a.check()
    assert "not renewed" in str(err.value)
    a.tick()  # a renew: a versioned write proves the lease
    a.check()


def test_suspended_connection_self_fences_at_once(own_zk: services.Server, name: str,
                                                  tmp_path: Path) -> None:
    hosts = own_zk.extra["hosts"]
    settings = _settings(hosts, name, tmp_path, snowflake_lease_seconds=10,
                         snowflake_renew_seconds=0.5)
    reg = open_registry(settings, "host-a:w:0", background=False)
    assert isinstance(reg, RecycleRegistry)
    lease = reg.claim()
    assert reg.client is not None
    states = StateLog(reg.client)
    try:
        own_zk.kill()
        states.wait_for("SUSPENDED", timeout=5)
        with pytest.raises(WorkerIdUnavailable) as err:
            reg.check()
        assert "SUSPENDED" in str(err.value)
    finally:
        own_zk.start()
        wait_serving(own_zk.extra["hosts"])
    # the same session comes back (before its timeout): still fenced until a renew
    states.wait_for("SUSPENDED", "CONNECTED", timeout=15)
    assert reg.fenced is None
    with pytest.raises(WorkerIdUnavailable) as err2:
        reg.check()
    assert "suspended" in str(err2.value)
    reg.tick()
    reg.check()
    reg.record_high_water(wall_clock_ms() + 1_000)
    reg.release()
    assert lease.worker_id == 0


def test_all_1024_worker_ids_taken(make: Factory, zk_hosts: str) -> None:
    probe = make("probe:w:0")
    with raw_client(zk_hosts) as client:
        client.ensure_path(probe.lease_dir)
        for start in range(0, 1024, 256):
            tx = client.transaction()
            for wid in range(start, start + 256):
                tx.create(probe.lease_path(wid), b"{}", ephemeral=True)
            assert all(isinstance(r, str) for r in tx.commit())
        with pytest.raises(WorkerIdUnavailable) as err:
            probe.claim()
        assert "all 1024 worker IDs are leased" in str(err.value)
        client.delete(probe.lease_path(517))
        assert probe.claim().worker_id == 517


def test_zookeeper_unreachable_refuses_the_start(make: Factory) -> None:
    reg = make("host-a:w:0", hosts=f"127.0.0.1:{services.free_port()}", connect_timeout_s=0.5)
    with pytest.raises(WorkerIdUnavailable) as err:
        reg.claim()
    assert "cache file cannot stand in" in str(err.value)


def test_renew_must_be_shorter_than_the_fence(tmp_path: Path) -> None:
    settings = _settings("127.0.0.1:1", "x", tmp_path, snowflake_lease_seconds=3,
                         snowflake_renew_seconds=2)
    with pytest.raises(ConfigurationError) as err:
        open_registry(settings, "h:n:0")
    assert err.value.field == "LEAFPOOL_SNOWFLAKE_RENEW_SECONDS"


def test_background_renew_keeps_the_lease(make: Factory, zk_hosts: str, name: str,
                                          tmp_path: Path) -> None:
    settings = _settings(zk_hosts, name, tmp_path, snowflake_lease_seconds=3,
                         snowflake_renew_seconds=0.2)
    reg = open_registry(settings, "host-a:w:0")
    assert isinstance(reg, RecycleRegistry)
    reg.claim()
    try:
        first = hw_of(zk_hosts, reg, 0)["timestamp"]
        assert isinstance(first, int)
        # bounded polling: the renew thread writes every 0.2 s; we cannot be told earlier
        services.wait_until(
            lambda: hw_of(zk_hosts, reg, 0)["timestamp"] > first, 5, "a renew")
        reg.check()
    finally:
        reg.release()
