"""Opening connections and mapping redis-py's errors (leafpool.redis.connect), on one real
node. Sentinel groups and Clusters are opened through the same function in
test_replicas.py and test_cluster.py."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import redis

from leafpool.core.config import Settings
from leafpool.core.errors import BackendUnavailable
from leafpool.redis.connect import _url_auth, connect, connect_async, is_cluster, redis_errors, wrap
from tests.support.services import free_port


def test_a_url_and_the_single_topology_open_the_same_node(
    r: redis.Redis, redis_url: str, make_settings: Callable[..., Settings]
) -> None:
    r.set("marker", "here")
    for client in (connect(redis_url), connect(make_settings())):
        assert client.get("marker") == b"here"
        assert not is_cluster(client)
        client.close()


def test_the_asyncio_flavour_opens_the_same_node(
    r: redis.Redis, make_settings: Callable[..., Settings]
) -> None:
    r.set("marker", "here")

    async def read() -> bytes | None:
        client = connect_async(make_settings())
        try:
            value: bytes | None = await client.get("marker")
            return value
        finally:
            await client.aclose()

    assert asyncio.run(read()) == b"here"


def test_connections_time_out_in_the_given_seconds() -> None:
    client = connect(f"redis://127.0.0.1:{free_port()}/0", timeout=0.5)
    kwargs = client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == kwargs["socket_connect_timeout"] == 0.5
    client.close()


def test_a_redis_py_error_becomes_backend_unavailable_naming_what_was_done() -> None:
    client = connect(f"redis://127.0.0.1:{free_port()}/0", timeout=0.5)
    with (pytest.raises(BackendUnavailable, match="redis: orders: LPOP: ") as caught,
          redis_errors("orders: LPOP")):
        client.lpop("x")
    assert isinstance(caught.value.__cause__, redis.ConnectionError)
    client.close()


def test_a_reply_error_is_wrapped_too(r: redis.Redis) -> None:
    r.set("s", "a string")
    with (pytest.raises(BackendUnavailable, match="orders: LPOP: WRONGTYPE") as caught,
          redis_errors("orders: LPOP")):
        r.lpop("s")
    assert isinstance(caught.value.__cause__, redis.ResponseError)


def test_wrap_names_the_error_for_hot_paths_that_catch_it_themselves() -> None:
    exc = wrap(redis.TimeoutError("Timeout reading from socket"), "orders: LPOP")
    assert str(exc) == "redis: orders: LPOP: Timeout reading from socket"


def test_sentinel_masters_get_the_database_and_credentials_of_the_url() -> None:
    assert _url_auth("redis://app:secret@unused:6379/3") == {
        "db": 3, "username": "app", "password": "secret"}
    assert _url_auth("redis://unused:6379/0") == {"db": 0}
