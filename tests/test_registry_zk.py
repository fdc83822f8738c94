"""Mode zk against a real ZooKeeper: Leaf's layout, reuse after restart, the clock
checks (recorded timestamp, live peers), fencing, session expiry mid-run, ZooKeeper
down at start (cache file), one live process per identity (a reconnect that finds it held
elsewhere fences), no wrap past 1023, and 4 real processes x 200,000 IDs."""

from __future__ import annotations

import itertools
import json
import logging
import multiprocessing
import os
import shutil
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from leafpool.config import Settings, load_settings
from leafpool.errors import ClockMovedBackwards, ConfigurationError, WorkerIdUnavailable
from leafpool.pool import Pool
from leafpool.registry import LeasedGenerator, open_registry, safe_identity
from leafpool.registry.zk import ZkRegistry
from leafpool.runtime import Runtime
from leafpool.snowflake import decode, wall_clock_ms
from leafpool.snowflake_pool import SnowflakeRefiller
from leafpool.status import tag_status
from tests import services
from tests.clocks import FakeMsClock
from tests.snowflake_worker import run as run_worker
from tests.zk_helpers import StateLog, expire_session, raw_client, unique_name, wait_serving

Factory = Callable[..., ZkRegistry]


@pytest.fixture
def name() -> str:
    return unique_name()


def _settings(hosts: str, name: str, tmp_path: Path, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "snowflake_mode": "zk", "zk_hosts": hosts, "snowflake_name": name,
        "snowflake_cache_dir": str(tmp_path / "cache"),
    }
    values.update(overrides)
    return load_settings(**values)


@pytest.fixture
def make(zk_hosts: str, name: str, tmp_path: Path) -> Iterator[Factory]:
    made: list[ZkRegistry] = []

    def factory(identity: str, clock: Callable[[], int] = wall_clock_ms,
                hosts: str = zk_hosts, cache: str = "cache", **kw: object) -> ZkRegistry:
        settings_kw = {k: kw.pop(k) for k in list(kw) if k.startswith("snowflake_")}
        settings = _settings(hosts, name, tmp_path, **settings_kw)
        settings = settings.model_copy(update={"snowflake_cache_dir": str(tmp_path / cache)})
        reg = open_registry(settings, identity, clock=clock, background=False, **kw)
        assert isinstance(reg, ZkRegistry)
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
    """A ZooKeeper of its own for the tests that kill it."""
    server = services.zookeeper_server()
    wait_serving(server.extra["hosts"])
    yield server
    server.stop()


def node_data(hosts: str, path: str) -> dict[str, object]:
    with raw_client(hosts) as client:
        raw, _ = client.get(path)
    return dict(json.loads(raw))


# -- layout and reuse --------------------------------------------------------------------

def test_leaf_layout_sequence_is_the_worker_id(make: Factory, zk_hosts: str,
                                               name: str) -> None:
    a = make("host-a:celery@w1:0")
    b = make("host-b:celery@w1:0")
    assert a.claim().worker_id == 0
    assert b.claim().worker_id == 1
    with raw_client(zk_hosts) as client:
        children = sorted(client.get_children(f"/snowflake/{name}/forever"))
        temporary = sorted(client.get_children(f"/snowflake/{name}/temporary"))
    assert children == [f"{safe_identity('host-a:celery@w1:0')}-0000000000",
                        f"{safe_identity('host-b:celery@w1:0')}-0000000001"]
    assert all(c.count("-") == 1 for c in children)  # Leaf splits child names on '-'
    assert temporary == sorted(safe_identity(i) for i in ("host-a:celery@w1:0",
                                                           "host-b:celery@w1:0"))
    data = node_data(zk_hosts, f"/snowflake/{name}/forever/{children[0]}")
    assert data["ip"] == "host-a" and data["port"] == "celery@w1:0"  # Leaf's Endpoint
    assert isinstance(data["timestamp"], int) and data["timestamp"] <= wall_clock_ms()


def test_same_identity_reuses_its_worker_id_after_restart(make: Factory) -> None:
    first = make("host-a:w:0")
    assert first.claim().worker_id == 0
    make("host-b:w:0").claim()
    first.record_high_water(wall_clock_ms())
    first.release()
    again = make("host-a:w:0", cache="other-cache")  # ZooKeeper alone remembers it
    lease = again.claim()
    assert (lease.worker_id, lease.source) == (0, "zookeeper")
    assert lease.last_timestamp_ms >= first.high_water_ms


