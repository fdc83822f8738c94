"""Beat-driven housekeeping, as plain functions the Celery tasks call.

- :func:`sync_tags` (Leaf: every 60 s): tags in ``leaf_alloc`` become pool tags; segment
  tags gone from the table stop being refilled, their mark is kept in the database
  (``leafpool_retired_tag``: a tag re-created under that name never repeats an ID) and
  their keys go away. The pool's tags are read *before* the database, so a tag added
  between the two reads is never taken for a removed one, and a tag is dropped only while
  its state is the one read (a tag removed and added again meanwhile is kept).

The sweep that queues refills is :mod:`leafpool.sweep`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from leafpool.pool import Pool
from leafpool.store import SegmentStore
from leafpool.tags import register

log = logging.getLogger(__name__)


@dataclass
class SyncResult:
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    total: int = 0

    def as_dict(self) -> dict[str, object]:
        return {"added": self.added, "removed": self.removed, "total": self.total}


def sync_tags(
    pool: Pool, store: SegmentStore, wall: Callable[[], float] = time.time
) -> SyncResult:
    """Make the pool's tags match the database: segment tags ``leaf_alloc``, snowflake
    tags ``leafpool_snowflake_tag``."""
    # Redis first: a tag added after this read is not in ``known`` and cannot be dropped;
    # one added before it is in the database read that follows (adds write the database
    # first, then Redis).
    known = pool.tags()
    snaps = {s.tag: s for s in pool.snapshots(known)}
    rows = store.list_tags()  # raises BackendUnavailable: then nothing is removed
    snowflakes = set(store.list_snowflake_tags())
    in_db = {r.tag: r for r in rows}
    result = SyncResult(total=len(in_db) + len(snowflakes))
    for tag, row in in_db.items():
        snap = snaps.get(tag)
        if snap is None or not snap.known:
            register(pool, tag, "segment", row.step, wall)
            result.added.append(tag)
            log.info("%s: tag found in leaf_alloc, pool registered", tag)
        elif snap.state.get("table_step") != str(row.step):
            pool.record(tag, table_step=row.step)
    for tag in sorted(snowflakes - set(in_db)):
        snap = snaps.get(tag)
        if snap is None or not snap.known:
            register(pool, tag, "snowflake", wall=wall)
            result.added.append(tag)
            log.info("%s: snowflake tag registered", tag)
    for tag in known:
        snap = snaps[tag]
        mode = snap.state.get("mode", "segment")
        gone = tag not in in_db if mode == "segment" else tag not in snowflakes
        if not gone:
            continue
        if mode == "segment" and snap.floor > 0:
            kept = store.retire(tag, snap.floor)
            log.info("%s: removed segment tag's mark %d kept in the database", tag, kept)
        if pool.drop(tag, if_created_ms=snap.state.get("created_ms", "")):
            result.removed.append(tag)
            log.info("%s: %s tag gone from the database, pool removed", tag, mode)
        else:
            log.info("%s: tag re-created during the sync, pool kept", tag)
    return result
