"""Shared by the HTTP service's tests (tests/test_http_*.py): Leaf's example snowflake
ID, filling a pool by hand, and the two tags the status views are tested with."""

from __future__ import annotations

import time

import redis

from leafpool.redis.pool import Pool

# Leaf's own example (LeafMonitorController.decodeSnowflakeId's comment)
LEAF_EPOCH = 1288834974657
LEAF_TS, LEAF_WORKER, LEAF_SEQ = 1567733700834, 39, 3448
LEAF_ID = ((LEAF_TS - LEAF_EPOCH) << 22) | (LEAF_WORKER << 12) | LEAF_SEQ


def fill(r: redis.Redis, tag: str, ids: list[int], mode: str = "segment") -> None:
    Pool(r, "leafpool").register(tag, mode, 0)
    if ids:
        r.rpush(f"leafpool:{{{tag}}}:ids", *[str(i) for i in ids])


def llen(r: redis.Redis, tag: str) -> int:
    return int(r.llen(f"leafpool:{{{tag}}}:ids"))


def fill_status_example(r: redis.Redis) -> None:
    """``order`` (segment: 1,234 ready, a reserve range up to 2**63 - 1, an error message
    holding markup) and ``sf`` (snowflake: two worker IDs, a clock step back)."""
    fill(r, "order", list(range(1, 1235)))
    r.rpush("leafpool:{order}:reserve", "9223372036854770000:9223372036854775807")
    r.hset("leafpool:{order}:state", mapping={
        "target": 2000, "low_water": 1000, "step": 1000, "max_id": 2**63 - 1, "rate": 12.5,
        "empty_hits": 3, "last_error": "<script>alert(1)</script>", "last_error_ms": 1,
        "last_refill_ms": int(time.time() * 1000), "last_refill_result": "ok +1000"})
    fill(r, "sf", [LEAF_ID], mode="snowflake")
    r.hset("leafpool:{sf}:state", mapping={
        "worker_ids": "3,7", "lease_state": "held", "last_backwards_ms": 1,
        "last_backwards_offset_ms": 12, "backwards_events": 2})
