"""A DC cut off from the one database (mode shared, docs/design.md §12.2), end to end:
``celery -A workers worker -B`` reaches MariaDB through tests/support/latency_proxy.py (50
ms each way); the link is cut while clients drain the pool. Once list and reserve are
gone, every client (leafpool.client with each empty policy, the HTTP API) is told that
the pool is empty because the database has been unreachable since when; the link comes
back and the pool is refilled within 2 s (the fast retry of §3.8), over the WAN."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from starlette.testclient import TestClient

from leafpool.client import Client
from leafpool.core.config import Settings
from leafpool.core.errors import PoolEmptyDatabaseUnreachable
from leafpool.http import create_app
from leafpool.segment.store import SegmentStore
from tests.support import services
from tests.support.latency_proxy import LatencyProxy
from tests.support.processes import Proc, leafpool_env

pytestmark = pytest.mark.slow

RECOVERY_SECONDS = 2.0
IDS = "leafpool:{order}:ids"
STATE = "leafpool:{order}:state"


@pytest.fixture
def wan(mariadb_server: services.Server) -> Iterator[LatencyProxy]:
    proxy = LatencyProxy(mariadb_server.port, delay_ms=50).open()
    yield proxy
    proxy.stop()


def _state(r: redis.Redis, name: str) -> str:
    raw = r.hget(STATE, name)
    return raw.decode() if isinstance(raw, bytes) else ""


def _failures(r: redis.Redis) -> int:
    return int(_state(r, "refill_failures") or 0)


def test_a_dc_cut_off_says_since_when_and_recovers_within_2s_of_the_link(
    wan: LatencyProxy, mysql_url: str, mariadb_server: services.Server, redis_url: str,
    r: redis.Redis, make_settings: Callable[..., Settings], tmp_path: Path,
) -> None:
    url = mysql_url.replace(f"127.0.0.1:{mariadb_server.port}/", f"127.0.0.1:{wan.port}/")
    store = SegmentStore.from_url(url)
    store.init_schema()
    store.add_tag("order", step=500)
    store.engine.dispose()
    env = leafpool_env(redis_url=redis_url, database_url=url, pool_floor=1000,
                       pool_ceiling=1000, reserve_seconds=1, outage_seconds=0,
                       watch_sweep_seconds=3600)
    log = tmp_path / "worker.log"
    worker = Proc([sys.executable, "-m", "celery", "-A", "workers", "worker", "-B",
                   "--loglevel=INFO", "-c", "2", "-s", str(tmp_path / "beat-schedule")],
                  env, log)
    clients = {policy: Client(settings=make_settings(), policy=policy, wait_seconds=0.2)
               for policy in ("raise", "wait", "reserve")}
    served: list[int] = []
    try:
        services.wait_until(lambda: r.llen(IDS) >= 1000, 60, "order pool filled")
        cut_ms = int(time.time() * 1000)
        wan.cut()

        def drained() -> bool:
            served.extend(int(x) for x in r.lpop(IDS, 500) or [])
            return (r.llen(IDS) == 0 and r.llen("leafpool:{order}:reserve") == 0
                    and bool(_state(r, "db_unreachable_ms")))

        services.wait_until(drained, 120, "drained, allocations failing")
        since = int(_state(r, "db_unreachable_ms"))
        assert since >= cut_ms
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(since / 1000))
        for policy, client in clients.items():
            with pytest.raises(PoolEmptyDatabaseUnreachable) as caught:
                client.next_id("order")
            assert caught.value.db_unreachable_ms == since, policy
            assert f"the database has been unreachable since {stamp}Z" in str(caught.value)
        with TestClient(create_app(make_settings(empty_wait_seconds=0.2))) as http:
            for path in ("/api/segment/get/order", "/api/segment/ids/order?count=3"):
                resp = http.get(path)
                assert resp.status_code == 503, path
                assert f"pool empty after waiting 0.200s: the database has been " \
                       f"unreachable since {stamp}Z" in resp.text, path

        # the retry chain runs (the fast retry of §3.8: a few attempts, refused at once)
        before = _failures(r)
        services.wait_until(lambda: _failures(r) >= before + 3, 30, "fast retries")

        wan.restore()
        back = time.monotonic()
        services.wait_until(lambda: r.llen(IDS) >= 500, 30, "refilled after the link",
                            interval=0.01)
        took = time.monotonic() - back
        print(f"\nrefilled {took:.2f} s after the link came back (50 ms each way; "
              f"allocations had failed for {time.time() - since / 1000:.1f} s)")
        assert took < RECOVERY_SECONDS
        for client in clients.values():
            served.append(client.next_id("order"))
        served.extend(int(x) for x in r.lpop(IDS, 1000) or [])
        assert served == sorted(set(served))  # no repeat, in order
    except BaseException:
        print(f"state: {r.hgetall(STATE)}")
        print("worker log (tail):\n" + "\n".join(log.read_text().splitlines()[-60:]))
        raise
    finally:
        for client in clients.values():
            client.close()
        worker.kill()
