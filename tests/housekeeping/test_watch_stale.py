"""The drop watcher decides on levels read a moment before it marks a tag queued: a tag
filled (or locked by a refill) in between is not queued (docs/design.md §4, the batched
first fill: one useless refill task per tag otherwise, taken before the batches)."""

from __future__ import annotations

import redis

from leafpool.housekeeping.watch import DropWatcher
from leafpool.redis.pool import Level, Pool
from tests.housekeeping.test_watch import Queued, filled


def _stale(tag: str) -> Level:
    """A level as read before the tag's first fill: registered, never refilled."""
    return Level(tag, 0, "segment", -1, False, 0)


def test_a_tag_filled_after_its_level_was_read_is_not_queued(
    pool: Pool, r: redis.Redis
) -> None:
    queued = Queued()
    watcher = DropWatcher(pool, queued, spill=False)  # not started: one decision, by hand
    for tag in ("filled", "locked", "due"):
        filled(pool, r, tag)
    r.delete(pool.tag("due").ids)  # below its low-water mark: still due when read again
    lock = pool.refill_lock("locked", 30_000)
    assert lock.acquire()
    watcher._decide([_stale("filled"), _stale("locked"), _stale("due")], set())
    assert queued.tags() == ["due"]
    assert r.exists(pool.tag("due").queued)  # marked: this refill stands for it
    assert not r.exists(pool.tag("filled").queued)  # not left marked by a refill not queued
    assert not r.exists(pool.tag("locked").queued)
    lock.release()
