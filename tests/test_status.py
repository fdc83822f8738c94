"""TagStatus: the one parsed shape of a tag's keys, read from a real Redis."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from leafpool.core.config import Settings
from leafpool.redis.lock import RefillLock
from leafpool.redis.pool import Pool, Range
from leafpool.segment.refiller import SegmentRefiller
from leafpool.segment.store import SegmentStore
from leafpool.status import pool_status, tag_status
from tests.support.clocks import FakeWallClock


def test_a_segment_tags_state_is_parsed_once(pool: Pool) -> None:
    lock = RefillLock(pool.redis, pool.tag("order").lock, 10_000)
    assert lock.acquire()
    pool.register(
        "order",
        "segment",
        0,
        target=4000,
        low_water=2000,
        step=1000,
        max_id=3001,
        rate="100.5",
        last_refill_ms=1_700_000_000_000,
        last_alloc_ms="2.50",
        allocations=3,
        empty_hits=2,
    )
    pool.append_reserve("order", lock.token, Range(1, 1001))
    pool.append_reserve("order", lock.token, Range(1001, 3001))
    pool.push("order", lock.token, Range(1, 1001), 600, 0)
    st = tag_status(pool.snapshot("order"))
    assert (st.tag, st.mode, st.length, st.target, st.low_water) == (
        "order",
        "segment",
        600,
        4000,
        2000,
    )
    assert st.reserve == ["601:1001", "1001:3001"] and st.reserve_size == 2400
    assert (st.step, st.max_id, st.hwm, st.pushed_total) == (1000, 3001, "600", 600)
    assert st.seconds_left == (600 + 2400) / 100.5
    assert (st.last_refill_ms, st.last_alloc_ms, st.allocations, st.empty_hits) == (
        1_700_000_000_000,
        2.5,
        3,
        2,
    )
    assert st.locked and st.worker_ids == [] and st.time_bits_years_left is None


def test_a_snowflake_tags_fields_and_an_idle_tag(pool: Pool) -> None:
    pool.register(
        "sf",
        "snowflake",
        0,
        worker_ids="5,9",
        lease_state="held (zk)",
        backwards_events=1,
        last_backwards_offset_ms=7,
        time_bits_years_left="41.500",
    )
    pool.register("idle", "segment", 0)
    by_tag = {st.tag: st for st in pool_status(pool)}
    sf = by_tag["sf"]
    assert (sf.worker_ids, sf.lease_state, sf.backwards_events) == (["5", "9"], "held (zk)", 1)
    assert (sf.last_backwards_offset_ms, sf.time_bits_years_left) == (7, 41.5)
    idle = by_tag["idle"]
    assert (idle.rate, idle.seconds_left, idle.max_id, idle.last_refill_ms) == (
        0.0,
        None,
        None,
        None,
    )


def test_many_tags_read_in_chunks_equal_their_one_by_one_status(pool: Pool) -> None:
    """1,200 tags (three chunks of TAGS_PER_PIPELINE): each status equals the one read
    by the tag's own snapshot (a MULTI)."""
    from leafpool.redis.pool import TAGS_PER_PIPELINE

    lock = RefillLock(pool.redis, pool.tag("t0007").lock, 10_000)
    tags = [f"t{n:04d}" for n in range(1200)]
    assert len(tags) > 2 * TAGS_PER_PIPELINE
    pool.register_many(
        [
            (t, "segment" if n % 3 else "snowflake", n, {"step": n, "rate": "1.5"})
            for n, t in enumerate(tags)
        ]
    )
    assert lock.acquire()
    pool.append_reserve("t0007", lock.token, Range(1, 101), max_id=101)
    pool.push("t0007", lock.token, Range(1, 101), 40, 0)
    pool.redis.hincrby(pool.tag("t1199").state, "empty_hits", 1)  # counted before 0.2
    pool.redis.hincrby(pool.tag("t1199").hits, "empty_hits", 2)  # what clients count now
    many = pool_status(pool)
    assert [st.tag for st in many] == tags
    assert many == [tag_status(pool.snapshot(t)) for t in tags]
    assert (many[7].length, many[7].reserve, many[7].locked) == (40, ["41:101"], True)
    assert many[1199].empty_hits == 3 and many[3].mode == "snowflake"


def test_status_output_json_and_plain_table(pool: Pool) -> None:
    import dataclasses
    import json

    from leafpool.status import STATUS_COLUMNS, plain_table, status_row
    from leafpool.status_json import status_json

    pool.register("sf", "snowflake", 0, worker_ids="5,9")
    pool.register("order", "segment", 0, step=10, last_error="database down", last_error_ms=1)
    statuses = pool_status(pool)
    assert json.loads(status_json(statuses)) == [dataclasses.asdict(st) for st in statuses]
    assert json.loads(status_json([])) == []
    lines = plain_table([status_row(st) for st in statuses]).splitlines()
    assert lines[0].split() == [c for c in STATUS_COLUMNS if " " not in c] + ["last", "error"]
    assert lines[1].startswith("order ") and "database down (" in lines[1]
    assert lines[2].startswith("sf ") and "w 5,9" in lines[2]



