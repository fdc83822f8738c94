"""Mode zk against a real ZooKeeper, what only it does: Leaf's layout, the report to the
ephemeral node, the clock check against the live peers, session expiry mid-run, ZooKeeper
down at start (cache file) and back, one live process per identity (a second one is
refused with a status that says why, a reconnect that finds the identity held elsewhere
fences), no wrap past 1023, 4 real processes x 200,000 IDs, the shipped zoo.cfg. What
every mode does is in tests/snowflake/registry/test_contract.py."""

from __future__ import annotations

import itertools
import json
import logging
import multiprocessing
import os
from array import array
from pathlib import Path

import pytest

from leafpool.core.config import load_settings
from leafpool.core.errors import ClockMovedBackwards, WorkerIdUnavailable
from leafpool.core.snowflake_layout import decode, wall_clock_ms
from leafpool.redis.pool import Pool
from leafpool.runtime import Runtime
from leafpool.snowflake.refiller import SnowflakeRefiller
from leafpool.snowflake.registry import LeasedGenerator, open_registry, safe_identity
from leafpool.snowflake.registry.zk import ZkRegistry
from leafpool.status import tag_status
from tests.support import registries, servers, services
from tests.support.clocks import FakeMsClock
from tests.support.registries import ZkBackend
from tests.support.snowflake_worker import run as run_worker
from tests.support.zk_helpers import (
    StateLog,
    expire_session,
    own_zk_fixture,
    raw_client,
    restart,
    wait_serving,
)

zk = registries.fixture("zk")


own_zk = own_zk_fixture()


# -- layout ------------------------------------------------------------------------------


def test_leaf_layout_sequence_is_the_worker_id(zk: ZkBackend) -> None:
    a = zk.open("host-a:celery@w1:0", wall_clock_ms)
    b = zk.open("host-b:celery@w1:0", wall_clock_ms)
    assert a.claim().worker_id == 0
    assert b.claim().worker_id == 1
    children = sorted(zk.zk.get_children(f"/snowflake/{zk.name}/forever"))
    temporary = sorted(zk.zk.get_children(f"/snowflake/{zk.name}/temporary"))
    assert children == [
        f"{safe_identity('host-a:celery@w1:0')}-0000000000",
        f"{safe_identity('host-b:celery@w1:0')}-0000000001",
    ]
    assert all(c.count("-") == 1 for c in children)  # Leaf splits child names on '-'
    assert temporary == sorted(
        safe_identity(i) for i in ("host-a:celery@w1:0", "host-b:celery@w1:0")
    )
    data = zk.data(f"/snowflake/{zk.name}/forever/{children[0]}")
    assert data["ip"] == "host-a" and data["port"] == "celery@w1:0"  # Leaf's Endpoint
    assert isinstance(data["timestamp"], int) and data["timestamp"] <= wall_clock_ms()
    live = zk.data(a.temp_path)
    assert (live["pid"], live["token"]) == (os.getpid(), a.token)


def test_report_tick_writes_the_clock_to_the_ephemeral_node(zk: ZkBackend) -> None:
    clock = FakeMsClock(wall_clock_ms())
    reg = zk.open("host-a:w:0", clock)
    reg.claim()
    clock.advance(3_000)
    reg.tick()
    assert zk.data(reg.temp_path)["timestamp"] == clock.now  # what the peers compare


# -- the clock against the live peers ----------------------------------------------------


def test_clock_far_from_the_live_peers_is_refused(zk: ZkBackend) -> None:
    zk.open("host-a:w:0", wall_clock_ms).claim()
    zk.open("host-b:w:0", wall_clock_ms).claim()
    ahead = zk.open("host-c:w:0", lambda: wall_clock_ms() + 10_000, snowflake_peer_skew_ms=5_000)
    with pytest.raises(WorkerIdUnavailable) as err:
        ahead.claim()
    assert "LEAFPOOL_SNOWFLAKE_PEER_SKEW_MS=5000" in str(err.value)
    assert "2 live peers" in str(err.value)
    behind = zk.open("host-c:w:0", lambda: wall_clock_ms() - 10_000, snowflake_peer_skew_ms=5_000)
    with pytest.raises(WorkerIdUnavailable):
        behind.claim()
    forever = zk.zk.get_children(f"/snowflake/{zk.name}/forever")
    temporary = zk.zk.get_children(f"/snowflake/{zk.name}/temporary")
    assert not any(c.startswith("host%2Dc") for c in forever + temporary)  # nothing written
    close = zk.open("host-c:w:0", lambda: wall_clock_ms() + 1_000, snowflake_peer_skew_ms=5_000)
    assert close.claim().worker_id == 2
    assert close.peer_skew_ms is not None and 500 < close.peer_skew_ms < 1_500


