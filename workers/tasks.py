"""Thin Celery tasks: each one call into the library."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from celery import Task

from leafpool.core.errors import BackendUnavailable, UnknownTag
from leafpool.housekeeping import sweep as sweeping
from leafpool.housekeeping import sync
from leafpool.redis.pool import Pool
from leafpool.refill import retry as retrying
from leafpool.refill.base import Refiller
from leafpool.refill.batch import refill_many
from leafpool.segment.first_fill import FirstFill
from workers.application import app, settings, sweep_seconds, watching
from workers.resources import runtime

log = logging.getLogger(__name__)

# a refill whose backend (Redis, database, ZooKeeper) is down is tried again: below its
# low-water mark with the database down on a short bounded backoff (0.25 s doubling to
# 1 s) for as long as both hold, otherwise with Celery's growing backoff, at most
# LEAFPOOL_REFILL_RETRY_MAX times (leafpool.refill.retry, docs/design.md §3.8); the sweep
# queues it again after that
REFILL_OPTIONS: dict[str, Any] = {"bind": True, "max_retries": None}


def _refill(task: Task, tag: str, force: bool, refiller: Refiller) -> dict[str, object]:
    try:
        # the task clears its queued marker once the refill holds the lock (docs/design.md §3.7)
        return refiller.refill(tag, force=force, clear_queued=True).as_dict()
    except UnknownTag:
        log.info("%s: not a tag any more, refill dropped", tag)
        return {"tag": tag, "skipped": "unknown tag"}
    except BackendUnavailable as exc:
        plan = retrying.after_failure(refiller.pool, tag, exc, task.request.retries,
                                      settings.refill_retry_backoff_max)
        if plan is None:  # recorded in the tag's state; the refill queued meanwhile goes on
            return {"tag": tag, "skipped": f"failed ({exc}); another refill is queued"}
        limit = None if plan.fast else settings.refill_retry_max
        raise task.retry(exc=exc, countdown=plan.seconds, max_retries=limit) from exc


@app.task(name="leafpool.refill_segment", **REFILL_OPTIONS)
def refill_segment(self: Task, tag: str, force: bool = False) -> dict[str, object]:
    """Refill one segment tag; the result (IDs pushed, segments, step) shows in Flower."""
    return _refill(self, tag, force, runtime().refiller)


@app.task(name="leafpool.refill_snowflake", **REFILL_OPTIONS)
def refill_snowflake(self: Task, tag: str, force: bool = False) -> dict[str, object]:
    """Refill one snowflake tag from this process's worker ID (claimed on first use)."""
    return _refill(self, tag, force, runtime().snowflake_refiller())


@app.task(name="leafpool.sweep")
def sweep() -> dict[str, object]:
    """Queue a refill for every tag below its low-water mark or found empty."""
    rt = runtime()
    queued = []
    # the trigger's short marker (docs/design.md §3.7): a refill that cannot run holds the
    # tag seconds, and the next sweep or the watcher queues it again. One sweep at a time,
    # full passes spaced by the tag count while the watcher runs (sweep_pass)
    done = sweeping.sweep_pass(rt.pool, sweeping.QUEUED_SECONDS, interval=sweep_seconds,
                               watching=watching)
    for tag, mode, force in done.queued:
        task = REFILL_TASKS.get(mode)
        if task is not None:
            task.delay(tag, force)
            queued.append(tag)
    return {"queued": queued, "full": done.full, "tags": done.tags,
            "rest_seconds": round(done.rest_seconds, 1)}


# The first fill of thousands of new tags is a backlog of batch tasks; a live tag's
# refill (queued by the sweep or the drop watcher) must not wait behind it. Redis
# transport: priority 0 (the default) is taken before 9 (kombu's priority steps).
FIRST_FILL_PRIORITY = 9


@app.task(name="leafpool.refill_segments")
def refill_segments(tags: list[str], force: bool = False) -> dict[str, object]:
    """Refill a batch of segment tags (the tag sync's first fill), a few at once; each
    tag's result or failure shows in Flower. A failed tag is queued again by the drop
    watcher when its hold ends, or by the sweep."""
    rt = runtime()
    first = FirstFill(rt.refiller)  # new tags' first fills: one round trip a step for all
    return refill_many(lambda tag: rt.refiller.refill(tag, force=force, clear_queued=True),
                       tags, threads=rt.settings.refill_batch_threads,
                       keep=_keep_queued(rt.pool),
                       first_fill=lambda batch: first.run(batch, force=force,
                                                          clear_queued=True)).as_dict()


@app.task(name="leafpool.refill_snowflakes")
def refill_snowflakes(tags: list[str], force: bool = False) -> dict[str, object]:
    """Refill a batch of snowflake tags from this process's worker ID, one at a time."""
    rt = runtime()
    refiller = rt.snowflake_refiller()
    return refill_many(lambda tag: refiller.refill(tag, force=force, clear_queued=True), tags,
                       keep=_keep_queued(rt.pool)).as_dict()


def _keep_queued(pool: Pool) -> Callable[[list[str]], None]:
    """A running batch keeps the markers of the tags it has not reached short and alive
    (docs/design.md §3.7): lost with its worker, they end within seconds."""
    return lambda tags: pool.keep_queued(tags, sweeping.QUEUED_SECONDS)


#: each mode's refill task (the sweep, the tag sync and the beat's drop watcher queue them)
REFILL_TASKS = {"segment": refill_segment, "snowflake": refill_snowflake}
BATCH_REFILL_TASKS = {"segment": refill_segments, "snowflake": refill_snowflakes}


#: what this process's last full tag sync saw: the syncs after it skip their reads of
#: Redis while the database's tags and the pool's tag count are unchanged (design §4)
SYNC_MEMO = sync.SyncMemo()


@app.task(name="leafpool.sync_tags", autoretry_for=(BackendUnavailable,), max_retries=3,
          retry_backoff=True)
def sync_tags() -> dict[str, object]:
    """Make the pool's tags match the database (Leaf's 60 s cache update) and queue the
    new tags' first refills: one task per ``LEAFPOOL_REFILL_BATCH_SIZE`` tags, each tag
    marked queued (the sweep and the drop watcher do not queue it meanwhile)."""
    rt = runtime()
    size = rt.settings.refill_batch_size
    # batches: the new tags are marked queued before they are registered (the drop
    # watcher would otherwise queue one refill per tag the moment it sees them)
    result = sync.sync_tags(rt.pool, rt.store,
                            queued_seconds=rt.settings.visibility_timeout if size > 1 else None,
                            memo=SYNC_MEMO)
    for mode, tags in result.added_by_mode().items():
        if size == 1:  # one task per tag
            single = REFILL_TASKS[mode]
            for tag in tags:
                single.delay(tag)
            continue
        batch = BATCH_REFILL_TASKS[mode]
        for lo in range(0, len(tags), size):
            batch.apply_async((tags[lo:lo + size],), priority=FIRST_FILL_PRIORITY)
    return result.as_dict()
