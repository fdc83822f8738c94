"""The Redis roles (leafpool/redis/acl.py, docs/design.md §1.2) loaded into a real
redis-server from an ACL file, as ``leafpool redis acl`` prints it: every part of leafpool
works under its role and Redis logs no denial; an application holding the ``app`` role
tries every command its ACL allows on every pool key and cannot hand out an ID twice, make
a refill fail or keep a pool empty; what it may not send is refused."""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from leafpool.client import AsyncClient, Client
from leafpool.core.config import load_settings
from leafpool.core.errors import ConfigurationError, PoolEmpty
from leafpool.housekeeping.sweep import sweep
from leafpool.housekeeping.sync import sync_tags
from leafpool.housekeeping.watch import DropWatcher
from leafpool.metrics import make_registry, render
from leafpool.redis import acl, scripts
from leafpool.redis.connect import connect
from leafpool.redis.pool import Pool
from leafpool.segment.refiller import SegmentRefiller
from leafpool.segment.store import SegmentStore
from leafpool.status import pool_status
from tests.support import services
from tests.support.processes import Proc, leafpool_env

TAG = "order"
ROLES = {role: f"pw-{role}-x/y@z" for role in acl.ROLES}  # a password needing encoding


@pytest.fixture(scope="module")
def acl_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[services.Server]:
    home = tmp_path_factory.mktemp("acl")
    path = home / "users.acl"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEAFPOOL_")}
    env.update({f"LEAFPOOL_ACL_{role.upper()}_PASSWORD": pw for role, pw in ROLES.items()})
    env.update(LEAFPOOL_HOME=str(home), COLUMNS="80")  # narrow: the lines must not wrap
    printed = subprocess.run([sys.executable, "-m", "leafpool.cli", "redis", "acl"],
                             env=env, capture_output=True, text=True, timeout=60, check=True)
    lines = printed.stdout.splitlines()
    assert len(lines) == len(acl.ROLES) and all(pw not in printed.stdout
                                                for pw in ROLES.values())
    lines.append("user default on nopass ~* &* +@all")  # the test's own view
    path.write_text("\n".join(lines) + "\n")
    server = services.redis_server(extra_args=["--aclfile", str(path)])
    yield server
    server.stop()


def _url(server: services.Server, role: str) -> str:
    port = server.extra["url"].rsplit(":", 1)[1].split("/")[0]
    password = ROLES[role].replace("/", "%2F").replace("@", "%40")
    return f"redis://leafpool-{role}:{password}@127.0.0.1:{port}/0"


@pytest.fixture
def root(acl_server: services.Server) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(acl_server.extra["url"])
    client.flushall()
    client.acl_log_reset()
    yield client
    client.close()


def _worker(acl_server: services.Server, sqlite_url: str, **overrides: object
            ) -> tuple[SegmentRefiller, Pool, SegmentStore]:
    settings = load_settings(redis_url=_url(acl_server, "worker"), database_url=sqlite_url,
                             pool_floor=100, pool_ceiling=100, **overrides)
    store = SegmentStore.from_url(sqlite_url)
    store.init_schema()
    pool = Pool(connect(settings))
    return SegmentRefiller(pool, store, settings), pool, store


def _denials(root: redis.Redis) -> list[str]:
    return [f"{e.get('username')}: {e.get('object')} ({e.get('reason')})"
            for e in root.acl_log()]


def test_every_role_is_a_user_of_the_acl_file(root: redis.Redis) -> None:
    users = set(root.acl_users())
    assert {f"leafpool-{role}" for role in acl.ROLES} <= {u.decode() if isinstance(u, bytes)
                                                           else u for u in users}