# -- session expiry ----------------------------------------------------------------------


def test_session_expiry_mid_run_keeps_the_worker_id(zk: ZkBackend) -> None:
    reg = zk.open("host-a:w:0", wall_clock_ms)
    gen = LeasedGenerator(reg, reg.settings, window_ms=0)
    lease = gen.start()
    before = gen.next_batch(10_000)
    assert reg.client is not None
    states = StateLog(reg.client)
    old_session = reg.client.client_id[0]
    expire_session(reg.client, zk.hosts)
    states.wait_for("LOST", "CONNECTED")
    assert reg.client.client_id[0] != old_session
    assert zk.zk.exists(reg.temp_path) is None  # the ephemeral node went with the session
    after = gen.next_batch(10_000)  # zk is Leaf's weak dependency: generation goes on
    reg.tick()  # the report re-creates the ephemeral node in the new session
    stat = zk.zk.exists(reg.temp_path)
    assert stat is not None and stat.ephemeralOwner == reg.client.client_id[0]
    assert {decode(i).worker_id for i in before + after} == {lease.worker_id}
    assert min(after) > max(before)
    assert zk.mark(reg, lease.worker_id) >= decode(after[-1]).timestamp_ms  # still written
    gen.close()


def test_an_expired_session_whose_identity_was_claimed_meanwhile_fences(zk: ZkBackend) -> None:
    a = zk.open("host-a:w:0", wall_clock_ms)
    gen = LeasedGenerator(a, a.settings, window_ms=0)
    gen.start()
    gen.next_batch(100)
    assert a.client is not None
    states = StateLog(a.client)
    expire_session(a.client, zk.hosts)
    states.wait_for("LOST", "CONNECTED")
    b = zk.open("host-a:w:0", wall_clock_ms, cache="b-cache")
    b.claim()  # the identity was free: a's node went with its session
    assert b.client is not None
    a.tick()
    assert a.fenced == (
        f"identity held by pid {os.getpid()} on host-a, ZooKeeper session "
        f"0x{b.client.client_id[0]:x}"
    )
    with pytest.raises(WorkerIdUnavailable):
        gen.next_batch(10)
    b.check()


# -- one live process per identity: a second one is refused, a reconnect fences --------


def test_a_second_process_with_a_live_identity_generates_nothing_and_status_says_why(
    zk: ZkBackend, tmp_path: Path, redis_url: str, pool: Pool
) -> None:
    live = zk.open("host-a:w:0", wall_clock_ms)
    live.claim()
    assert live.client is not None
    # another worker process with the same identity (its own cache file), as in Celery
    settings = zk.settings("second-cache", redis_url=redis_url)
    rt = Runtime(settings, identity="host-a:w:0")
    try:
        refiller = rt.snowflake_refiller()
        pool.register("flake", "snowflake", 0)
        with pytest.raises(WorkerIdUnavailable) as err:
            refiller.refill("flake")
        assert "identity in use" in str(err.value)
        status = tag_status(pool.snapshot("flake"))
        assert status.lease_state.startswith("unavailable: host-a:w:0: identity in use")
        session = live.client.client_id[0]
        assert f"held by pid {os.getpid()} on host-a, ZooKeeper session 0x{session:x}" in (
            status.lease_state
        )
        assert status.length == 0 and status.last_refill_result == "failed: IdentityHeld"
        live.release()
        assert refiller.refill("flake").pushed > 0  # the next refill claims: holder gone
        assert tag_status(pool.snapshot("flake")).lease_state == "held (zk, from zookeeper)"
    finally:
        rt.close()


