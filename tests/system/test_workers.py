"""End to end with real Celery workers and beat: ``celery -A workers worker|beat``."""

from __future__ import annotations

import shutil
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from celery import Celery
from sqlalchemy import text

from leafpool.segment.store import SegmentStore
from tests.support import services
from tests.support.processes import Proc, leafpool_env

pytestmark = pytest.mark.slow

CELERY = [sys.executable, "-m", "celery", "-A", "workers"]


def _has_ids(r: redis.Redis, tag: str, at_least: int = 1) -> Callable[[], bool]:
    return lambda: r.llen(f"leafpool:{{{tag}}}:ids") >= at_least


def _refills(r: redis.Redis, tag: str) -> int:
    return int(r.hget(f"leafpool:{{{tag}}}:state", "refills") or 0)


def _refilled(r: redis.Redis, tag: str, at_least: int, more_than: int = 0) -> Callable[[], bool]:
    """The list holds ``at_least`` IDs and more than ``more_than`` refills have finished.

    A refill records its completion after its last push: a list already full does not yet
    say the refill that filled it has been counted."""
    return lambda: _has_ids(r, tag, at_least)() and _refills(r, tag) > more_than


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for p in started:
        p.kill()


def worker(env: dict[str, str], log: Path, *extra: str) -> Proc:
    return Proc([*CELERY, "worker", "--loglevel=INFO", "-c", "2", *extra], env, log)


def beat(env: dict[str, str], tmp: Path) -> Proc:
    return Proc([*CELERY, "beat", "--loglevel=INFO", "-s", str(tmp / "beat-schedule")], env,
                tmp / "beat.log")


def test_pools_fill_sync_and_vanish_with_celery(
    store: SegmentStore, database_url: str, redis_url: str, r: redis.Redis, tmp_path: Path,
    procs: list[Proc],
) -> None:
    store.add_tag("order", step=1000)
    env = leafpool_env(redis_url=redis_url, database_url=database_url, sweep_seconds=0.5,
                       tag_sync_seconds=2)
    procs.append(worker(env, tmp_path / "worker.log"))
    procs.append(beat(env, tmp_path))
    # the tag sync registers 'order' and the refill fills it: bounded wait for the workers
    services.wait_until(_has_ids(r, "order", 100), 60, "order pool filled")
    first = int(r.lpop("leafpool:{order}:ids"))  # type: ignore[arg-type]
    batch = [int(x) for x in r.lpop("leafpool:{order}:ids", 100)]  # type: ignore[union-attr]
    assert first == 1 and batch == list(range(2, 102))

    with store.engine.begin() as conn:  # a tag inserted by hand, as a Leaf user would
        conn.execute(text("INSERT INTO leaf_alloc(biz_tag, max_id, step) VALUES ('pay', 7, 50)"))
    services.wait_until(_has_ids(r, "pay", 100), 60, "pay pool filled by the tag sync")
    assert int(r.lpop("leafpool:{pay}:ids")) == 7  # type: ignore[arg-type]

    with store.engine.begin() as conn:
        conn.execute(text("DELETE FROM leaf_alloc WHERE biz_tag = 'order'"))
    services.wait_until(lambda: not r.keys("leafpool:{order}:*"), 60, "order keys removed")
    assert r.sismember("leafpool:tags", "pay") and not r.sismember("leafpool:tags", "order")


def test_a_tag_already_in_the_database_fills_within_seconds_of_the_start(
    sqlite_url: str, redis_url: str, r: redis.Redis, tmp_path: Path, procs: list[Proc]
) -> None:
    """`celery -A workers worker -B` with the default tag sync interval (60 s): the beat
    syncs and sweeps once when it starts, so the first IDs do not wait for the interval."""
    store = SegmentStore.from_url(sqlite_url)
    store.init_schema()
    with store.engine.begin() as conn:  # as a Leaf user would, before anything runs
        conn.execute(text("INSERT INTO leaf_alloc(biz_tag, max_id, step) VALUES ('pay', 1, 100)"))
    env = leafpool_env(redis_url=redis_url, database_url=sqlite_url)
    assert "LEAFPOOL_TAG_SYNC_SECONDS" not in env  # the default: 60 s
    procs.append(worker(env, tmp_path / "worker.log", "-B", "-s",
                        str(tmp_path / "beat-schedule")))
    services.wait_until(_has_ids(r, "pay"), 10, "pay filled within 10 s of the start")
    assert int(r.lpop("leafpool:{pay}:ids")) == 1  # type: ignore[arg-type]