def test_each_part_of_leafpool_works_under_its_role_and_redis_denies_nothing(
    acl_server: services.Server, root: redis.Redis, sqlite_url: str
) -> None:
    refiller, pool, store = _worker(acl_server, sqlite_url)
    store.add_tag(TAG, step=1000)
    sync_tags(pool, store)  # worker: the tag sync registers the tag
    assert refiller.refill(TAG).pushed == 100
    # app: pops under raise and wait, sync and asyncio
    app = load_settings(redis_url=_url(acl_server, "app"), database_url=sqlite_url,
                        empty_wait_seconds=0.2)
    raising = Client(settings=app, policy="raise")
    got = [raising.next_id(TAG), *raising.next_ids(TAG, 98)]
    waiting = Client(settings=app, policy="wait")
    got.append(waiting.next_id(TAG))
    with pytest.raises(PoolEmpty):  # known, signalled, counted, then the policy
        raising.next_id(TAG)
    with pytest.raises(PoolEmpty):
        waiting.next_id(TAG)

    async def async_pops() -> list[int]:
        client = AsyncClient(settings=app, policy="raise")
        try:
            with pytest.raises(PoolEmpty):
                await client.next_id(TAG)
            assert sweep(pool, 30)  # worker: the wanted tag is due
            refiller.refill(TAG, force=True)
            return [await client.next_id(TAG), *await client.next_ids(TAG, 10)]
        finally:
            await client.aclose()

    got += asyncio.run(async_pops())
    assert got == sorted(set(got)) and len(got) == 111
    # monitor: status and metrics, read only
    monitor = Pool(connect(load_settings(redis_url=_url(acl_server, "monitor"))))
    (status,) = pool_status(monitor)
    assert status.empty_hits == 3 and status.pushed_total == 200
    assert b"leafpool_up 1.0" in render(make_registry(monitor))
    # admin: the CLI's writes
    admin = Pool(connect(load_settings(redis_url=_url(acl_server, "admin"))))
    admin.register("other", "segment", 0)
    assert admin.drop("other")
    assert _denials(root) == []


def test_the_reserve_policy_is_refused_at_start_for_the_app_role(
    acl_server: services.Server, root: redis.Redis, sqlite_url: str
) -> None:
    app = load_settings(redis_url=_url(acl_server, "app"), database_url=sqlite_url)
    with pytest.raises(ConfigurationError) as refused:
        Client(settings=app, policy="reserve")
    assert "LEAFPOOL_EMPTY_POLICY" in str(refused.value)

    async def start() -> None:
        client = AsyncClient(settings=app, policy="reserve")
        try:
            await client.start()
        finally:
            await client.aclose()

    with pytest.raises(ConfigurationError):
        asyncio.run(start())
    worker = load_settings(redis_url=_url(acl_server, "admin"), database_url=sqlite_url)
    Client(settings=worker, policy="reserve").close()  # a role that may: no refusal


def test_the_drop_watchers_move_runs_under_the_worker_role_and_not_the_apps(
    acl_server: services.Server, root: redis.Redis, sqlite_url: str
) -> None:
    """The watcher runs in the beat under the worker role: its move of reserve IDs into a
    list (spill_range.lua below 2^53, spill_reserve.lua above, docs/design.md §3.7) is
    within that role; the app role may run neither."""
    refiller, pool, store = _worker(acl_server, sqlite_url)
    store.add_tag(TAG, step=1000)
    sync_tags(pool, store)
    assert refiller.refill(TAG).pushed == 100  # and 900 IDs left in the reserve
    app = redis.Redis.from_url(_url(acl_server, "app"))
    ids = f"leafpool:{{{TAG}}}:ids"
    assert len(app.lpop(ids, 60) or []) == 60  # 40 left: below low-water (50)
    watcher = DropWatcher(pool, lambda due: None, interval_s=0.005).start()
    try:  # its full pass reads the tag below low-water: the move
        services.wait_until(lambda: watcher.stats.spills == 1, 10.0, "reserve moved")
    finally:
        watcher.stop()
    assert root.llen(ids) == 100 and root.hget(f"leafpool:{{{TAG}}}:state",
                                               "watch_pushed") == b"60"
    assert _denials(root) == []
    for name, chunk in (("spill_reserve", ["1001"]), ("spill_range", ["1001", "1001"])):
        with pytest.raises(redis.exceptions.NoPermissionError):  # the IDs, or the two ends
            app.evalsha(scripts.sha1(name), 4, ids, f"leafpool:{{{TAG}}}:reserve",
                        f"leafpool:{{{TAG}}}:state", f"leafpool:{{{TAG}}}:lock",
                        "1001:2001", "1002:2001", "1", "100", *chunk)
    assert root.llen(ids) == 100
    app.close()


# -- an application holding the app role, careless or hostile -------------------------------


def _keys(tag: str) -> list[str]:
    k = Pool(redis.Redis()).tag(tag)  # names only
    return [*k.all(), "leafpool:tags", "leafpool:wanted", "leafpool:beat:lock",
            f"leafpool:{{{tag}}}:ids:hits", "other:key"]


