"""Refills of many tags in one call: the Celery task the tag sync queues for a batch of
new tags (docs/design.md §4), so 10,000 tags inserted with SQL are 100 tasks, not 10,000.

Each tag is refilled by the one-tag protocol unchanged (its lock, its fenced writes, one
atomic ``max_id`` advance per allocation: docs/design.md §3, §5, G3); a batch only
saves the task overhead per tag and overlaps the tags' round trips: ``threads`` refills
run at once, so their Redis and database commits (``appendfsync always``, InnoDB's
commit flush) are written in groups instead of one after the other.

New tags' first fills go by :mod:`leafpool.segment.first_fill` when the caller passes
``first_fill``: one round trip per protocol step for the whole batch, one database
transaction for its allocations; the tags it leaves (not plain first fills) are refilled
one by one as above.

A tag's failure is its own: recorded in its state by the refiller, listed in the batch's
result, and the drop watcher queues that tag again when its failure's hold ends (it is
still due: below its low-water mark, or its reserve short), or the next sweep does.

The tag sync marks a batch's tags ``queued`` for as long as the batch may wait in its
queue. Once the batch runs, ``keep`` holds the markers of the tags it has not reached yet
to a few seconds and renews them while it runs (docs/design.md §3.7): a batch lost with its
worker leaves its remaining tags to the drop watcher within seconds, not after the
visibility timeout.
"""

from __future__ import annotations

import logging
import threading
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


@dataclass
class FirstFillDone:
    """What a batched first fill did (:mod:`leafpool.segment.first_fill`): each tag's
    outcome (``refilled``, ``skipped`` or ``failed``, its text, IDs pushed) and the tags
    it left to the one-tag path, in order."""

    outcomes: dict[str, tuple[str, str, int]] = field(default_factory=dict)
    rest: list[str] = field(default_factory=list)


#: how often a running batch renews the markers of the tags it has not reached
KEEP_EVERY_SECONDS = 1.0


class _Keeper:
    """Calls ``keep(tags not begun)`` now and every ``every`` seconds in a thread, until
    :meth:`stop`. Best effort: a failed call is logged and tried again at the next."""

    def __init__(self, keep: Callable[[list[str]], None], tags: Sequence[str],
                 every: float) -> None:
        self._keep, self._every = keep, every
        self._waiting = list(dict.fromkeys(tags))
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._call()
        self._thread = threading.Thread(target=self._run, name="leafpool-batch-keep",
                                        daemon=True)
        self._thread.start()

    def begun(self, tag: str) -> None:
        with self._lock:
            if tag in self._waiting:
                self._waiting.remove(tag)

    def _call(self) -> None:
        with self._lock:
            waiting = list(self._waiting)
        if not waiting:
            return
        try:
            self._keep(waiting)
        except Exception as exc:  # Redis away: the markers expire, the watcher takes over
            log.warning("batch: queued markers not renewed: %s", exc)

    def _run(self) -> None:
        while not self._done.wait(self._every):
            self._call()

    def stop(self) -> None:
        self._done.set()
        self._thread.join()


def refill_many(
    refill: Callable[[str], RefillResult],
    tags: Sequence[str],
    threads: int = 1,
    before: Callable[[str], None] | None = None,
    keep: Callable[[list[str]], None] | None = None,
    keep_every: float = KEEP_EVERY_SECONDS,
    first_fill: Callable[[Sequence[str]], FirstFillDone] | None = None,
) -> BatchResult:
    """``refill(tag)`` for every tag, ``threads`` at a time (``before(tag)`` first: the
    task clears the tag's ``queued`` marker). Every tag is tried; none's failure stops
    the others. ``keep(tags)``: called at once and every ``keep_every`` seconds until the
    batch ends with the tags whose refill has not begun (the task shortens and renews
    their markers). ``first_fill(tags)``: fills the plain first fills among them at once
    (:class:`~leafpool.segment.first_fill.FirstFill`); the tags it leaves go by
    ``refill``, and all of them when it raises."""
    keeper = _Keeper(keep, tags, keep_every) if keep is not None else None
    first: dict[str, tuple[str, str, int]] = {}
    if first_fill is not None:
        try:
            filled = first_fill(tags)
        except Exception as exc:  # nothing lost: its locks released or expiring, the
            # fences refuse what it did not finish; every tag goes the one-tag way
            log.warning("batch: first fill of %d tags failed, one by one instead: %s",
                        len(tags), exc)
        else:
            first = filled.outcomes
            if keeper is not None:
                for tag in first:
                    keeper.begun(tag)
            tags = filled.rest

    def one(tag: str) -> tuple[str, str, str, int]:
        """(tag, outcome, text, IDs pushed); outcome: refilled, skipped or failed."""
        try:
            if keeper is not None:
                keeper.begun(tag)
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

    try:
        if threads <= 1 or len(tags) <= 1:
            outcomes = [one(tag) for tag in tags]
        else:
            with ThreadPoolExecutor(
                min(threads, len(tags)), thread_name_prefix="leafpool-refill"
            ) as pool:
                outcomes = list(pool.map(one, tags))
    finally:
        if keeper is not None:
            keeper.stop()
    result = BatchResult()
    for tag, outcome, what, pushed in [*((t, *o) for t, o in first.items()), *outcomes]:
        getattr(result, outcome)[tag] = what
        result.pushed += pushed
    if result.failed:
        log.warning(
            "%s: %d of %d tags in the batch failed to refill",
            next(iter(result.failed)),
            len(result.failed),
            len(tags) + len(first),
        )
    return result
