"""The first fill of a batch of new segment tags, one protocol step for all of them at
once (docs/design.md §4): the tag sync registers thousands of tags and queues them in
batches; refilled one by one, each tag cost ~14 Redis round trips (most of them writes,
each waiting for ``appendfsync always``) and one database transaction.

Here the steps share round trips, each step's commands for every tag in order within
them: the scripts checked, the N refill locks taken and the N snapshots read (each after
its lock) in one pipeline; the first segment of every tag allocated in ONE database
transaction (:meth:`~leafpool.segment.store.SegmentStore.allocate_many`: each tag's own
checks and its one atomic ``max_id`` advance on its locked row); the appends and pushes
in one pipeline (the same fenced scripts, each checking its own tag's lock token, reserve
head and high-water mark: a refused write leaves a gap, never a repeat); the records,
markers and lock releases in one.

What is decided and recorded for each tag is the one-tag refill's own code
(:class:`~leafpool.segment.refiller.SegmentRefiller`: the measurement, the targets, the
step rule, the allocation's record), run against a stand-in of the pool that collects its
records into one per tag (sent before the lock is released, as the one-tag refill's
last record is) and a stand-in of the store that hands it the batch's segment: a status
cannot tell a batched first fill from a single one.

Only plain first fills are batched: a tag known to the pool, in segment mode, never
filled (no reserve, nothing in its list, ``pushed_total`` 0), not forced, registered on
this master. Every other tag (unknown to the pool, a reserve present, a failover to
note, a push refused because a client moved the reserve head) is left to the one-tag
path, whole.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any, cast

from leafpool.core.errors import BackendUnavailable, LeafpoolError, StaleWrite, UnknownTag
from leafpool.redis import pool_batch, scripts
from leafpool.redis.lock import RefillLock
from leafpool.redis.pool import Pool, Range, Snapshot
from leafpool.refill.base import RefillResult
from leafpool.refill.batch import FirstFillDone
from leafpool.segment.refiller import MAX_ALLOCATIONS_PER_REFILL, SegmentRefiller, _Allocator
from leafpool.segment.step import StepRule
from leafpool.segment.store import Segment, SegmentStore

log = logging.getLogger(__name__)


class _Records:
    """Stands in for the pool in the one-tag refill's code: its records of one tag are
    collected (fields set in order, counters added), its reserve appends kept for the
    batch's pipeline."""

    def __init__(self) -> None:
        self.fields: dict[str, object] = {}
        self.counts: dict[str, int] = {}
        self.appends: list[tuple[Range, dict[str, object]]] = []

    def record(self, tag: str, counts: Mapping[str, int] | None = None,
               **fields: object) -> bool:
        self.fields.update(fields)
        for name, by in (counts or {}).items():
            self.counts[name] = self.counts.get(name, 0) + by
        return True

    def count(self, tag: str, name: str, by: int = 1) -> bool:
        return self.record(tag, counts={name: by})

    def append_reserve(self, tag: str, token: bytes, segment: Range, **fields: object) -> int:
        self.appends.append((segment, dict(fields)))
        return 0


class _Handed:
    """Stands in for the store in the one-tag refill's code: hands it the segment the
    batch's transaction allocated for its tag."""

    def __init__(self) -> None:
        self.segment: Segment | None = None

    def allocate(self, tag: str, rule: StepRule | None = None, floor: int = 0,
                 heal: bool = False) -> Segment:
        seg, self.segment = self.segment, None
        assert seg is not None and seg.tag == tag, "a segment handed for another tag"
        return seg


