"""Snowflake pools: a refiller that fills a tag's list with IDs from this process's
:class:`~leafpool.snowflake.registry.LeasedGenerator` (docs/design.md §8, G4).

With a reserve (``LEAFPOOL_SNOWFLAKE_RESERVE_SECONDS``, unset ``LEAFPOOL_OUTAGE_SECONDS``;
docs/design.md §8.7) a snowflake tag is kept as a segment tag is: the list holds
``LEAFPOOL_POOL_SECONDS`` of demand and is filled from the head of the reserve, which
holds that many seconds of the tag's recent peak demand, pre-generated as whole
milliseconds (one ``start:end`` range each, so millions of IDs cost Redis a few thousand
short strings) and topped up from the generator after the list is filled. So the pool
serves through every refiller paused and through its worker-ID source down, the list for
every client and the reserve for clients of the ``reserve`` policy; the price is that a
pooled ID carries the time it was generated, up to the reserve's depth earlier. Ranges
older than the reserve's seconds are dropped (a gap) and replaced while the generator can
replace them; ranges at or below the tag's high-water ID (pushed over by a refiller that
keeps no reserve) are dropped at once.

Without one (``0``) a batch is a few seconds of demand
(``LEAFPOOL_SNOWFLAKE_BATCH_SECONDS``), generated at the refill and pushed as it is.

The generator records the worker ID's high-water timestamp before it returns IDs, and
every push is fenced by the tag's lock token and the tag's high-water ID, so IDs in one
pool are strictly increasing even when several worker processes take turns refilling it.
The generator's source not answering (a lease that could not be renewed) is
:class:`~leafpool.refill.base.SourceUnavailable`: retried on the short backoff while the
list is low (:mod:`leafpool.refill.retry`), so the pool is refilled within a second of the
source's return.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable

from leafpool.core.config import Settings
from leafpool.core.errors import ClockMovedBackwards, StaleWrite, UnknownTag, WorkerIdUnavailable
from leafpool.core.snowflake_layout import TIMESTAMP_SHIFT, decode
from leafpool.redis import scripts
from leafpool.redis.lock import RefillLock
from leafpool.redis.pool import Pool, Range, Snapshot
from leafpool.refill.base import Refiller, RefillResult
from leafpool.refill.sizing import reserve_target
from leafpool.snowflake.registry.leased import LeasedGenerator

log = logging.getLogger(__name__)

# How far another worker's clock may be ahead before a refill waits for this one's clock
# to pass the tag's high-water ID rather than giving up on the round.
SKEW_WAIT_MS = 1000
MAX_WORKER_IDS_SHOWN = 16
#: milliseconds (ranges) one refill takes from the generator for its reserve: about 4
#: million IDs and a second of the clock; a reserve left short grows at the next refill
MAX_RESERVE_MS_PER_REFILL = 1000
#: a client taking from the reserve (policy "reserve") moves its head under a running
#: refill; the refill reads the reserve again and carries on, this many times at most
MAX_HEAD_REREADS = 1000
TRIM_BATCH = 1000


def list_seconds(settings: Settings) -> float:
    """The seconds of demand a snowflake tag's list is sized for: the pool's, as a
    segment tag's, with a reserve; a batch's without one."""
    if settings.snowflake_reserve > 0:
        return settings.pool_seconds
    return settings.snowflake_batch_seconds


class SnowflakeRefiller(Refiller):
    mode = "snowflake"

    def __init__(
        self,
        pool: Pool,
        generator: LeasedGenerator,
        settings: Settings,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(pool, settings, wall, monotonic)
        self.generator = generator
        self._sleep = sleep

    def _ensure_known(self, tag: str) -> Snapshot:
        snap = self.pool.snapshot(tag)
        if not snap.known:
            raise UnknownTag(tag)
        return snap

    def _refill_locked(self, snap: Snapshot, lock: RefillLock, force: bool) -> RefillResult:
        m = self._measure(snap, list_seconds(self.settings))
        result = RefillResult(snap.tag, length=snap.length, target=m.target)
        try:
            if self.settings.snowflake_reserve > 0:
                self._from_reserve(snap, lock, force, m.target, m.low_water,
                                   self._reserve_ids(m.rate, m.peak), result)
            else:
                self._fresh(snap, lock, force, m.target, m.low_water, result)
        except ClockMovedBackwards as exc:
            self._record_backwards(snap.tag, exc)
            raise
        except WorkerIdUnavailable as exc:
            # fenced (identity held by another live process) or never claimed: this
            # process generates nothing; the pool keeps serving what it holds
            self.pool.record(snap.tag, lease_state=self.generator.lease_state(exc))
            raise
        self._record_worker(snap, result.worker_id)
        return result

    def _reserve_ids(self, rate: float, peak: float) -> int:
        """IDs to keep in the reserve: the reserve's seconds of the recent peak rate (at
        least the floor, at most 100 pool ceilings)."""
        s = self.settings
        seconds = s.snowflake_reserve
        return reserve_target(rate, peak, seconds, seconds, s.pool_floor, 100 * s.pool_ceiling)

    # -- without a reserve -------------------------------------------------------------

    def _fresh(self, snap: Snapshot, lock: RefillLock, force: bool, target: int,
               low_water: int, result: RefillResult) -> None:
        if snap.reserve:  # left by a time with a reserve: not pushed any more, a gap
            self._trim(snap.tag, lock, below=2**63 - 1)
        if not (snap.length < low_water or (force and snap.length < target)):
            return
        ids = self._generate(snap, target - snap.length)
        result.worker_id = self._worker_id()
        chunk = self.settings.chunk_size
        for i in range(0, len(ids), chunk):
            result.length = self.pool.push_fresh(snap.tag, lock.token, ids[i:i + chunk],
                                                 self._now_ms())
            result.pushed += len(ids[i:i + chunk])
            lock.keep()

    def _generate(self, snap: Snapshot, n: int) -> list[int]:
        """``n`` IDs above the tag's high-water ID. Another worker whose clock runs a
        little ahead may have pushed higher IDs: wait for this clock to pass them (up to
        SKEW_WAIT_MS) rather than have the push refused."""
        with self._from_source():
            ids = self.generator.next_batch(n)
        hwm = snap.state.get("hwm")
        if not hwm or ids[0] > int(hwm):
            return ids
        self._wait_for(snap.tag, int(hwm), ids[0])
        with self._from_source():
            return self.generator.next_batch(n)

    # -- with a reserve (docs/design.md §8.7) -------------------------------------------

    def _from_reserve(self, snap: Snapshot, lock: RefillLock, force: bool, target: int,
                      low_water: int, want: int, result: RefillResult) -> None:
        tag = snap.tag
        self.pool.record(tag, reserve_target=want)
        reserve = self._trimmed(snap, lock)
        hwm = snap.int("hwm")
        if snap.length < low_water or (force and snap.length < target):
            need = target - snap.length
            rereads = 0
            while need > 0:
                if not reserve:
                    reserve = self._top_up(tag, lock, hwm, [], need, result)
                head = reserve[0]
                n = min(self.settings.chunk_size, need, head.size)
                try:
                    result.length = self.pool.push(tag, lock.token, head, n, self._now_ms())
                except StaleWrite as exc:
                    # a client took IDs from the reserve head (policy "reserve") while the
                    # list was empty, or a refiller without a reserve pushed over it: read
                    # the reserve again (trimmed) and go on from its new head
                    if exc.code not in (scripts.HEAD_MOVED, scripts.NOT_ABOVE_HWM) or \
                            rereads >= MAX_HEAD_REREADS:
                        raise
                    rereads += 1
                    fresh = self.pool.snapshot(tag)
                    hwm, reserve = fresh.int("hwm"), self._trimmed(fresh, lock)
                    continue
                result.pushed += n
                need -= n
                hwm = head.start + n - 1
                reserve[0] = Range(head.start + n, head.end)
                if reserve[0].size == 0:
                    reserve.pop(0)
                lock.keep()
        held = sum(r.size for r in reserve)
        if held < want:
            self._top_up(tag, lock, hwm, reserve, want - held, result)

    def _trimmed(self, snap: Snapshot, lock: RefillLock) -> list[Range]:
        """The reserve without its head ranges that are not to be pushed: at or below
        the high-water ID always; older than the reserve's seconds too while the
        generator can replace them (its lease held: not during an outage of its source,
        when old IDs are better than none)."""
        hwm = snap.int("hwm")
        reserve = list(snap.reserve)
        below = None
        if self.generator.live():
            cutoff = self._now_ms() - int(self.settings.snowflake_reserve * 1000)
            below = max(0, cutoff - self.settings.snowflake_epoch) << TIMESTAMP_SHIFT
        stale = "hwm" in snap.state
        head = reserve[0] if reserve else None
        if head is None or not ((stale and head.start <= hwm)
                                or (below is not None and head.end <= below)):
            return reserve
        dropped = self._trim(snap.tag, lock, below)
        log.info("%s: %d reserve range(s) dropped (older than %ss, or at or below the "
                 "high-water ID)", snap.tag, dropped, self.settings.snowflake_reserve)
        return reserve[dropped:]

    def _trim(self, tag: str, lock: RefillLock, below: int | None) -> int:
        """Drop the head ranges trim_reserve.lua finds not to be pushed; how many."""
        dropped = 0
        while True:
            n = self.pool.trim_reserve(tag, lock.token, below, TRIM_BATCH)
            dropped += n
            if n < TRIM_BATCH:
                return dropped
            lock.keep()

    def _top_up(self, tag: str, lock: RefillLock, hwm: int, reserve: list[Range], n: int,
                result: RefillResult) -> list[Range]:
        """Append at least ``n`` IDs of whole milliseconds to the reserve (at most
        MAX_RESERVE_MS_PER_REFILL of them), above its tail and the high-water ID; returns
        the reserve as it is then."""
        floor = max(hwm, reserve[-1].end - 1 if reserve else 0)
        with self._from_source():
            ranges = self.generator.next_ranges(n, MAX_RESERVE_MS_PER_REFILL)
        if ranges and ranges[0][0] <= floor:
            self._wait_for(tag, floor, ranges[0][0])
            with self._from_source():
                ranges = self.generator.next_ranges(n, MAX_RESERVE_MS_PER_REFILL)
        result.worker_id = self._worker_id()
        for i, (start, end) in enumerate(ranges):
            rng = Range(start, end)
            self.pool.append_reserve(tag, lock.token, rng)
            reserve.append(rng)
            if i % 100 == 99:
                lock.keep()
        lock.keep()
        return reserve

    def _wait_for(self, tag: str, above: int, first: int) -> None:
        """This worker's next IDs are not above ``above`` (another worker's clock runs
        ahead): wait up to SKEW_WAIT_MS for this clock to pass it, else refuse."""
        epoch = self.settings.snowflake_epoch
        ahead_ms = decode(above, epoch).timestamp_ms - decode(first, epoch).timestamp_ms
        if ahead_ms > SKEW_WAIT_MS:
            raise StaleWrite(
                f"{tag}: this worker's IDs are {ahead_ms} ms behind the tag's "
                "high-water ID (clock skew between workers); not pushed",
                code=scripts.NOT_ABOVE_HWM)
        log.info("%s: clock %d ms behind the tag's high-water ID, waiting", tag, ahead_ms)
        self._sleep((ahead_ms + 1) / 1000)

    def _from_source(self) -> contextlib.AbstractContextManager[None]:
        """Around the generator's calls: its registry's source not answering (the lease
        could not be renewed) is SourceUnavailable, the database's in mode mysql."""
        return self.from_source(database=self.settings.snowflake_mode == "mysql")

    # -- what the state says -----------------------------------------------------------

    def _source_back(self, snap: Snapshot, result: RefillResult) -> dict[str, object]:
        """``db_unreachable_ms`` clears once the generator produced IDs again (its source
        answered); a refill served from the reserve leaves it."""
        since = snap.int("db_unreachable_ms")
        if not since or result.worker_id is None:
            return {}
        log.warning("%s: worker-ID source reachable again; generation had failed for %.1f s",
                    snap.tag, max(0.0, self._now_ms() - since) / 1000)
        return {"db_unreachable_ms": ""}

    def _worker_id(self) -> int | None:
        return self.generator.lease.worker_id if self.generator.lease else None

    def _record_worker(self, snap: Snapshot, worker_id: int | None) -> None:
        if worker_id is None:
            return
        seen = [w for w in snap.state.get("worker_ids", "").split(",") if w]
        if str(worker_id) in seen:
            seen.remove(str(worker_id))
        seen = [str(worker_id), *seen][:MAX_WORKER_IDS_SHOWN]
        gen = self.generator.generator
        years_left = gen.years_left() if gen is not None else None
        if gen is not None and gen.exhausts_within(self.settings.snowflake_exhaustion_warn_days):
            log.warning("%s: worker %s: the snowflake time bits run out in %.2f years",
                        snap.tag, worker_id, years_left)
        self.pool.record(snap.tag, worker_ids=",".join(seen), last_worker_id=worker_id,
                         lease_state=self.generator.lease_state(),
                         time_bits_years_left=f"{years_left:.3f}" if years_left else "")

    def _record_backwards(self, tag: str, exc: ClockMovedBackwards) -> None:
        self.pool.record(tag, last_backwards_ms=self._now_ms(),
                         last_backwards_offset_ms=exc.offset_ms,
                         last_backwards_worker_id=exc.worker_id)
        self.pool.count(tag, "backwards_events")
