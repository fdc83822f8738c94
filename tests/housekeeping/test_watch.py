"""The drop watcher (leafpool/housekeeping/watch.py) against a real redis-server: a pop that takes a
list below its low-water mark queues a refill with no sweep running; a new tag, a
client's empty hit and a released lock are heard too; after a Redis restart it reads
every tag again; what it queues is what a full sweep finds."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
import redis

from leafpool.core.config import Settings
from leafpool.housekeeping.sweep import Due, due_tags
from leafpool.housekeeping.watch import DropWatcher
from leafpool.redis.pool import Pool
from leafpool.segment.refiller import SegmentRefiller
from leafpool.segment.store import SegmentStore
from tests.support import services
from tests.support.clocks import FakeWallClock

WAIT = 10.0  # bounded polling for what the watcher must do


class Queued:
    """The watcher's callback: records every refill it queues."""

    def __init__(self, action: Callable[[Due], object] | None = None) -> None:
        self.due: list[Due] = []
        self.action = action
        self._lock = threading.Lock()

    def __call__(self, due: Due) -> None:
        if self.action is not None:
            self.action(due)
        with self._lock:
            self.due.append(due)

    def tags(self) -> list[str]:
        with self._lock:
            return [d.tag for d in self.due]


@pytest.fixture
def queued() -> Queued:
    return Queued()


@pytest.fixture
def watcher(pool: Pool, queued: Queued) -> Iterator[DropWatcher]:
    w = DropWatcher(pool, queued, interval_s=0.005).start()
    assert w.ready.wait(WAIT), "watcher's first full pass"
    yield w
    w.stop()


def filled(pool: Pool, r: redis.Redis, tag: str, n: int = 10, low_water: int = 5) -> None:
    """A tag as a refill leaves it: ``n`` IDs, its low-water mark and counters, written
    in one MULTI (a watcher reading a tag half registered would rightly find it due)."""
    k = pool.tag(tag)
    pipe = r.pipeline(transaction=True)
    pipe.rpush(k.ids, *range(1, n + 1))
    pipe.hset(
        k.state,
        mapping={
            "mode": "segment",
            "created_ms": 0,
            "low_water": low_water,
            "target": n,
            "pushed_total": n,
            "reserve_due": 0,
        },
    )
    pipe.sadd(pool.keys.tags, tag)
    pipe.execute()


def test_a_pop_below_low_water_queues_a_refill_with_no_sweep_running(
    pool: Pool, r: redis.Redis, queued: Queued
) -> None:
    filled(pool, r, "order")
    filled(pool, r, "idle")
    w = DropWatcher(pool, queued, interval_s=0.005).start()
    try:
        assert w.ready.wait(WAIT)
        assert queued.tags() == []  # both above low-water: nothing due
        r.lpop("leafpool:{order}:ids", 5)  # 5 left: not below the mark (5)
        r.lpop("leafpool:{order}:ids")  # 4 left: below it
        services.wait_until(lambda: queued.tags() == ["order"], WAIT, "refill queued")
        assert queued.due == [Due("order", "segment", False)]
        assert r.exists("leafpool:{order}:queued")  # marked: queued once
        state = r.hgetall("leafpool:{order}:state")
        assert float(state[b"drop_rate"]) > 0  # the rate seen, for the refill's sizing
        r.lpop("leafpool:{order}:ids")  # further pops: already queued, not again
        r.lpop("leafpool:{idle}:ids")
        r.delete("leafpool:{idle}:queued")
        r.lpop("leafpool:{idle}:ids", 5)  # the second tag's drop is heard too
        services.wait_until(lambda: "idle" in queued.tags(), WAIT, "second tag queued")
        assert queued.tags() == ["order", "idle"]
    finally:
        w.stop()


def test_a_new_tag_and_an_empty_hit_are_heard_at_once(
    pool: Pool, r: redis.Redis, queued: Queued, watcher: DropWatcher
) -> None:
    pool.register("new", "segment", 0)  # never refilled: due
    services.wait_until(lambda: queued.tags() == ["new"], WAIT, "new tag queued")
    filled(pool, r, "full")
    pool.want("full")  # a client found it empty (say, after a drain): forced refill
    services.wait_until(lambda: "full" in queued.tags(), WAIT, "wanted tag queued")
    assert queued.due[-1] == Due("full", "segment", True)