class _Fill:
    """One tag's first fill: the one-tag refill's state (its targets, its allocator, the
    reserve as this fill knows it) and the writes of the current round."""

    def __init__(self, refiller: SegmentRefiller, snap: Snapshot, lock: RefillLock) -> None:
        s = refiller.settings
        self.snap, self.lock, self.tag = snap, lock, snap.tag
        self.records = _Records()
        self.handed = _Handed()
        # the one-tag refill's code, writing into the stand-ins
        self.r = SegmentRefiller(cast(Pool, self.records), cast(SegmentStore, self.handed),
                                 s, refiller._wall, refiller._monotonic)
        m = self.r._measure(snap, s.pool_seconds)
        self.reserve_target = self.r.reserve_ids(m)
        self.records.record(self.tag, reserve_target=self.reserve_target)
        self.result = RefillResult(self.tag, length=snap.length, target=m.target,
                                   step=snap.int("step"))
        self.alloc = _Allocator(self.r, self.tag, lock, snap, self.result,
                                self.r._segment_lifetime(snap, m.consumed_total),
                                rate=m.rate if s.burst_sizing else 0.0)
        # protocol step 3 (the list from the reserve) is due: a first fill's list is empty
        self.need = m.target - snap.length if snap.length < m.low_water else 0
        self.reserve: list[Range] = []
        self.pushes: list[tuple[Range, int]] = []  # this round's chunks: (head, count)
        self.error: LeafpoolError | None = None
        self.to_single = False  # left to the one-tag path (a client moved the head)
        self.released = False  # its lock released with its last record

    @property
    def open(self) -> bool:
        return self.error is None and not self.to_single

    def wants_segment(self) -> bool:
        """The one-tag refill's loop would allocate now: the list still short and the
        reserve empty (step 3), or the reserve short of its target (step 4, at most
        :data:`MAX_ALLOCATIONS_PER_REFILL` allocations)."""
        if not self.open:
            return False
        if self.need > 0:
            return not self.reserve
        return sum(r.size for r in self.reserve) < self.reserve_target and \
            self.alloc.count < MAX_ALLOCATIONS_PER_REFILL

    def request(self, heal: bool) -> tuple[str, StepRule | None, int, bool]:
        return self.tag, self.alloc._rule(), self.alloc.floor, heal

    def allocated(self, seg: Segment, chunk_size: int) -> None:
        """The one-tag refill's record of the allocation, and the chunks it pushes from
        it (step 3) before it allocates again."""
        self.handed.segment = seg
        self.reserve.append(self.alloc.allocate())
        self.pushes = []
        while self.need > 0 and self.reserve:
            head = self.reserve[0]
            n = min(chunk_size, self.need, head.size)
            self.pushes.append((head, n))
            self.need -= n
            self.reserve[0] = Range(head.start + n, head.end)
            if self.reserve[0].size == 0:
                self.reserve.pop(0)

    def fail(self, exc: LeafpoolError) -> None:
        if self.error is None:
            self.error = exc