def _attempts(key: str) -> list[tuple[object, ...]]:
    """Every command the app role may send, and a few it may not, with hostile
    arguments, against ``key``."""
    sha = [scripts.sha1(name) for name in ("push_ids", "take_reserve", "record", "drop",
                                           "lock_acquire", "lock_release", "spill_reserve",
                                           "spill_range", "push_range")]
    return [
        ("LPOP", key), ("LPOP", key, 100_000), ("BLPOP", key, "0.01"),
        ("SISMEMBER", key, TAG), ("SADD", key, TAG, "junk", "{x}"),
        ("HINCRBY", key, "hwm", 10**15), ("HINCRBY", key, "empty_hits", 2**63 - 1),
        ("HINCRBY", key, "gaps", -5), ("WAIT", 0, 1), ("INFO", "replication"),
        ("RPUSH", key, "1"), ("LSET", key, 0, "1:2"), ("HSET", key, "hwm", "0"),
        ("DEL", key), ("SET", key, "x"), ("EXPIRE", key, 1), ("RENAME", key, "x"),
        ("LPUSH", key, "7"), ("SREM", key, TAG), ("SPOP", key),
        *(("EVALSHA", s, 1, key, "x") for s in sha), ("EVAL", "return 1", 0),
        ("SCRIPT", "FLUSH"), ("FLUSHALL",), ("CONFIG", "SET", "maxmemory", "1"),
        ("CLIENT", "KILL", "TYPE", "normal"), ("ACL", "SETUSER", "x", "on"),
    ]


def test_an_app_role_user_cannot_repeat_stall_or_starve_a_pool(
    acl_server: services.Server, root: redis.Redis, sqlite_url: str
) -> None:
    refiller, pool, store = _worker(acl_server, sqlite_url)
    store.add_tag(TAG, step=1000)
    sync_tags(pool, store)
    assert refiller.refill(TAG).pushed == 100
    app = redis.Redis.from_url(_url(acl_server, "app"))
    handed: list[int] = [int(x) for x in app.lpop(f"leafpool:{{{TAG}}}:ids", 10) or []]
    allowed = refused = 0
    for key in itertools.chain(_keys(TAG), _keys("other")):
        for command in _attempts(key):
            try:
                reply = app.execute_command(*command)
            except redis.exceptions.NoPermissionError:
                refused += 1
                continue
            except redis.ResponseError:  # allowed, and refused by the type or the value
                allowed += 1
                continue
            allowed += 1
            if command[0] in ("LPOP", "BLPOP") and reply:  # the IDs it took are its own
                values = reply if isinstance(reply, list) else [reply]
                handed += [int(v) for v in values if isinstance(v, bytes) and v.isdigit()]
    assert allowed and refused
    # the worker goes on as if nothing happened: the sweep finds the tag due, the refill
    # succeeds, and everything the application takes is new and in order
    assert TAG in {tag for tag, _, _ in sweep(pool, 30)}
    result = refiller.refill(TAG, force=True)
    assert result.pushed > 0 and not result.skipped
    after = [int(x) for x in app.lpop(f"leafpool:{{{TAG}}}:ids", 50) or []]
    assert after and after[0] > max(handed)
    everything = handed + after
    assert len(everything) == len(set(everything)), "an ID was handed out twice"
    assert after == sorted(after)
    denied = {entry.get("username") for entry in root.acl_log(count=1000)}
    assert denied <= {"leafpool-app"}  # the worker was denied nothing
    app.close()


def test_a_beat_under_the_worker_role_announces_its_presence_and_one_without_it_does_not(
    acl_server: services.Server, root: redis.Redis, sqlite_url: str
) -> None:
    """docs/design.md §3.1: the worker role grants the beat's presence channel
    (``leafpool:beat:lock:*``), so a beat's lock says who holds it and is taken over at
    once when that beat dies. Under a role without the channel (the admin's; or a
    worker's ACL file from an earlier release) the beat still takes the lock, without
    announcing itself (the earlier release's value: waited out if it dies)."""
    _, pool, _ = _worker(acl_server, sqlite_url)
    lock = pool.beat_lock(15, identity="host-a")
    assert lock.acquire() and lock.announced and b"/host-a@" in lock.token
    nonce = lock.token.decode().split("/", 1)[0]
    assert root.pubsub_numsub(f"leafpool:beat:lock:{nonce}")[0][1] == 1
    lock.release()
    assert _denials(root) == []
    admin = Pool(connect(load_settings(redis_url=_url(acl_server, "admin"),
                                       database_url=sqlite_url)))
    plain = admin.beat_lock(15, identity="host-b")
    assert plain.acquire() and not plain.announced and b"/" not in plain.token
    plain.release()
    assert {e.get("username") for e in root.acl_log(count=100)} == {"leafpool-admin"}