def test_a_worker_killed_mid_refill_is_redelivered_and_repeats_nothing(
    sqlite_url: str, redis_url: str, r: redis.Redis, tmp_path: Path, procs: list[Proc]
) -> None:
    store = SegmentStore.from_url(sqlite_url)
    store.init_schema()
    store.add_tag("order", step=1000)
    broker = redis_url.rsplit("/", 1)[0] + "/1"
    env = leafpool_env(redis_url=redis_url, broker_url=broker, database_url=sqlite_url,
                       chunk_size=1, pool_floor=20_000, pool_ceiling=20_000,
                       lock_ttl_ms=1000, visibility_timeout=3)
    first = worker(env, tmp_path / "worker1.log", "-c", "1")
    procs.append(first)
    sender = Celery(broker=broker)  # the worker's broker keys are under its prefix
    sender.conf.broker_transport_options = {"global_keyprefix": "leafpool-broker:"}
    # force: the redelivered refill fills to the target wherever the kill left the list
    # (without it, a kill past the low-water mark would leave nothing due)
    sender.send_task("leafpool.refill_segment", args=["order", True], queue="leafpool.segment")
    services.wait_until(_has_ids(r, "order", 500), 60, "refill under way")
    first.kill()  # SIGKILL the worker and its pool process in the middle of the refill
    interrupted_at = r.llen("leafpool:{order}:ids")
    assert 500 <= interrupted_at < 20_000
    assert r.hget("leafpool:{order}:state", "refills") is None  # it never finished
    procs.append(worker(env, tmp_path / "worker2.log", "-c", "1"))
    # acks_late: the unacknowledged task comes back after the visibility timeout
    # (with a 3 s visibility timeout a long refill may be delivered once more while it
    # runs; that second run finds the pool full or locked: harmless, as checked below)
    services.wait_until(_refilled(r, "order", 20_000), 90, "redelivered refill finished")
    ids = [int(x) for x in r.lpop("leafpool:{order}:ids", 100_000)]  # type: ignore[union-attr]
    assert ids == list(range(1, len(ids) + 1))


def test_refills_recover_on_their_own_when_the_database_returns(
    redis_url: str, r: redis.Redis, tmp_path: Path, procs: list[Proc]
) -> None:
    if shutil.which("mariadbd") is None and shutil.which("mysqld") is None:
        services.missing("mariadb-server")
    db = services.mariadb_server()
    try:
        store = SegmentStore.from_url(db.extra["url"])
        store.init_schema()
        store.add_tag("order", step=500)
        env = leafpool_env(redis_url=redis_url, database_url=db.extra["url"],
                           sweep_seconds=0.5, tag_sync_seconds=1, pool_floor=1000,
                           pool_ceiling=1000, reserve_seconds=1, refill_retry_backoff_max=2)
        procs.append(worker(env, tmp_path / "worker.log"))
        procs.append(beat(env, tmp_path))
        services.wait_until(_has_ids(r, "order", 1000), 60, "order pool filled")
        db.kill()
        served: list[int] = []

        def drained_and_failing() -> bool:
            served.extend(int(x) for x in r.lpop("leafpool:{order}:ids", 500) or [])
            return int(r.hget("leafpool:{order}:state", "refill_failures") or 0) >= 2

        # list + reserve keep serving while the database is down, then refills fail
        services.wait_until(drained_and_failing, 90, "refill failures with the database down")
        assert len(served) >= 1000
        db.start(timeout=60)
        # The database's counter once it is back: every ID at or above it comes from an
        # allocation made after the outage. While the pool is drained the refills are
        # obliged to reach such IDs (list and reserve hold only finitely many below it).
        # Waiting for a full list instead is not: a drain that stops at the low-water
        # mark (500 of 1,000) leaves nothing due.
        back = SegmentStore.from_url(db.extra["url"])
        try:
            counter = back.get_tag("order").max_id
        finally:
            back.engine.dispose()
        after: list[int] = []

        def served_above(mark: int) -> Callable[[], bool]:
            def check() -> bool:
                after.extend(int(x) for x in r.lpop("leafpool:{order}:ids", 500) or [])
                return bool(after) and after[-1] >= mark
            return check

        services.wait_until(served_above(counter), 90,
                            "IDs allocated after the database returned")
        # once the drain stops, a list below its low-water mark is due a refill
        services.wait_until(_has_ids(r, "order", 500), 90, "list back above its low-water mark")
        ids = served + after
        assert ids == sorted(set(ids))
        error = r.hget("leafpool:{order}:state", "last_error")
        assert error and b"database" in error
    finally:
        db.stop()