def test_a_tag_being_refilled_is_queued_when_its_lock_is_released(
    pool: Pool, r: redis.Redis, queued: Queued
) -> None:
    filled(pool, r, "busy")
    r.set("leafpool:{busy}:lock", "token")
    r.lpop("leafpool:{busy}:ids", 8)
    w = DropWatcher(pool, queued, interval_s=0.005).start()
    try:
        assert w.ready.wait(WAIT)  # its full pass read the tag: low, but a refill runs
        assert queued.tags() == []
        r.delete("leafpool:{busy}:lock")  # the refill ended and the list is still low
        services.wait_until(lambda: queued.tags() == ["busy"], WAIT, "queued after the lock")
    finally:
        w.stop()


def test_a_tag_whose_lock_was_written_on_a_former_master_is_queued_at_once(
    pool: Pool, r: redis.Redis, queued: Queued
) -> None:
    """A refill held the lock when its master died and a replica was promoted with it: the
    lock names the former master's replication ID, and the next refill takes it over at
    once. The watcher queues that refill; waiting for the lock's release (its TTL: nobody
    releases it) left the pool empty for 30 s after a failover. A lock of this master
    still holds its tag."""
    filled(pool, r, "moved")
    filled(pool, r, "busy")
    r.set("leafpool:{moved}:lock", b"c3@" + b"0" * 40, px=60_000)
    assert pool.refill_lock("busy", 60_000).acquire()
    r.lpop("leafpool:{moved}:ids", 10)
    r.lpop("leafpool:{busy}:ids", 10)
    w = DropWatcher(pool, queued, interval_s=0.005).start()
    try:
        assert w.ready.wait(WAIT)
        services.wait_until(lambda: queued.tags() == ["moved"], WAIT, "queued, lock and all")
        assert "busy" not in queued.tags()  # its refill runs on this master
    finally:
        w.stop()


def test_a_tag_drained_while_a_failed_refill_holds_it_is_queued_when_the_hold_ends(
    pool: Pool, r: redis.Redis, queued: Queued
) -> None:
    """A refill that failed marks the tag queued for a few seconds (its hold, with no
    retry behind it when it ran in a batch); clients drain the list meanwhile, and a plain
    LPOP of an empty list writes nothing. When the hold ends (the marker expires: nothing
    the watcher tracks is written) the watcher must still queue the refill."""
    filled(pool, r, "order")
    assert pool.mark_queued("order", 60)  # the failed refill's hold
    r.lpop("leafpool:{order}:ids", 10)  # drained during the hold
    assert pool.note_dry("order", 1) == 1  # and marked dry: the watcher writes nothing
    w = DropWatcher(pool, queued, interval_s=0.005).start()
    try:
        assert w.ready.wait(WAIT)  # its full pass read the tag: due, but held
        assert queued.tags() == []
        for _ in range(5):
            assert r.lpop("leafpool:{order}:ids") is None  # clients ask: nothing written
        r.delete("leafpool:{order}:queued")  # the hold ends (as its expiry would)
        services.wait_until(lambda: queued.tags() == ["order"], WAIT, "queued after the hold")
        assert r.exists("leafpool:{order}:queued")  # marked by the watcher: queued once
    finally:
        w.stop()