# -- the outage budget, the database, dry tags (docs/design.md §3.2, §3.8) ----------------


def test_seconds_held_at_the_peak_and_left_at_the_rate_now(pool: Pool) -> None:
    from leafpool.status import held, status_row

    lock = RefillLock(pool.redis, pool.tag("order").lock, 10_000)
    assert lock.acquire()
    pool.register("order", "segment", 0, rate="10", peak_rate="100", target=3000)
    pool.append_reserve("order", lock.token, Range(1, 60_001))
    pool.push("order", lock.token, Range(1, 60_001), 3000, 0)
    st = tag_status(pool.snapshot("order"))
    assert (st.peak_rate, st.list_seconds, st.reserve_seconds) == (100.0, 30.0, 570.0)
    assert st.seconds_left == 6000.0  # 60,000 IDs at 10 IDs/s
    assert held(st) == "30s+10m" and "30s+10m" in status_row(st)


def test_a_dry_tag_has_no_seconds_left_whatever_its_rate_says(pool: Pool) -> None:
    pool.register("dry", "segment", 0, rate="0", pushed_total=5000, dry_since_ms=1_000)
    pool.register("new", "segment", 0)  # never filled: nothing to run out of
    by_tag = {st.tag: st for st in pool_status(pool)}
    assert by_tag["dry"].seconds_left == 0.0 and by_tag["dry"].dry_since_ms == 1_000
    assert by_tag["new"].seconds_left is None and by_tag["new"].dry_since_ms is None


def test_database_unreachable_dry_and_a_counter_behind_are_said_above_the_table(
    pool: Pool,
) -> None:
    from leafpool.status import empty_cell, error_text, notices

    now = 1_700_000_600.0
    fix = "UPDATE leaf_alloc SET max_id = 5001 WHERE biz_tag = 'pay'"
    pool.register("order", "segment", 0, db_unreachable_ms=1_700_000_000_000,
                  dry_since_ms=1_700_000_420_000, pushed_total=10,
                  last_error="database: order: allocate failed",
                  last_error_ms=1_700_000_590_000, last_refill_result="failed: SourceUnavailable")
    pool.register("pay", "segment", 0, last_refill_result="failed: CounterBehind",
                  last_error=f"pay: leaf_alloc.max_id=1 is below 5001 ... Move it up with: {fix}")
    pool.register("ok", "segment", 0)
    by_tag = {st.tag: st for st in pool_status(pool)}
    order, pay = by_tag["order"], by_tag["pay"]
    lines = notices(list(by_tag.values()), clock=lambda: now)
    assert lines[0].startswith("database unreachable since ") and "(10m ago)" in lines[0]
    assert lines[0].endswith("allocations failing for 1 tag(s): order")
    assert "order: dry since " in lines[1] and "(3m ago)" in lines[1]
    assert lines[2] == "pay: counter behind, nothing allocated; the fix: `leafpool status pay`"
    assert len(lines) == 3
    assert error_text(order, clock=lambda: now).startswith("database unreachable since ")
    assert error_text(order, clock=lambda: now).endswith("allocate failed (10s ago)")
    assert empty_cell(order, clock=lambda: now) == "dry 3m ago, 0 hits"
    assert pay.counter_behind and fix in error_text(pay)


def test_the_detail_view_shows_one_tag_whole(pool: Pool) -> None:
    from leafpool.status import status_detail

    fix = "UPDATE leaf_alloc SET max_id = 123456789012 WHERE biz_tag = 'pay'"
    pool.register("pay", "segment", 0, rate="5", peak_rate="50", heals=2,
                  last_heal_ms=1_700_000_000_000, last_heal="max_id 7 -> 1001",
                  last_refill_result="failed: CounterBehind", last_error_ms=1_700_000_000_000,
                  last_error=f"pay: leaf_alloc.max_id=1 is below 123456789012. Move it up "
                             f"with: {fix}")
    text = status_detail(tag_status(pool.snapshot("pay")))
    lines = dict(re.findall(r"^(\S.*?)\s{2,}(.*)$", text, re.MULTILINE))
    assert lines["tag"] == "pay (segment)" and lines["database"] == "answering"
    assert text.endswith(f"Move it up with: {fix}\n")  # whole, on a line of its own
    assert "2, last 2023-11-14" in text and "max_id 7 -> 1001" in text
    assert lines["rate"] == "5.0/s now, 50.0/s recent peak"


