"""TLS to Redis (leafpool/core/tls.py, leafpool/redis/connect.py) against TLS-only
redis-servers with a throwaway CA made by ``openssl`` (tests/support/tls.py): the pools,
the clients, status and a real Celery worker and beat (pools and broker) over mutual TLS;
a server certificate from another CA, a missing client certificate and a plain URL to a
TLS port refused with an error that names the setting; Sentinel over TLS, through a
failover."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from leafpool.client import AsyncClient, Client
from leafpool.core.config import Settings, load_settings
from leafpool.core.errors import BackendUnavailable
from leafpool.redis.connect import connect
from leafpool.redis.pool import Pool
from leafpool.segment.refiller import SegmentRefiller
from leafpool.segment.store import SegmentStore
from leafpool.status import pool_status
from tests.support import services
from tests.support.processes import Proc, leafpool_env
from tests.support.servers import NotInstalled
from tests.support.tls import Pki
from tests.support.topologies import SentinelGroup, cluster, sentinel_group

TAG = "order"


@pytest.fixture(scope="module")
def tls_server(pki: Pki) -> Iterator[services.Server]:
    """TLS only, client certificates required (Redis's default)."""
    server = services.redis_server(tls_args=pki.tls_args)
    yield server
    server.stop()


@pytest.fixture
def admin(tls_server: services.Server, pki: Pki) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(tls_server.extra["url"], **{
        k: v for k, v in pki.client_options().items() if k != "ssl"})
    client.flushall()
    yield client
    client.close()


def _settings(url: str, pki: Pki, sqlite_url: str, *, mutual: bool = True,
              ca: str | None = None, **overrides: object) -> Settings:
    tls = {k.removeprefix("LEAFPOOL_").lower(): v for k, v in pki.settings_env(mutual).items()}
    if ca is not None:
        tls["redis_tls_ca_file"] = ca
    return load_settings(redis_url=url, database_url=sqlite_url, pool_floor=100,
                         pool_ceiling=100, **tls, **overrides)  # type: ignore[arg-type]


def _refiller(settings: Settings, sqlite_url: str) -> tuple[SegmentRefiller, Pool]:
    store = SegmentStore.from_url(sqlite_url)
    store.init_schema()
    if TAG not in {row.tag for row in store.list_tags()}:
        store.add_tag(TAG, step=1000)
    pool = Pool(connect(settings))
    pool.register(TAG, "segment", 0)
    return SegmentRefiller(pool, store, settings), pool


def test_the_pools_clients_and_status_work_over_mutual_tls(
    tls_server: services.Server, pki: Pki, admin: redis.Redis, sqlite_url: str
) -> None:
    settings = _settings(tls_server.extra["url"], pki, sqlite_url)
    refiller, pool = _refiller(settings, sqlite_url)
    assert refiller.refill(TAG).pushed == 100
    client = Client(settings=settings, policy="raise")
    got = [client.next_id(TAG), *client.next_ids(TAG, 49)]
    client.close()

    async def async_pops() -> list[int]:
        aclient = AsyncClient(settings=settings, policy="raise")
        try:
            return [await aclient.next_id(TAG), *await aclient.next_ids(TAG, 49)]
        finally:
            await aclient.aclose()

    got += asyncio.run(async_pops())
    assert got == sorted(set(got)) and len(got) == 100
    (status,) = pool_status(pool)
    assert status.tag == TAG and status.pushed_total == 100
    # the server has no plain port: what answered spoke TLS, with the client certificate
    assert admin.info("clients")["connected_clients"] >= 1


def test_a_server_certificate_signed_by_another_ca_is_refused_naming_the_setting(
    tls_server: services.Server, pki: Pki, sqlite_url: str
) -> None:
    settings = _settings(tls_server.extra["url"], pki, sqlite_url, ca=pki.wrong_ca)
    with pytest.raises(BackendUnavailable) as caught:
        Client(settings=settings, policy="raise").next_id(TAG)
    message = str(caught.value)
    assert "CERTIFICATE_VERIFY_FAILED" in message
    assert "LEAFPOOL_REDIS_TLS_CA_FILE" in message


def test_without_a_client_certificate_the_error_names_the_certificate_settings(
    tls_server: services.Server, pki: Pki, sqlite_url: str
) -> None:
    settings = _settings(tls_server.extra["url"], pki, sqlite_url, mutual=False)
    with pytest.raises(BackendUnavailable) as caught:
        Pool(connect(settings)).tags()
    assert "LEAFPOOL_REDIS_TLS_CERT_FILE" in str(caught.value)


def test_a_plain_url_to_a_tls_port_is_refused_suggesting_rediss(
    tls_server: services.Server, sqlite_url: str
) -> None:
    url = tls_server.extra["url"].replace("rediss://", "redis://")
    with pytest.raises(BackendUnavailable) as caught:
        Pool(connect(load_settings(redis_url=url, database_url=sqlite_url))).tags()
    assert "rediss://" in str(caught.value)


def test_leafpool_status_with_the_wrong_ca_exits_with_the_hint(
    tls_server: services.Server, pki: Pki, tmp_path: Path
) -> None:
    env = leafpool_env(home=tmp_path / "home", redis_url=tls_server.extra["url"],
                       raw=pki.settings_env() | {"LEAFPOOL_REDIS_TLS_CA_FILE": pki.wrong_ca})
    done = subprocess.run([sys.executable, "-m", "leafpool.cli", "status"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "LEAFPOOL_REDIS_TLS_CA_FILE" in done.stderr + done.stdout
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_a_celery_worker_and_beat_fill_and_refill_over_mutual_tls(
    tls_server: services.Server, pki: Pki, admin: redis.Redis, sqlite_url: str,
    tmp_path: Path
) -> None:
    """``celery -A workers worker -B`` with a ``rediss://`` URL for pools and broker (the
    broker defaults to the pools' Redis): the beat's tag sync fills the tag, pops below the
    low-water mark are refilled through the broker."""
    store = SegmentStore.from_url(sqlite_url)
    store.init_schema()
    store.add_tag(TAG, step=1000)
    env = leafpool_env(home=tmp_path / "home", redis_url=tls_server.extra["url"],
                       database_url=sqlite_url, pool_floor=100, pool_ceiling=100,
                       raw=pki.settings_env())
    worker = Proc([sys.executable, "-m", "celery", "-A", "workers", "worker", "-B",
                   "--loglevel=INFO", "-c", "1", "-s", str(tmp_path / "beat")], env,
                  tmp_path / "worker.log")
    ids_key = f"leafpool:{{{TAG}}}:ids"
    try:
        services.wait_until(lambda: admin.llen(ids_key) >= 100, 90, "the worker's first fill")
        client = Client(settings=_settings(tls_server.extra["url"], pki, sqlite_url,
                                           empty_wait_seconds=10))
        got = client.next_ids(TAG, 80)  # below the low-water mark: a refill task is queued
        services.wait_until(lambda: admin.llen(ids_key) >= 100, 60, "the refill after the drop")
        got += client.next_ids(TAG, 100)
        client.close()
    finally:
        worker.stop()
    assert got == sorted(set(got)) and len(got) == 180
    # the refill went through the broker on the same TLS-only server
    assert any(k.startswith(b"leafpool-broker:") for k in admin.scan_iter(count=1000))


@pytest.fixture(scope="module")
def tls_sentinels(pki: Pki) -> Iterator[SentinelGroup]:
    try:
        group = sentinel_group(n_replicas=1, n_sentinels=3, tls=pki)
    except NotInstalled as exc:
        services.missing(exc.what)
    yield group
    group.stop()


@pytest.mark.slow
def test_sentinel_over_tls_serves_and_follows_a_failover(
    tls_sentinels: SentinelGroup, pki: Pki, sqlite_url: str
) -> None:
    """Sentinels and data nodes speak TLS only (replication and Sentinel's own links too):
    leafpool asks the sentinels over TLS for the master, refills and pops; after a
    failover it finds the new master and goes on, every ID new."""
    group = tls_sentinels
    sentinels = ",".join(f"{h}:{p}" for h, p in group.sentinel_addrs)
    settings = _settings("rediss://127.0.0.1/0", pki, sqlite_url, redis_sentinels=sentinels)
    assert settings.redis_topology == "sentinel" and settings.broker_tls
    refiller, _pool = _refiller(settings, sqlite_url)
    assert refiller.refill(TAG).pushed == 100
    client = Client(settings=settings, policy="raise")
    got = client.next_ids(TAG, 50)
    old = group.master
    group.wait_synced()  # the pops are on the replica: this failover repeats nothing
    old.kill()
    group.wait_failover(old)
    later: list[int] = []
    deadline = time.monotonic() + 30
    while not later:  # bounded: errors while the sentinels switch the master
        assert time.monotonic() < deadline, "pops did not resume within 30 s"
        with contextlib.suppress(BackendUnavailable):
            later = client.next_ids(TAG, 50)
    client.close()
    assert group.master is not old
    got += later
    assert got == sorted(set(got)) and len(got) == 100


@pytest.mark.slow
def test_a_redis_cluster_over_tls_serves(pki: Pki, sqlite_url: str) -> None:
    """Cluster nodes that speak TLS only (the cluster bus too): leafpool reaches them by
    a ``rediss://`` URL of any node, follows the slots, refills and pops."""
    try:
        group = cluster(masters=3, replicas_per_master=0, tls=pki)
    except NotInstalled as exc:
        services.missing(exc.what)
    try:
        settings = _settings(group.url, pki, sqlite_url, redis_cluster=True,
                             broker_url="redis://127.0.0.1:1/0")
        refiller, _pool = _refiller(settings, sqlite_url)
        assert refiller.refill(TAG).pushed == 100
        client = Client(settings=settings, policy="raise")
        got = [client.next_id(TAG), *client.next_ids(TAG, 99)]
        client.close()
        assert got == sorted(set(got)) and len(got) == 100
    finally:
        group.stop()