def test_a_tag_whose_queued_refill_never_starts_is_queued_again_when_its_marker_ends(
    pool: Pool, r: redis.Redis, queued: Queued
) -> None:
    """docs/design.md §3.7: the watcher queued a refill, and the task never runs (lost with
    its worker, failed without a retry, or in a queue no worker reads), and nothing writes
    the tag again: here a refill left its reserve short (due with no pop, so the watcher
    records no drop rate and no dry mark). When the marker ends the watcher must queue the
    refill again by itself, not leave the tag to the sweep."""
    filled(pool, r, "order")
    w = DropWatcher(pool, queued, interval_s=0.005, queued_seconds=60).start()
    try:
        assert w.ready.wait(WAIT)
        pool.record("order", reserve_due=1)  # the last refill left the reserve short
        services.wait_until(lambda: queued.tags() == ["order"], WAIT, "refill queued")
        first = r.get("leafpool:{order}:queued")
        assert first is not None and 0 < r.ttl("leafpool:{order}:queued") <= 60
        r.delete("leafpool:{order}:queued")  # the marker ends (as its expiry would)
        services.wait_until(lambda: queued.tags() == ["order", "order"], WAIT,
                            "refill queued again")
        assert r.get("leafpool:{order}:queued") not in (None, first)  # marked anew
    finally:
        w.stop()


def test_the_triggers_markers_are_short() -> None:
    """The watcher's and the sweep's markers, and a failed refill's hold, end within a few
    seconds: with the watcher's heartbeat (1 s) a tag whose refill cannot run is queued
    again within 5 s (docs/design.md §3.7)."""
    from leafpool.housekeeping.sweep import QUEUED_SECONDS
    from leafpool.housekeeping.watch import HEARTBEAT_SECONDS
    from leafpool.refill.base import FAILED_HOLD_SECONDS

    assert max(QUEUED_SECONDS, FAILED_HOLD_SECONDS) + HEARTBEAT_SECONDS < 5


def test_after_a_redis_restart_the_watcher_reads_every_tag_again(
    make_settings: Callable[..., Settings],
) -> None:
    server = services.redis_server()
    try:
        r = redis.Redis.from_url(server.extra["url"])
        pool = Pool(r)
        filled(pool, r, "order")
        queued = Queued()
        w = DropWatcher(pool, queued, interval_s=0.005).start()
        try:
            assert w.ready.wait(WAIT)
            assert w.stats.full_passes == 1
            server.kill()  # SIGKILL: the watcher's connections break, tracking is gone
            services.wait_until(lambda: not w.ready.is_set(), WAIT, "watcher noticed")
            # while Redis is down a pop could not happen; once it is back (the AOF
            # restores the tag), the watcher reconnects and reads every tag again
            server.start()
            services.wait_until(w.ready.is_set, WAIT, "watcher reconnected")
            assert w.stats.full_passes == 2 and w.stats.connects == 2
            r.lpop("leafpool:{order}:ids", 6)  # tracked again: the drop is heard
            services.wait_until(lambda: queued.tags() == ["order"], WAIT, "refill queued")
        finally:
            w.stop()
            r.close()
    finally:
        server.stop()


def test_a_flush_makes_the_watcher_read_every_tag_again(
    pool: Pool, r: redis.Redis, watcher: DropWatcher
) -> None:
    r.flushall()  # Redis sends one invalidation naming no key: everything changed
    services.wait_until(lambda: watcher.stats.full_passes >= 2, WAIT, "full pass")


def test_the_watcher_queues_what_a_full_sweep_finds(
    pool: Pool, r: redis.Redis, queued: Queued, watcher: DropWatcher
) -> None:
    """The incremental sweep (the tags touched since their last read) against the full
    one: after pops, pushes, a short reserve and an empty hit on some of 40 tags, the
    tags queued are exactly those a read of every tag finds due."""
    for i in range(40):
        filled(pool, r, f"t{i}", n=10, low_water=5)
    # each new tag is read (and tracked) once the tag set's invalidation is heard
    services.wait_until(lambda: watcher.stats.reads >= 40, WAIT, "new tags read")
    for i in range(0, 40, 3):
        r.lpop(f"leafpool:{{t{i}}}:ids", 6)  # below low-water
    for i in range(1, 40, 7):
        r.lpop(f"leafpool:{{t{i}}}:ids", 2)  # still above it
    pool.record("t5", reserve_due=1)  # a refill left its reserve short
    pool.want("t8")  # an empty hit
    everything = pool.levels(pool.tags())
    expected = {d.tag for d in due_tags(everything, {"t8"})}
    assert len(expected) == 16
    services.wait_until(lambda: set(queued.tags()) >= expected, WAIT, "all due tags queued")
    assert sorted(queued.tags()) == sorted(expected)  # each once, nothing else


