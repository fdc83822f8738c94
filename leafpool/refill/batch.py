"""Refills of many tags in one call: the Celery task the tag sync queues for a batch of
new tags (docs/design.md §4), so 10,000 tags inserted with SQL are 100 tasks, not 10,000.

Each tag is refilled by the one-tag protocol unchanged (its lock, its fenced writes, one
atomic ``max_id`` advance per allocation: docs/design.md §3, §5, G3); a batch only
saves the task overhead per tag and overlaps the tags' round trips: ``threads`` refills
run at once, so their Redis and database commits (``appendfsync always``, InnoDB's
commit flush) are written in groups instead of one after the other.

A tag's failure is its own: recorded in its state by the refiller, listed in the batch's
result, and the drop watcher queues that tag again when its failure's hold ends (it is
still due: below its low-water mark, or its reserve short), or the next sweep does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from leafpool.core.errors import LeafpoolError, UnknownTag
from leafpool.refill.base import RefillResult

log = logging.getLogger(__name__)


@dataclass
class BatchResult:
    """What a batch did, tag by tag; the Celery task result Flower shows."""

    refilled: dict[str, str] = field(default_factory=dict)  # tag -> the refill's summary
    skipped: dict[str, str] = field(default_factory=dict)  # tag -> why (locked, unknown)
    failed: dict[str, str] = field(default_factory=dict)  # tag -> the error
    pushed: int = 0

    def as_dict(self) -> dict[str, object]:
        return {
            "tags": len(self.refilled) + len(self.skipped) + len(self.failed),
            "pushed": self.pushed,
            "refilled": self.refilled,
            "skipped": self.skipped,
            "failed": self.failed,
        }


def refill_many(
    refill: Callable[[str], RefillResult],
    tags: Sequence[str],
    threads: int = 1,
    before: Callable[[str], None] | None = None,
) -> BatchResult:
    """``refill(tag)`` for every tag, ``threads`` at a time (``before(tag)`` first: the
    task clears the tag's ``queued`` marker). Every tag is tried; none's failure stops
    the others."""

    def one(tag: str) -> tuple[str, str, str, int]:
        """(tag, outcome, text, IDs pushed); outcome: refilled, skipped or failed."""
        try:
            if before is not None:
                before(tag)
            done = refill(tag)
        except UnknownTag:
            log.info("%s: not a tag any more, refill dropped", tag)
            return tag, "skipped", "unknown tag", 0
        except LeafpoolError as exc:  # logged and recorded in the tag's state by the refiller
            return tag, "failed", f"{type(exc).__name__}: {exc}", 0
        except Exception as exc:  # a bug in one tag's refill must not starve the others
            log.exception("%s: refill failed unexpectedly", tag)
            return tag, "failed", f"{type(exc).__name__}: {exc}", 0
        if done.skipped:
            return tag, "skipped", done.skipped, 0
        return tag, "refilled", done.summary(), done.pushed

    if threads <= 1 or len(tags) <= 1:
        outcomes = [one(tag) for tag in tags]
    else:
        with ThreadPoolExecutor(
            min(threads, len(tags)), thread_name_prefix="leafpool-refill"
        ) as pool:
            outcomes = list(pool.map(one, tags))
    result = BatchResult()
    for tag, outcome, what, pushed in outcomes:
        getattr(result, outcome)[tag] = what
        result.pushed += pushed
    if result.failed:
        log.warning(
            "%s: %d of %d tags in the batch failed to refill",
            next(iter(result.failed)),
            len(result.failed),
            len(tags),
        )
    return result