@pytest.mark.slow
def test_a_celery_worker_and_beat_run_under_the_worker_role(
    acl_server: services.Server, root: redis.Redis, sqlite_url: str, tmp_path: Path
) -> None:
    """``celery -A workers worker -B`` with the worker role's URL as pools and broker: the
    beat's tag sync fills the tag, an application's pops below the low-water mark are
    refilled (the drop watcher and the refill task through the broker), every broker key
    is under ``leafpool-broker:``, and Redis logs no denial."""
    store = SegmentStore.from_url(sqlite_url)
    store.init_schema()
    store.add_tag(TAG, step=1000)
    env = leafpool_env(home=tmp_path / "home", redis_url=_url(acl_server, "worker"),
                       database_url=sqlite_url, pool_floor=100, pool_ceiling=100)
    worker = Proc([sys.executable, "-m", "celery", "-A", "workers", "worker", "-B",
                   "--loglevel=INFO", "-c", "1", "-s", str(tmp_path / "beat")], env,
                  tmp_path / "worker.log")
    ids_key = f"leafpool:{{{TAG}}}:ids"
    try:
        services.wait_until(lambda: root.llen(ids_key) >= 100, 90, "the worker's first fill")
        app = Client(settings=load_settings(redis_url=_url(acl_server, "app"),
                                            database_url=sqlite_url, empty_wait_seconds=10))
        got = app.next_ids(TAG, 80)  # below the low-water mark: the watcher queues a refill
        services.wait_until(lambda: root.llen(ids_key) >= 100, 60, "the refill after the drop")
        got += app.next_ids(TAG, 100)
        app.close()
    finally:
        worker.stop()
    assert got == sorted(set(got)) and len(got) == 180
    names = [k.decode() for k in root.scan_iter(count=1000)]
    assert any(k.startswith("leafpool-broker:") for k in names)
    assert all(k.startswith(("leafpool:", "leafpool-broker:")) for k in names), names
    assert _denials(root) == []


def test_orm_inserts_take_ids_under_the_app_role_and_redis_denies_nothing(
    acl_server: services.Server, root: redis.Redis, sqlite_url: str, tmp_path: Path
) -> None:
    from sqlalchemy import BigInteger, Column, MetaData, String, Table, create_engine, select
    from sqlalchemy.ext.asyncio import create_async_engine

    from leafpool.orm.batch import AsyncIdBatches, IdBatches
    from leafpool.orm.sqlalchemy import leafpool_id

    refiller, pool, store = _worker(acl_server, sqlite_url)
    store.add_tag(TAG, step=1000)
    sync_tags(pool, store)
    assert refiller.refill(TAG).pushed == 100
    app = load_settings(redis_url=_url(acl_server, "app"), database_url=sqlite_url,
                        empty_policy="raise")
    sync_ids = IdBatches(lambda: Client(settings=app), prefetch=5)
    async_ids = AsyncIdBatches(lambda: AsyncClient(settings=app))
    table = Table("orders", MetaData(),
                  Column("id", BigInteger, primary_key=True, default=leafpool_id(
                      TAG, batches=sync_ids, async_batches=lambda: async_ids)),
                  Column("note", String(10)))
    url = f"sqlite:///{tmp_path / 'app.sqlite3'}"
    engine = create_engine(url)
    table.metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(table.insert(), [{"note": "a"}] * 50)
        conn.execute(table.insert().values(note="b"))

    async def async_inserts() -> None:
        aengine = create_async_engine(url.replace("sqlite:", "sqlite+aiosqlite:"))
        async with aengine.begin() as conn:
            await conn.execute(table.insert(), [{"note": "c"}] * 30)
            with pytest.raises(PoolEmpty):  # 15 left: the policy, counted, refill wanted
                await conn.execute(table.insert(), [{"note": "d"}] * 20)
        await aengine.dispose()
        await async_ids.aclose()

    asyncio.run(async_inserts())
    with engine.connect() as conn:
        ids = conn.execute(select(table.c.id).order_by(table.c.id)).scalars().all()
    engine.dispose()
    assert len(ids) == 81 and ids == sorted(set(ids))
    assert _denials(root) == []
    assert root.sismember("leafpool:wanted", TAG)