def test_a_second_beat_stands_by_and_takes_over_when_the_first_goes(
    redis_url: str, r: redis.Redis, tmp_path: Path, procs: list[Proc]
) -> None:
    env = leafpool_env(redis_url=redis_url, sweep_seconds=0.5,
                       database_url=f"sqlite:///{tmp_path / 'db.sqlite3'}")
    first_dir, second_dir = tmp_path / "a", tmp_path / "b"
    first_dir.mkdir()
    second_dir.mkdir()
    first = beat(env, first_dir)
    procs.append(first)
    services.wait_until(lambda: bool(r.exists("leafpool:beat:lock")), 60, "first beat's lock")
    holder = r.get("leafpool:beat:lock")
    second = beat(env, second_dir)
    procs.append(second)
    log = second_dir / "beat.log"
    services.wait_until(lambda: "ANOTHER BEAT IS RUNNING" in log.read_text(), 60,
                        "second beat standing by")
    assert r.get("leafpool:beat:lock") == holder
    killed = time.monotonic()
    first.kill()  # SIGKILL: its presence subscription goes with its connections
    services.wait_until(lambda: "holds the beat lock" in log.read_text(), 60,
                        "second beat taking over")
    took = time.monotonic() - killed
    assert r.get("leafpool:beat:lock") != holder
    # at once (docs/design.md §3.1), not once the lock's 15 s TTL ran out
    assert "taken over from the beat on" in log.read_text()
    print(f"a standby beat took over {took:.2f} s after the active one's SIGKILL")


def _presence_channel(value: bytes) -> str:
    """The presence channel a beat holding the lock with ``value`` is subscribed to."""
    return "leafpool:beat:lock:" + value.decode().split("/", 1)[0]


