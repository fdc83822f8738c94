"""Redis connections and Redis errors: the one place that opens a connection (sync and
asyncio) for each topology, and the one place that turns redis-py's errors into
leafpool's (:class:`~leafpool.core.errors.BackendUnavailable`).

Topologies (docs/design.md §7), chosen by the settings:

- ``single``: ``LEAFPOOL_REDIS_URL``;
- ``sentinel``: redis-py's :class:`~redis.sentinel.Sentinel` over
  ``LEAFPOOL_REDIS_SENTINELS``; the client asks the sentinels for the master of
  ``LEAFPOOL_REDIS_MASTER_NAME`` and asks again after a failover (the URL gives the
  database number and the data nodes' user and password; the sentinels' own login is
  ``LEAFPOOL_REDIS_SENTINEL_USERNAME``/``_PASSWORD``);
- ``cluster``: redis-py's :class:`~redis.cluster.RedisCluster`, from the URL of any node.

A ``rediss://`` URL adds TLS with the files of ``LEAFPOOL_REDIS_TLS_*``
(:mod:`leafpool.core.tls`), to every node, sentinels included.

Timeouts are short so an outage is noticed in seconds; redis-py uses the hiredis parser
when it is installed.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.asyncio.sentinel import SentinelConnectionPool as AsyncSentinelPool
from redis.cluster import RedisCluster
from redis.connection import parse_url
from redis.sentinel import Sentinel, SentinelConnectionPool

from leafpool.redis import retries
from leafpool.redis.errors import wrap as wrap

if TYPE_CHECKING:
    from leafpool.core.config import Settings

#: a client of the pools' Redis, whatever the topology. RedisCluster speaks the same
#: command API as Redis (it routes each command by its key's slot); it is typed as Redis
#: for the callers, and :func:`is_cluster` tells the two apart where it matters.
RedisClient = redis.Redis
AsyncRedisClient = aioredis.Redis


def is_cluster(client: object) -> bool:
    return isinstance(client, RedisCluster | AsyncRedisCluster)


def _options(timeout: float) -> dict[str, Any]:
    return {"socket_timeout": timeout, "socket_connect_timeout": timeout,
            "health_check_interval": 30}


def _url_auth(url: str) -> dict[str, Any]:
    """Database number, user name and password of a Redis URL (for Sentinel's master)."""
    parsed: dict[str, Any] = parse_url(url)  # type: ignore[no-untyped-call]
    return {k: parsed[k] for k in ("db", "username", "password") if parsed.get(k) is not None}


#: how often a Sentinel client asks the sentinels which node is the master, besides after
#: a connection error (redis-py's own rule) and after a refused acknowledgement
MASTER_CHECK_SECONDS = 1.0


class _Checked:
    """When the master was last asked for (redis-py asks only when a connection opens:
    a connection kept open to a paused master that comes back after a failover would
    write to it until Sentinel demotes it, 8 s or more later; docs/design.md §7.1)."""

    _asked = float("-inf")

    def _due(self) -> bool:
        now = time.monotonic()
        if now - self._asked < MASTER_CHECK_SECONDS:
            return False
        self._asked = now
        return True


class CheckedSentinelPool(_Checked, SentinelConnectionPool):
    """redis-py's Sentinel pool, asking the sentinels for the master at most once a
    second when a connection is taken: when the master moved, the connections to the
    former one are closed (redis-py's ``get_master_address``) and the next command goes
    to the new one."""

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        if self._due():
            with contextlib.suppress(redis.RedisError):  # the command will say it
                self.get_master_address()  # type: ignore[no-untyped-call]
        return super().get_connection(*args, **kwargs)


class AsyncCheckedSentinelPool(_Checked, AsyncSentinelPool):
    """The asyncio twin of :class:`CheckedSentinelPool`."""

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        if self._due():
            with contextlib.suppress(redis.RedisError):
                await self.get_master_address()  # type: ignore[no-untyped-call]
        return await super().get_connection(*args, **kwargs)  # type: ignore[no-untyped-call]


@dataclass(frozen=True)
class _Flavour:
    """redis-py's classes of one flavour (blocking or asyncio): one node, a Cluster and a
    Sentinel group, and the retry policy of their connections (:data:`retries.ONCE`:
    redis-py repeats nothing; :mod:`leafpool.redis.retries` decides per command)."""

    node: Any
    cluster: Any
    sentinel: Any
    sentinel_pool: Any
    once: Any


_BLOCKING = _Flavour(redis.Redis, RedisCluster, Sentinel, CheckedSentinelPool, retries.ONCE)
_ASYNCIO = _Flavour(aioredis.Redis, AsyncRedisCluster, AsyncSentinel, AsyncCheckedSentinelPool,
                    retries.ONCE_ASYNC)


def _tls(settings: Settings) -> dict[str, Any]:
    """redis-py's TLS options for a ``rediss://`` URL (:mod:`leafpool.core.tls`); none
    for ``redis://``. With Sentinel, the scheme of the URL says whether the sentinels and
    the data nodes speak TLS (``ssl``: the URL itself is not used to connect)."""
    if not settings.pools_tls:
        return {}
    tls = settings.redis_tls.redis_options()
    return {"ssl": True, **tls} if settings.redis_topology == "sentinel" else tls


def _open(flavour: _Flavour, settings: Settings | str, timeout: float) -> Any:
    options = {**_options(timeout), "retry": flavour.once}
    if isinstance(settings, str):
        return flavour.node.from_url(settings, **options)
    tls = _tls(settings)
    topology = settings.redis_topology
    if topology == "cluster":
        return flavour.cluster.from_url(
            settings.redis_url, socket_timeout=timeout, socket_connect_timeout=timeout,
            retry=flavour.once, **tls)
    if topology == "sentinel":
        # the sentinels' own login (LEAFPOOL_REDIS_SENTINEL_*): to the sentinels only; the
        # URL's user and password are the data nodes'. One try per sentinel: redis-py
        # asks the next one when a sentinel fails (its default retries backed off up to
        # 10 s on each, a refused login included, before the next was asked)
        sentinel_kwargs = {**options, **tls, **settings.sentinel_login.redis_options()}
        sentinel = flavour.sentinel(list(settings.sentinels), sentinel_kwargs=sentinel_kwargs,
                                    **options, **tls)
        return sentinel.master_for(settings.redis_master_name,
                                   connection_pool_class=flavour.sentinel_pool,
                                   **_url_auth(settings.redis_url), **options, **tls)
    return flavour.node.from_url(settings.redis_url, **options, **tls)


def connect(settings: Settings | str, *, timeout: float = 5.0) -> RedisClient:
    """The pools' Redis in the configured topology (a bare URL: one node)."""
    return cast(RedisClient, _open(_BLOCKING, settings, timeout))


def connect_async(settings: Settings | str, *, timeout: float = 5.0) -> AsyncRedisClient:
    """The asyncio twin of :func:`connect`."""
    return cast(AsyncRedisClient, _open(_ASYNCIO, settings, timeout))


def answers(client: RedisClient) -> bool:
    """True when the node answers PING; False when nothing accepts the connection (other
    errors, such as a refused password, are raised as :class:`BackendUnavailable`)."""
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False
    except redis.RedisError as exc:
        raise wrap(exc, "PING") from exc


@contextmanager
def redis_errors(what: str) -> Iterator[None]:
    """Wrap redis-py's errors at the boundary: ``what`` names the tag and the command."""
    try:
        yield
    except redis.RedisError as exc:
        raise wrap(exc, what) from exc
