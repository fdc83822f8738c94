"""What every refiller shares (docs/design.md §3): one refill at a time per tag (the
lock), the measurement of consumption and the targets derived from it (the recent peak
rate and the reserve an outage needs among them), and the record of a failure: which
one was the source's (``db_unreachable_ms``, docs/design.md §3.8), and whether the list
is dry. :mod:`leafpool.segment.refiller` and :mod:`leafpool.snowflake.refiller` fill
the list from their source."""

from __future__ import annotations

import contextlib
import logging
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

from leafpool.core.config import Settings
from leafpool.core.errors import BackendUnavailable, CounterBehind, LeafpoolError, OutsideDcSlot
from leafpool.redis.lock import RefillLock
from leafpool.redis.pool import Pool, Snapshot
from leafpool.refill.sizing import (
    HINT_FRESH_SECONDS,
    decayed_peak,
    instant_rate,
    list_seconds,
    pool_target,
    reserve_target,
    sizing_rate,
    smooth_rate,
)

log = logging.getLogger(__name__)

#: after a failed refill, how long the sweep and the drop watcher leave the tag to Celery's
#: retry (at most the retry backoff's maximum): at most one more refill this often while a
#: backend is down, and a retry that is lost, or a failure Celery does not retry, delays the
#: tag's next refill no longer than this and a watcher's heartbeat (docs/design.md §3.7)
FAILED_HOLD_SECONDS = 3


class SourceUnavailable(BackendUnavailable):
    """The refiller's source (the database, for a segment tag) did not answer an
    allocation: raised by :meth:`Refiller.from_source` in place of the store's
    :class:`BackendUnavailable`, with its message, so the failure record and the retry
    (:mod:`leafpool.refill.retry`) can tell it from a Redis error."""

    #: set by the failure record when it marked the tag queued itself (no other refill
    #: of the tag was queued meanwhile): this failure's retry is the tag's one
    #: (leafpool.refill.retry)
    requeued: bool = False
    #: the source is the database (a segment tag's; a snowflake tag's worker-ID registry
    #: in mode mysql): the failure record says since when it is unreachable
    #: (``db_unreachable_ms``). False: another source (ZooKeeper), retried the same way
    database: bool = True
    #: the tag's smoothed allocation latency (seconds, ``alloc_ms``) when it failed: the
    #: fast retry's step is shortened across a WAN (leafpool.refill.retry.fast_step_max)
    latency: float = 0.0


@dataclass
class RefillResult:
    """What one refill did; also the Celery task result Flower shows."""

    tag: str
    pushed: int = 0
    length: int = 0
    target: int = 0
    step: int = 0
    segments: list[str] = field(default_factory=list)
    worker_id: int | None = None
    skipped: str = ""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)

    def summary(self) -> str:
        if self.skipped:
            return f"skipped: {self.skipped}"
        segs = f", segments {' '.join(self.segments)}" if self.segments else ""
        return f"pushed {self.pushed}, length {self.length}/{self.target}, step {self.step}{segs}"


@dataclass(frozen=True)
class Measure:
    """Consumption rate and the targets derived from it (protocol steps 1-2)."""

    rate: float
    consumed_total: int
    target: int
    low_water: int
    peak: float = 0.0  # the recent peak rate (a decaying maximum, refill.sizing.decayed_peak)
    latency: float = 0.0  # the smoothed allocation latency, seconds (``alloc_ms``)


