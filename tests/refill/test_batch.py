"""A batch of tags refilled in one call (the tag sync's first fill): every tag of the
batch is refilled by the one-tag protocol, a few at once, and each tag's failure is its
own (recorded in its state and in the batch's result)."""

from __future__ import annotations

from collections.abc import Callable

import redis
from sqlalchemy import text

from leafpool.core.config import Settings
from leafpool.housekeeping.sync import sync_tags
from leafpool.redis.pool import Pool
from leafpool.refill.batch import refill_many
from leafpool.segment.refiller import SegmentRefiller
from leafpool.segment.store import SegmentStore


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
