"""A batch of tags refilled in one call (the tag sync's first fill): every tag of the
batch is refilled by the one-tag protocol, a few at once, and each tag's failure is its
own (recorded in its state and in the batch's result)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import redis
from sqlalchemy import text

from leafpool.core.config import Settings
from leafpool.housekeeping.sync import sync_tags
from leafpool.redis.pool import Pool
from leafpool.refill.base import RefillResult
from leafpool.refill.batch import BatchResult, refill_many
from leafpool.segment.refiller import SegmentRefiller
from leafpool.segment.store import SegmentStore
from tests.support import services

WAIT = 10.0


def test_a_batch_refills_every_tag_and_records_failures_per_tag(
    pool: Pool, store: SegmentStore, r: redis.Redis, make_settings: Callable[..., Settings]
) -> None:
    tags = [f"t{n:02d}" for n in range(40)]
    for tag in tags:
        store.add_tag(tag, step=50)
    sync_tags(pool, store)
    # t13's pool has handed out IDs up to 999 while its row was moved back by hand: its
    # refill must be refused (CounterBehind), the others must not notice
    pool.record("t13", hwm=999)
    # (refuse: with the default, heal, the row would be moved up and t13 refilled)
    refiller = SegmentRefiller(pool, store, make_settings(pool_floor=30, pool_ceiling=30,
                                                          counter_behind="refuse"))
    cleared: list[str] = []
    pool.mark_queued_many(tags, 60)
    result = refill_many(
        refiller.refill,
        [*tags, "gone"],
        threads=4,
        before=lambda tag: (cleared.append(tag), pool.clear_queued(tag)),
    )
    assert sorted(cleared) == sorted([*tags, "gone"])
    assert set(result.failed) == {"t13"} and "CounterBehind" in result.failed["t13"]
    assert result.skipped == {"gone": "unknown tag"}
    assert set(result.refilled) == set(tags) - {"t13"}
    assert result.pushed == 39 * 30
    assert result.as_dict()["tags"] == 41
    for tag in set(tags) - {"t13"}:
        ids = [int(x) for x in r.lrange(f"leafpool:{{{tag}}}:ids", 0, -1)]
        assert ids == list(range(1, 31)), tag
    failed = pool.snapshot("t13")
    assert failed.length == 0 and failed.int("refill_failures") == 1
    assert "UPDATE leaf_alloc" in failed.state["last_error"]
    # cleared before each refill; the failed tag's refill holds its marker again for the
    # retry backoff (a failure must not be queued again as fast as it fails)
    assert [tag for tag in tags if r.exists(pool.tag(tag).queued)] == ["t13"]


def test_concurrent_refills_of_one_batch_allocate_disjoint_ranges(
    pool: Pool, store: SegmentStore, r: redis.Redis, make_settings: Callable[..., Settings]
) -> None:
    """A tag listed twice in a batch (two threads refill it at once): its lock lets one
    refill through; the allocations of all tags stay one atomic advance each (G3)."""
    for tag in ("a", "b", "c"):
        store.add_tag(tag, step=10)
    sync_tags(pool, store)
    refiller = SegmentRefiller(pool, store, make_settings(pool_floor=25, pool_ceiling=25))
    result = refill_many(
        lambda t: refiller.refill(t, force=True), ["a", "b", "a", "c", "a", "b"], threads=6
    )
    assert not result.failed
    for tag in ("a", "b", "c"):
        ids = [int(x) for x in r.lrange(f"leafpool:{{{tag}}}:ids", 0, -1)]
        assert ids == list(range(1, len(ids) + 1)) and len(ids) >= 25, (tag, ids)
        with store.engine.begin() as conn:
            max_id = conn.execute(
                text("SELECT max_id FROM leaf_alloc WHERE biz_tag = :t"), {"t": tag}
            ).scalar_one()
        assert max_id == pool.snapshot(tag).floor


def test_a_running_batch_keeps_the_markers_of_the_tags_it_has_not_reached_short_and_alive(
    pool: Pool, r: redis.Redis
) -> None:
    """docs/design.md §3.7: the tag sync marks a batch's tags queued for as long as the
    batch may wait in its queue. Once the batch runs, the tags it has not reached hold
    markers of a few seconds, renewed while it runs, so that a batch lost with its worker
    leaves them to the drop watcher within seconds; each tag's marker is cleared when its
    refill begins, and nothing is renewed after the batch."""
    tags = ["a", "b", "c"]
    pool.mark_queued_many(tags, 300)  # as the tag sync marks a batch's tags
    release = threading.Event()
    kept: list[list[str]] = []

    def refill(tag: str) -> RefillResult:
        if tag == "a":
            assert release.wait(WAIT)
        return RefillResult(tag, pushed=1)

    def keep(waiting: list[str]) -> None:
        kept.append(waiting)
        pool.keep_queued(waiting, 3)

    result: list[BatchResult] = []
    batch = threading.Thread(target=lambda: result.append(refill_many(
        refill, tags, before=pool.clear_queued, keep=keep, keep_every=0.05)))
    batch.start()
    try:
        services.wait_until(lambda: len(kept) >= 3, WAIT, "markers renewed while it runs")
        assert kept[0] == tags  # at once, before any refill: every marker shortened
        assert all(k == ["b", "c"] for k in kept[2:])  # "a" begun: not renewed
        assert r.exists(pool.tag("a").queued) == 0  # cleared when its refill began
        for tag in ("b", "c"):
            assert 0 < r.pttl(pool.tag(tag).queued) <= 3000, tag
    finally:
        release.set()
        batch.join(WAIT)
    assert not batch.is_alive() and result[0].pushed == 3
    assert [t for t in tags if r.exists(pool.tag(t).queued)] == []
    # the keeper stopped with the batch
    assert not [t for t in threading.enumerate() if t.name == "leafpool-batch-keep"]


def test_a_refill_task_clears_its_marker_only_once_it_holds_the_lock(
    pool: Pool, store: SegmentStore, r: redis.Redis, make_settings: Callable[..., Settings]
) -> None:
    """docs/design.md §3.7: cleared before the lock, the marker left a moment in which the
    drop watcher, reading the tag again, found it due, unlocked and unmarked and queued a
    second refill (two refused refills 0.2 s apart in tests/system/test_requeue.py). Found
    locked, the task clears it too: the running refill fills the tag, and its release is
    heard."""
    store.add_tag("order", step=50)
    sync_tags(pool, store)
    refiller = SegmentRefiller(pool, store, make_settings(pool_floor=30, pool_ceiling=30))
    seen: list[bool] = []
    clear = pool.clear_queued

    def clear_and_look(tag: str) -> None:
        seen.append(bool(r.exists(pool.tag(tag).lock)))
        clear(tag)

    pool.clear_queued = clear_and_look  # type: ignore[method-assign]
    assert pool.mark_queued("order", 60)
    assert refiller.refill("order", clear_queued=True).pushed == 30
    assert seen == [True] and not r.exists(pool.tag("order").queued)
    assert pool.mark_queued("order", 60)
    r.set(pool.tag("order").lock, f"ab@{r.info('replication')['master_replid']}")  # held
    assert refiller.refill("order", force=True, clear_queued=True).skipped == "locked"
    assert seen == [True, True] and not r.exists(pool.tag("order").queued)
    r.delete(pool.tag("order").lock)
    assert pool.mark_queued("order", 60)
    refiller.refill("order", force=True)  # a refill of no task's (the CLI): marker kept
    assert r.exists(pool.tag("order").queued)
