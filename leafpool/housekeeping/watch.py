"""The drop watcher: a refill is queued when a pop takes a tag's list below its low-water
mark, within milliseconds, whatever client popped (docs/design.md §3.7).

Clients pop with a plain ``LPOP`` and cannot signal; Redis does. The watcher reads each
tag's :class:`~leafpool.redis.pool.Level` on a connection with client-side-caching tracking
on (``CLIENT TRACKING on REDIRECT``, default mode, RESP2): Redis then sends one
invalidation on ``__redis__:invalidate`` (to the watcher's subscriber connection) the
next time any key read there is written: a pop, a push, the lock taken or released. A
key is tracked again only when it is read again, so a tag popped 50,000 times a second
costs one invalidation and one read per ``interval`` (the reads are batched), and an
idle tag costs nothing. The tag set and the ``wanted`` set are tracked the same way: a
new tag is read at once; a client that found a tag empty gets a forced refill at once.

After every (re)connect (Redis restarted, a Sentinel failover, a broken socket) tracking
starts afresh, so the watcher reads every tag again (a full pass) before waiting. Every
``HEARTBEAT_SECONDS`` without traffic it pings its subscriber and checks that its node is
still the master (a failover that keeps the old master running).

A tag found due and not locked (its refill queued now, or held by another's ``queued``
marker: a refill queued, or a failed refill's hold, docs/design.md §3.8) is read again at
every heartbeat until its refill takes the lock or it is no longer due, and queued again
once its marker has ended: the marker's expiry writes nothing the watcher tracks, and a
plain ``LPOP`` of an empty list writes nothing either. So a refill task that cannot run
(lost with its worker, failed without a retry, left in a queue no worker reads) holds its
tag for the marker's few seconds and a heartbeat, not until the sweep (docs/design.md
§3.7).

A segment tag read below its low-water mark while no refill holds it gets IDs from its
reserve at once (:class:`~leafpool.redis.spill.ReserveSpill`, ``spill_range.lua``):
the watcher's recent rate (or the rate since the tag's last read, over at least
``SHORT_SPAN_SECONDS``, when that is more) for ``SPILL_SECONDS``, or when that is less
what takes the list back to its target up to a chunk, at most ``MAX_SPILL``; then its
refill is queued as before. Those IDs were allocated already (the reserve,
docs/design.md §3.8), so the move asks no database and waits for no Celery worker: a
500x demand step no longer drains the list in the 30-50 ms between the pop that crosses
the mark and the refill's first push. The script is refused while the tag's refill lock
exists and is fenced like a refill's push (the reserve head, the high-water mark), so
the pool stays strictly increasing and no ID is pushed twice (docs/design.md §3.7).

On a Redis Cluster tracking is per node connection and the tags are spread over nodes:
the watcher does not run there (:func:`supported`), and the sweep runs every
``LEAFPOOL_SWEEP_SECONDS`` as without it.

The watcher decides; ``on_due`` acts (the Celery beat queues a refill task): this
module does not import Celery.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from leafpool.core.errors import LeafpoolError
from leafpool.housekeeping.sweep import (
    QUEUED_SECONDS,
    Due,
    due_tags,
    note_dry,
    queue_due,
    still_due,
)
from leafpool.redis.connect import is_cluster
from leafpool.redis.pool import Level, Pool
from leafpool.redis.spill import ReserveSpill
from leafpool.redis.tracking import Tracking
from leafpool.refill.sizing import RecentRate

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 1.0
RECONNECT_SECONDS = 0.5
#: a tag is read again this long after its queued marker's end (Redis has expired it)
MARKER_MARGIN_SECONDS = 0.02
#: a tag below its low-water mark gets from its reserve, at once, the rate the watcher
#: saw for this long (at least what takes it back to its target, up to a chunk): the
#: refill queued lands within tens of milliseconds, so a second leaves a wide margin (a
#: loaded machine, a queue with other tasks in it) and the next crossing moves more
SPILL_SECONDS = 1.0
#: a move reads the rate since a tag's last read over at least this long
SHORT_SPAN_SECONDS = 0.1
#: at most this many IDs a move (100 chunks, one round trip; about 0.5 MB of Redis)
MAX_SPILL = 100_000


def supported(pool: Pool) -> bool:
    """False on a Redis Cluster (tracking is per node; the sweep covers it alone)."""
    return not is_cluster(pool.redis)


@dataclass
class WatchStats:
    connects: int = 0  # sessions started (each begins with a full pass)
    full_passes: int = 0
    invalidations: int = 0
    reads: int = 0  # tags read after an invalidation
    queued: int = 0  # refills handed to on_due
    spills: int = 0  # moves from a reserve into a list that pushed IDs
    spilled: int = 0  # IDs they pushed


class DropWatcher:
    """Watches every tag of ``pool`` and calls ``on_due`` for each tag due a refill
    (marked queued first, so one refill is queued once). :meth:`start` runs it in a
    daemon thread; :meth:`stop` ends it."""

    def __init__(
        self,
        pool: Pool,
        on_due: Callable[[Due], None],
        *,
        interval_s: float = 0.01,
        queued_seconds: int = QUEUED_SECONDS,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        outgrown: Callable[[Level, float], bool] | None = None,
        spill: bool = True,
        chunk: int = 1000,
        spill_seconds: float = SPILL_SECONDS,
        max_spill: int = MAX_SPILL,
    ) -> None:
        """``outgrown(level, rate)``: whether a tag's pool is too small for the rate the
        watcher sees (then it queues a forced refill, which sizes by that rate); None:
        only drops below the low-water mark count. ``spill``: move reserve IDs into the
        list of a segment tag read below its low-water mark (``chunk`` IDs a script call,
        at most ``max_spill``: the rate seen times ``spill_seconds``, at least what takes
        the list back to its target up to ``chunk``)."""
        if not supported(pool):
            raise LeafpoolError("the drop watcher does not run on a Redis Cluster")
        self.pool = pool
        self.on_due = on_due
        self.interval_s = interval_s
        self.queued_seconds = queued_seconds
        self.stats = WatchStats()
        self._outgrown = outgrown
        self._spill = ReserveSpill(pool, chunk) if spill else None
        self.spill_seconds = spill_seconds
        self.max_spill = max_spill
        self._monotonic = monotonic
        self._wall = wall
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._rates: dict[str, RecentRate] = {}
        self._last: dict[str, tuple[float, int]] = {}  # tag -> its last read: time, consumed
        # due and not locked (queued, or marked queued by another): read again when its
        # marker ends (tag -> that monotonic time) and at every heartbeat, until a refill
        # holds its lock or it is no longer due
        self._recheck: dict[str, float] = {}
        self._next_end = math.inf  # at most the earliest of them (a scan finds which)
        self.ready = threading.Event()  # set once a session's full pass is done

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> DropWatcher:
        self._stop.clear()
        self._thread = threading.Thread(target=self.run, name="leafpool-drop-watcher", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def run(self) -> None:
        """Watch until :meth:`stop`; reconnect (and read every tag again) after errors."""
        while not self._stop.is_set():
            try:
                self._session()
            except (LeafpoolError, OSError) as exc:
                self.ready.clear()
                log.warning("drop watcher: %s; reconnecting (then a full pass)", exc)
                self._stop.wait(RECONNECT_SECONDS)
            except Exception:  # a bug: say so loudly, keep watching (the sweep backs up)
                self.ready.clear()
                log.exception("drop watcher: unexpected error; reconnecting")
                self._stop.wait(RECONNECT_SECONDS)

    # -- one session: connect, full pass, then invalidations --------------------------------

    def _session(self) -> None:
        tracking = Tracking(self.pool.redis).open()
        reader = tracking.reader
        self.stats.connects += 1
        try:
            known = self._full_pass(reader)
            self.ready.set()
            dirty: set[str] = set()
            tags_dirty = wanted_dirty = False
            last_read = last_beat = self._monotonic()
            while not self._stop.is_set():
                now = self._monotonic()
                dirty |= self._markers_ended(now) & known
                pending = dirty or tags_dirty or wanted_dirty
                wait = last_beat + HEARTBEAT_SECONDS - now
                wait = min(wait, self._next_end - now)
                if pending:
                    wait = min(wait, last_read + self.interval_s - now)
                if tracking.wait(min(max(wait, 0.0), 0.25)):
                    for keys in tracking.messages():
                        self.stats.invalidations += 1
                        if keys is None:  # a flush: every key of the node
                            known = self._full_pass(reader)
                            dirty.clear()
                            tags_dirty = wanted_dirty = False
                            continue
                        for key in keys:
                            if key == self.pool.keys.tags:
                                tags_dirty = True
                            elif key == self.pool.keys.wanted:
                                wanted_dirty = True
                            else:
                                tag = self.pool.keys.tag_of(key)
                                if tag is not None:
                                    dirty.add(tag)
                    continue
                now = self._monotonic()
                if pending and now >= last_read + self.interval_s:
                    if tags_dirty:
                        tags_dirty = False
                        fresh = set(self.pool.tracked_tags(reader))
                        dirty |= fresh - known
                        for gone in known - fresh:
                            self._rates.pop(gone, None)
                            self._last.pop(gone, None)
                        known = fresh
                    wanted: set[str] = set()
                    if wanted_dirty:
                        wanted_dirty = False
                        wanted = set(self.pool.take_wanted())
                        if self.pool.tracked_wanted(reader):  # more came meanwhile
                            wanted_dirty = True
                    names = sorted((dirty & known) | (wanted & known))
                    dirty.clear()
                    self._decide(self.pool.tracked_levels(reader, names), wanted)
                    self.stats.reads += len(names)
                    last_read = self._monotonic()
                if now >= last_beat + HEARTBEAT_SECONDS:
                    tracking.heartbeat()
                    last_beat = now
                    dirty |= self._recheck.keys() & known  # its refill begun? its marker?
        finally:
            tracking.close()

    def _full_pass(self, reader: Any) -> set[str]:
        """Read (and so track) every tag, the tag set and the wanted set; queue what is
        due. After a (re)connect nothing is tracked, so nothing would be heard otherwise."""
        tags = self.pool.tracked_tags(reader)
        wanted = set(self.pool.take_wanted())
        self.pool.tracked_wanted(reader)
        self._decide(self.pool.tracked_levels(reader, tags), wanted)
        self.stats.full_passes += 1
        log.info("drop watcher: watching %d tags (full pass)", len(tags))
        return set(tags)

    # -- deciding -------------------------------------------------------------------------

    def _decide(self, levels: list[Level], wanted: set[str]) -> None:
        # the pop that took a list's last ID is heard within ms: the time it went dry
        # (docs/design.md §3.8); a push is heard too: no longer dry
        note_dry(self.pool, levels, int(self._wall() * 1000))
        now = self._monotonic()
        rates, lately = {}, {}
        for lv in levels:
            if lv.known:
                recent = self._rates.setdefault(lv.tag, RecentRate())
                rates[lv.tag] = recent.add(now, lv.consumed)
                lately[lv.tag] = max(rates[lv.tag], self._since_last(lv.tag, now, lv.consumed))
        self._spill_below(levels, lately)
        due = due_tags(levels, wanted)
        if self._outgrown is not None:
            listed = {d.tag for d in due}
            due += [
                Due(lv.tag, lv.mode or "segment", True)
                for lv in levels
                if lv.known and lv.tag not in listed and self._outgrown(lv, rates.get(lv.tag, 0.0))
            ]
        for lv in levels:
            self._recheck.pop(lv.tag, None)
        if not due:
            return
        locked = {lv.tag: lv.locked for lv in levels}
        free = [d.tag for d in due if not locked[d.tag]]  # a locked tag: its release is heard
        ends = {}
        marked = queue_due(self.pool, due, [locked[d.tag] for d in due], self.queued_seconds)
        for d in still_due(self.pool, marked, locks=True):
            # its marker, or (not queued: the marker cleared) the next heartbeat
            ends[d.tag] = self.queued_seconds if self._queue(d, rates.get(d.tag, 0.0)) \
                else HEARTBEAT_SECONDS
        held = [tag for tag in free if tag not in ends]  # marked queued by another
        if held:
            with contextlib.suppress(LeafpoolError):  # else: at the next heartbeat
                ttls = self.pool.queued_ttls(held)
                ends.update({t: ms / 1000 if ms >= 0 else HEARTBEAT_SECONDS
                             for t, ms in zip(held, ttls, strict=True)})
        # read again when the marker ends, queued now or not: a refill that starts takes
        # the lock (heard), one that never does leaves the tag due once its marker ends
        now = self._monotonic()
        for tag in free:
            at = now + ends.get(tag, HEARTBEAT_SECONDS) + MARKER_MARGIN_SECONDS
            self._recheck[tag] = at
            self._next_end = min(self._next_end, at)

    def _since_last(self, tag: str, now: float, consumed: int) -> float:
        """The rate since the tag's last read, over at least ``SHORT_SPAN_SECONDS``: a
        burst shows at once, where the recent rate (over at least a second, for sizing)
        reads 50,000 IDs/s as 2,500 IDs/s 50 ms into it. For a move only: one batch pop
        of 100 just after a read moves 1,000 IDs, not a pool sized for 1,000 IDs/s."""
        last = self._last.get(tag)
        self._last[tag] = (now, consumed)
        if last is None or consumed < last[1]:
            return 0.0
        return (consumed - last[1]) / max(now - last[0], SHORT_SPAN_SECONDS)

    def _spill_below(self, levels: list[Level], rates: dict[str, float]) -> None:
        """Move reserve IDs into the list of each segment tag read below its low-water
        mark with no refill lock (docs/design.md §3.7), before its refill is queued. A
        move refused (a refill took the lock, the list was filled meanwhile, the head
        moved) or failed changes nothing: the refill queued next fills the list."""
        spill = self._spill
        if spill is None:
            return
        now_ms = int(self._wall() * 1000)
        for lv in levels:
            if not (lv.known and lv.mode == "segment" and not lv.locked
                    and 0 <= lv.length < lv.low_water):
                continue
            # the rate decides; at least what takes the list back to its target, up to a
            # chunk (a small pool is topped up as its refill would); not the whole way
            # to a target sized for a rate gone by (a step down: the refill resizes)
            by_rate = math.ceil(rates.get(lv.tag, 0.0) * self.spill_seconds)
            least = min(lv.target - lv.length, spill.chunk)
            count = min(self.max_spill, max(least, by_rate))
            try:
                done = spill.move(lv.tag, count, lv.low_water, now_ms)
            except LeafpoolError as exc:  # the refill queued next fills it
                log.warning("%s: reserve not moved into the list: %s", lv.tag, exc)
                continue
            if done.moved:
                self.stats.spills += 1
                self.stats.spilled += done.moved
                log.debug("%s: moved %d reserve IDs into the list (%d -> %d)",
                          lv.tag, done.moved, lv.length, done.length)

    def _markers_ended(self, now: float) -> set[str]:
        """The tags whose marker has ended by ``now``, taken off the list (read again, a
        tag still due goes back on it). Scans the list only once the earliest end is due."""
        if now < self._next_end:
            return set()
        ended = {tag for tag, at in self._recheck.items() if at <= now}
        for tag in ended:
            del self._recheck[tag]
        self._next_end = min(self._recheck.values(), default=math.inf)
        return ended

    def _queue(self, due: Due, rate: float) -> bool:
        """Hand ``due`` to ``on_due``; False when it could not be (its marker cleared: tried
        again at the next heartbeat)."""
        try:
            if rate > 0:  # the refill sizes the pool by it (docs/design.md §3.2)
                self.pool.record(
                    due.tag, drop_rate=f"{rate:.3f}", drop_rate_ms=int(self._wall() * 1000)
                )
            self.on_due(due)
            self.stats.queued += 1
        except Exception as exc:  # the broker is down: the next heartbeat tries again
            log.warning("%s: refill not queued: %s", due.tag, exc)
            with contextlib.suppress(LeafpoolError):
                self.pool.clear_queued(due.tag)
            return False
        return True
