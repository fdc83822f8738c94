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

The sweep that queues refills is :mod:`leafpool.housekeeping.sweep`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from leafpool.redis.pool import Pool
from leafpool.redis.register import register_many
from leafpool.segment.store import SegmentStore

log = logging.getLogger(__name__)

#: what the sync reads of each registered tag's state
SYNC_FIELDS = ("mode", "created_ms", "table_step")


@dataclass
class SyncResult:
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    total: int = 0
    modes: dict[str, str] = field(default_factory=dict, repr=False)  # added tag -> mode

    def added_by_mode(self) -> dict[str, list[str]]:
        """The added tags by mode, in the order they were added."""
        out: dict[str, list[str]] = {}
        for tag in self.added:
            out.setdefault(self.modes.get(tag, "segment"), []).append(tag)
        return out

    def as_dict(self) -> dict[str, object]:
        return {"added": self.added, "removed": self.removed, "total": self.total}


def sync_tags(
    pool: Pool,
    store: SegmentStore,
    wall: Callable[[], float] = time.time,
    queued_seconds: int | None = None,
) -> SyncResult:
    """Make the pool's tags match the database: segment tags ``leaf_alloc``, snowflake
    tags ``leafpool_snowflake_tag``.

    ``queued_seconds``: mark each new tag ``queued`` that long *before* registering it:
    the caller queues their first refills itself (in batches), and the sweep and the drop
    watcher, which see a registered tag that was never filled as due, leave them alone."""
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