def test_a_reconnect_finding_the_identity_held_by_a_live_process_fences(
    own_zk: services.Server, zk: ZkBackend, pool: Pool, caplog: pytest.LogCaptureFixture
) -> None:
    """Started from the cache file while ZooKeeper was down; meanwhile another process
    claimed the same identity. Once ZooKeeper answers, this one stops generating for
    good, the pool keeps serving what it holds, and the log and the status say why."""
    hosts = own_zk.extra["hosts"]
    first = zk.open("host-a:w:0", wall_clock_ms, zk_hosts=hosts)
    first.claim()
    first.release()  # its cache file is what a start without ZooKeeper uses
    pool.register("flake", "snowflake", 0)
    own_zk.kill()
    try:
        degraded = zk.open("host-a:w:0", wall_clock_ms, zk_hosts=hosts, connect_timeout_s=0.5)
        gen = LeasedGenerator(degraded, degraded.settings, window_ms=0)
        refiller = SnowflakeRefiller(pool, gen, degraded.settings)
        assert refiller.refill("flake").pushed > 0  # generating from the cache file
        assert degraded.degraded and gen.lease is not None and gen.lease.source == "cache"
    finally:
        restart(own_zk)
    held = zk.open("host-a:w:0", wall_clock_ms, zk_hosts=hosts, cache="other-host-cache")
    held.claim()  # another process takes the identity while this one is disconnected
    assert held.client is not None
    session = f"ZooKeeper session 0x{held.client.client_id[0]:x}"
    served = pool.snapshot("flake").length

    def fenced() -> bool:  # each tick tries ZooKeeper again (a short connect timeout)
        degraded.tick()
        return degraded.fenced is not None

    with caplog.at_level(logging.ERROR, logger="leafpool.snowflake.registry"):
        services.wait_until(fenced, 30, "the reconnect fenced")
    assert degraded.fenced == f"identity held by pid {os.getpid()} on host-a, {session}"
    assert any(
        rec.getMessage().startswith("host-a:w:0: worker 0 fenced") and session in rec.getMessage()
        for rec in caplog.records
    )
    with pytest.raises(WorkerIdUnavailable) as err:
        gen.next_batch(10)
    assert "fenced: identity held by" in str(err.value)
    reserved = pool.snapshot("flake").reserve_size
    taken = pool.redis.lpop("leafpool:{flake}:ids", served - 10)  # clients drain it
    assert taken is not None and len(taken) == served - 10
    with pytest.raises(WorkerIdUnavailable):  # a refill is due: its top-up is refused
        refiller.refill("flake")
    snap = pool.snapshot("flake")
    status = tag_status(snap)
    assert status.lease_state == f"fenced: {degraded.fenced}"
    # the pool keeps serving what it holds: the list filled from the reserve generated
    # before, nothing generated since
    assert status.length > 10 and status.length + snap.reserve_size == 10 + reserved
    held.check()  # the live holder is left alone


# -- no wrap past 1023 -------------------------------------------------------------------


def test_more_than_1024_nodes_is_refused_never_wrapped(zk: ZkBackend) -> None:
    forever = f"/snowflake/{zk.name}/forever"
    zk.zk.ensure_path(forever)
    for start in range(0, 1024, 256):
        tx = zk.zk.transaction()
        for i in range(start, start + 256):
            tx.create(f"{forever}/other{i}-", b"{}", sequence=True)
        assert all(isinstance(r, str) for r in tx.commit())
    with pytest.raises(WorkerIdUnavailable) as err:
        zk.open("host-new:w:0", wall_clock_ms).claim()
    assert "1024" in str(err.value) and "never reuses" in str(err.value)
    assert len(zk.zk.get_children(forever)) == 1024  # its node numbered 1024 was removed


# -- ZooKeeper down at start -------------------------------------------------------------


def test_zookeeper_down_at_start_uses_the_cache_with_the_clock_check(
    own_zk: services.Server, zk: ZkBackend
) -> None:
    hosts = own_zk.extra["hosts"]
    first = zk.open("host-a:w:0", wall_clock_ms, zk_hosts=hosts, snowflake_lease_seconds=4)
    first.claim()
    first.record_high_water(wall_clock_ms() + 2_000)
    recorded = first.high_water_ms
    first.release()
    own_zk.kill()
    try:
        behind = zk.open(
            "host-a:w:0", FakeMsClock(recorded - 500), zk_hosts=hosts, connect_timeout_s=0.5
        )
        with pytest.raises(ClockMovedBackwards) as err:
            behind.claim()
        assert "cache file" in str(err.value)

        clock = FakeMsClock(recorded + 10)
        reg = zk.open("host-a:w:0", clock, zk_hosts=hosts, connect_timeout_s=0.5)
        lease = reg.claim()
        assert (lease.worker_id, lease.source, lease.last_timestamp_ms) == (0, "cache", recorded)
        assert reg.degraded
        gen = LeasedGenerator(reg, reg.settings, clock=clock, sleep=clock.sleep, window_ms=100)
        gen.start()
        ids = gen.next_batch(5_000)
        assert decode(ids[0]).timestamp_ms > recorded and decode(ids[0]).worker_id == 0
        assert reg.pending_sync  # the high-water went to the cache file only
        cached = json.loads(reg.cache.path.read_text())["last_timestamp"]
        assert cached >= decode(ids[-1]).timestamp_ms
    finally:
        restart(own_zk)
    clock.advance(1_000)

    def synced() -> bool:  # each tick tries ZooKeeper again (a short connect timeout)
        reg.tick()
        return not reg.degraded and not reg.pending_sync

    # ZooKeeper answers again: worker ID confirmed, high-water synced
    services.wait_until(synced, 30, "worker ID confirmed in ZooKeeper")
    assert reg.node_path is not None
    with raw_client(hosts) as client:
        assert json.loads(client.get(reg.node_path)[0])["timestamp"] >= cached
    gen.close()


