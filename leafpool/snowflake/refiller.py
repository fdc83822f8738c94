"""Snowflake pools: a refiller that fills a tag's list with IDs from this process's
:class:`~leafpool.snowflake.registry.LeasedGenerator` (docs/design.md §8, G4).

Batches are a few seconds of demand (``LEAFPOOL_SNOWFLAKE_BATCH_SECONDS``): a pooled
snowflake ID carries its generation time. The generator records the worker ID's
high-water timestamp before it returns a batch, and every push is fenced by the tag's
lock token and the tag's high-water ID, so IDs in one pool are strictly increasing even
when several worker processes take turns refilling it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from leafpool.core.config import Settings
from leafpool.core.errors import ClockMovedBackwards, StaleWrite, UnknownTag, WorkerIdUnavailable
from leafpool.core.snowflake_layout import decode
from leafpool.redis import scripts
from leafpool.redis.lock import RefillLock
from leafpool.redis.pool import Pool, Snapshot
from leafpool.refill.base import Refiller, RefillResult
from leafpool.snowflake.registry.leased import LeasedGenerator

log = logging.getLogger(__name__)

# How far another worker's clock may be ahead before a refill waits for this one's clock
# to pass the tag's high-water ID rather than giving up on the round.
SKEW_WAIT_MS = 1000
MAX_WORKER_IDS_SHOWN = 16


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
        s = self.settings
        m = self._measure(snap, s.snowflake_batch_seconds)
        result = RefillResult(snap.tag, length=snap.length, target=m.target)
        if not (snap.length < m.low_water or (force and snap.length < m.target)):
            return result
        need = m.target - snap.length
        try:
            ids = self._generate(snap, need)
            worker_id = self.generator.lease.worker_id if self.generator.lease else None
            result.worker_id = worker_id
            for i in range(0, len(ids), s.chunk_size):
                result.length = self.pool.push_fresh(snap.tag, lock.token,
                                                     ids[i:i + s.chunk_size], self._now_ms())
                result.pushed += len(ids[i:i + s.chunk_size])
                lock.keep()
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

    def _generate(self, snap: Snapshot, n: int) -> list[int]:
        """``n`` IDs above the tag's high-water ID. Another worker whose clock runs a
        little ahead may have pushed higher IDs: wait for this clock to pass them (up to
        SKEW_WAIT_MS) rather than have the push refused."""
        ids = self.generator.next_batch(n)
        hwm = snap.state.get("hwm")
        if not hwm or ids[0] > int(hwm):
            return ids
        ahead_ms = decode(int(hwm), self.settings.snowflake_epoch).timestamp_ms - \
            decode(ids[0], self.settings.snowflake_epoch).timestamp_ms
        if ahead_ms > SKEW_WAIT_MS:
            raise StaleWrite(
                f"{snap.tag}: this worker's IDs are {ahead_ms} ms behind the tag's "
                "high-water ID (clock skew between workers); not pushed",
                code=scripts.NOT_ABOVE_HWM)
        log.info("%s: clock %d ms behind the tag's high-water ID, waiting", snap.tag, ahead_ms)
        self._sleep((ahead_ms + 1) / 1000)
        return self.generator.next_batch(n)

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