def test_record_high_water_is_durable_in_zookeeper_and_the_cache(
        make: Factory, zk_hosts: str) -> None:
    reg = make("host-a:w:0")
    reg.claim()
    target = wall_clock_ms() + 3_000
    reg.record_high_water(target)
    assert reg.node_path is not None
    assert node_data(zk_hosts, reg.node_path)["timestamp"] == target
    assert json.loads(reg.cache.path.read_text())["last_timestamp"] == target
    reg.record_high_water(target - 1000)  # never lowered
    assert node_data(zk_hosts, reg.node_path)["timestamp"] == target


def test_report_tick_writes_the_clock(make: Factory, zk_hosts: str) -> None:
    clock = FakeMsClock(wall_clock_ms())
    reg = make("host-a:w:0", clock=clock)
    reg.claim()
    clock.advance(3_000)
    reg.tick()
    assert reg.node_path is not None
    assert node_data(zk_hosts, reg.node_path)["timestamp"] == clock.now
    assert node_data(zk_hosts, reg.temp_path)["timestamp"] == clock.now
    assert json.loads(reg.cache.path.read_text())["last_timestamp"] == clock.now


# -- clock checks ------------------------------------------------------------------------

def test_clock_behind_the_recorded_timestamp_is_refused(make: Factory) -> None:
    now = wall_clock_ms()
    reg = make("host-a:w:0")
    reg.claim()
    reg.record_high_water(now + 60_000)
    path = reg.node_path
    reg.release()  # keeps the recorded window
    behind = make("host-a:w:0", clock=FakeMsClock(now + 1_000), cache="fresh-cache")
    with pytest.raises(ClockMovedBackwards) as err:
        behind.claim()
    assert err.value.worker_id == 0 and err.value.offset_ms == 59_000
    assert f"ZooKeeper {path}" in str(err.value)
    # the refused start left no live node behind: the identity can start again later
    ok = make("host-a:w:0", clock=FakeMsClock(now + 60_001), cache="fresh-cache")
    assert ok.claim().worker_id == 0


def test_clock_behind_the_cache_file_is_refused_even_with_zookeeper_up(
        make: Factory, zk_hosts: str) -> None:
    now = wall_clock_ms()
    reg = make("host-a:w:0")
    reg.claim()
    reg.record_high_water(now + 30_000)
    reg.release()
    assert reg.node_path is None
    with raw_client(zk_hosts) as client:  # ZooKeeper forgot the window (an old snapshot)
        path = f"/snowflake/{reg.name}/forever/{safe_identity('host-a:w:0')}-0000000000"
        client.set(path, json.dumps({"ip": "h", "port": "p", "timestamp": now}).encode())
    with pytest.raises(ClockMovedBackwards) as err:
        make("host-a:w:0", clock=FakeMsClock(now + 10)).claim()
    assert "cache file" in str(err.value)


def test_clock_far_from_the_live_peers_is_refused(make: Factory, zk_hosts: str,
                                                  name: str) -> None:
    make("host-a:w:0").claim()
    make("host-b:w:0").claim()
    ahead = make("host-c:w:0", clock=lambda: wall_clock_ms() + 10_000,
                 snowflake_peer_skew_ms=5_000)
    with pytest.raises(WorkerIdUnavailable) as err:
        ahead.claim()
    assert "LEAFPOOL_SNOWFLAKE_PEER_SKEW_MS=5000" in str(err.value)
    assert "2 live peers" in str(err.value)
    behind = make("host-c:w:0", clock=lambda: wall_clock_ms() - 10_000,
                  snowflake_peer_skew_ms=5_000)
    with pytest.raises(WorkerIdUnavailable):
        behind.claim()
    with raw_client(zk_hosts) as client:  # the bad clock was never written anywhere
        forever = client.get_children(f"/snowflake/{name}/forever")
        temporary = client.get_children(f"/snowflake/{name}/temporary")
    assert not any(c.startswith("host%2Dc") for c in forever + temporary)
    close = make("host-c:w:0", clock=lambda: wall_clock_ms() + 1_000,
                 snowflake_peer_skew_ms=5_000)
    assert close.claim().worker_id == 2
    assert close.peer_skew_ms is not None and 500 < close.peer_skew_ms < 1_500


# -- one process per identity, fencing ---------------------------------------------------

