"""leafpool on a real Redis Cluster (3 masters with 2 replicas each, on loopback): 30 tags spread
over the masters, tag sync, refills, sweep, status and the client with pops every replica
acknowledged (``LEAFPOOL_POP_REPLICAS=all``, docs/design.md §7.1); a master killed during
pops, a replica promoted, the killed node restarted as a supervisor would (it rejoins as
a replica: pops on its slots wait for it), and no ID handed out twice."""

from __future__ import annotations

import contextlib
import itertools
import time
from typing import TYPE_CHECKING

import pytest

from leafpool.client import Client
from leafpool.core.config import Settings, load_settings
from leafpool.core.errors import BackendUnavailable
from leafpool.housekeeping.sweep import sweep
from leafpool.housekeeping.sync import sync_tags
from leafpool.redis.connect import connect, is_cluster
from leafpool.runtime import Runtime
from leafpool.segment.refiller import SegmentRefiller
from leafpool.segment.store import SegmentStore
from leafpool.status import pool_status

if TYPE_CHECKING:
    from tests.support import topologies as t
    from tests.support.topology_fixtures import Topologies

pytest_plugins = ["tests.support.topology_fixtures"]
pytestmark = pytest.mark.timeout(180)

TAGS = [f"t{n}" for n in range(30)]


def _settings(cluster: t.Cluster, sqlite_url: str, **extra: object) -> Settings:
    values: dict[str, object] = {
        "redis_url": cluster.url, "redis_cluster": True, "database_url": sqlite_url,
        "broker_url": "redis://127.0.0.1:1/0", "pool_floor": 200, "pool_ceiling": 200,
        "reserve_seconds": 1, "empty_wait_seconds": 2, "pop_wait_ms": 500}
    values.update(extra)
    return load_settings(**values)


def test_pools_on_a_cluster_survive_a_master_failover_without_a_repeat(
    topologies: Topologies, sqlite_url: str
) -> None:
    cluster = topologies.cluster(3, 2)  # a promoted replica still has one to acknowledge pops
    settings = _settings(cluster, sqlite_url)
    with pytest.raises(Exception, match="LEAFPOOL_BROKER_URL"):
        load_settings(redis_url=cluster.url, redis_cluster=True, database_url=sqlite_url)
    rt = Runtime(settings)
    assert is_cluster(rt.redis)
    store = SegmentStore.from_url(sqlite_url)
    store.init_schema()
    for tag in TAGS:
        store.add_tag(tag, step=100)
    assert sorted(sync_tags(rt.pool, store).added) == sorted(TAGS)
    assert {tag for tag, _, _ in sweep(rt.pool, 5)} == set(TAGS)
    refiller = SegmentRefiller(rt.pool, store, settings)
    for tag in TAGS:
        refiller.refill(tag)

    statuses = pool_status(rt.pool)
    assert [s.length for s in statuses] == [200] * 30
    nodes = {s.redis_node for s in statuses}
    assert len(nodes) == 3, nodes  # status says which master serves each tag

    client = Client(connect(settings), settings=settings.model_copy(
        update={"pop_replicas": "all"}))
    assert client.pool.acks == 2
    handed_out = {tag: client.next_ids(tag, 5) for tag in TAGS}

    victim = cluster.masters()[0]
    cluster.kill_master(victim)
    killed = time.monotonic()
    cluster.wait_promotion(victim, timeout=30)
    victim.restart()  # its supervisor: it rejoins as a replica of the promoted node
    resumed_after = None
    for tag in itertools.cycle(TAGS):  # bounded: pops resume once the cluster is ok
        assert time.monotonic() - killed < 60, "pops did not resume within 60 s"
        with contextlib.suppress(BackendUnavailable):
            handed_out[tag] += client.next_ids(tag, 5)
            if resumed_after is None and all(len(v) >= 10 for v in handed_out.values()):
                resumed_after = time.monotonic() - killed
                break
    # every tag's IDs were handed out once each, in order, across the failover
    for tag, ids in handed_out.items():
        assert ids == sorted(ids) and len(ids) == len(set(ids)), (tag, ids)
    print(f"cluster: pops on all 30 tags resumed {resumed_after:.1f} s after the SIGKILL")


def test_the_http_service_metrics_status_page_and_beat_lock_work_on_a_cluster(
    topologies: Topologies, sqlite_url: str
) -> None:
    from starlette.testclient import TestClient

    from leafpool.http import create_app
    from leafpool.metrics import make_registry, render

    cluster = topologies.cluster(3, 1)
    settings = _settings(cluster, sqlite_url)
    rt = Runtime(settings)
    store = SegmentStore.from_url(sqlite_url)
    store.init_schema()
    for tag in TAGS[:6]:
        store.add_tag(tag, step=100)
    sync_tags(rt.pool, store)
    refiller = SegmentRefiller(rt.pool, store, settings)
    for tag in TAGS[:6]:
        refiller.refill(tag)
    with TestClient(create_app(settings)) as http:
        assert [http.get(f"/api/segment/get/{tag}").text.strip() for tag in TAGS[:6]] == \
            ["1"] * 6
        page = http.get("/cache")
        assert page.status_code == 200 and all(tag in page.text for tag in TAGS[:6])
        metrics = http.get("/metrics").text
    assert "leafpool_up 1.0" in metrics
    assert render(make_registry(rt.pool)).decode().count("leafpool_pool_ids{") == 6
    first, second = rt.pool.beat_lock(15), rt.pool.beat_lock(15)
    assert first.acquire() and not second.acquire()  # one active beat on a cluster too
    first.release()
