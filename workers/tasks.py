"""Thin Celery tasks: each one call into the library."""

from __future__ import annotations

import logging
from typing import Any

from leafpool import sweep as sweeping
from leafpool import sync
from leafpool.errors import BackendUnavailable, UnknownTag
from leafpool.refill import Refiller
from workers.application import app, settings
from workers.resources import runtime

log = logging.getLogger(__name__)

# a refill whose backend (Redis, database, ZooKeeper) is down retries with backoff; the
# sweep queues it again after the retries run out
REFILL_OPTIONS: dict[str, Any] = {
    "autoretry_for": (BackendUnavailable,),
    "retry_backoff": 1,
    "retry_backoff_max": int(settings.refill_retry_backoff_max),
    "retry_jitter": True,
    "max_retries": settings.refill_retry_max,
}


def _refill(tag: str, force: bool, refiller: Refiller) -> dict[str, object]:
    try:
        return refiller.refill(tag, force=force).as_dict()
    except UnknownTag:
        log.info("%s: not a tag any more, refill dropped", tag)
        return {"tag": tag, "skipped": "unknown tag"}


@app.task(name="leafpool.refill_segment", **REFILL_OPTIONS)
def refill_segment(tag: str, force: bool = False) -> dict[str, object]:
    """Refill one segment tag; the result (IDs pushed, segments, step) shows in Flower."""
    rt = runtime()
    rt.pool.clear_queued(tag)
    return _refill(tag, force, rt.refiller)


@app.task(name="leafpool.refill_snowflake", **REFILL_OPTIONS)
def refill_snowflake(tag: str, force: bool = False) -> dict[str, object]:
    """Refill one snowflake tag from this process's worker ID (claimed on first use)."""
    rt = runtime()
    rt.pool.clear_queued(tag)
    return _refill(tag, force, rt.snowflake_refiller())


@app.task(name="leafpool.sweep")
def sweep() -> dict[str, object]:
    """Queue a refill for every tag below its low-water mark or found empty."""
    rt = runtime()
    queued = []
    wait = max(5, rt.settings.lock_ttl_ms // 1000)
    for tag, mode, force in sweeping.sweep(rt.pool, queued_seconds=wait):
        task = {"segment": refill_segment, "snowflake": refill_snowflake}.get(mode)
        if task is not None:
            task.delay(tag, force)
            queued.append(tag)
    return {"queued": queued}


@app.task(name="leafpool.sync_tags", autoretry_for=(BackendUnavailable,), max_retries=3,
          retry_backoff=True)
def sync_tags() -> dict[str, object]:
    """Make the pool's tags match the database (Leaf's 60 s cache update)."""
    rt = runtime()
    result = sync.sync_tags(rt.pool, rt.store)
    for tag in result.added:
        if rt.pool.mode(tag) == "snowflake":
            refill_snowflake.delay(tag)
        else:
            refill_segment.delay(tag)
    return result.as_dict()
