"""MySQL least privilege (leafpool/database/grants.py, docs/design.md §1.2) against a real
MariaDB: users holding exactly what ``leafpool db grants`` prints. The admin runs ``db
init`` and adds tags; the worker refills, syncs (a tag gone from the table keeps its mark)
and claims a snowflake worker ID (writing the DC layout the database serves, which it
may not change), never needing DDL; the monitor reads the tag table and
can write nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from leafpool.core.config import load_settings
from leafpool.core.errors import BackendUnavailable, ConfigurationError, GuardFailed
from leafpool.housekeeping.sync import sync_tags
from leafpool.redis.pool import Pool
from leafpool.segment.refiller import SegmentRefiller
from leafpool.segment.store import SegmentStore
from leafpool.snowflake.registry.mysql import MySqlRegistry
from tests.support import services

pytestmark = pytest.mark.slow
ROLES = ("admin", "worker", "monitor")


def _root(server: services.Server, sql: str) -> None:
    subprocess.run([server.extra["client"], f"--socket={server.extra['socket']}", "-uroot",
                    "-e", sql], check=True, capture_output=True, timeout=30)


def _cli(url: str, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEAFPOOL_")}
    env.update(LEAFPOOL_DATABASE_URL=url, LEAFPOOL_HOME=str(home), COLUMNS="80")
    return subprocess.run([sys.executable, "-m", "leafpool.cli", *args], env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def users(mariadb_server: services.Server, mysql_url: str, tmp_path: Path) -> dict[str, str]:
    """A user per role on a fresh database, holding what ``leafpool db grants`` prints."""
    database = mysql_url.rsplit("/", 1)[1]
    suffix = database.rsplit("_", 2)[-2] + database.rsplit("_", 1)[-1]
    urls = {}
    for role in ROLES:
        user = f"lp{suffix}-{role}"[:32]
        _root(mariadb_server, f"DROP USER IF EXISTS '{user}'@'%'; "
                              f"CREATE USER '{user}'@'%' IDENTIFIED BY 'pw-{role}';")
        printed = _cli(mysql_url, tmp_path, "db", "grants", role, "--user-prefix",
                       f"lp{suffix}-")
        assert printed.returncode == 0, printed.stderr
        urls[role] = mysql_url.replace("leafpool:leafpool@", f"{user}:pw-{role}@")
        grants = printed.stdout.replace(f"lp{suffix}-{role}", user)
        if role != "admin":  # the worker's and monitor's tables exist once db init ran
            urls[f"{role}-grants"] = grants
            continue
        _root(mariadb_server, grants)
    return urls


def test_each_role_works_with_exactly_its_grants_and_the_worker_needs_no_ddl(
    users: dict[str, str], mariadb_server: services.Server, redis_url: str,
    r: redis.Redis, tmp_path: Path
) -> None:
    # admin: the one DDL path, and the tags
    assert _cli(users["admin"], tmp_path, "db", "init").returncode == 0
    for role in ("worker", "monitor"):
        _root(mariadb_server, users[f"{role}-grants"])
    added = _cli(users["admin"], tmp_path, "tag", "add", "order", "--step", "1000")
    assert added.returncode == 0, added.stderr
    admin = SegmentStore.from_url(users["admin"])
    admin.add_tag("gone", step=100)
    # worker: refill, sync, retire a mark, claim a worker ID; it may not CREATE anything
    settings = load_settings(redis_url=redis_url, database_url=users["worker"],
                             pool_floor=100, pool_ceiling=100, snowflake_mode="mysql",
                             snowflake_cache_dir=str(tmp_path / "cache"))
    worker = SegmentStore.from_url(users["worker"])
    pool = Pool(r)
    assert sorted(sync_tags(pool, worker).added) == ["gone", "order"]
    assert SegmentRefiller(pool, worker, settings).refill("order").pushed == 100
    assert SegmentRefiller(pool, worker, settings).refill("gone").pushed == 100
    with admin.engine.begin() as conn:  # removed by hand, as an operator would
        conn.execute(text("DELETE FROM leaf_alloc WHERE biz_tag = 'gone'"))
    assert sync_tags(pool, worker).removed == ["gone"]
    assert admin.retired_mark("gone") > 100  # the worker kept the mark
    registry = MySqlRegistry(settings, "host-a:w:0")
    assert 1 <= registry.claim().worker_id <= 1023
    registry.release()
    # the DC layout the database serves (docs/design.md §12.1): the first worker writes
    # it; the worker may not change or remove it
    with admin.engine.connect() as conn:
        assert conn.execute(text("SELECT registry, dc_id, dc_count FROM "
                                 "leafpool_snowflake_layout")).all() == [
            ("leaf_workerid_alloc", 0, 1)]
    for denied, sql in [("UPDATE", "UPDATE leafpool_snowflake_layout SET dc_count = 2"),
                        ("DELETE", "DELETE FROM leafpool_snowflake_layout")]:
        with pytest.raises(OperationalError, match=f"{denied} command denied"), \
                worker.engine.begin() as conn:
            conn.execute(text(sql))
    with pytest.raises(OperationalError, match="CREATE command denied"), \
            worker.engine.begin() as conn:
        conn.execute(text("CREATE TABLE lp_probe (id int)"))  # the grants deny DDL
    # monitor: the /db page's reads; no write
    monitor = SegmentStore.from_url(users["monitor"])
    assert [row.tag for row, _ in monitor.leaf_alloc_rows()] == ["order"]
    with pytest.raises(BackendUnavailable):
        monitor.set_step("order", 5)


def test_a_worker_on_a_database_without_leafpools_tables_is_told_to_run_db_init(
    users: dict[str, str], mariadb_server: services.Server, mysql_url: str, redis_url: str,
    r: redis.Redis
) -> None:
    """Leaf's table alone (a Leaf database, ``db init`` not run): the refill does not try
    to create what is missing; it says what to run."""
    with SegmentStore.from_url(mysql_url).engine.begin() as conn:
        conn.execute(text((Path(__file__).resolve().parents[2] / "leafpool" / "database"
                           / "sql" / "mysql" / "leaf_alloc.sql").read_text()))
        conn.execute(text("INSERT INTO leaf_alloc (biz_tag, max_id, step) VALUES "
                          "('order', 1, 1000)"))
    _root(mariadb_server, users["worker-grants"].split(";")[0] + ";")  # leaf_alloc only
    settings = load_settings(redis_url=redis_url, database_url=users["worker"],
                             pool_floor=100, pool_ceiling=100)
    worker = SegmentStore.from_url(users["worker"])
    with pytest.raises(ConfigurationError) as refused:
        SegmentRefiller(Pool(r), worker, settings).refill("order")
    assert "leafpool db init" in str(refused.value) and "pw-worker" not in str(refused.value)


def test_a_guard_needs_select_on_its_table_and_refuses_until_the_worker_has_it(
    users: dict[str, str], mariadb_server: services.Server, redis_url: str,
    r: redis.Redis, tmp_path: Path
) -> None:
    """``db grants`` cannot know the application's tables: it ends the worker's lines
    with a comment saying so. Without SELECT on the guarded table the refill refuses,
    naming the tag and the guard (never skipping it); granted, it runs."""
    assert "-- and for each tag guard" in users["worker-grants"]
    assert _cli(users["admin"], tmp_path, "db", "init").returncode == 0
    _root(mariadb_server, users["worker-grants"])
    admin = SegmentStore.from_url(users["admin"])
    with admin.engine.begin() as conn:
        conn.execute(text("CREATE TABLE orders (id BIGINT PRIMARY KEY)"))
        conn.execute(text("INSERT INTO orders VALUES (4242)"))
    added = _cli(users["admin"], tmp_path, "tag", "add", "order", "--step", "1000",
                 "--guard", "orders.id")
    assert added.returncode == 0 and "first ID 4243" in added.stdout, added.stderr
    settings = load_settings(redis_url=redis_url, database_url=users["worker"],
                             pool_floor=100, pool_ceiling=100)
    refiller = SegmentRefiller(Pool(r), SegmentStore.from_url(users["worker"]), settings)
    with pytest.raises(GuardFailed, match=r"^order: the guard orders.id could not be read "
                                          r"\(.*SELECT command denied"):
        refiller.refill("order")
    database = users["worker"].rsplit("/", 1)[1]
    worker_user = users["worker"].split("//", 1)[1].split(":", 1)[0]
    _root(mariadb_server, f"GRANT SELECT ON `{database}`.`orders` TO '{worker_user}'@'%';")
    assert refiller.refill("order").pushed == 100
    assert int(r.lindex("leafpool:{order}:ids", 0) or 0) == 4243


def test_a_worker_on_a_database_the_previous_db_init_made_serves_one_dc_and_no_other(
    users: dict[str, str], mariadb_server: services.Server, mysql_url: str, tmp_path: Path
) -> None:
    """A database from before the DC layout record (the previous release's db init and
    grants: no leafpool_snowflake_layout): a one-DC worker claims as before; a worker of
    another layout is told to run db init and the grants."""
    assert _cli(users["admin"], tmp_path, "db", "init").returncode == 0
    _root(mariadb_server, "DROP TABLE " + mysql_url.rsplit("/", 1)[1]
          + ".leafpool_snowflake_layout;")
    previous = ";".join(line for line in users["worker-grants"].split(";")
                        if "leafpool_snowflake_layout" not in line)
    _root(mariadb_server, previous)
    base = {"database_url": users["worker"], "snowflake_mode": "mysql",
            "snowflake_cache_dir": str(tmp_path / "cache")}
    one = MySqlRegistry(load_settings(**base), "host-a:w:0")
    assert 1 <= one.claim().worker_id <= 1023
    one.release()
    two = MySqlRegistry(load_settings(**base, dc_id=1, dc_count=2), "host-b:w:0")
    with pytest.raises(ConfigurationError) as refused:
        two.claim()
    assert refused.value.field == "LEAFPOOL_DC_COUNT"
    assert "leafpool_snowflake_layout" in str(refused.value)
    assert "leafpool db init" in str(refused.value)


def test_snowflake_layout_set_runs_under_the_admin_s_grants_not_the_worker_s(
    users: dict[str, str], mariadb_server: services.Server, tmp_path: Path
) -> None:
    """``leafpool snowflake layout --set`` updates the record: the admin's grants allow it
    (no grant added), the worker's do not (refused, naming the admin's grants, the record
    unchanged); the worker's claim share-locks the record under its own grants (SELECT)."""
    assert _cli(users["admin"], tmp_path, "db", "init").returncode == 0
    _root(mariadb_server, users["worker-grants"])
    base = {"database_url": users["worker"], "snowflake_mode": "mysql",
            "snowflake_cache_dir": str(tmp_path / "cache")}
    one = MySqlRegistry(load_settings(**base), "host-a:w:0")
    assert 1 <= one.claim().worker_id <= 511
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEAFPOOL_")}
    env.update(LEAFPOOL_HOME=str(tmp_path), LEAFPOOL_SNOWFLAKE_MODE="mysql",
               LEAFPOOL_DC_COUNT="2", COLUMNS="200")

    def layout_set(url: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "leafpool.cli", "snowflake", "layout",
                               "--set"], env={**env, "LEAFPOOL_DATABASE_URL": url},
                              capture_output=True, text=True, timeout=60)

    denied = layout_set(users["worker"])
    assert denied.returncode == 2, denied.stderr
    assert "admin's grants" in denied.stderr and "pw-worker" not in denied.stderr
    done = layout_set(users["admin"])
    assert done.returncode == 0 and "recorded the configured layout" in done.stdout, done.stderr
    two = MySqlRegistry(load_settings(**base, dc_count=2), "host-b:w:0")
    assert 1 <= two.claim().worker_id <= 511
    two.release()
    one.release()