def test_a_tag_at_the_floor_that_becomes_busy_is_refilled_before_it_runs_dry(
    pool: Pool, r: redis.Redis, make_settings: Callable[..., Settings], sqlite_url: str
) -> None:
    """An idle tag holds the floor (200 IDs). Clients start taking from it: the pop that
    takes it below low-water triggers its refill (no sweep, no client finding it empty),
    and the refill sizes the pool by the consumption it measures."""
    store = SegmentStore.from_url(sqlite_url)
    store.init_schema()
    store.add_tag("order", step=1000)
    clock = FakeWallClock()
    settings = make_settings(database_url=sqlite_url, pool_floor=200, pool_seconds=30)
    refiller = SegmentRefiller(pool, store, settings, wall=clock)
    refiller.refill("order")
    assert r.llen("leafpool:{order}:ids") == 200
    refilled = threading.Event()

    def refill(due: Due) -> None:
        r.delete(pool.tag(due.tag).queued)  # as the refill task does
        refiller.refill(due.tag)
        refilled.set()

    w = DropWatcher(pool, Queued(refill), interval_s=0.005).start()
    try:
        assert w.ready.wait(WAIT)
        clock.advance(1.0)  # the tag becomes busy: 101 IDs in the next second
        r.lpop("leafpool:{order}:ids", 101)
        assert refilled.wait(WAIT), "refill triggered by the drop"
    finally:
        w.stop()
        store.engine.dispose()
    state = r.hgetall("leafpool:{order}:state")
    assert r.hget("leafpool:{order}:hits", "empty_hits") is None  # no client found it empty
    # 101 IDs/s for 30 pool seconds: the pool follows the rate, above the floor
    assert int(state[b"target"]) == 3030
    assert r.llen("leafpool:{order}:ids") == 3030


def test_a_pool_too_small_for_the_rate_seen_gets_a_forced_refill_before_its_low_water(
    pool: Pool, r: redis.Redis, queued: Queued
) -> None:
    """With an ``outgrown`` rule the watcher resizes a pool as soon as the rate it sees
    asks for more than twice the pool's target, before the list reaches low-water."""
    from leafpool.refill.sizing import outgrown

    filled(pool, r, "order", n=10, low_water=5)
    w = DropWatcher(
        pool,
        queued,
        interval_s=0.005,
        outgrown=lambda lv, rate: outgrown(rate, 1000, lv.target, 10**6),
    ).start()
    try:
        assert w.ready.wait(WAIT)
        r.lpop("leafpool:{order}:ids", 4)  # 6 left: above low-water, but 4 IDs within
        # seconds at 1,000 pool seconds ask for far more than 10
        services.wait_until(lambda: queued.tags() == ["order"], WAIT, "forced refill")
        assert queued.due == [Due("order", "segment", True)]
    finally:
        w.stop()


def test_the_pop_that_takes_the_last_id_marks_the_tag_dry_at_once(
    pool: Pool, r: redis.Redis, watcher: DropWatcher
) -> None:
    """docs/design.md §3.8: the last plain LPOP deletes the list, which the watcher hears;
    the plain LPOPs of the empty list after it are seen by nothing (the mark says since
    when); a push ends it."""
    filled(pool, r, "order", n=3, low_water=1)
    services.wait_until(lambda: watcher.stats.reads > 0 or watcher.stats.full_passes > 0,
                        WAIT, "watching")
    assert r.lpop("leafpool:{order}:ids", 3)
    services.wait_until(lambda: bool(r.hget("leafpool:{order}:state", "dry_since_ms")),
                        WAIT, "marked dry")
    r.rpush("leafpool:{order}:ids", 4)
    services.wait_until(lambda: r.hget("leafpool:{order}:state", "dry_events") == b"1",
                        WAIT, "no longer dry")
    assert r.hget("leafpool:{order}:state", "dry_since_ms") == b""