class Refiller(ABC):
    """One refill at a time per tag: the lock, the measurement, the failure record.
    Subclasses fill the list from their source in :meth:`_refill_locked`."""

    mode: str

    def __init__(
        self,
        pool: Pool,
        settings: Settings,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """``wall``: seconds since the epoch (recorded times, rates); ``monotonic``:
        seconds for intervals (the lock's extension)."""
        self.pool = pool
        self.settings = settings
        self._wall = wall
        self._monotonic = monotonic

    def _now_ms(self) -> int:
        return int(self._wall() * 1000)

    def refill(self, tag: str, force: bool = False, clear_queued: bool = False) -> RefillResult:
        """Refill ``tag`` if it is below its low-water mark (or not full, with ``force``).

        Returns ``skipped="locked"`` when another refiller holds the tag. ``clear_queued``:
        the caller is the task the tag's ``queued`` marker stands for; the marker is cleared
        once the lock is taken (or found held), not before: in between, a trigger reading
        the tag would find it due, unlocked and unmarked, and queue a second refill
        (docs/design.md §3.7).
        """
        lock = self.pool.refill_lock(tag, self.settings.lock_ttl_ms, self._monotonic)
        if not lock.acquire():
            if clear_queued:  # the refill holding the lock fills it; its release is heard
                self.pool.clear_queued(tag)
            return RefillResult(tag, skipped="locked")
        with lock:
            if clear_queued:
                self.pool.clear_queued(tag)
            snap = self._ensure_known(tag)  # UnknownTag: nothing recorded (no keys made)
            mode = snap.state.get("mode", "segment")
            if mode != self.mode:
                return RefillResult(tag, skipped=f"mode is {mode}")
            self.pool.note_master(snap, self._now_ms())
            try:
                result = self._refill_locked(snap, lock, force)
            except LeafpoolError as exc:
                self._record_failure(snap, exc)
                self._note_dry(tag)  # the list may be dry now: nothing was added
                raise
            if snap.int("dry_since_ms") or not result.pushed:
                # only then can the mark change here: pushed IDs end a dry period, a
                # refill that pushed nothing may leave the list at 0 (the watcher and the
                # sweep mark what clients drain meanwhile)
                self._note_dry(tag)
            back = self._source_back(snap, result)
            self.pool.record(
                tag,
                counts={"refills": 1},
                last_refill_ms=self._now_ms(),
                last_refill_result=f"ok +{result.pushed}",
                **back,
            )
        log.info("%s: refill %s", tag, result.summary())
        return result

    @contextlib.contextmanager
    def from_source(self, database: bool = True) -> Iterator[None]:
        """Around a call to the refiller's source (an allocation; a snowflake generator's
        worker-ID registry): its :class:`BackendUnavailable` goes up as
        :class:`SourceUnavailable` (``database``: whether that source is the database)."""
        try:
            yield
        except SourceUnavailable:
            raise
        except BackendUnavailable as exc:
            error = SourceUnavailable(*exc.args)
            error.database = database
            raise error from exc

    def _source_back(self, snap: Snapshot, result: RefillResult) -> dict[str, object]:
        """The fields that clear ``db_unreachable_ms`` when this refill allocated (the
        source answered again); none otherwise: a refill served from the reserve did not
        ask the source, so the mark stays until an allocation succeeds."""
        since = snap.int("db_unreachable_ms")
        if not since or not result.segments:
            return {}
        log.warning("%s: database reachable again; allocations had failed for %.1f s",
                    snap.tag, max(0.0, self._now_ms() - since) / 1000)
        return {"db_unreachable_ms": ""}

    def _note_dry(self, tag: str) -> None:
        """Mark the list dry (at 0 after IDs were pushed) or no longer dry, as the list
        is now (``dry.lua``, atomic on ``LLEN``: docs/design.md §3.8)."""
        with contextlib.suppress(BackendUnavailable):
            self.pool.note_dry(tag, self._now_ms())

    def _record_failure(self, snap: Snapshot, exc: LeafpoolError) -> None:
        tag = snap.tag
        # the source's failure: when allocations started failing (kept from the first
        # failure on; cleared by the first allocation that succeeds). Its retries, once a
        # second while the list is low (leafpool.refill.retry), log at INFO
        source: dict[str, object] = {}
        level = logging.ERROR if isinstance(exc, CounterBehind | OutsideDcSlot) \
            else logging.WARNING
        if isinstance(exc, SourceUnavailable) and exc.database:
            since = snap.int("db_unreachable_ms")
            if since:
                level = logging.INFO
            else:
                source = {"db_unreachable_ms": self._now_ms()}
        log.log(level, "%s: refill failed: %s", tag, exc)
        with contextlib.suppress(BackendUnavailable):  # Redis down: the exception says so
            # reserve_due: a failed refill may have left the reserve short; the sweep
            # queues the tag again (the next refill that tops it up clears the flag).
            # Until then the queued marker holds the triggers off for a few seconds
            # (FAILED_HOLD_SECONDS; Celery retries this refill meanwhile): without it the
            # drop watcher would queue a refill against a database that is down as fast as
            # each fails (set while the lock is held, so the watcher hears the release after
            # it). Not for the whole retry backoff: a retry waits in its worker's memory and
            # is lost with it (a worker killed), and the tag would have no trigger until the
            # marker expired (30 s, seen in the Sentinel failover test); a failure Celery
            # does not retry (CounterBehind, StaleWrite, or retries used up) has none behind
            # it at all. A batch's refill (the tag sync's first fill) has no retry of its
            # own either: the watcher reads a tag it found due but held again every second,
            # so it is queued when the hold ends (leafpool.housekeeping.watch)
            registered = self.pool.record(
                tag,
                counts={"refill_failures": 1},
                last_error=str(exc),
                reserve_due=1,
                last_error_ms=self._now_ms(),
                last_refill_ms=self._now_ms(),
                last_refill_result=f"failed: {type(exc).__name__}",
                **source,
            )
            if registered:  # a dropped tag gets no stray key
                backoff = math.ceil(self.settings.refill_retry_backoff_max)
                # at least 2 s: longer than a fast retry's step (leafpool.refill.retry)
                hold = max(2, min(FAILED_HOLD_SECONDS, backoff))
                marked = self.pool.mark_queued(tag, hold)
                if isinstance(exc, SourceUnavailable):
                    exc.requeued = marked
                    exc.latency = snap.float("alloc_ms") / 1000

    def _measure(self, snap: Snapshot, pool_seconds: float) -> Measure:
        """Smooth the consumption rate and record it with the targets."""
        s = self.settings
        now = self._wall()
        consumed_total = snap.int("pushed_total") - snap.length
        rate = snap.float("rate")
        instant = elapsed = 0.0
        if "rate_ts_ms" in snap.state:
            elapsed = now - snap.int("rate_ts_ms") / 1000
            consumed = consumed_total - snap.int("rate_consumed")
            rate = smooth_rate(rate, consumed, elapsed, s.rate_smoothing)
            instant = instant_rate(consumed, elapsed)
        sized = rate
        if s.burst_sizing:
            hint = snap.float("drop_rate")
            if now - snap.int("drop_rate_ms") / 1000 > HINT_FRESH_SECONDS:
                hint = 0.0
            sized = sizing_rate(rate, instant, hint)
        # the allocation's latency (a database across a WAN, docs/design.md §12.2): the
        # low-water mark holds ALLOC_LATENCY_FACTOR of it at the sizing rate
        latency = snap.float("alloc_ms") / 1000
        seconds = list_seconds(pool_seconds, latency, s.low_water_ratio)
        target = pool_target(sized, seconds, s.pool_floor, s.pool_ceiling)
        low_water = math.ceil(target * s.low_water_ratio)
        # the recent peak: a maximum of the sizing rate that halves every hour once
        # demand falls (PEAK_HALF_LIFE_SECONDS); the outage reserve is sized by it
        peak = decayed_peak(snap.float("peak_rate"), elapsed, sized)
        self.pool.record(
            snap.tag,
            rate=f"{rate:.3f}",
            rate_ts_ms=int(now * 1000),
            rate_consumed=consumed_total,
            target=target,
            low_water=low_water,
            sizing_rate=f"{sized:.3f}",
            peak_rate=f"{peak:.3f}",
        )
        return Measure(sized, consumed_total, target, low_water, peak, latency)

    def reserve_ids(self, m: Measure) -> int:
        """IDs to keep allocated in the reserve (segment mode): ``LEAFPOOL_RESERVE_SECONDS``
        of the sizing rate, or ``LEAFPOOL_OUTAGE_SECONDS`` of the recent peak rate when
        that is more (docs/design.md §3.2), or twice the IDs consumed while the
        measured allocation latency passes ``ALLOC_LATENCY_FACTOR`` times (the half left
        when a top-up is due lasts its allocations), at most 100 pool ceilings."""
        s = self.settings
        return reserve_target(m.rate, m.peak, s.reserve_seconds, s.outage_seconds,
                              s.pool_floor, 100 * s.pool_ceiling, m.latency)

    @abstractmethod
    def _ensure_known(self, tag: str) -> Snapshot: ...

    @abstractmethod
    def _refill_locked(self, snap: Snapshot, lock: RefillLock, force: bool) -> RefillResult: ...
