"""Sentinels that ask for a login (issue 27 item 5): three real sentinels whose default
user is off, with leafpool's two users as ``leafpool/redis/acl.py`` states them
(``SENTINEL_CLIENT_RULES`` for leafpool's clients, ``SENTINEL_PEER_RULES`` for the
sentinels between themselves: ``sentinel sentinel-user``/``sentinel-pass``), watching a
master and a replica.

- With ``LEAFPOOL_REDIS_SENTINEL_USERNAME``/``_PASSWORD``, a real ``celery worker -B``
  (pools and broker through the sentinels: redis-py's and kombu's ``sentinel_kwargs``)
  fills a tag an application pops from, sync and asyncio, and no sentinel logged a denial
  of leafpool's user.
- Without the login, or with a wrong password, a client is refused: leafpool's pools
  (the pop raises :class:`BackendUnavailable`), kombu's ``sentinel://`` transport and a
  bare client asking for the master's address.
- leafpool's user may not move the master or change what the sentinels watch.
- The sentinels, logged in to one another as the peer user, still fail over.

Against the code before these settings the first test fails: the login is not sent and
the sentinels refuse every client (the pool is never filled, the pops fail)."""

from __future__ import annotations

import asyncio
import itertools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis
from kombu import Connection

from leafpool.client import AsyncClient, Client
from leafpool.core.config import Settings, load_settings
from leafpool.core.errors import BackendUnavailable
from leafpool.redis import acl
from leafpool.redis.connect import connect
from leafpool.segment.store import SegmentStore
from tests.support import services
from tests.support.processes import Proc, leafpool_env

if TYPE_CHECKING:
    from tests.support.topologies import SentinelGroup
    from tests.support.topology_fixtures import Topologies

pytest_plugins = ["tests.support.topology_fixtures"]
pytestmark = pytest.mark.timeout(240)

CLIENT_PASSWORD = "client pass:word/with #odd chars"
PEER_PASSWORD = "peer-password"
#: the test's own user: the topology's checks (INFO, SENTINEL's reads) and the ACL log
ADMIN = {"username": "topology", "password": "topology-password"}
CELERY = [sys.executable, "-m", "celery", "-A", "workers"]


def sentinel_conf() -> str:
    return "".join(f"{line}\n" for line in [
        "user default off",
        acl.sentinel_user_line(acl.SENTINEL_PEER_USER, acl.SENTINEL_PEER_RULES,
                               PEER_PASSWORD),
        acl.sentinel_user_line(acl.SENTINEL_CLIENT_USER, acl.SENTINEL_CLIENT_RULES,
                               CLIENT_PASSWORD),
        f"user {ADMIN['username']} on >{ADMIN['password']} allchannels +@all",
        f"sentinel sentinel-user {acl.SENTINEL_PEER_USER}",
        f"sentinel sentinel-pass {PEER_PASSWORD}",
    ])


@pytest.fixture
def group(topologies: Topologies) -> SentinelGroup:
    return topologies.sentinel_group(1, 3, sentinel_conf=sentinel_conf(),
                                     sentinel_login=ADMIN)


def _sentinels(group: SentinelGroup) -> str:
    return ",".join(f"{h}:{p}" for h, p in group.sentinel_addrs)


def _login(password: str = CLIENT_PASSWORD) -> dict[str, str]:
    return {"redis_sentinel_username": acl.SENTINEL_CLIENT_USER,
            "redis_sentinel_password": password}


def _settings(group: SentinelGroup, database_url: str, **more: Any) -> Settings:
    return load_settings(redis_url="redis://sentinel-master/0",
                         redis_sentinels=_sentinels(group),
                         redis_master_name=group.master_name, database_url=database_url,
                         **more)


def _denials(group: SentinelGroup, user: str) -> list[str]:
    """What each sentinel's ACL log holds for ``user``: the denied commands."""
    found = []
    for sentinel in group.sentinels:
        for entry in sentinel.command("ACL", "LOG"):
            fields = dict(zip(entry[::2], entry[1::2], strict=True)) \
                if isinstance(entry, list) else entry
            if fields.get("username") == user:
                found.append(f":{sentinel.port} {fields.get('object')}")
    return found


def _pop(client: Client, n: int, deadline_s: float) -> list[int]:
    """``n`` IDs, taken 100 at a time (each call waits for a refill up to its own
    empty-pool wait); bounded by ``deadline_s``."""
    got: list[int] = []

    def more() -> bool:
        got.extend(client.next_ids("order", min(100, n - len(got))))
        return len(got) >= n

    services.wait_until(more, deadline_s, f"{n} IDs through the sentinels", interval=0)
    return got