def test_identity_held_by_a_live_process_is_refused(make: Factory) -> None:
    make("host-a:w:0").claim()
    with pytest.raises(WorkerIdUnavailable) as err:
        make("host-a:w:0").claim()
    assert "identity in use" in str(err.value)


def test_a_foreign_write_fences_the_holder(make: Factory, zk_hosts: str) -> None:
    reg = make("host-a:w:0")
    reg.claim()
    assert reg.node_path is not None
    with raw_client(zk_hosts) as client:  # another process claimed the same identity
        client.set(reg.node_path, json.dumps({"timestamp": 1, "token": "other"}).encode())
    with pytest.raises(WorkerIdUnavailable) as err:
        reg.record_high_water(wall_clock_ms() + 1_000)
    assert "written by another process" in str(err.value)
    with pytest.raises(WorkerIdUnavailable):
        reg.check()


def test_session_expiry_mid_run_keeps_the_worker_id(make: Factory, zk_hosts: str) -> None:
    reg = make("host-a:w:0")
    gen = LeasedGenerator(reg, reg.settings, window_ms=0)
    lease = gen.start()
    before = gen.next_batch(10_000)
    assert reg.client is not None
    states = StateLog(reg.client)
    old_session = reg.client.client_id[0]
    expire_session(reg.client, zk_hosts)
    states.wait_for("LOST", "CONNECTED")
    assert reg.client.client_id[0] != old_session
    with raw_client(zk_hosts) as client:  # the ephemeral node went with the session
        assert client.exists(reg.temp_path) is None
    after = gen.next_batch(10_000)  # zk is Leaf's weak dependency: generation goes on
    reg.tick()  # the report re-creates the ephemeral node in the new session
    with raw_client(zk_hosts) as client:
        stat = client.exists(reg.temp_path)
    assert stat is not None and stat.ephemeralOwner == reg.client.client_id[0]
    assert {decode(i).worker_id for i in before + after} == {lease.worker_id}
    assert min(after) > max(before)
    assert reg.node_path is not None
    recorded = node_data(zk_hosts, reg.node_path)["timestamp"]
    assert isinstance(recorded, int)
    assert recorded >= decode(after[-1]).timestamp_ms  # high-water still written
    gen.close()


# -- one live process per identity: a second one is refused, a reconnect fences --------

def test_a_second_process_with_a_live_identity_generates_nothing_and_status_says_why(
        make: Factory, zk_hosts: str, name: str, tmp_path: Path, redis_url: str,
        pool: Pool) -> None:
    live = make("host-a:w:0")
    live.claim()
    assert live.client is not None
    # another worker process with the same identity (its own cache file), as in Celery
    settings = _settings(zk_hosts, name, tmp_path, redis_url=redis_url,
                         snowflake_cache_dir=str(tmp_path / "second-cache"))
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
            status.lease_state)
        assert status.length == 0 and status.last_refill_result == "failed: IdentityHeld"
        live.release()
        assert refiller.refill("flake").pushed > 0  # the next refill claims: holder gone
        assert tag_status(pool.snapshot("flake")).lease_state == "held (zk, from zookeeper)"
    finally:
        rt.close()