def with_reserve(pool: Pool, r: redis.Redis, tag: str, n: int = 10, low_water: int = 5,
                 ranges: tuple[str, ...] = ("11:2011",)) -> None:
    """:func:`filled`, with reserve ranges above the list (the high-water mark at ``n``)."""
    filled(pool, r, tag, n, low_water)
    k = pool.tag(tag)
    pipe = r.pipeline(transaction=True)
    pipe.rpush(k.reserve, *ranges)
    pipe.hset(k.state, "hwm", n)
    pipe.execute()


def test_a_drop_below_low_water_moves_reserve_ids_into_the_list_before_queueing(
    pool: Pool, r: redis.Redis
) -> None:
    """docs/design.md §3.7: the watcher fills the list from the reserve at once, up to
    its target (or the rate it saw for a second), and then queues the refill; the IDs
    are the reserve's head, in order after the list."""
    with_reserve(pool, r, "order", n=10, low_water=5)
    lengths: list[int] = []
    queued = Queued(lambda due: lengths.append(int(r.llen(pool.tag(due.tag).ids))))
    clock = [0.0]
    w = DropWatcher(pool, queued, interval_s=0.005, monotonic=lambda: clock[0]).start()
    try:
        assert w.ready.wait(WAIT)  # its full pass: 0 consumed at 0 s
        clock[0] = 0.05
        assert r.lpop("leafpool:{order}:ids", 6) == [b"1", b"2", b"3", b"4", b"5", b"6"]
        services.wait_until(lambda: queued.tags() == ["order"], WAIT, "refill queued")
    finally:
        w.stop()
    # 4 left: 6 IDs in 0.05 s since the last read, counted over 0.1 s, are 60 IDs/s: 60
    # moved before the refill was queued (the target alone asks 6)
    assert lengths == [64] and w.stats.spills == 1 and w.stats.spilled == 60
    assert r.lrange("leafpool:{order}:ids", 0, -1) == [str(i).encode() for i in range(7, 71)]
    assert r.lrange("leafpool:{order}:reserve", 0, -1) == [b"71:2011"]
    state = r.hgetall("leafpool:{order}:state")
    assert state[b"hwm"] == b"70" and state[b"pushed_total"] == b"70"
    assert state[b"watch_pushed"] == b"60"
    assert state[b"reserve_due"] == b"1"  # due until a refill replaces what it gave


def test_a_move_takes_the_rate_seen_for_a_second_when_that_is_more_than_the_target(
    pool: Pool, r: redis.Redis, queued: Queued
) -> None:
    with_reserve(pool, r, "fast", n=10, low_water=5)
    clock = [0.0]
    w = DropWatcher(pool, queued, interval_s=0.005, monotonic=lambda: clock[0]).start()
    try:
        assert w.ready.wait(WAIT)  # its full pass: the first sample, 0 consumed at 0 s
        clock[0] = 1.0
        pipe = r.pipeline(transaction=True)  # one write heard: 1,006 IDs taken in 1 s
        pipe.lpop("leafpool:{fast}:ids", 6)
        pipe.rpush("leafpool:{fast}:ids", *range(100, 1100))  # (as if pushed)
        pipe.hincrby("leafpool:{fast}:state", "pushed_total", 1000)
        pipe.lpop("leafpool:{fast}:ids", 1000)
        pipe.execute()
        services.wait_until(lambda: queued.tags() == ["fast"], WAIT, "refill queued")
    finally:
        w.stop()
    # 1,006/s for a second: more than the 10 - 4 = 6 the target asks
    assert w.stats.spilled == 1006 and r.llen("leafpool:{fast}:ids") == 1010