# -- real processes ----------------------------------------------------------------------


def test_four_processes_200k_ids_each_all_unique(zk: ZkBackend, tmp_path: Path) -> None:
    overrides = {
        "snowflake_mode": "zk",
        "zk_hosts": zk.hosts,
        "snowflake_name": zk.name,
        "snowflake_cache_dir": str(tmp_path / "cache"),
    }
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    procs = []
    for i in range(4):
        out = str(tmp_path / f"ids{i}.bin")
        proc = ctx.Process(
            target=run_worker,
            args=(overrides, f"host{i}:celery@w:{i}", 200_000, 20_000, out, barrier),
        )
        proc.start()
        procs.append((proc, out))
    all_ids: list[int] = []
    worker_ids = set()
    for proc, out in procs:
        proc.join(60)
        assert proc.exitcode == 0, f"worker process failed ({proc.exitcode})"
        values = array("q")
        with open(out, "rb") as fh:
            values.frombytes(fh.read())
        worker_id, ids = values[0], values[1:].tolist()
        assert len(ids) == 200_000
        assert all(a < b for a, b in itertools.pairwise(ids))
        assert {decode(i).worker_id for i in ids[::997]} == {worker_id}
        worker_ids.add(worker_id)
        all_ids.extend(ids)
    assert worker_ids == {0, 1, 2, 3}
    assert len(all_ids) == 800_000 and len(set(all_ids)) == 800_000


# -- the shipped ZooKeeper configuration -------------------------------------------------


def test_shipped_zoo_cfg_starts_and_grants_the_default_lease(tmp_path: Path) -> None:
    shipped = (services.ROOT / "ops" / "zookeeper" / "zoo.cfg").read_text()
    conf = dict(
        line.split("=", 1)
        for line in shipped.splitlines()
        if line.strip() and not line.startswith("#")
    )
    default_lease_ms = load_settings().snowflake_lease_seconds * 1000
    assert int(conf["minSessionTimeout"]) <= default_lease_ms <= int(conf["maxSessionTimeout"])
    assert conf["forceSync"] == "yes"
    port = services.free_port()
    local = {
        "dataDir": str(tmp_path / "zk"),
        "dataLogDir": str(tmp_path / "zk" / "log"),
        "clientPort": str(port),
    }
    text = "\n".join(f"{k}={local.get(k, v)}" for k, v in conf.items())
    cfg = tmp_path / "zoo.cfg"
    cfg.write_text(text + "\nclientPortAddress=127.0.0.1\n")
    (tmp_path / "zk").mkdir()
    try:
        argv = servers.zookeeper_argv(cfg)
    except servers.NotInstalled as exc:
        services.missing(exc.what)
    server = services.Server(
        "zookeeper-shipped",
        port,
        tmp_path,
        argv,
        tmp_path / "zk.log",
    )
    server.start(timeout=60)
    try:
        hosts = f"127.0.0.1:{port}"
        wait_serving(hosts)
        settings = load_settings(
            snowflake_mode="zk",
            zk_hosts=hosts,
            snowflake_name="t",
            snowflake_cache_dir=str(tmp_path / "cache"),
            # the shipped config closes a session that does not log in (enforce.auth)
            zk_username="leafpool",
            zk_password="shipped-cfg-test",
        )
        reg = open_registry(settings, "host-a:w:0", background=False)
        assert isinstance(reg, ZkRegistry)
        assert reg.claim().worker_id == 0
        assert reg.session is not None
        assert reg.session.negotiated_s == load_settings().snowflake_lease_seconds
        reg.release()
    finally:
        server.stop()