def test_leafpool_status_says_it_above_the_table_and_shows_one_tag_whole(
    pool: Pool, redis_url: str, tmp_path: Path
) -> None:
    """The command as a real process, on a terminal 80 columns wide (a pipe)."""
    fix = "UPDATE leaf_alloc SET max_id = 123456789012 WHERE biz_tag = 'pay'"
    pool.register("pay", "segment", 0, db_unreachable_ms=1_700_000_000_000,
                  last_refill_result="failed: CounterBehind", last_error_ms=1_700_000_000_000,
                  last_error=f"pay: leaf_alloc.max_id=1 is below 123456789012. Move it up "
                             f"with: {fix}")
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEAFPOOL_")}
    env.update({"LEAFPOOL_REDIS_URL": redis_url, "COLUMNS": "80",
                "LEAFPOOL_DATABASE_URL": f"sqlite:///{tmp_path / 'db.sqlite3'}",
                "LEAFPOOL_HOME": os.environ["LEAFPOOL_HOME"]})

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "leafpool.cli", "status", *args],
                              env=env, capture_output=True, text=True, timeout=60)

    table = run()
    assert table.returncode == 0, table.stderr
    first = table.stdout.splitlines()[0]
    assert first.startswith("database unreachable since 2023-11-14") and first.endswith(": pay")
    assert "pay: counter behind, nothing allocated; the fix: `leafpool status pay`" in table.stdout
    detail = run("pay")
    assert detail.returncode == 0 and fix in detail.stdout.strip().splitlines()[-1]
    assert "unreachable since 2023-11-14" in detail.stdout
    unknown = run("nope")
    assert unknown.returncode == 2 and "nope: unknown tag" in unknown.stderr


# -- issue 27: an idle pool claims no rate; the step in use says what it grew from ---------


def _run_cli(env: dict[str, str], *args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "leafpool.cli", *args], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_pool_left_idle_by_a_previous_run_claims_no_rate(
    pool: Pool, r: redis.Redis, make_settings: Callable[..., Settings], redis_url: str
) -> None:
    """As ``./dev up`` restarted finds its pools (issue 27): real refills measured 9.3
    IDs/s an hour ago and only its own 5 pops came since; ``leafpool status`` (a real process,
    piped) shows no rate and no time left for it, while a pool measured now keeps its
    rate; a step grown from the table step says so, and ``tag list`` calls its column
    the table step."""
    settings = make_settings(pool_floor=200, pool_seconds=10)
    store = SegmentStore.from_url(settings.database_url)
    store.init_schema()
    for tag, ago in (("idle", 3600.0), ("busy", 0.0)):
        store.add_tag(tag, step=100)
        clock = FakeWallClock(time.time() - ago - 20)
        refiller = SegmentRefiller(pool, store, settings, wall=clock)
        refiller.refill(tag)
        for _ in range(2):  # 93 IDs every 10 s: 9.3 IDs/s
            assert len(r.lpop(f"leafpool:{{{tag}}}:ids", 93) or []) == 93
            clock.advance(10.0)
            refiller.refill(tag, force=True)
    assert len(r.lpop("leafpool:{idle}:ids", 5) or []) == 5  # what `leafpool up` pops at start
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEAFPOOL_")}
    env.update({"LEAFPOOL_REDIS_URL": redis_url, "LEAFPOOL_DATABASE_URL": settings.database_url,
                "LEAFPOOL_HOME": os.environ["LEAFPOOL_HOME"], "COLUMNS": "200"})

    by_tag = {st["tag"]: st for st in json.loads(_run_cli(env, "status", "--json"))}
    idle, busy = by_tag["idle"], by_tag["busy"]
    assert idle["measured_rate"] == pytest.approx(9.3, rel=0.01)  # what the refill said
    assert (idle["rate"], idle["seconds_left"]) == (0.0, None)
    assert busy["rate"] > 0 and busy["seconds_left"] is not None
    assert idle["table_step"] == 100 and idle["step"] > 100  # grown at 9.3 IDs/s

    lines = _run_cli(env, "status").splitlines()
    header = lines[0].split("  ")
    row = dict(zip([h.strip() for h in header if h.strip()],
                   re.split(r"\s{2,}", lines[2]), strict=False))
    assert lines[2].startswith("idle ") and row["pops/s"] == "0.0" and row["left"] == "-"
    assert row["step/workers"] == f"{idle['step']:,} (table 100)", lines
    assert lines[-1].startswith("step: the step allocations use now; it grows from the "
                                "table step"), lines

    listed = _run_cli(env, "tag", "list").splitlines()  # piped: plain lines, no box
    assert listed[0].split() == ["tag", "mode", "max_id", "table", "step", "description"]
    assert listed[2].split()[:2] == ["idle", "segment"] and listed[2].split()[3] == "100"


def test_the_collector_pause_ends_with_the_last_of_overlapping_pauses() -> None:
    """Two scrapes in threads overlap: the first to end leaves the collector off while
    the other reads; the last puts it back as the first found it (on, or off when the
    caller had it off)."""
    import gc
    import threading

    from leafpool.core.collector import collector_paused

    assert gc.isenabled()
    inside, release = threading.Event(), threading.Event()

    def scrape() -> None:
        with collector_paused():
            inside.set()
            assert release.wait(10)

    other = threading.Thread(target=scrape)
    with collector_paused():
        other.start()
        assert inside.wait(10)
    assert not gc.isenabled()  # the other scrape still reads
    release.set()
    other.join(10)
    assert not other.is_alive() and gc.isenabled()
    gc.disable()
    try:
        with collector_paused(), collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