def test_a_reconnect_finding_the_identity_held_by_a_live_process_fences(
        own_zk: services.Server, name: str, tmp_path: Path, pool: Pool,
        caplog: pytest.LogCaptureFixture) -> None:
    """Started from the cache file while ZooKeeper was down; meanwhile another process
    claimed the same identity. Once ZooKeeper answers, this one stops generating for
    good, the pool keeps serving what it holds, and the log and the status say why."""
    hosts = own_zk.extra["hosts"]
    settings = _settings(hosts, name, tmp_path)
    first = open_registry(settings, "host-a:w:0", background=False)
    first.claim()
    first.release()  # its cache file is what a start without ZooKeeper uses
    pool.register("flake", "snowflake", 0)
    own_zk.kill()
    try:
        degraded = open_registry(settings, "host-a:w:0", background=False,
                                 connect_timeout_s=0.5)
        assert isinstance(degraded, ZkRegistry)
        gen = LeasedGenerator(degraded, settings, window_ms=0)
        refiller = SnowflakeRefiller(pool, gen, settings)
        assert refiller.refill("flake").pushed > 0  # generating from the cache file
        assert degraded.degraded and gen.lease is not None and gen.lease.source == "cache"
    finally:
        own_zk.start()
        wait_serving(hosts)
    held = open_registry(settings.model_copy(update={
        "snowflake_cache_dir": str(tmp_path / "other-host-cache")}), "host-a:w:0",
        background=False)
    assert isinstance(held, ZkRegistry)
    held.claim()  # another process takes the identity while this one is disconnected
    assert held.client is not None
    session = f"ZooKeeper session 0x{held.client.client_id[0]:x}"
    served = pool.snapshot("flake").length

    def fenced() -> bool:  # each tick tries ZooKeeper again (a short connect timeout)
        degraded.tick()
        return degraded.fenced is not None

    with caplog.at_level(logging.ERROR, logger="leafpool.registry"):
        services.wait_until(fenced, 30, "the reconnect fenced")
    assert degraded.fenced == f"identity held by pid {os.getpid()} on host-a, {session}"
    assert any(rec.getMessage().startswith("host-a:w:0: worker 0 fenced")
               and session in rec.getMessage() for rec in caplog.records)
    with pytest.raises(WorkerIdUnavailable) as err:
        gen.next_batch(10)
    assert "fenced: identity held by" in str(err.value)
    taken = pool.redis.lpop("leafpool:{flake}:ids", served - 10)  # clients drain it
    assert taken is not None and len(taken) == served - 10
    with pytest.raises(WorkerIdUnavailable):  # a refill is due, and refused
        refiller.refill("flake")
    status = tag_status(pool.snapshot("flake"))
    assert status.lease_state == f"fenced: {degraded.fenced}"
    assert status.length == 10  # the pool keeps serving what it holds
    held.check()  # the live holder is left alone
    held.release()
    degraded.release()


def test_an_expired_session_whose_identity_was_claimed_meanwhile_fences(
        make: Factory, zk_hosts: str) -> None:
    a = make("host-a:w:0")
    gen = LeasedGenerator(a, a.settings, window_ms=0)
    gen.start()
    gen.next_batch(100)
    assert a.client is not None
    states = StateLog(a.client)
    expire_session(a.client, zk_hosts)
    states.wait_for("LOST", "CONNECTED")
    b = make("host-a:w:0", cache="b-cache")
    b.claim()  # the identity was free: a's node went with its session
    assert b.client is not None
    a.tick()
    assert a.fenced == (f"identity held by pid {os.getpid()} on host-a, ZooKeeper session "
                        f"0x{b.client.client_id[0]:x}")
    with pytest.raises(WorkerIdUnavailable):
        gen.next_batch(10)
    b.check()


# -- no wrap past 1023 -------------------------------------------------------------------

def test_more_than_1024_nodes_is_refused_never_wrapped(make: Factory, zk_hosts: str,
                                                       name: str) -> None:
    forever = f"/snowflake/{name}/forever"
    with raw_client(zk_hosts) as client:
        client.ensure_path(forever)
        for start in range(0, 1024, 256):
            tx = client.transaction()
            for i in range(start, start + 256):
                tx.create(f"{forever}/other{i}-", b"{}", sequence=True)
            assert all(isinstance(r, str) for r in tx.commit())
    with pytest.raises(WorkerIdUnavailable) as err:
        make("host-new:w:0").claim()
    assert "1024" in str(err.value) and "never reuses" in str(err.value)
    with raw_client(zk_hosts) as client:
        children = client.get_children(forever)
    assert len(children) == 1024  # its node numbered 1024 was removed again


# -- ZooKeeper down at start -------------------------------------------------------------