class FirstFill:
    """Batched first fills of new segment tags with ``refiller``'s pool, store and
    settings; one instance per process, safe to call for any tags."""

    def __init__(self, refiller: SegmentRefiller) -> None:
        self.refiller = refiller
        self.pool = refiller.pool
        self.store = refiller.store
        self.settings = refiller.settings

    def run(self, tags: Sequence[str], force: bool = False,
            clear_queued: bool = False) -> FirstFillDone:
        """Fill the plain first fills among ``tags`` (their locks free) in shared round
        trips; the others are in ``rest`` for the one-tag path (all of them when
        ``force``, or on a Redis Cluster). ``clear_queued``: as
        :meth:`~leafpool.refill.base.Refiller.refill`'s, for the tags handled here (the
        ones left to the one-tag path keep their marker until their refill takes it)."""
        done = FirstFillDone()
        unique = list(dict.fromkeys(tags))
        if force or len(unique) < 2 or not pool_batch.batchable(self.pool):
            done.rest = list(tags)
            return done
        # a tag listed twice: the copy waits for the one-tag path, as a second refill would
        done.rest = _repeats(tags)
        taken = pool_batch.take_and_read(self.pool, unique, self.settings.lock_ttl_ms,
                                         self.refiller._monotonic)
        shas, locks = taken.shas, taken.locks
        held = {tag: lock for tag, lock in locks.items() if lock is not None}
        fills: dict[str, _Fill] = {}
        try:
            for tag, lock in locks.items():
                if lock is None:
                    done.outcomes[tag] = ("skipped", "locked", 0)
            if clear_queued:  # held by another refill: it fills the tag, its release heard
                pool_batch.clear_queued(self.pool, [t for t, lock in locks.items()
                                                    if lock is None and t not in done.rest])
            plain = self._plain(shas, held, taken, done)
            for tag, snap in plain.items():
                fills[tag] = _Fill(self.refiller, snap, held[tag])
            self._rounds(shas, list(fills.values()))
            self._finish(shas, fills, taken.master, done, clear_queued)
        finally:
            pool_batch.release_locks(self.pool, shas, list(held.values()))
        # tags the fill gave up on keep the order they were asked in
        order = {tag: i for i, tag in enumerate(tags)}
        done.rest.sort(key=lambda t: order[t])
        return done

    def _plain(self, shas: pool_batch.Shas, held: dict[str, RefillLock],
               taken: pool_batch.Taken, done: FirstFillDone) -> dict[str, Snapshot]:
        """The held tags that are plain first fills, by snapshot; the others' locks are
        released for the one-tag path (and taken out of ``held``) and they are listed in
        ``rest``."""
        replid = taken.master[0]
        plain: dict[str, Snapshot] = {}
        others: list[str] = []
        for tag in held:
            snap = taken.snapshots[tag]
            s = snap.state
            if snap.known and s.get("mode", "segment") == "segment" and not snap.reserve \
                    and snap.length == 0 and snap.int("pushed_total") == 0 \
                    and s.get("redis_replid", "") in ("", replid):
                plain[tag] = snap
            else:
                others.append(tag)
        pool_batch.release_locks(self.pool, shas, [held[tag] for tag in others])
        for tag in others:
            del held[tag]
        done.rest += others
        return plain

    def _rounds(self, shas: pool_batch.Shas, fills: list[_Fill]) -> None:
        """Allocate, append and push, a round for every segment a tag needs: one database
        transaction and one Redis pipeline a round for all the tags that need one."""
        heal = self.settings.counter_behind == "heal"
        chunk = self.settings.chunk_size
        while True:
            due = [f for f in fills if f.wants_segment()]
            if not due:
                return
            try:
                with self.refiller.from_source():  # the database down: SourceUnavailable
                    segments = self.store.allocate_many([f.request(heal) for f in due])
            except LeafpoolError as exc:
                for f in due:
                    f.fail(exc)
                continue
            writing: list[_Fill] = []
            for f in due:
                got = segments[f.tag]
                if isinstance(got, Segment):
                    f.allocated(got, chunk)
                    writing.append(f)
                else:
                    f.fail(got)
            self._write(shas, writing)
            for f in fills:
                if f.open:
                    f.lock.keep()  # a round trip only when a third of its TTL has passed

    def _write(self, shas: pool_batch.Shas, fills: list[_Fill]) -> None:
        """Each tag's append and pushes of this round, in one pipeline sent once."""
        commands: list[tuple[Any, ...]] = []
        spans: list[tuple[_Fill, int, int]] = []
        for f in fills:
            token = f.lock.token
            segment, fields = f.records.appends.pop()
            first = len(commands)
            commands.append(pool_batch.append_command(self.pool, shas, f.tag, token, segment,
                                                      fields))
            now_ms = self.refiller._now_ms()
            for head, n in f.pushes:
                commands.append(pool_batch.push_command(self.pool, shas, f.tag, token, head,
                                                        n, now_ms))
            spans.append((f, first, len(commands)))
        try:
            replies = pool_batch.send_writes(self.pool, commands, "batch: reserve and push")
        except BackendUnavailable as exc:
            for f in fills:
                f.fail(exc)
            return
        for f, lo, hi in spans:
            self._landed(f, replies[lo], replies[lo + 1:hi])

    def _landed(self, f: _Fill, appended: Any, pushed: list[Any]) -> None:
        refused = pool_batch.refusal(appended)
        if refused is not None:  # a gap in the counter, never a repeat
            f.fail(_stale(f.tag, "reserve range refused", refused))
            return
        for (head, n), reply in zip(f.pushes, pushed, strict=True):
            refused = pool_batch.refusal(reply)
            if refused is None:
                f.result.length = int(reply)
                f.result.pushed += n
                continue
            if refused.code == scripts.HEAD_MOVED:
                # a client took IDs from the reserve head (policy "reserve"): the one-tag
                # refill reads the reserve again and goes on from its new head
                f.to_single = True
            else:
                f.fail(_stale(f.tag, f"push of {n} IDs from {head.encode()} refused",
                              refused))
            return

    def _finish(self, shas: pool_batch.Shas, fills: dict[str, _Fill],
                master_is: tuple[str, str], done: FirstFillDone, clear_queued: bool) -> None:
        """Each tag's state recorded as the one-tag refill records it, before its lock is
        released; a failed tag's failure recorded as the one-tag refill records it.

        One pipeline, run in order: every tag's record, the ``queued`` markers cleared
        (``clear_queued``), the filling tags' dry marks, then their locks released: each
        lock released after its tag's state is recorded, as the one-tag refill releases
        after its last record. A tag that failed in the rounds keeps its lock past it:
        its failure (and the failure's hold) is recorded while the lock is held. A tag
        whose record is refused (an error reply; its lock released meanwhile) fails as the
        one-tag refill's refused last record fails it, with no further record.

        The markers are cleared once the state is recorded, not when the locks are taken
        (as the one-tag refill clears its own): the drop watcher reads a tag and marks it
        a moment later, and a batch's tags, read due and free just before the batch took
        their locks, were marked and queued again (one useless refill each, taken before
        the batches waiting behind it) when their markers went at the start of the fill."""
        replid, where = master_is
        now_ms = self.refiller._now_ms()
        commands: list[tuple[Any, ...]] = []
        ok: list[_Fill] = []
        for f in fills.values():
            rec = f.records
            # what note_master records for a tag registered on this master
            master = {"redis_replid": replid, "redis_node": where}
            if f.snap.state.get("redis_replid") == replid and \
                    f.snap.state.get("redis_node") == where:
                master = {}
            if f.open:
                reserve = sum(r.size for r in f.reserve)
                rec.record(f.tag, reserve_due=int(reserve < f.reserve_target // 2))
                back = self.refiller._source_back(f.snap, f.result)
                rec.record(f.tag, counts={"refills": 1}, last_refill_ms=now_ms,
                           last_refill_result=f"ok +{f.result.pushed}", **back)
                ok.append(f)
            commands.append(pool_batch.record_command(
                self.pool, shas, f.tag, {**master, **rec.fields}, rec.counts))
        recorded = len(commands)
        cleared = [f.tag for f in fills.values() if not f.to_single] if clear_queued else []
        commands += [pool_batch.clear_queued_command(self.pool, tag) for tag in cleared]
        # the list may be dry now (nothing added), as the one-tag refill marks it
        dry_ms = self.refiller._now_ms()
        commands += [pool_batch.dry_command(self.pool, shas, f.tag, dry_ms) for f in ok
                     if f.snap.int("dry_since_ms") or not f.result.pushed]
        releasing = [f for f in ok if f.lock.held]
        commands += [pool_batch.release_command(shas, f.lock) for f in releasing]
        try:
            replies = pool_batch.send_writes(self.pool, commands, "batch: record and release")
        except BackendUnavailable as exc:
            for f in ok:  # some of it may have run: markers cleared again, locks released
                f.fail(exc)
            if cleared:
                pool_batch.clear_queued(self.pool, cleared)
        else:
            for f in releasing:  # released (an error reply: the lock's TTL ends it)
                f.lock.held, f.released = False, True
            for f, reply in zip(fills.values(), replies[:recorded], strict=True):
                refused = pool_batch.refusal(reply)
                if refused is not None and f.open:
                    f.fail(_stale(f.tag, "record refused", refused))
        dry = [f.tag for f in fills.values() if not f.open and not f.released]
        for f in fills.values():
            if f.error is not None:
                self._failed(f, done)
            elif f.to_single:
                done.rest.append(f.tag)
            else:
                done.outcomes[f.tag] = ("refilled", f.result.summary(), f.result.pushed)
                log.info("%s: refill %s", f.tag, f.result.summary())
        if dry:  # a failed tag's list may be dry now, as the one-tag refill marks it
            try:
                pool_batch.note_dry(self.pool, shas, dry, self.refiller._now_ms())
            except BackendUnavailable as exc:
                log.warning("batch: dry marks not recorded: %s", exc)

    def _failed(self, f: _Fill, done: FirstFillDone) -> None:
        """The one-tag refill's record of a failure (while the lock is held)."""
        exc = f.error
        assert exc is not None
        if not f.released:
            self.refiller._record_failure(f.snap, exc)
        else:  # its last record refused, released with it: reported, as the one-tag path
            log.warning("%s: refill failed: %s", f.tag, exc)
        if isinstance(exc, UnknownTag):  # the row is gone: the sync drops the tag
            log.info("%s: not a tag any more, refill dropped", f.tag)
            done.outcomes[f.tag] = ("skipped", "unknown tag", 0)
            return
        done.outcomes[f.tag] = ("failed", f"{type(exc).__name__}: {exc}", 0)


def _stale(tag: str, what: str, refused: pool_batch.Refused) -> StaleWrite:
    why = refused.error or scripts.REFUSALS.get(refused.code, str(refused.code))
    return StaleWrite(f"{tag}: {what}: {why}", code=refused.code)


def _repeats(tags: Sequence[str]) -> list[str]:
    seen: set[str] = set()
    out: list[str] = []
    for tag in tags:
        if tag in seen:
            out.append(tag)
        seen.add(tag)
    return out
