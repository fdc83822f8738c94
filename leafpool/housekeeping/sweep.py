"""The sweep: which tags need a refill now: below their low-water mark, never filled,
with a short reserve, or found empty by a client. A short-lived ``queued`` marker per tag
keeps the same refill from being queued twice (docs/design.md §3.7).

:func:`sweep` reads each tag's :class:`~leafpool.redis.pool.Level` (``LLEN`` of the list and
four state fields, two commands a tag), the ``queued`` marker only of the tags found due
and the lock only of those no trigger holds (:func:`unmarked`): the
reserve's shortness is recorded by the refill that left it short (``reserve_due``),
so the reserve itself is not read. :func:`snapshot_sweep` is the sweep before that (a
full snapshot of every tag: the reserve ranges, the whole state hash, the lock), kept as
the benchmark's baseline. With ``tags``, :func:`sweep` looks only at those (the drop
watcher's dirty tags: the incremental sweep).

:func:`sweep_pass` is the beat's periodic sweep: one at a time (the sweep lock, a short
Redis lock with a TTL: a sweep that finds it held looks only at the wanted tags and
returns), and with the drop watcher running its full passes at least
:func:`full_pass_seconds` apart: N / 250 s for N tags, so the backstop's cost at rest
stays near 0.5 % of a core however many tags there are (docs/design.md §3.7).

Both the sweep and the drop watcher also keep each tag's dry mark true to its list
(:func:`note_dry`, docs/design.md §3.8): a list found at 0 after pushes is marked dry
from then on, one found holding IDs again is marked no longer dry.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from leafpool.core.errors import LeafpoolError
from leafpool.redis.lock import TokenLock
from leafpool.redis.pool import Level, Pool
from leafpool.redis.pool_batch import clear_queued

#: how long a trigger's ``queued`` marker holds a tag (the drop watcher's, the sweep's, a
#: running batch's): a refill task that cannot run (lost with its worker, failed without
#: a retry, left in a queue no worker reads) holds the tag this long, and the watcher reads
#: a tag it queued again at every heartbeat until it is refilled, so the tag is queued
#: again within this and a heartbeat (docs/design.md §3.7). A task that waits longer in a
#: busy queue is queued twice at worst: the second refill finds the tag locked or full
QUEUED_SECONDS = 3
#: with the drop watcher running, the sweep's full passes are at least this many seconds
#: a tag apart (N / 250 s): up to 7,500 tags keep LEAFPOOL_WATCH_SWEEP_SECONDS' 30 s,
#: 100,000 tags are swept every 400 s (docs/design.md §3.7)
SWEEP_SECONDS_PER_TAG = 0.004
#: a running sweep holds the sweep lock this long at least (and 4 intervals at least): a
#: sweep lost with its worker holds the next full pass off that long at worst
SWEEP_LOCK_SECONDS = 120.0


def full_pass_seconds(tags: int, interval: float, watching: bool) -> float:
    """The least time between the starts of two full sweeps of ``tags`` tags, the beat
    sending a sweep every ``interval`` seconds: the interval itself without the drop
    watcher (the sweep is then the only trigger), else at least ``tags`` x
    :data:`SWEEP_SECONDS_PER_TAG`."""
    if tags < 0 or interval <= 0:
        raise ValueError(f"full_pass_seconds: tags {tags} must be >= 0 and interval "
                         f"{interval} > 0")
    return max(interval, tags * SWEEP_SECONDS_PER_TAG) if watching else interval


@dataclass(frozen=True)
class SweepPass:
    """One periodic sweep: what it queued; ``full``: it read every tag (else another sweep
    ran or the last full pass is resting: it read only the wanted tags); ``tags``: how
    many the pool held; ``rest_seconds``: how long the lock now holds the next full pass
    off."""

    queued: list[tuple[str, str, bool]]
    full: bool
    tags: int = 0
    rest_seconds: float = 0.0


@dataclass(frozen=True)
class Due:
    """A tag due a refill: its mode, and ``force`` (fill to the target, not only when
    below low-water: a client found it empty)."""

    tag: str
    mode: str
    force: bool


def due_tags(levels: Sequence[Level], wanted: set[str]) -> list[Due]:
    """The tags of ``levels`` that are due a refill (not counting their locks)."""
    out = []
    for lv in levels:
        if lv.known and (lv.due() or lv.tag in wanted):
            out.append(Due(lv.tag, lv.mode or "segment", lv.tag in wanted))
    return out


def queue_due(
    pool: Pool, due: Sequence[Due], locked: Sequence[bool], queued_seconds: int
) -> list[Due]:
    """The due tags whose refill is not running (``locked``) and not already queued,
    each marked queued now."""
    free = [d for d, held in zip(due, locked, strict=True) if not held]
    if not free:
        return []
    marked = pool.mark_queued_many([d.tag for d in free], queued_seconds)  # one round trip
    return [d for d, ok in zip(free, marked, strict=True) if ok]


def note_dry(pool: Pool, levels: Sequence[Level], now_ms: int) -> list[str]:
    """Record the dry mark of every tag whose mark disagrees with its list as read
    (``dry.lua`` decides again on the list as it is: a level read a moment ago changes
    nothing wrongly); the tags whose mark changed. Best effort: a tag that cannot be
    marked now is marked at the next read."""
    changed = []
    for lv in levels:
        if lv.dry_mark_stale():
            with contextlib.suppress(LeafpoolError):
                if pool.note_dry(lv.tag, now_ms):
                    changed.append(lv.tag)
    return changed


def sweep(
    pool: Pool, queued_seconds: int, tags: Sequence[str] | None = None,
    wall: Callable[[], float] = time.time,
) -> list[tuple[str, str, bool]]:
    """Tags to refill now, as ``(tag, mode, force)``; each is marked queued. ``tags``:
    look only at these (and the wanted ones), not every tag of the pool. Dry marks are
    kept true on the way (:func:`note_dry`)."""
    wanted = set(pool.take_wanted())
    names = pool.tags() if tags is None else sorted(set(tags) | wanted)
    if not names:
        return []
    levels = pool.levels(names)
    note_dry(pool, levels, int(wall() * 1000))
    due = unmarked(pool, due_tags(levels, wanted))
    locked = pool.locks_held([d.tag for d in due]) if due else []
    queued = still_due(pool, queue_due(pool, due, locked, queued_seconds))
    return [(d.tag, d.mode, d.force) for d in queued]


def still_due(pool: Pool, marked: Sequence[Due], locks: bool = False) -> list[Due]:
    """The tags just marked queued that are still due, read again after the mark (the
    sweep's and the drop watcher's step between marking and queueing). The levels decided
    on were read a moment before the mark (seconds, over many tags), and a refill that
    ran meanwhile (a first-fill batch, which holds a tag's marker until its state is
    recorded) filled the tag and cleared its marker (10,000 new tags: a sweep queued 100
    refills with nothing to do, which held a pool process for 12 s before the batches
    behind them). Those are not queued (their mark cleared); a forced refill (a client
    found the tag empty, or its pool outgrown) is queued as decided. ``locks``: a tag
    whose lock is held now is dropped too (the watcher, which reads it again at its next
    heartbeat); the sweep reads only the levels: a tag a refill holds now was free a
    moment ago, and its queued refill finds it locked or filled."""
    check = [d.tag for d in marked if not d.force]
    if not check:
        return list(marked)
    try:
        fresh = pool.levels(check)
        held = pool.locks_held(check) if locks else [False] * len(check)
    except LeafpoolError:  # queued as decided: a useless refill at worst
        return list(marked)
    stale = {lv.tag for lv, lock in zip(fresh, held, strict=True) if lock or not lv.due()}
    if stale:
        with contextlib.suppress(LeafpoolError):  # else they expire (queued_seconds)
            clear_queued(pool, sorted(stale))
    return [d for d in marked if d.tag not in stale]


def sweep_lock(pool: Pool, interval: float) -> TokenLock:
    """The lock one periodic sweep holds while it runs, and then while its full pass rests."""
    seconds = max(SWEEP_LOCK_SECONDS, 4 * interval)
    return TokenLock(pool.redis, pool.keys.sweep_lock, int(seconds * 1000))


def sweep_pass(
    pool: Pool, queued_seconds: int, interval: float, watching: bool,
    wall: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic,
) -> SweepPass:
    """The beat's sweep, sent every ``interval`` seconds: a full :func:`sweep` under the
    sweep lock, or, while another holds it, only the wanted tags (a client found them
    empty; the marker keeps each from being queued twice). After a full pass the lock is
    kept until :func:`full_pass_seconds` from its start, less half an interval (the beat's
    next sweep at or after that time does the next full pass); when that is the interval
    itself (a few thousand tags, or no watcher) it is released at once: every sweep the
    beat sends is a full pass, as before."""
    lock = sweep_lock(pool, interval)
    if not lock.acquire():
        return SweepPass(sweep(pool, queued_seconds, tags=(), wall=wall), full=False)
    started = monotonic()
    rest = 0.0
    try:
        queued = sweep(pool, queued_seconds, wall=wall)
        count = pool.tag_count()
        gap = full_pass_seconds(count, interval, watching)
        if gap > interval:
            rest = gap - interval / 2 - (monotonic() - started)
    finally:
        if rest >= 0.1:
            lock.ttl_ms = int(rest * 1000)
            if not lock.extend():  # expired mid-pass: the next sweep runs at once
                rest = 0.0
        else:
            rest = 0.0
            lock.release()
    return SweepPass(queued, full=True, tags=count, rest_seconds=rest)


def unmarked(pool: Pool, due: Sequence[Due]) -> list[Due]:
    """The due tags no trigger holds (no ``queued`` marker: ``PTTL`` -2), one read each.
    A held tag would not be queued anyway (its marker fails the ``SET NX``); reading
    the markers first spares the lock read and the marker write of each held tag: after
    the tag sync registers 100,000 new tags, every one is due (never refilled) and held
    by the sync's marker until its first-fill batch runs, and a sweep read 100,000 locks
    and tried 100,000 markers in vain."""
    if not due:
        return []
    ttls = pool.queued_ttls([d.tag for d in due])
    return [d for d, ttl in zip(due, ttls, strict=True) if ttl == -2]


def snapshot_sweep(pool: Pool, queued_seconds: int) -> list[tuple[str, str, bool]]:
    """The sweep before levels (a full snapshot of every tag): the baseline the
    benchmark compares :func:`sweep` with. Same decisions, except that it computes the
    reserve's shortness from the ranges rather than reading ``reserve_due``."""
    wanted = set(pool.take_wanted())
    out: list[tuple[str, str, bool]] = []
    for snap in pool.snapshots(pool.tags()):
        if not snap.known:
            continue
        low_water = snap.int("low_water", -1)
        below = low_water < 0 or snap.length < low_water
        if snap.state.get("mode", "segment") == "segment":
            below = below or snap.reserve_size < snap.int("reserve_target") // 2
        force = snap.tag in wanted
        if (below or force) and not snap.locked and pool.mark_queued(snap.tag, queued_seconds):
            out.append((snap.tag, snap.state.get("mode", "segment"), force))
    return out