def test_a_beat_restarted_after_a_kill_takes_its_lock_at_once_and_sweeps(
    sqlite_url: str, redis_url: str, r: redis.Redis, tmp_path: Path, procs: list[Proc]
) -> None:
    """Issue 32: a beat SIGKILLed and restarted on the same host waited out its dead
    predecessor's lock (15 s, "ANOTHER BEAT IS RUNNING" at every try) with no sweep and
    no drop watcher meanwhile. Now the restarted beat finds the lock's holder gone (its
    presence subscription went with its process) and takes it at once: its start sweep
    and its watcher refill the tag clients drained while no beat ran."""
    store = SegmentStore.from_url(sqlite_url)
    store.init_schema()
    store.add_tag("order", step=1000)
    env = leafpool_env(redis_url=redis_url, database_url=sqlite_url, pool_floor=1000,
                       pool_ceiling=1000, watch_sweep_seconds=3600, tag_sync_seconds=3600)
    worker_log = tmp_path / "worker.log"
    procs.append(worker(env, worker_log))
    first_dir, second_dir = tmp_path / "a", tmp_path / "b"
    first_dir.mkdir()
    second_dir.mkdir()
    first = beat(env, first_dir)
    procs.append(first)
    services.wait_until(_refilled(r, "order", 1000), 60, "order filled")
    holder = r.get("leafpool:beat:lock")
    assert holder is not None
    channel = _presence_channel(holder)
    first.kill()  # SIGKILL, as in the issue
    services.wait_until(lambda: r.pubsub_numsub(channel)[0][1] == 0, 30,
                        "Redis dropping the dead beat's presence (if it had one)")
    assert r.pttl("leafpool:beat:lock") > 5_000  # its lock would hold another 5 s or more
    served = [int(x) for x in r.lpop("leafpool:{order}:ids", 1000) or []]  # drained
    sweeps = worker_log.read_text().count("Task leafpool.sweep[")
    restarted = time.monotonic()
    second = beat(env, second_dir)
    procs.append(second)
    log = second_dir / "beat.log"
    services.wait_until(lambda: r.get("leafpool:beat:lock") not in (None, holder), 60,
                        "the restarted beat holding the lock")
    locked_at = time.monotonic()
    services.wait_until(lambda: worker_log.read_text().count("Task leafpool.sweep[") > sweeps,
                        60, "the restarted beat's first sweep", interval=0.02)
    swept_at = time.monotonic()
    services.wait_until(_has_ids(r, "order", 1), 60, "the drained tag refilled",
                        interval=0.02)
    refilled_at = time.monotonic()
    text_ = log.read_text()
    assert "ANOTHER BEAT IS RUNNING" not in text_, "the restarted beat waited out the lock"
    assert f"taken over from the beat on {socket.gethostname()}" in text_
    assert f"/{socket.gethostname()}@".encode() in holder  # it had announced itself
    served += [int(x) for x in r.lpop("leafpool:{order}:ids", 100_000) or []]
    assert served == sorted(set(served))
    print(f"beat restarted after a SIGKILL: it held the lock {locked_at - restarted:.2f} s "
          f"after its start, its first sweep was received {swept_at - restarted:.2f} s "
          f"after, the drained tag had IDs again {refilled_at - restarted:.2f} s after")


def test_snowflake_pools_fill_from_worker_ids_leased_in_zookeeper(
    sqlite_url: str, redis_url: str, zk_hosts: str, r: redis.Redis, tmp_path: Path,
    procs: list[Proc],
) -> None:
    from kazoo.client import KazooClient

    from leafpool.core.snowflake_layout import decode

    store = SegmentStore.from_url(sqlite_url)
    store.init_schema()
    store.add_snowflake_tag("orderno")
    name = f"e2e{tmp_path.name[-8:].replace('-', '')}"
    env = leafpool_env(redis_url=redis_url, database_url=sqlite_url, zk_hosts=zk_hosts,
                       snowflake_mode="zk", snowflake_name=name, sweep_seconds=0.5,
                       tag_sync_seconds=1, snowflake_cache_dir=str(tmp_path / "cache"))
    procs.append(worker(env, tmp_path / "worker.log"))
    procs.append(beat(env, tmp_path))
    services.wait_until(_has_ids(r, "orderno", 100), 60, "snowflake pool filled")
    seen: list[int] = []

    def popped_enough() -> bool:  # keep popping so refills keep coming
        seen.extend(int(x) for x in r.lpop("leafpool:{orderno}:ids", 1000) or [])
        return len(seen) >= 20_000

    services.wait_until(popped_enough, 120, "20,000 snowflake IDs popped")
    assert seen == sorted(set(seen))
    workers = {decode(i).worker_id for i in seen}
    zk = KazooClient(hosts=zk_hosts)
    zk.start(timeout=20)
    try:
        nodes = zk.get_children(f"/snowflake/{name}/forever")
    finally:
        zk.stop()
    # the worker IDs in the IDs are the sequence numbers of the processes' ZooKeeper nodes
    assert workers <= {int(n.rsplit("-", 1)[1]) for n in nodes}
    state = r.hgetall("leafpool:{orderno}:state")
    assert state[b"mode"] == b"snowflake" and state[b"lease_state"].startswith(b"held (zk")


