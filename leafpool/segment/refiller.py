"""The segment refill protocol (docs/design.md §3), one refiller per tag at a time.

1. measure consumption (``pushed_total - LLEN ids``) and smooth the rate;
2. pool target = rate x pool seconds within floor and ceiling; low-water = a ratio of it;
3. below low-water, move IDs from the reserve head into ``ids`` in chunks;
4. keep the reserve topped up from the database (one atomic ``max_id`` advance each; a
   counter found below the pool's mark is healed, docs/design.md §7.3);
5. every write is a fenced Lua script that refuses IDs not above the high-water mark;
6. the step follows Leaf's 15/30-minute rule, applied to how long the last consumed
   segment lasted (measured from consumption, never from back-to-back allocations).

The list is filled from the reserve *before* the database is asked, so a database outage
leaves the pool serving list + reserve while the task retries.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from leafpool.core.config import Settings
from leafpool.core.errors import StaleWrite
from leafpool.redis import scripts
from leafpool.redis.lock import RefillLock
from leafpool.redis.pool import Pool, Range, Snapshot
from leafpool.redis.register import register
from leafpool.refill.base import Refiller, RefillResult
from leafpool.refill.sizing import smooth_latency
from leafpool.segment.step import StepRule
from leafpool.segment.store import SegmentStore

log = logging.getLogger(__name__)

MAX_ALLOCATIONS_PER_REFILL = 16
# A client taking from the reserve (policy "reserve") moves its head under a running
# refill; the refill reads the reserve again and carries on, this many times at most.
MAX_HEAD_REREADS = 1000
# Chunks sent in one pipeline (Pool.push_run): Redis runs them in one pass of its event
# loop and, with appendfsync always, waits for one fsync instead of one a chunk.
CHUNKS_PER_ROUND_TRIP = 8


class SegmentRefiller(Refiller):
    """Refills segment tags. One instance per process; safe to call for any tag."""

    mode = "segment"

    def __init__(
        self,
        pool: Pool,
        store: SegmentStore,
        settings: Settings,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(pool, settings, wall, monotonic)
        self.store = store

    def _ensure_known(self, tag: str) -> Snapshot:
        snap = self.pool.snapshot(tag)
        if snap.known:
            return snap
        row = self.store.get_tag(tag)  # raises UnknownTag when not in leaf_alloc either
        register(self.pool, tag, "segment", row.step, self._wall)
        return self.pool.snapshot(tag)

    def _refill_locked(self, snap: Snapshot, lock: RefillLock, force: bool) -> RefillResult:
        s = self.settings
        tag = snap.tag
        m = self._measure(snap, s.pool_seconds)
        target, low_water = m.target, m.low_water
        reserve_target = self.reserve_ids(m)  # with the outage budget (docs/design.md §3.2)
        self.pool.record(tag, reserve_target=reserve_target)

        result = RefillResult(tag, length=snap.length, target=target, step=snap.int("step"))
        reserve = list(snap.reserve)
        alloc = _Allocator(
            self,
            tag,
            lock,
            snap,
            result,
            self._segment_lifetime(snap, m.consumed_total),
            rate=m.rate if s.burst_sizing else 0.0,
        )

        # 3: fill the list from the reserve, in chunks, several a round trip
        if snap.length < low_water or (force and snap.length < target):
            need = target - snap.length
            rereads = 0
            while need > 0:
                if not reserve:
                    reserve.append(alloc.allocate())
                # (an empty head range, never appended, would be refused -7 as before)
                chunks = _chunks(reserve, need, s.chunk_size) or [(reserve[0], 0)]
                run = self.pool.push_run(tag, lock.token, chunks, self._now_ms())
                if run.length >= 0:
                    result.length = run.length
                result.pushed += run.pushed
                need -= run.pushed
                for head, n in chunks[:run.landed]:
                    reserve[0] = Range(head.start + n, head.end)
                    if reserve[0].size == 0:
                        reserve.pop(0)
                if run.code:
                    # a client took IDs from the reserve head (policy "reserve") while the
                    # list was empty: read the reserve again and go on from its new head
                    if run.code != scripts.HEAD_MOVED or rereads >= MAX_HEAD_REREADS:
                        raise StaleWrite(f"{tag}: push of {chunks[run.landed][1]} IDs from "
                                         f"{chunks[run.landed][0].encode()} refused: "
                                         f"{scripts.REFUSALS[run.code]}", code=run.code)
                    rereads += 1
                    reserve = self.pool.snapshot(tag).reserve
                lock.keep()
            if rereads:
                log.info(
                    "%s: reserve head moved by clients %d times during the refill", tag, rereads
                )

        # 4: top up the reserve
        while (
            sum(r.size for r in reserve) < reserve_target
            and alloc.count < MAX_ALLOCATIONS_PER_REFILL
        ):
            reserve.append(alloc.allocate())
            lock.keep()
        # the sweep and the watcher read this flag, not the reserve (§3.7): a reserve
        # left short (the allocation cap) is due another refill at once
        self.pool.record(tag, reserve_due=int(sum(r.size for r in reserve) < reserve_target // 2))
        return result

    def _segment_lifetime(self, snap: Snapshot, consumed_total: int) -> float | None:
        """How long the last consumed segment lasted, in seconds (Leaf's rule input), or
        None when no whole segment was consumed since the step last changed.

        A segment counts as consumed when clients took ``step`` IDs since the last mark;
        its lifetime is the time that took (scaled to exactly one step). The measurement
        stays pending in state until an allocation uses it.
        """
        step = snap.int("step")
        if step <= 0:
            return None
        now_ms = self._now_ms()
        mark_consumed = snap.int("seg_mark_consumed")
        mark_ms = snap.int("seg_mark_ms") or snap.int("created_ms") or now_ms
        since = consumed_total - mark_consumed
        if since < step:
            pending = snap.state.get("segment_lasted_s")
            return float(pending) if pending else None
        lasted = max(0.0, (now_ms - mark_ms) / 1000) * step / since
        self.pool.record(
            snap.tag,
            seg_mark_consumed=consumed_total,
            seg_mark_ms=now_ms,
            segment_lasted_s=f"{lasted:.3f}",
        )
        return lasted


def _chunks(reserve: list[Range], need: int, size: int) -> list[tuple[Range, int]]:
    """The chunks that push ``need`` IDs (at most :data:`CHUNKS_PER_ROUND_TRIP` of them, of
    at most ``size`` IDs each) from the reserve's ranges in order: each chunk's head is the
    one the chunks before it leave."""
    chunks: list[tuple[Range, int]] = []
    for rng in reserve:
        head = rng
        while need > 0 and head.size > 0 and len(chunks) < CHUNKS_PER_ROUND_TRIP:
            n = min(size, need, head.size)
            chunks.append((head, n))
            need -= n
            head = Range(head.start + n, head.end)
        if need <= 0 or len(chunks) >= CHUNKS_PER_ROUND_TRIP:
            break
    return chunks


class _Allocator:
    """Takes segments from the database for one refill, with the dynamic step: the first
    allocation applies the last consumed segment's lifetime, later ones keep that step
    (back-to-back allocations say nothing about how long a segment lasts), unless the
    measured ``rate`` says a segment of the current step lasts under
    ``STEP_GROW_SECONDS``: then each allocation doubles it, as Leaf's rule would at each
    of the segment updates that rate makes (a jump to 50,000 IDs/s at step 1,000 reaches
    a step that lasts in ten allocations, not hundreds; the rate never shrinks a step,
    only consumed segments do, docs/design.md §3.5)."""

    def __init__(
        self,
        refiller: SegmentRefiller,
        tag: str,
        lock: RefillLock,
        snap: Snapshot,
        result: RefillResult,
        lasted: float | None,
        rate: float = 0.0,
    ) -> None:
        self.r = refiller
        self.rate = rate
        self.tag = tag
        self.lock = lock
        self.step = snap.int("step")
        self.lasted = lasted
        self.floor = snap.floor
        self.result = result
        self.count = 0
        self.alloc_ms = snap.float("alloc_ms")  # the smoothed allocation latency

    def _rule(self) -> StepRule:
        s = self.r.settings
        lasted = self.lasted
        if lasted is None and self.rate > 0 and self.step > 0:
            predicted = self.step / self.rate  # how long a segment lasts at this rate
            if predicted < s.step_grow_seconds:  # only ever to grow
                lasted = predicted
        return StepRule(
            current=self.step,
            lasted_seconds=lasted,
            grow_below=s.step_grow_seconds,
            shrink_above=s.step_shrink_seconds,
            cap=s.max_step,
        )

    def allocate(self) -> Range:
        heal = self.r.settings.counter_behind == "heal"
        with self.r.from_source():  # the database down: SourceUnavailable (§3.8)
            seg = self.r.store.allocate(self.tag, self._rule(), self.floor, heal=heal)
        now_ms = self.r._now_ms()
        rng = Range(seg.start, seg.end)
        self.alloc_ms = smooth_latency(self.alloc_ms, seg.took_ms)
        if seg.healed_from is not None:  # counted even if the append below is refused:
            # the row was moved in the database either way (docs/design.md §7.3)
            self.r.pool.record(self.tag, counts={"heals": 1}, last_heal_ms=now_ms,
                               last_heal=f"max_id {seg.healed_from} -> {seg.start}")
        # A refused append (lost lock) leaves a gap in the database counter: never a repeat.
        self.r.pool.append_reserve(
            self.tag,
            self.lock.token,
            rng,
            step=seg.step,
            table_step=seg.table_step,
            max_id=seg.end,
            segment_ms=now_ms,
            last_alloc_ms=f"{seg.took_ms:.2f}",
            alloc_ms=f"{self.alloc_ms:.2f}",
        )
        self.r.pool.count(self.tag, "allocations")
        if self.lasted is not None:  # this measurement is used up
            self.r.pool.record(self.tag, segment_lasted_s="")
            self.lasted = None
        self.step = seg.step
        self.floor = seg.end
        self.count += 1
        self.result.step = seg.step
        self.result.segments.append(rng.encode())
        log.info(
            "%s: segment [%d, %d) step %d from the database in %.1f ms",
            self.tag,
            seg.start,
            seg.end,
            seg.step,
            seg.took_ms,
        )
        return rng