def test_a_tag_whose_refill_holds_the_lock_gets_no_move(
    pool: Pool, r: redis.Redis, queued: Queued
) -> None:
    """A refill holding the lock fills the list; a lock written on a former master (the
    watcher queues its refill at once, §3.1) is refused by the script itself: the watcher
    writes under no token, so it never writes while any lock exists."""
    with_reserve(pool, r, "busy")
    with_reserve(pool, r, "moved")
    assert pool.refill_lock("busy", 60_000).acquire()
    r.set("leafpool:{moved}:lock", b"c3@" + b"0" * 40, px=60_000)
    w = DropWatcher(pool, queued, interval_s=0.005).start()
    try:
        assert w.ready.wait(WAIT)
        reads = w.stats.reads
        r.lpop("leafpool:{busy}:ids", 6)
        r.lpop("leafpool:{moved}:ids", 6)
        services.wait_until(lambda: queued.tags() == ["moved"], WAIT, "queued, no move")
        services.wait_until(lambda: w.stats.reads >= reads + 2, WAIT, "both read")
    finally:
        w.stop()
    assert w.stats.spills == 0
    for tag in ("busy", "moved"):
        assert r.llen(f"leafpool:{{{tag}}}:ids") == 4
        assert r.lrange(f"leafpool:{{{tag}}}:reserve", 0, -1) == [b"11:2011"]
        assert r.hget(f"leafpool:{{{tag}}}:state", "watch_pushed") is None


def test_no_move_for_a_snowflake_tag_or_without_a_reserve_or_when_turned_off(
    pool: Pool, r: redis.Redis, queued: Queued
) -> None:
    with_reserve(pool, r, "flake")
    r.hset("leafpool:{flake}:state", "mode", "snowflake")
    filled(pool, r, "bare")  # no reserve
    with_reserve(pool, r, "off")
    w = DropWatcher(pool, queued, interval_s=0.005).start()
    try:
        assert w.ready.wait(WAIT)
        r.lpop("leafpool:{flake}:ids", 6)
        r.lpop("leafpool:{bare}:ids", 6)
        services.wait_until(lambda: sorted(queued.tags()) == ["bare", "flake"], WAIT, "queued")
    finally:
        w.stop()
    w = DropWatcher(pool, queued, interval_s=0.005, spill=False).start()
    try:
        assert w.ready.wait(WAIT)
        r.lpop("leafpool:{off}:ids", 6)
        services.wait_until(lambda: "off" in queued.tags(), WAIT, "queued")
    finally:
        w.stop()
    assert [r.llen(f"leafpool:{{{t}}}:ids") for t in ("flake", "bare", "off")] == [4, 4, 4]


def test_a_tag_whose_refill_never_starts_after_a_move_is_queued_again(
    pool: Pool, r: redis.Redis, queued: Queued
) -> None:
    """The move lifts the list above its low-water mark, but the refill queued after it
    (to replace what the reserve gave, and to resize the pool) may never run: the move
    marks the reserve due, so the tag stays due and is queued again when the marker ends
    (docs/design.md §3.7), as without the move."""
    with_reserve(pool, r, "order")
    w = DropWatcher(pool, queued, interval_s=0.005, queued_seconds=60).start()
    try:
        assert w.ready.wait(WAIT)
        r.lpop("leafpool:{order}:ids", 6)
        services.wait_until(lambda: queued.tags() == ["order"], WAIT, "refill queued")
        assert r.llen("leafpool:{order}:ids") >= 10  # moved: above low-water again
        r.delete("leafpool:{order}:queued")  # the marker ends (as its expiry would)
        services.wait_until(lambda: queued.tags() == ["order", "order"], WAIT,
                            "refill queued again")
    finally:
        w.stop()
    assert w.stats.spills == 1


def test_after_a_step_down_a_move_follows_the_rate_not_a_target_sized_for_the_old_one(
    pool: Pool, r: redis.Redis, queued: Queued
) -> None:
    """A list sized for a rate gone by (target 100,000) crosses its low-water mark at a
    trickle: the move tops it up by a chunk, not by the 50,000 IDs its old target asks;
    the refill queued resizes the pool."""
    with_reserve(pool, r, "calm", n=50_000, low_water=50_000, ranges=("50001:200001",))
    r.hset("leafpool:{calm}:state", "target", 100_000)
    w = DropWatcher(pool, queued, interval_s=0.005).start()
    try:
        assert w.ready.wait(WAIT)
        r.lpop("leafpool:{calm}:ids")  # 49,999 left: below the mark
        services.wait_until(lambda: queued.tags() == ["calm"], WAIT, "refill queued")
    finally:
        w.stop()
    assert w.stats.spilled == 1000 and r.llen("leafpool:{calm}:ids") == 50_999
