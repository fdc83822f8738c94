"""A database outage end to end (issue 19, items 2 and 3): ``celery -A workers worker -B``
against a real MariaDB that is killed (or stopped with SIGSTOP), plain ``LPOP`` clients
draining the pool dry meanwhile. While the tag is below its low-water mark and its
allocations fail, the refill is retried on the short bounded backoff (docs/design.md
§3.8), so the pool is refilled within 2 s of the database coming back, with the sweep an
hour away; the state says when allocations started failing and when the list went dry,
and both marks clear on recovery."""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from leafpool.segment.store import SegmentStore
from tests.support import services
from tests.support.processes import Proc, leafpool_env

pytestmark = pytest.mark.slow

RECOVERY_SECONDS = 2.0
IDS = "leafpool:{order}:ids"
STATE = "leafpool:{order}:state"


@pytest.fixture
def mariadb() -> Iterator[services.Server]:
    """A MariaDB of this test's own (it is killed or stopped)."""
    if shutil.which("mariadbd") is None and shutil.which("mysqld") is None \
            and not Path("/usr/sbin/mariadbd").exists():
        services.missing("mariadb-server")
    db = services.mariadb_server()
    try:
        yield db
    finally:
        if db.proc is not None and db.proc.poll() is None:
            os.killpg(db.proc.pid, signal.SIGCONT)  # a stopped server cannot terminate
        db.stop()


def _state(r: redis.Redis, name: str) -> str:
    raw = r.hget(STATE, name)
    return raw.decode() if raw else ""


def _failures(r: redis.Redis) -> int:
    return int(_state(r, "refill_failures") or 0)


def _drain(r: redis.Redis, served: list[int]) -> Callable[[], bool]:
    """Pop everything there is (plain LPOP, as any client); true once the list and the
    reserve are empty and the refills fail with the database down."""
    def check() -> bool:
        served.extend(int(x) for x in r.lpop(IDS, 500) or [])
        # list and reserve read in one transaction: read apart, the drop watcher could move
        # the reserve into the list between the two reads (both then read 0)
        pipe = r.pipeline(transaction=True)
        pipe.llen(IDS)
        pipe.llen("leafpool:{order}:reserve")
        ids, reserve = pipe.execute()
        return ids == 0 and reserve == 0 and bool(_state(r, "db_unreachable_ms"))
    return check


@pytest.mark.parametrize("outage", ["killed", "stopped"])
def test_the_pool_is_refilled_within_2s_of_the_database_coming_back(
    outage: str, mariadb: services.Server, redis_url: str, r: redis.Redis, tmp_path: Path
) -> None:
    store = SegmentStore.from_url(mariadb.extra["url"])
    store.init_schema()
    store.add_tag("order", step=500)
    store.engine.dispose()
    env = leafpool_env(redis_url=redis_url, database_url=mariadb.extra["url"],
                       pool_floor=1000, pool_ceiling=1000, reserve_seconds=1,
                       outage_seconds=0, watch_sweep_seconds=3600)
    log = tmp_path / "worker.log"
    worker = Proc([sys.executable, "-m", "celery", "-A", "workers", "worker", "-B",
                   "--loglevel=INFO", "-c", "2", "-s", str(tmp_path / "beat-schedule")],
                  env, log)
    try:
        services.wait_until(lambda: r.llen(IDS) >= 1000, 60, "order pool filled")
        assert mariadb.proc is not None
        if outage == "killed":
            mariadb.kill()
        else:
            os.killpg(mariadb.proc.pid, signal.SIGSTOP)
        served: list[int] = []
        services.wait_until(_drain(r, served), 120, "drained, allocations failing")
        for _ in range(100):  # clients keep asking: plain LPOPs of an empty list
            assert r.lpop(IDS) is None
        since = int(_state(r, "db_unreachable_ms"))
        # the drop watcher heard the pop that took the last ID
        services.wait_until(lambda: bool(_state(r, "dry_since_ms")), 10, "marked dry")
        if outage == "killed":  # connection refused at once: the retries run a second apart
            before = _failures(r)
            services.wait_until(lambda: _failures(r) >= before + 4, 15, "fast retries")
        else:  # each attempt waits for the driver's timeouts; one more failure at least
            before = _failures(r)
            services.wait_until(lambda: _failures(r) > before, 60, "a retry while stopped")

        if outage == "killed":
            mariadb.start(timeout=60)  # returns once the port answers
        else:
            os.killpg(mariadb.proc.pid, signal.SIGCONT)
        back = time.monotonic()
        services.wait_until(lambda: r.llen(IDS) >= 500, 30, "refilled after the outage",
                            interval=0.01)
        took = time.monotonic() - back
        print(f"\n{outage}: refilled {took:.2f} s after the database came back "
              f"(allocations had failed for {time.time() - since / 1000:.1f} s)")
        assert took < RECOVERY_SECONDS

        services.wait_until(lambda: not _state(r, "db_unreachable_ms"), 10, "mark cleared")
        assert not _state(r, "dry_since_ms") and int(_state(r, "dry_events")) >= 1
        after = [int(x) for x in r.lpop(IDS, 1000) or []]
        ids = served + after
        assert ids == sorted(set(ids))  # no repeat, in order
        # the retries while the database was down waited at most a second each
        waits = [float(w) for w in re.findall(r"Retry in ([0-9.]+)s", log.read_text())]
        assert waits and max(waits) <= 1.0
    except BaseException:
        print(f"state: {r.hgetall(STATE)}\nids: {r.llen(IDS)} "
              f"reserve: {r.llen('leafpool:{order}:reserve')}\nkeys: {sorted(r.keys('*'))}")
        print("worker log (tail):\n" + "\n".join(log.read_text().splitlines()[-80:]))
        raise
    finally:
        worker.kill()
