"""Opening Redis connections from a URL (sync and asyncio), with timeouts so an outage
is noticed in seconds. redis-py uses the hiredis parser when it is installed."""

from __future__ import annotations

import redis
import redis.asyncio as aioredis


def connect(url: str, *, timeout: float = 5.0) -> redis.Redis:
    return redis.Redis.from_url(
        url,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        health_check_interval=30,
    )


def connect_async(url: str, *, timeout: float = 5.0) -> aioredis.Redis:
    return aioredis.Redis.from_url(
        url,
        socket_timeout=timeout,
        socket_connect_timeout=timeout,
        health_check_interval=30,
    )
