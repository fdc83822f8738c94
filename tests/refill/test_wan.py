"""A DC that reaches its database across a WAN (mode shared, docs/design.md §12.2): MariaDB
behind tests/support/latency_proxy.py adding 50 ms each way. The refiller measures each
allocation's latency (``alloc_ms``, smoothed) and the sizing keeps the list's low-water
mark and the reserve's top-up margin above rate x latency x ALLOC_LATENCY_FACTOR; over a
local database the sizing is as before."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import pytest
import redis

from leafpool.core.config import Settings
from leafpool.redis.pool import Pool
from leafpool.refill.sizing import ALLOC_LATENCY_FACTOR, latency_cover
from leafpool.segment.refiller import SegmentRefiller
from leafpool.segment.store import SegmentStore
from tests.support import services
from tests.support.clocks import FakeWallClock
from tests.support.latency_proxy import LatencyProxy

DELAY_MS = 50


@pytest.fixture
def wan(mariadb_server: services.Server) -> Iterator[LatencyProxy]:
    proxy = LatencyProxy(mariadb_server.port, delay_ms=DELAY_MS).open()
    yield proxy
    proxy.stop()


def through(url: str, server: services.Server, proxy: LatencyProxy) -> str:
    direct = f"127.0.0.1:{server.port}/"
    assert direct in url
    return url.replace(direct, f"127.0.0.1:{proxy.port}/")


def _drive(refiller: SegmentRefiller, r: redis.Redis, clock: FakeWallClock,
           rate: int) -> float:
    """Three seconds (fake) of ``rate`` IDs/s popped, a forced refill after each; the
    smoothed allocation latency (seconds) the last refill was sized by."""
    refiller.refill("order", force=True)
    latency = 0.0
    for _ in range(3):
        clock.advance(1.0)
        assert len(r.lpop("leafpool:{order}:ids", rate) or []) == rate
        latency = refiller.pool.snapshot("order").float("alloc_ms") / 1000
        refiller.refill("order", force=True)
    return latency


@pytest.mark.parametrize("path", ["wan", "local"])
def test_the_sizing_covers_the_measured_allocation_latency(
    path: str, request: pytest.FixtureRequest, mysql_url: str,
    mariadb_server: services.Server, pool: Pool, r: redis.Redis,
    make_settings: Callable[..., Settings],
) -> None:
    rate = 5000
    url = mysql_url
    if path == "wan":
        url = through(mysql_url, mariadb_server, request.getfixturevalue("wan"))
    store = SegmentStore.from_url(url)
    store.init_schema()
    store.add_tag("order", step=10_000)
    settings = make_settings(database_url=url, pool_floor=rate, pool_ceiling=10**6,
                             chunk_size=10_000, pool_seconds=2, reserve_seconds=2,
                             outage_seconds=0, low_water_ratio=0.5, burst_sizing=False)
    clock = FakeWallClock()
    latency = _drive(SegmentRefiller(pool, store, settings, wall=clock), r, clock, rate)
    state = pool.snapshot("order").state
    sized = float(state["sizing_rate"])
    assert sized == pytest.approx(rate, rel=0.05)
    target, low_water = int(state["target"]), int(state["low_water"])
    reserve_target = int(state["reserve_target"])
    cover = latency_cover(sized, latency)
    print(f"{path}: alloc_ms {state['alloc_ms']} (last {state['last_alloc_ms']}), "
          f"target {target}, low_water {low_water}, reserve_target {reserve_target}, "
          f"cover {cover:.0f}")
    if path == "wan":
        # a transaction is at least a round trip (BEGIN is sent with the first query):
        # the lock read, the retired mark, the update, the commit: 4 x 100 ms at least
        assert latency >= 0.4
        assert low_water >= cover  # the refill's allocations fit before the list is dry
        assert reserve_target // 2 >= cover  # the top-up's allocations fit in its margin
        assert target > math.ceil(sized * settings.pool_seconds)  # the latency raised it
        assert target == math.ceil(sized * latency * ALLOC_LATENCY_FACTOR / 0.5)
    else:  # a local database: as before the latency was measured (under 250 ms: 4 x it
        # is under the low-water mark's 1 s of the 2 s list)
        assert latency < 0.25
        assert target == math.ceil(sized * settings.pool_seconds)
        assert low_water == math.ceil(target * 0.5)
        assert reserve_target == math.ceil(sized * settings.reserve_seconds)
    store.engine.dispose()