def test_leafpool_pops_through_sentinels_that_ask_for_a_login(
    group: SentinelGroup, sqlite_url: str, tmp_path: Path
) -> None:
    store = SegmentStore.from_url(sqlite_url)
    store.init_schema()
    store.add_tag("order", step=1000)
    env = leafpool_env(redis_url="redis://sentinel-master/0", redis_sentinels=_sentinels(group),
                       redis_master_name=group.master_name, database_url=sqlite_url,
                       sweep_seconds=0.5, **_login())
    worker = Proc([*CELERY, "worker", "-B", "--loglevel=INFO", "-c", "1", "-s",
                   str(tmp_path / "beat-schedule")], env, tmp_path / "worker.log")
    settings = _settings(group, sqlite_url, empty_wait_seconds=5, **_login())
    client = Client(settings=settings)
    try:
        ids = _pop(client, 1500, 90)

        async def pops() -> list[int]:
            aclient = AsyncClient(settings=settings)
            try:
                return await aclient.next_ids("order", 100)
            finally:
                await aclient.aclose()

        ids += asyncio.run(pops())
    finally:
        client.close()
        worker.kill()
    assert len(ids) == 1600 == len(set(ids))
    assert all(a < b for a, b in itertools.pairwise(ids))
    # every command leafpool sent the sentinels was allowed (the worker's, the beat's,
    # kombu's and the clients')
    assert _denials(group, acl.SENTINEL_CLIENT_USER) == []


def _refused(call: Callable[[], object]) -> BaseException:
    with pytest.raises(Exception) as caught:
        call()
    return caught.value


@pytest.mark.parametrize("login", [{}, _login("wrong password")],
                         ids=["no login", "wrong password"])
def test_a_client_without_the_login_is_refused(
    group: SentinelGroup, sqlite_url: str, login: dict[str, str]
) -> None:
    settings = _settings(group, sqlite_url, empty_wait_seconds=0, **login)
    # leafpool's pools: no master to pop from
    pool = connect(settings, timeout=2)
    err = _refused(lambda: Client(pool, settings=settings).next_ids("order", 1))
    assert isinstance(err, BackendUnavailable), repr(err)
    pool.close()
    if not login:  # the broker's sentinel:// transport (26 s: redis-py's retries, each)
        conn = Connection(settings.broker_url, transport_options=settings.broker_options,
                          connect_timeout=2)
        try:
            err = _refused(lambda: conn.ensure_connection(max_retries=1))
            assert "No master found" in str(err), repr(err)
        finally:
            conn.release()
    # a bare client: the master's address is not given
    host, port = group.sentinel_addrs[0]
    bare = redis.Redis(host, port, socket_timeout=2,
                       **({"username": acl.SENTINEL_CLIENT_USER, "password": "wrong password"}
                          if login else {}))
    err = _refused(lambda: bare.sentinel_get_master_addr_by_name(group.master_name))
    assert isinstance(err, redis.AuthenticationError | redis.ResponseError), repr(err)
    bare.close()
    # and with the login the same settings reach it
    ok = connect(_settings(group, sqlite_url, **_login()), timeout=2)
    assert ok.ping()
    ok.close()


def test_leafpool_s_sentinel_user_cannot_move_the_master_or_change_the_watch(
    group: SentinelGroup,
) -> None:
    host, port = group.sentinel_addrs[0]
    client = redis.Redis(host, port, socket_timeout=2, username=acl.SENTINEL_CLIENT_USER,
                         password=CLIENT_PASSWORD, decode_responses=True)
    assert client.sentinel_get_master_addr_by_name(group.master_name)[1] == group.master.port
    refused = []
    for command in (["SENTINEL", "FAILOVER", group.master_name],
                    ["SENTINEL", "SET", group.master_name, "quorum", "1"],
                    ["SENTINEL", "REMOVE", group.master_name],
                    ["SENTINEL", "RESET", "*"],
                    ["SENTINEL", "MONITOR", "other", "127.0.0.1", "1", "1"],
                    ["SENTINEL", "CONFIG", "SET", "resolve-hostnames", "yes"],
                    ["SENTINEL", "DEBUG", "info-period", "1"],
                    ["PUBLISH", "__sentinel__:hello", "x"], ["ACL", "LIST"],
                    ["CLIENT", "KILL", "TYPE", "normal"], ["SHUTDOWN"]):
        try:
            client.execute_command(*command)  # type: ignore[no-untyped-call]
        except redis.exceptions.NoPermissionError:
            refused.append(command[1] if command[0] == "SENTINEL" else command[0])
    client.close()
    assert refused == ["FAILOVER", "SET", "REMOVE", "RESET", "MONITOR", "CONFIG", "DEBUG",
                       "PUBLISH", "ACL", "CLIENT", "SHUTDOWN"]
    # the master was not moved nor the quorum changed
    state = group.sentinels[0].admin.sentinel_master(group.master_name)
    assert state["port"] == group.master.port and state["quorum"] == 2


def test_the_sentinels_logged_in_to_one_another_fail_over(
    group: SentinelGroup, sqlite_url: str
) -> None:
    settings = _settings(group, sqlite_url, **_login())
    pool = connect(settings, timeout=2)
    pool.set("before", "1")
    old = group.master
    old.kill()
    new = group.wait_failover(old)
    assert new is not old
    # leafpool's client follows the new master, still logged in to the sentinels
    services.wait_until(lambda: bool(pool.set("after", "1")), 30, "a write to the new master")
    assert pool.get("before") == b"1"
    pool.close()
    assert _denials(group, acl.SENTINEL_PEER_USER) == []