def test_a_pop_below_low_water_is_refilled_by_the_beats_watcher_without_a_sweep(
    sqlite_url: str, redis_url: str, r: redis.Redis, tmp_path: Path, procs: list[Proc]
) -> None:
    """The beat's drop watcher queues the refill task the moment a plain LPOP takes the
    list below its low-water mark: the sweep is an hour away (the beat sends one at its
    start, which fills the tag), and no client found the pool empty."""
    store = SegmentStore.from_url(sqlite_url)
    store.init_schema()
    store.add_tag("order", step=1000)
    env = leafpool_env(redis_url=redis_url, database_url=sqlite_url, pool_floor=1000,
                       pool_ceiling=1000, sweep_seconds=3600, watch_sweep_seconds=3600,
                       tag_sync_seconds=3600)
    procs.append(worker(env, tmp_path / "worker.log", "-B", "-s",
                        str(tmp_path / "beat-schedule")))
    services.wait_until(_refilled(r, "order", 1000), 60, "order filled at the start")
    refills = _refills(r, "order")
    r.lpop("leafpool:{order}:ids", 501)  # 499 left: below the low-water mark (500)
    services.wait_until(lambda: _refills(r, "order") > refills, 60, "refill after the drop")
    assert r.hget("leafpool:{order}:hits", "empty_hits") is None
    services.wait_until(_has_ids(r, "order", 1000), 60, "order full again")


def test_a_worker_rides_a_broker_restart_with_a_refill_in_flight(
    sqlite_url: str, tmp_path: Path, procs: list[Proc]
) -> None:
    """docs/design.md §3.9 with a plain Redis broker: the server is SIGKILLed and started
    again on its data while a refill is in flight (held by a write lock on its SQLite
    database), so a task is unacknowledged when the connection breaks. Celery 5.7's worker
    exited there ("Unrecoverable error: AttributeError ... 'hostname'"); now it reconnects
    and runs the next task, the same process."""
    import sqlite3

    server = services.redis_server()
    try:
        url = server.extra["url"]
        store = SegmentStore.from_url(sqlite_url)
        store.init_schema()
        store.add_tag("order", step=1000)
        store.engine.dispose()
        log = tmp_path / "worker.log"
        procs.append(worker(leafpool_env(redis_url=url, database_url=sqlite_url), log))
        sender = Celery(broker=url)
        sender.conf.broker_transport_options = {"global_keyprefix": "leafpool-broker:"}
        r = redis.Redis.from_url(url)
        writer = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), timeout=30,
                                 isolation_level=None)
        try:
            writer.execute("BEGIN IMMEDIATE")  # the refill's allocation waits behind it
            sender.send_task("leafpool.refill_segment", args=["order", True],
                             queue="leafpool.segment")
            services.wait_until(lambda: bool(r.exists("leafpool:{order}:lock")), 60,
                                "the refill running (its lock taken)")
            server.kill()
            services.wait_until(lambda: "Connection to broker lost" in log.read_text(), 30,
                                "the worker seeing its broker connection drop")
            writer.execute("ROLLBACK")
        finally:
            writer.close()
        server.start()
        before = _refills(r, "order")
        sender.send_task("leafpool.refill_segment", args=["order", True],
                         queue="leafpool.segment")
        services.wait_until(lambda: not procs[0].alive() or _refills(r, "order") > before, 90,
                            "a task sent after the restart run by the same worker")
        assert procs[0].alive(), "the worker exited on the broker's restart"
        assert "Unrecoverable error" not in log.read_text()
        r.close()
    finally:
        server.stop()