def test_zookeeper_down_at_start_uses_the_cache_with_the_clock_check(
        own_zk: services.Server, name: str, tmp_path: Path) -> None:
    hosts = own_zk.extra["hosts"]
    settings = _settings(hosts, name, tmp_path, snowflake_lease_seconds=4)
    first = open_registry(settings, "host-a:w:0", background=False)
    first.claim()
    first.record_high_water(wall_clock_ms() + 2_000)
    recorded = first.high_water_ms
    first.release()
    own_zk.kill()
    try:
        behind = open_registry(settings, "host-a:w:0", background=False,
                               clock=FakeMsClock(recorded - 500), connect_timeout_s=0.5)
        with pytest.raises(ClockMovedBackwards) as err:
            behind.claim()
        assert "cache file" in str(err.value)

        clock = FakeMsClock(recorded + 10)
        reg = open_registry(settings, "host-a:w:0", background=False, clock=clock,
                            connect_timeout_s=0.5)
        assert isinstance(reg, ZkRegistry)
        lease = reg.claim()
        assert (lease.worker_id, lease.source, lease.last_timestamp_ms) == (0, "cache",
                                                                             recorded)
        assert reg.degraded
        gen = LeasedGenerator(reg, settings, clock=clock, sleep=clock.sleep, window_ms=100)
        gen.start()
        ids = gen.next_batch(5_000)
        assert decode(ids[0]).timestamp_ms > recorded and decode(ids[0]).worker_id == 0
        assert reg.pending_sync  # the high-water went to the cache file only
        cached = json.loads(reg.cache.path.read_text())["last_timestamp"]
        assert cached >= decode(ids[-1]).timestamp_ms

        no_cache = open_registry(settings.model_copy(update={
            "snowflake_cache_dir": str(tmp_path / "empty")}), "host-a:w:0",
            background=False, connect_timeout_s=0.5)
        with pytest.raises(WorkerIdUnavailable) as err2:
            no_cache.claim()
        assert "no cache file" in str(err2.value)
    finally:
        own_zk.start()
        wait_serving(own_zk.extra["hosts"])
    clock.advance(1_000)

    def synced() -> bool:  # each tick tries ZooKeeper again (a short connect timeout)
        reg.tick()
        return not reg.degraded and not reg.pending_sync

    # ZooKeeper answers again: worker ID confirmed, high-water synced
    services.wait_until(synced, 30, "worker ID confirmed in ZooKeeper")
    assert reg.node_path is not None
    assert node_data(hosts, reg.node_path)["timestamp"] >= cached
    gen.close()


def test_missing_zk_hosts_is_a_configuration_error(tmp_path: Path) -> None:
    settings = load_settings(snowflake_mode="zk", snowflake_cache_dir=str(tmp_path))
    with pytest.raises(ConfigurationError) as err:
        open_registry(settings, "h:n:0")
    assert err.value.field == "LEAFPOOL_ZK_HOSTS"


# -- real processes ----------------------------------------------------------------------

def test_four_processes_200k_ids_each_all_unique(zk_hosts: str, name: str,
                                                 tmp_path: Path) -> None:
    overrides = {"snowflake_mode": "zk", "zk_hosts": zk_hosts, "snowflake_name": name,
                 "snowflake_cache_dir": str(tmp_path / "cache")}
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    procs = []
    for i in range(4):
        out = str(tmp_path / f"ids{i}.bin")
        proc = ctx.Process(target=run_worker,
                           args=(overrides, f"host{i}:celery@w:{i}", 200_000, 20_000, out,
                                 barrier))
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

def test_shipped_zoo_cfg_starts_and_grants_the_default_lease(tmp_path: Path,
                                                             name: str) -> None:
    shipped = (services.ROOT / "ops" / "zookeeper" / "zoo.cfg").read_text()
    conf = dict(line.split("=", 1) for line in shipped.splitlines()
                if line.strip() and not line.startswith("#"))
    default_lease_ms = load_settings().snowflake_lease_seconds * 1000
    assert int(conf["minSessionTimeout"]) <= default_lease_ms <= int(conf["maxSessionTimeout"])
    assert conf["forceSync"] == "yes"
    port = services.free_port()
    local = {"dataDir": str(tmp_path / "zk"), "dataLogDir": str(tmp_path / "zk" / "log"),
             "clientPort": str(port)}
    text = "\n".join(f"{k}={local.get(k, v)}" for k, v in conf.items())
    cfg = tmp_path / "zoo.cfg"
    cfg.write_text(text + "\nclientPortAddress=127.0.0.1\n")
    (tmp_path / "zk").mkdir()
    java = shutil.which("java")
    if java is None or not Path(services.ZK_CLASSPATH[0]).exists():
        services.missing("zookeeper (Debian package) or java")
    classpath = ":".join(p for p in services.ZK_CLASSPATH if Path(p).exists())
    server = services.Server(
        "zookeeper-shipped", port, tmp_path, [
            str(java), "-Xmx256m", "-cp", classpath,
            "org.apache.zookeeper.server.quorum.QuorumPeerMain", str(cfg)],
        tmp_path / "zk.log")
    server.start(timeout=60)
    try:
        hosts = f"127.0.0.1:{port}"
        wait_serving(hosts)
        reg = open_registry(_settings(hosts, name, tmp_path), "host-a:w:0", background=False)
        assert isinstance(reg, ZkRegistry)
        assert reg.claim().worker_id == 0
        assert reg.session is not None
        assert reg.session.negotiated_s == load_settings().snowflake_lease_seconds
        reg.release()
    finally:
        server.stop()
