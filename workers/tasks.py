"""Thin Celery tasks: each one call into the library."""

from __future__ import annotations

import logging

from leafpool import sync
from leafpool.errors import BackendUnavailable, UnknownTag
from workers.application import app, settings
from workers.resources import runtime

log = logging.getLogger(__name__)


@app.task(
    name="leafpool.refill_segment",
    autoretry_for=(BackendUnavailable,),
    retry_backoff=1,
    retry_backoff_max=int(settings.refill_retry_backoff_max),
    retry_jitter=True,
    max_retries=settings.refill_retry_max,
)
def refill_segment(tag: str, force: bool = False) -> dict[str, object]:
    """Refill one segment tag; the result (IDs pushed, segments, step) shows in Flower."""
    rt = runtime()
    rt.pool.clear_queued(tag)
    try:
        return rt.refiller.refill(tag, force=force).as_dict()
    except UnknownTag:
        log.info("%s: not a tag any more, refill dropped", tag)
        return {"tag": tag, "skipped": "unknown tag"}


@app.task(
    name="leafpool.refill_snowflake",
    autoretry_for=(BackendUnavailable,),
    retry_backoff=1,
    retry_backoff_max=int(settings.refill_retry_backoff_max),
    retry_jitter=True,
    max_retries=settings.refill_retry_max,
)
def refill_snowflake(tag: str, force: bool = False) -> dict[str, object]:
    """Refill one snowflake tag from this process's worker ID (claimed on first use)."""
    rt = runtime()
    rt.pool.clear_queued(tag)
    try:
        return rt.snowflake_refiller().refill(tag, force=force).as_dict()
    except UnknownTag:
        log.info("%s: not a tag any more, refill dropped", tag)
        return {"tag": tag, "skipped": "unknown tag"}


@app.task(name="leafpool.sweep")
def sweep() -> dict[str, object]:
    """Queue a refill for every tag below its low-water mark or found empty."""
    rt = runtime()
    queued = []
    wait = max(5, rt.settings.lock_ttl_ms // 1000)
    for tag, mode, force in sync.sweep(rt.pool, queued_seconds=wait):
        if mode == "segment":
            refill_segment.delay(tag, force)
        elif mode == "snowflake":
            refill_snowflake.delay(tag, force)
        else:
            continue
        queued.append(tag)
    return {"queued": queued}


@app.task(name="leafpool.sync_tags", autoretry_for=(BackendUnavailable,), max_retries=3,
          retry_backoff=True)
def sync_tags() -> dict[str, object]:
    """Make the pool's tags match leaf_alloc (Leaf's 60 s cache update)."""
    rt = runtime()
    result = sync.sync_tags(rt.pool, rt.store)
    for tag in result.added:
        if rt.pool.mode(tag) == "snowflake":
            refill_snowflake.delay(tag)
        else:
            refill_segment.delay(tag)
    return result.as_dict()
