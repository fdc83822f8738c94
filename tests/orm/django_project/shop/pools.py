"""The tests' side of Redis: pools filled by hand (a tag registered, IDs pushed, as a
refill would) and Redis's own count of LPOP commands (``INFO commandstats``)."""

from __future__ import annotations

import os
import time

import redis

from leafpool.redis.pool import Pool

PREFIX = "leafpool"


def connection() -> redis.Redis:
    return redis.Redis.from_url(os.environ["SHOP_REDIS_URL"])


def fill(tag: str, ids: range | list[int]) -> None:
    """Register ``tag`` and push ``ids`` onto its list."""
    r = connection()
    try:
        Pool(r, PREFIX).register(tag, "segment", int(time.time() * 1000))
        if ids:
            r.rpush(f"{PREFIX}:{{{tag}}}:ids", *[str(i) for i in ids])
    finally:
        r.close()


def left(tag: str) -> int:
    r = connection()
    try:
        return int(r.llen(f"{PREFIX}:{{{tag}}}:ids"))
    finally:
        r.close()


def lpop_calls() -> int:
    """LPOP commands the server has run (every client's)."""
    r = connection()
    try:
        return int(r.info("commandstats").get("cmdstat_lpop", {}).get("calls", 0))
    finally:
        r.close()


def flush() -> None:
    r = connection()
    try:
        r.flushdb()
    finally:
        r.close()
