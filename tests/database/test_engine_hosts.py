"""LEAFPOOL_DATABASE_URL naming several hosts (leafpool/database/hosts.py, docs/design.md
§7.4), against the session's real MariaDB behind loopback proxies (tests/support/
mysql_proxy.py): the format checked at start naming the variable, a host that does not
answer passed over, the store moving to the next host when the one in use goes and
staying there, and an allocation whose COMMIT reply is lost: a gap, never a repeat."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from sqlalchemy import text

from leafpool.core.config import load_settings
from leafpool.core.errors import BackendUnavailable, ConfigurationError
from leafpool.core.setting_values import DatabaseHost, split_database_hosts
from leafpool.database.engine import parse_url
from leafpool.database.grants import database_of
from leafpool.redis.pool import Pool
from leafpool.segment.refiller import SegmentRefiller
from leafpool.segment.store import SegmentStore
from tests.support.mysql_proxy import MysqlProxy
from tests.support.servers import free_port

STEP = 100


def _hosts_url(mysql_url: str, *addresses: str) -> str:
    """``mysql_url`` (``scheme://user:password@host:port/db``) naming ``addresses``."""
    userinfo, rest = mysql_url.split("@", 1)
    return f"{userinfo}@{','.join(addresses)}/{rest.split('/', 1)[1]}"


def _address(mysql_url: str) -> str:
    return mysql_url.split("@", 1)[1].split("/", 1)[0]


@pytest.fixture
def proxy(mysql_url: str) -> Iterator[MysqlProxy]:
    port = int(_address(mysql_url).rsplit(":", 1)[1])
    p = MysqlProxy(port).open()
    yield p
    p.stop()


def _server_port(store: SegmentStore) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(text("SELECT @@port")).scalar_one())


def test_the_format_is_host_port_comma_separated_and_a_mistake_names_the_variable() -> None:
    first, hosts = split_database_hosts(
        "mysql+pymysql://u:p%40ss@db1:3306,db2,[::1]:3308/leafpool?charset=utf8mb4")
    assert first == "mysql+pymysql://u:p%40ss@db1:3306/leafpool?charset=utf8mb4"
    assert hosts == (DatabaseHost("db1", 3306), DatabaseHost("db2"),
                     DatabaseHost("::1", 3308))
    assert [str(h) for h in hosts] == ["db1:3306", "db2", "[::1]:3308"]
    assert parse_url("mysql+pymysql://u:p@db1:3306,db2:3307/leafpool").port == 3306
    assert database_of("mysql+pymysql://u:p@db1:3306,db2:3307/leafpool") == "leafpool"
    assert split_database_hosts("mysql+pymysql://u:p@db1:3306/x") == (
        "mysql+pymysql://u:p@db1:3306/x", ())
    assert split_database_hosts("sqlite:///a,b/c.sqlite3") == ("sqlite:///a,b/c.sqlite3", ())
    load_settings(database_url="mysql+pymysql://u:secret@db1:3306,db2:3307/leafpool")
    for bad in ("db1:3306,,db2", "db1:3306,db2:0", "db1:3306,db2:x", "db1,db1",
                "db1:3306,[::1", "db1,db2:65536"):
        with pytest.raises(ConfigurationError) as refused:
            load_settings(database_url=f"mysql+pymysql://u:secret@{bad}/leafpool")
        assert refused.value.field == "LEAFPOOL_DATABASE_URL", bad
        assert "host:port,host:port" in str(refused.value) and "secret" not in str(
            refused.value), bad


def test_a_host_that_does_not_answer_is_passed_over(mysql_url: str) -> None:
    closed = f"127.0.0.1:{free_port()}"
    store = SegmentStore.from_url(_hosts_url(mysql_url, closed, _address(mysql_url)))
    store.init_schema()
    store.add_tag("order", step=STEP)
    assert store.allocate("order").start == 1
    assert _server_port(store) == int(_address(mysql_url).rsplit(":", 1)[1])
    store.engine.dispose()


def test_no_host_answering_is_backend_unavailable_naming_every_host(mysql_url: str) -> None:
    closed = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    store = SegmentStore.from_url(_hosts_url(mysql_url, *closed))
    with pytest.raises(BackendUnavailable) as failed:
        store.ping()
    assert all(address in str(failed.value) for address in closed), failed.value
    assert "leafpool@" not in str(failed.value)  # no user information, no password


def test_the_store_moves_to_the_next_host_when_the_one_in_use_goes_and_stays_there(
    mysql_url: str, proxy: MysqlProxy
) -> None:
    store = SegmentStore.from_url(_hosts_url(mysql_url, proxy.address, _address(mysql_url)))
    store.init_schema()
    store.add_tag("order", step=STEP)
    first = store.allocate("order")
    assert proxy.accepted >= 1
    proxy.close()  # the host in use goes: its pooled connection dies with it
    second = store.allocate("order")  # the pool's ping sees it; the next host takes over
    assert second.start == first.end
    proxy.open()  # back on the same port, first in the list
    store.engine.dispose()  # every connection new
    accepted = proxy.accepted
    assert store.allocate("order").start == second.end
    assert proxy.accepted == accepted  # new connections go where the store moved
    store.engine.dispose()


def test_a_commit_whose_reply_is_lost_is_a_gap_never_a_repeat(
    mysql_url: str, proxy: MysqlProxy, redis_url: str, r: redis.Redis
) -> None:
    """The node dies after running the COMMIT of an allocation and before answering: the
    refill fails (BackendUnavailable) and pushes nothing of that range; the allocation
    committed, so the next one, through the next host, reads max_id above it. The lost
    range is a gap: no ID of it is ever handed out, and no ID twice."""
    store = SegmentStore.from_url(_hosts_url(mysql_url, proxy.address, _address(mysql_url)))
    store.init_schema()
    store.add_tag("order", step=STEP)
    settings = load_settings(redis_url=redis_url, pool_floor=STEP, pool_ceiling=STEP,
                             reserve_seconds=0.001)
    pool = Pool(r)
    refiller = SegmentRefiller(pool, store, settings)
    handed: list[int] = []

    def drain() -> None:
        while got := pool.pop_many("order", 1000):
            handed.extend(got)

    refiller.refill("order")
    drain()
    proxy.lose_commit_reply()
    with pytest.raises(BackendUnavailable):
        refiller.refill("order")  # the reserve's IDs go to the list, then the allocation
    assert proxy.commits_lost == 1
    with store.engine.connect() as conn:  # through the next host: the proxy is gone
        max_id = int(conn.execute(text(
            "SELECT max_id FROM leaf_alloc WHERE biz_tag = 'order'")).scalar_one())
    lost = range(max_id - STEP, max_id)  # what the lost COMMIT took
    drain()
    for _ in range(5):
        refiller.refill("order")
        drain()
    assert handed and max(handed) >= max_id  # IDs from after the lost allocation
    assert len(handed) == len(set(handed))
    assert not set(handed) & set(lost)
    assert sorted(handed) == handed
    store.engine.dispose()
