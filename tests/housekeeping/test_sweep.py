"""The sweep that queues refills."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence

import pytest
import redis

from leafpool.core.errors import LeafpoolError
from leafpool.housekeeping.sweep import (
    SweepPass,
    full_pass_seconds,
    snapshot_sweep,
    sweep,
    sweep_pass,
)
from leafpool.redis.pool import Level, Pool


def test_sweep_queues_new_low_and_wanted_tags_once(pool: Pool, r: redis.Redis) -> None:
    pool.register("new", "segment", 0)
    pool.register("full", "segment", 0, low_water=2, target=4)
    r.rpush("leafpool:{full}:ids", 1, 2, 3)
    pool.register("low", "segment", 0, low_water=2, target=4)
    r.rpush("leafpool:{low}:ids", 1)
    assert sorted(sweep(pool, 30)) == [("low", "segment", False), ("new", "segment", False)]
    assert sweep(pool, 30) == []  # already queued
    pool.want("full")
    assert sweep(pool, 30) == [("full", "segment", True)]
    pool.clear_queued("low")
    assert sweep(pool, 30) == [("low", "segment", False)]


def test_sweep_skips_a_tag_being_refilled(pool: Pool, r: redis.Redis) -> None:
    pool.register("busy", "segment", 0)
    r.set("leafpool:{busy}:lock", "token")
    assert sweep(pool, 30) == []


def test_a_lock_written_on_a_former_master_does_not_hold_the_tag_up(
    pool: Pool, r: redis.Redis
) -> None:
    """docs/design.md §3.7: a refill held the tag's lock when its master died; the promoted
    replica has the lock (replicated) until its TTL ends, but the next refill takes it over
    at once (it names the former master's replication ID). The sweep queues that refill
    instead of waiting out the TTL with the pool empty; a lock taken on this master still
    holds the tag."""
    pool.register("order", "segment", 0, low_water=2, target=4)
    r.set("leafpool:{order}:lock", b"c3@" + b"0" * 40, px=30_000)  # a former master's
    assert sweep(pool, 30) == [("order", "segment", False)]
    pool.clear_queued("order")
    r.delete("leafpool:{order}:lock")
    assert pool.refill_lock("order", 30_000).acquire()  # a refill on this master
    assert sweep(pool, 30) == []


def _mixed_tags(pool: Pool, r: redis.Redis) -> None:
    """One tag of each kind the sweep must tell apart."""
    pool.register("new", "segment", 0)  # never refilled
    pool.register("full", "segment", 0, low_water=2, target=4, reserve_target=10, reserve_due=0)
    r.rpush("leafpool:{full}:ids", 1, 2, 3)
    r.rpush("leafpool:{full}:reserve", "10:20")
    pool.register("low", "segment", 0, low_water=2, target=4, reserve_target=10, reserve_due=0)
    r.rpush("leafpool:{low}:ids", 1)
    r.rpush("leafpool:{low}:reserve", "10:20")
    # a refill left the reserve short (the flag) and the ranges say so too
    pool.register("short", "segment", 0, low_water=2, target=4, reserve_target=100, reserve_due=1)
    r.rpush("leafpool:{short}:ids", 1, 2, 3)
    r.rpush("leafpool:{short}:reserve", "10:20")
    pool.register("flake", "snowflake", 0, low_water=2, target=4, reserve_due=1)
    r.rpush("leafpool:{flake}:ids", 1, 2, 3)  # snowflake: no reserve, not due
    pool.register("locked", "segment", 0, low_water=2, target=4)
    r.set("leafpool:{locked}:lock", "token")
    pool.register("wanted", "segment", 0, low_water=2, target=4, reserve_target=10, reserve_due=0)
    r.rpush("leafpool:{wanted}:ids", 1, 2, 3)
    r.rpush("leafpool:{wanted}:reserve", "10:20")
    pool.want("wanted")


def test_the_level_sweep_finds_what_the_snapshot_sweep_found(pool: Pool, r: redis.Redis) -> None:
    _mixed_tags(pool, r)
    before = sorted(snapshot_sweep(pool, 30))
    assert before == [
        ("low", "segment", False),
        ("new", "segment", False),
        ("short", "segment", False),
        ("wanted", "segment", True),
    ]
    for tag in ("low", "new", "short", "wanted"):
        pool.clear_queued(tag)
    pool.want("wanted")
    assert sorted(sweep(pool, 30)) == before


def test_an_incremental_sweep_looks_at_the_given_tags_and_the_wanted_ones(
    pool: Pool, r: redis.Redis
) -> None:
    _mixed_tags(pool, r)
    assert sorted(sweep(pool, 30, tags=["low", "full"])) == [
        ("low", "segment", False),
        ("wanted", "segment", True),
    ]
    assert sweep(pool, 30, tags=[]) == []
    assert sorted(sweep(pool, 30)) == [("new", "segment", False), ("short", "segment", False)]


def test_the_sweep_marks_a_list_emptied_by_plain_pops_dry_and_clears_it_once_filled(
    pool: Pool, r: redis.Redis
) -> None:
    """docs/design.md §3.8: plain LPOPs of an empty list change nothing in Redis; the
    sweep finds the list at 0 and records since when (and not a tag never filled)."""
    pool.register("t", "segment", 0, low_water=2, target=4, pushed_total=3)
    pool.register("new", "segment", 0)
    sweep(pool, 30, wall=lambda: 1_700_000_000.0)
    assert r.hget("leafpool:{t}:state", "dry_since_ms") == b"1700000000000"
    assert r.hget("leafpool:{new}:state", "dry_since_ms") is None
    r.rpush("leafpool:{t}:ids", 4, 5, 6)
    sweep(pool, 30, wall=lambda: 1_700_000_042.0)
    state = r.hgetall("leafpool:{t}:state")
    assert state[b"dry_since_ms"] == b"" and state[b"dry_ms"] == b"42000"


def _calls(r: redis.Redis, command: str) -> int:
    return int(r.info("commandstats").get(f"cmdstat_{command}", {}).get("calls", 0))


def test_a_due_tag_held_by_a_marker_costs_the_sweep_one_read(pool: Pool, r: redis.Redis) -> None:
    """After the tag sync registers many tags, every one is due (never refilled) and held
    by the sync's marker until its first-fill batch runs: the sweep reads each marker
    and neither its lock nor tries its marker (100,000 of each, in vain, for 100,000 new
    tags). A due tag no trigger holds is still queued."""
    for n in range(20):
        pool.register(f"held{n:02d}", "segment", 0)
    pool.mark_queued_many([f"held{n:02d}" for n in range(20)], 300)
    pool.register("free", "segment", 0)
    gets, sets = _calls(r, "get"), _calls(r, "set")
    assert sweep(pool, 30) == [("free", "segment", False)]
    assert _calls(r, "get") - gets == 1  # the free tag's lock
    assert _calls(r, "set") - sets == 1  # the free tag's marker


# -- the periodic sweep: one at a time, full passes spaced by the tag count --------------


def test_full_pass_spacing_grows_with_the_tags_only_while_the_watcher_runs() -> None:
    assert full_pass_seconds(0, 30, watching=True) == 30
    assert full_pass_seconds(3_000, 30, watching=True) == 30  # a few thousand: as before
    assert full_pass_seconds(7_500, 30, watching=True) == 30
    assert full_pass_seconds(10_000, 30, watching=True) == 40
    assert full_pass_seconds(100_000, 30, watching=True) == 400
    assert full_pass_seconds(100_000, 1, watching=False) == 1  # the only trigger
    with pytest.raises(ValueError, match="tags -1 must be >= 0"):
        full_pass_seconds(-1, 30, watching=True)
    with pytest.raises(ValueError, match="interval 0 > 0"):
        full_pass_seconds(10, 0, watching=True)


def test_two_sweeps_started_together_one_does_the_work(pool: Pool, r: redis.Redis) -> None:
    """A sweep that starts while another runs reads only the wanted tags and returns: the
    second sweep is started inside the first one's pass (at its dry-mark step, after
    its read of every tag), so the two overlap for certain."""
    for i in range(20):
        pool.register(f"t{i}", "segment", 0)  # never filled: all due
    pool.register("full", "segment", 0, low_water=2, target=4)
    r.rpush("leafpool:{full}:ids", 1, 2, 3)
    inner: list[SweepPass] = []
    tags_read: dict[str, Counter[str]] = {"outer": Counter(), "inner": Counter()}
    reading = ["outer"]  # which sweep is reading now
    real_levels = pool.levels

    def counting_levels(tags: Sequence[str]) -> list[Level]:
        tags_read[reading[0]].update(tags)
        return real_levels(tags)

    def wall() -> float:
        if not inner:
            pool.want("full")  # a client found it empty meanwhile
            reading[0] = "inner"
            inner.append(sweep_pass(pool, 30, interval=30, watching=True))
            reading[0] = "outer"
        return time.time()

    pool.levels = counting_levels  # type: ignore[method-assign]
    outer = sweep_pass(pool, 30, interval=30, watching=True, wall=wall)
    assert outer.full and not inner[0].full
    assert sorted(t for t, _, _ in outer.queued) == sorted(f"t{i}" for i in range(20))
    assert inner[0].queued == [("full", "segment", True)]  # the wanted tag, at once
    # the second sweep read the wanted tag only (and decided on it once: a forced refill
    # is not read again after its mark); the first read every tag
    assert tags_read["inner"] == Counter({"full": 1})
    assert set(tags_read["outer"]) == {f"t{i}" for i in range(20)} | {"full"}
    # 21 tags at 30 s: the lock is released at once, the next sweep is a full pass
    assert not r.exists("leafpool:sweep:lock")
    assert sweep_pass(pool, 30, interval=30, watching=True).full


def test_a_full_pass_over_many_tags_rests_until_its_spacing(pool: Pool, r: redis.Redis) -> None:
    """1,000 tags at a 1 s interval: 4 s between full passes with the watcher, so the
    lock is kept about 3.5 s after the pass (the beat's sweep at or after 4 s runs the
    next); the sweeps between read only the wanted tags. Without the watcher every
    sweep is a full pass."""
    pool.register_many([(f"t{i:04}", "segment", 0, {}) for i in range(1_000)])
    first = sweep_pass(pool, 30, interval=1, watching=True)
    assert first.full and first.tags == 1_000 and len(first.queued) == 1_000
    assert 3.0 < first.rest_seconds <= 3.5
    assert 3_000 < r.pttl("leafpool:sweep:lock") <= 3_500
    pool.want("t0001")
    between = sweep_pass(pool, 30, interval=1, watching=True)
    assert not between.full and between.queued == []  # t0001 is held by its marker
    r.delete("leafpool:sweep:lock")  # the rest ends
    assert sweep_pass(pool, 30, interval=1, watching=True).full
    r.delete("leafpool:sweep:lock")
    assert sweep_pass(pool, 30, interval=1, watching=False).rest_seconds == 0
    assert not r.exists("leafpool:sweep:lock")
    assert sweep_pass(pool, 30, interval=1, watching=False).full


def test_a_failed_sweep_releases_the_lock(pool: Pool, r: redis.Redis) -> None:
    pool.register("t", "segment", 0)

    def broken() -> float:
        raise LeafpoolError("redis went away")

    with pytest.raises(LeafpoolError):
        sweep_pass(pool, 30, interval=1, watching=True, wall=broken)
    assert not r.exists("leafpool:sweep:lock")
    assert sweep_pass(pool, 30, interval=1, watching=True).full
