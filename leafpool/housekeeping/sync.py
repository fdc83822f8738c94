"""Beat-driven housekeeping, as plain functions the Celery tasks call.

- :func:`sync_tags` (Leaf: every 60 s): tags in ``leaf_alloc`` become pool tags; segment
  tags gone from the table stop being refilled, their mark is kept in the database
  (``leafpool_retired_tag``: a tag re-created under that name never repeats an ID) and
  their keys go away. The pool's tags are read *before* the database, so a tag added
  between the two reads is never taken for a removed one, and a tag is dropped only while
  its state is the one read (a tag removed and added again meanwhile is kept).

A sync of 10,000 rows costs a few round trips, not one per tag: the pool's states are
read (``HMGET`` of the fields the sync compares, not the tags' lists) and new tags are
registered in pipelines of :data:`leafpool.redis.pool.TAGS_PER_PIPELINE` tags. Only a tag
found gone is read whole (its floor becomes the retired mark).

At rest the sync reads neither: with a :class:`SyncMemo` it first reads the database's
fingerprint of its tags (:func:`leafpool.database.fingerprint.tags_fingerprint`, one row)
and the pool's tag count (``SCARD``), and does nothing more while both are what its last
full pass left (at most :data:`FULL_SYNC_SECONDS` apart; docs/design.md §4).

The sweep that queues refills is :mod:`leafpool.housekeeping.sweep`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from leafpool.database.fingerprint import tags_fingerprint
from leafpool.redis.pool import Pool
from leafpool.redis.register import register_many
from leafpool.segment.store import SegmentStore

log = logging.getLogger(__name__)

#: what the sync reads of each registered tag's state
SYNC_FIELDS = ("mode", "created_ms", "table_step")
#: a full pass at least this often, fingerprint unchanged or not (a change in Redis the
#: tag count does not show, a renamed tag SQLite's fingerprint does not show)
FULL_SYNC_SECONDS = 3600.0


@dataclass
class SyncMemo:
    """What the last full pass saw (the database's fingerprint, the pool's tag count after
    it) and when (monotonic seconds); one per worker process."""

    fingerprint: tuple[str, ...] | None = None
    pool_count: int = -1
    total: int = 0
    at: float = 0.0


@dataclass
class SyncResult:
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    total: int = 0
    modes: dict[str, str] = field(default_factory=dict, repr=False)  # added tag -> mode
    unchanged: bool = False  # the fingerprint and the tag count as the last full pass left

    def added_by_mode(self) -> dict[str, list[str]]:
        """The added tags by mode, in the order they were added."""
        out: dict[str, list[str]] = {}
        for tag in self.added:
            out.setdefault(self.modes.get(tag, "segment"), []).append(tag)
        return out

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"added": self.added, "removed": self.removed,
                                  "total": self.total}
        if self.unchanged:
            out["unchanged"] = True
        return out


def sync_tags(
    pool: Pool,
    store: SegmentStore,
    wall: Callable[[], float] = time.time,
    queued_seconds: int | None = None,
    memo: SyncMemo | None = None,
    monotonic: Callable[[], float] = time.monotonic,
) -> SyncResult:
    """Make the pool's tags match the database: segment tags ``leaf_alloc``, snowflake
    tags ``leafpool_snowflake_tag``.

    ``queued_seconds``: mark each new tag ``queued`` that long *before* registering it:
    the caller queues their first refills itself (in batches), and the sweep and the drop
    watcher, which see a registered tag that was never filled as due, leave them alone.

    ``memo``: skip the pass while the database's fingerprint and the pool's tag count are
    those ``memo`` recorded, for up to :data:`FULL_SYNC_SECONDS`; a full pass records them.
    The fingerprint is read before the pass: a change made during the pass makes the next
    sync a full pass too."""
    if memo is None:
        return _full_pass(pool, store, wall, queued_seconds)
    fingerprint = tags_fingerprint(store.engine)  # raises BackendUnavailable
    now = monotonic()
    if (memo.fingerprint == fingerprint and now - memo.at < FULL_SYNC_SECONDS
            and pool.tag_count() == memo.pool_count):
        return SyncResult(total=memo.total, unchanged=True)
    result = _full_pass(pool, store, wall, queued_seconds)
    memo.fingerprint, memo.pool_count = fingerprint, pool.tag_count()
    memo.total, memo.at = result.total, now
    return result


def _full_pass(
    pool: Pool, store: SegmentStore, wall: Callable[[], float], queued_seconds: int | None
) -> SyncResult:
    # Redis first: a tag added after this read is not in ``known`` and cannot be dropped;
    # one added before it is in the database read that follows (adds write the database
    # first, then Redis).
    known = pool.tags()
    states = dict(zip(known, pool.states(known, SYNC_FIELDS), strict=True))
    rows = store.list_tags()  # raises BackendUnavailable: then nothing is removed
    snowflakes = set(store.list_snowflake_tags())
    in_db = {r.tag: r for r in rows}
    result = SyncResult(total=len(in_db) + len(snowflakes))
    new: list[tuple[str, str, int | None]] = []
    for tag, row in in_db.items():
        state = states.get(tag, {})
        if "mode" not in state:
            new.append((tag, "segment", row.step))
        elif state.get("table_step") != str(row.step):
            pool.record(tag, table_step=row.step)
    for tag in sorted(snowflakes - set(in_db)):
        if "mode" not in states.get(tag, {}):
            new.append((tag, "snowflake", None))
    if new:
        if queued_seconds is not None:
            pool.mark_queued_many([tag for tag, _, _ in new], queued_seconds)
        register_many(pool, new, wall)
        result.added = [tag for tag, _, _ in new]
        result.modes = {tag: mode for tag, mode, _ in new}
        for tag, mode, _ in new:
            log.debug("%s: %s tag found in the database, pool registered", tag, mode)
        log.info(
            "%s: %d tags found in the database, pools registered", _sample(result.added), len(new)
        )
    for tag in known:
        state = states[tag]
        mode = state.get("mode", "segment")
        gone = tag not in in_db if mode == "segment" else tag not in snowflakes
        if not gone:
            continue
        created = state.get("created_ms", "")
        if mode == "segment":
            snap = pool.snapshot(tag)
            # the floor of the state read above (a tag added again meanwhile has its own
            # created_ms and is kept below; its floor is not this tag's mark)
            if snap.state.get("created_ms", "") == created and snap.floor > 0:
                kept = store.retire(tag, snap.floor)
                log.info("%s: removed segment tag's mark %d kept in the database", tag, kept)
        if pool.drop(tag, if_created_ms=created):
            result.removed.append(tag)
            log.info("%s: %s tag gone from the database, pool removed", tag, mode)
        else:
            log.info("%s: tag re-created during the sync, pool kept", tag)
    return result


def _sample(tags: list[str], shown: int = 5) -> str:
    more = f" and {len(tags) - shown} more" if len(tags) > shown else ""
    return ", ".join(tags[:shown]) + more
