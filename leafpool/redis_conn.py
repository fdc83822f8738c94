"""Redis connections and Redis errors: the one place that opens a connection from a URL
(sync and asyncio, with timeouts so an outage is noticed in seconds; redis-py uses the
hiredis parser when it is installed) and the one place that turns redis-py's errors into
leafpool's (:class:`~leafpool.errors.BackendUnavailable`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
import redis.asyncio as aioredis

from leafpool.errors import BackendUnavailable


def _options(timeout: float) -> dict[str, Any]:
    return {"socket_timeout": timeout, "socket_connect_timeout": timeout,
            "health_check_interval": 30}


def connect(url: str, *, timeout: float = 5.0) -> redis.Redis:
    return redis.Redis.from_url(url, **_options(timeout))


def connect_async(url: str, *, timeout: float = 5.0) -> aioredis.Redis:
    return aioredis.Redis.from_url(url, **_options(timeout))


@contextmanager
def redis_errors(what: str) -> Iterator[None]:
    """Wrap redis-py's errors at the boundary: ``what`` names the tag and the command."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise BackendUnavailable(f"redis: {what}: {exc}") from exc
    except redis.ResponseError as exc:
        raise BackendUnavailable(f"redis: {what}: {exc}") from exc


def wrap(exc: redis.RedisError, what: str) -> BackendUnavailable:
    """The leafpool error for ``exc`` (for hot paths that catch redis-py's errors
    themselves rather than enter :func:`redis_errors`)."""
    return BackendUnavailable(f"redis: {what}: {exc}")
