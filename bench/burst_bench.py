"""``python -m bench --only burst``: bursts, the sweep's cost and idle tags' memory, today's
path side by side with the drop watcher's, in one run (docs/design.md §3.2, §3.7).

Bursts. One redis-server and one MariaDB; for each path a real
``celery -A workers worker -B -c 2`` (its beat sends the sweep, or runs the drop watcher)
and one tag of its own (its own key prefix and broker database). Client processes with
the ``wait`` policy take ``next_ids(50)`` at 1,000 IDs/s (or nothing: an idle tag at its
floor), then at 50,000 IDs/s. Reported: PoolEmpty raised, the longest pop, pops over
100 ms, the tag's ``empty_hits``, how long the pool took to reach its new size, and the
segments allocated from MariaDB. Paths:

- **before**: the sweep every second, the smoothed rate alone, floor 2,000
  (``LEAFPOOL_WATCH=false LEAFPOOL_BURST_SIZING=false LEAFPOOL_POOL_FLOOR=2000``);
- **now**: the drop watcher in the beat, burst sizing, floor 200 (the defaults).

Sweep. 10,000 tags in the state a refill leaves them; the worker's CPU time and Redis's
CPU time (``INFO cpu``, main thread) of one sweep: the full snapshot of every tag (before)
against the level sweep (now), the watcher's full pass (on a (re)connect) and the
watcher's read of 100 tags touched (its steady state). Memory: 10,000 idle tags at the
floor, segment and snowflake, floor 2,000 against 200 (``INFO memory``).

Steps (``bench.step_bench``, issue 30): 100 -> 5,000 IDs/s, 100 -> 50,000 IDs/s and
50,000 -> 100 IDs/s with the defaults, beside a model of Leaf's double buffer fed the
allocation latencies measured (``bench.leaf_model``), and the targets: no empty pop at
50x, under 1 s of them at 500x, never more than Leaf's. They run first; the before/now
bursts above run in a full run only (``--quick`` leaves them out).
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import redis
from rich.console import Console
from rich.table import Table

from bench import servers, step_bench
from leafpool.children import die_with_parent
from leafpool.housekeeping.sweep import snapshot_sweep, sweep
from leafpool.redis.pool import Pool

BATCH, CLIENTS = step_bench.BATCH, step_bench.CLIENTS  # paced by step_bench.paced
BURST_RATE = 50_000
STEADY_RATE = 1_000
SLOW_MS = 100.0
#: Redis's latency monitor records its own events (fsync, fork, commands) above this
STALL_MS = 50


@dataclass(frozen=True)
class BurstSizes:
    warm_s: float = 8.0  # at the steady rate before measuring
    steady_s: float = 5.0
    burst_s: float = 15.0
    tags: int = 10_000  # sweep and memory
    trigger_s: float = 3.0  # popping one tag while listening for drops
    idle: bool = True  # also the bursts from an idle tag at its floor
    before_now: bool = True  # the bursts above, before and now (the steps run always)
    steps: step_bench.StepSizes = step_bench.FULL


FULL = BurstSizes()
QUICK = BurstSizes(warm_s=4.0, steady_s=3.0, burst_s=8.0, tags=10_000, before_now=False,
                   steps=step_bench.QUICK)
SMOKE = BurstSizes(warm_s=0.5, steady_s=0.5, burst_s=1.0, tags=100, trigger_s=0.2, idle=False,
                   steps=step_bench.SMOKE)


PATHS: tuple[tuple[str, dict[str, str]], ...] = (
    (
        "before",
        {
            "LEAFPOOL_WATCH": "false",
            "LEAFPOOL_BURST_SIZING": "false",
            "LEAFPOOL_POOL_FLOOR": "2000",
        },
    ),
    ("now", {}),
)
CAPTION = (
    "before: the sweep every second, the smoothed rate, floor 2,000; now: the drop "
    "watcher in the beat, burst sizing, floor 200"
)


# -- clients ------------------------------------------------------------------------------


@dataclass
class ClientReport:
    calls: int = 0
    ids: int = 0
    pool_empty: int = 0
    errors: int = 0
    slow: int = 0  # pops over SLOW_MS
    longest_ms: float = 0.0
    longest_at: float = 0.0  # wall clock when the longest pop started
    slow_at: list[float] = field(default_factory=list)  # wall clock of each slow pop's start
    latencies_ms: list[float] = field(default_factory=list)


def _client(
    url: str, prefix: str, tag: str, start: float, phases: list[tuple[float, int]], out: Any
) -> None:
    """Pop ``next_ids(BATCH)`` at each phase's rate (this process's share), paced from
    ``start`` (wall clock, shared by the processes: ``step_bench.paced``)."""
    from leafpool.client import Client
    from leafpool.core.config import load_settings
    from leafpool.core.errors import LeafpoolError, PoolEmpty

    client = Client(settings=load_settings(redis_url=url, key_prefix=prefix), policy="wait")
    report = ClientReport()
    for _ in step_bench.paced(phases, start):
        t0 = time.perf_counter()
        began = time.time()
        try:
            report.ids += len(client.next_ids(tag, BATCH))
        except PoolEmpty:
            report.pool_empty += 1
        except LeafpoolError:
            report.errors += 1
        ms = (time.perf_counter() - t0) * 1000
        report.calls += 1
        if ms > SLOW_MS:
            report.slow += 1
            report.slow_at.append(began)
        report.latencies_ms.append(ms)
        if ms > report.longest_ms:
            report.longest_ms, report.longest_at = ms, began
    client.close()
    out.put(report)


@dataclass
class BurstRow:
    name: str
    start: str
    report: ClientReport
    empty_hits: int
    resize_s: float | None
    target_after: int
    allocations: int
    step: int
    burst_ids_per_s: float
    stalls: str = ""  # Redis's own latency events over STALL_MS (LATENCY LATEST)
    aof_rewrites: int = 0


def _burst_path(
    name: str,
    extra: dict[str, str],
    steady: int,
    index: int,
    url: str,
    db_url: str,
    sizes: BurstSizes,
) -> BurstRow:
    with step_bench.tag_with_worker(name, extra, index, url, db_url) as (r, k, prefix, tag):
        settle = int(r.llen(k.ids))
        r.config_set("latency-monitor-threshold", STALL_MS)
        r.execute_command("LATENCY", "RESET")
        rewrites0 = int(r.info("persistence")["aof_rewrites"])
        start = time.time() + 0.5
        phases = [(sizes.warm_s + sizes.steady_s, steady), (sizes.burst_s, BURST_RATE)]
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        clients = [
            ctx.Process(target=_client, args=(url, prefix, tag, start, phases, out))
            for _ in range(CLIENTS)
        ]
        for p in clients:
            p.start()
        burst_at = start + sizes.warm_s + sizes.steady_s
        while time.time() < burst_at:
            time.sleep(0.01)
        hits0 = int(r.hget(k.hits, "empty_hits") or 0)
        consumed0 = int(r.hget(k.state, "pushed_total") or 0) - int(r.llen(k.ids))
        want = 0.9 * min(int(extra.get("LEAFPOOL_POOL_CEILING", "1000000")), BURST_RATE * 30)
        resize_s: float | None = None
        while time.time() < burst_at + sizes.burst_s:
            if resize_s is None and int(r.hget(k.state, "target") or 0) >= want:
                resize_s = time.time() - burst_at
            time.sleep(0.01)
        consumed1 = int(r.hget(k.state, "pushed_total") or 0) - int(r.llen(k.ids))
        total = ClientReport()
        for _ in clients:
            rep: ClientReport = out.get(timeout=120)
            total.calls += rep.calls
            total.ids += rep.ids
            total.pool_empty += rep.pool_empty
            total.errors += rep.errors
            total.slow += rep.slow
            total.slow_at += [at - burst_at for at in rep.slow_at]
            total.latencies_ms += rep.latencies_ms
            if rep.longest_ms > total.longest_ms:
                total.longest_ms, total.longest_at = rep.longest_ms, rep.longest_at - burst_at
        for p in clients:
            p.join(30)
        state = r.hgetall(k.state)
        hits = int(r.hget(k.hits, "empty_hits") or 0)
        stalls = _stalls(r)
        aof_rewrites = int(r.info("persistence")["aof_rewrites"]) - rewrites0
        return BurstRow(
            name,
            f"{steady:,}/s" if steady else f"idle (pool {settle:,})",
            total,
            hits - hits0,
            resize_s,
            int(state.get(b"target", 0)),
            int(state.get(b"allocations", 0)),
            int(state.get(b"step", 0)),
            (consumed1 - consumed0) / sizes.burst_s,
            stalls,
            aof_rewrites,
        )


def _stalls(r: redis.Redis) -> str:
    """Redis's latency events since the reset: ``event max ms``, one per kind."""
    latest = r.execute_command("LATENCY", "LATEST")
    events = sorted((e[0].decode() if isinstance(e[0], bytes) else str(e[0]), int(e[3]))
                    for e in latest)
    return ", ".join(f"{name} {worst} ms" for name, worst in events) or "none"


def bursts(sizes: BurstSizes) -> list[BurstRow]:
    rows = []
    with servers.redis() as rs, servers.mariadb() as db:
        index = len(step_bench.SCENARIOS)  # the steps' tags and broker databases come first
        for steady in (STEADY_RATE, 0) if sizes.idle else (STEADY_RATE,):
            for name, extra in PATHS:
                rows.append(
                    _burst_path(name, extra, steady, index, rs.extra["url"], db.extra["url"], sizes)
                )
                index += 1
    return rows


# -- the sweep and idle memory --------------------------------------------------------------


def _redis_cpu_ms(r: redis.Redis) -> float:
    info = r.info("cpu")
    return 1000 * (
        float(info["used_cpu_sys_main_thread"]) + float(info["used_cpu_user_main_thread"])
    )


def _idle_tags(r: redis.Redis, prefix: str, n: int, floor: int, mode: str) -> None:
    """``n`` tags as a refill leaves an idle one: the floor in the list, a reserve range
    (segment), a state hash with the refiller's fields."""
    pool = Pool(r, prefix)
    start = 1_000_000 if mode == "segment" else 7_000_000_000_000_000_000
    pipe = r.pipeline(transaction=False)
    for i in range(n):
        k = pool.tag(f"t{i}")
        lo = start + i * 100_000
        pipe.sadd(pool.keys.tags, f"t{i}")
        pipe.hset(
            k.state,
            mapping={
                "mode": mode,
                "created_ms": 1_763_000_000_000,
                "table_step": 1000,
                "step": 1000,
                "max_id": lo + 3000,
                "segment_ms": 1_763_000_000_000,
                "rate": "0.000",
                "rate_ts_ms": 1_763_000_000_000,
                "rate_consumed": 0,
                "target": floor,
                "low_water": floor // 2,
                "reserve_target": floor,
                "reserve_due": 0,
                "sizing_rate": "0.000",
                "hwm": lo + floor - 1,
                "pushed_total": floor,
                "last_push_ms": 1_763_000_000_000,
                "allocations": 3,
                "refills": 1,
                "last_refill_ms": 1_763_000_000_000,
                "last_refill_result": "ok",
                "redis_replid": "a" * 40,
                "redis_node": "127.0.0.1:6379",
            },
        )
        pipe.rpush(k.ids, *range(lo, lo + floor))
        if mode == "segment":
            pipe.rpush(k.reserve, f"{lo + floor}:{lo + 3000}")
        if len(pipe) >= 400:
            pipe.execute()
    pipe.execute()


@dataclass
class Cost:
    name: str
    worker_ms: list[float] = field(default_factory=list)
    redis_ms: list[float] = field(default_factory=list)

    def add(self, r: redis.Redis, call: Any) -> None:
        c0, w0 = _redis_cpu_ms(r), time.thread_time()
        call()
        self.worker_ms.append((time.thread_time() - w0) * 1000)
        self.redis_ms.append(_redis_cpu_ms(r) - c0)


def sweep_costs(n: int, rounds: int = 5) -> tuple[list[Cost], int]:
    from leafpool.housekeeping.watch import DropWatcher
    from leafpool.redis.tracking import Tracking

    with servers.redis("--appendfsync", "everysec") as rs:
        r = redis.Redis.from_url(rs.extra["url"])
        _idle_tags(r, "leafpool", n, 200, "segment")
        pool = Pool(r)
        old, new = Cost("before: full snapshot of every tag"), Cost("now: level sweep")
        for _ in range(rounds):  # interleaved
            old.add(r, lambda: snapshot_sweep(pool, 30))
            new.add(r, lambda: sweep(pool, 30))
        full, dirty = (
            Cost("now: drop watcher's full pass (on a (re)connect)"),
            Cost("now: drop watcher, 100 tags touched since their last read"),
        )
        watcher = DropWatcher(pool, lambda due: None)
        tracking = Tracking(pool.redis).open()
        reader = tracking.reader
        try:
            tags = pool.tags()
            for _ in range(rounds):
                full.add(r, lambda: watcher._full_pass(reader))
                touched = tags[:: max(1, n // 100)][:100]
                dirty.add(
                    r,
                    lambda t=touched: watcher._decide(
                        pool.tracked_levels(  # type: ignore[misc]
                            reader, t
                        ),
                        set(),
                    ),
                )
        finally:
            tracking.close()
        r.close()
    return [old, new, full, dirty], n


def idle_memory(n: int) -> list[tuple[str, int, float]]:
    """Redis memory of ``n`` idle tags (MB), by mode and floor."""
    out = []
    for mode in ("segment", "snowflake"):
        for floor in (2000, 200):
            with servers.redis("--appendfsync", "everysec") as rs:
                r = redis.Redis.from_url(rs.extra["url"])
                before = int(r.info("memory")["used_memory"])
                _idle_tags(r, "leafpool", n, floor, mode)
                used = int(r.info("memory")["used_memory"]) - before
                r.close()
            out.append((mode, floor, used / 1e6))
    return out


# -- what tells the watcher about a drop: tracking against keyspace notifications -----------

POPPER = """
import sys, time, redis
r = redis.Redis.from_url(sys.argv[1]); key = sys.argv[2]
rate, seconds = float(sys.argv[3]), float(sys.argv[4])
t = start = time.time()
while t < start + seconds:
    now = time.time()
    if t > now:
        time.sleep(t - now)
    pipe = r.pipeline(transaction=False)
    for _ in range(100):
        pipe.lpop(key)
    pipe.execute()
    t += 100 / rate
"""


def _thread_cpu_ms(thread: Any) -> float:
    return 1000 * time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


@dataclass
class Trigger:
    name: str
    messages_per_s: float
    listener_cpu_ms_per_s: float
    redis_cpu_ms_per_s: float


def _listen(ps: Any, stop: Any, count: list[int]) -> None:
    while not stop.is_set():
        if ps.get_message(timeout=0.05):
            count[0] += 1


def triggers(seconds: float, pops_per_s: int = BURST_RATE) -> list[Trigger]:
    """One tag popped at ``pops_per_s`` single LPOPs for ``seconds``: what listening for
    its drops costs, by keyspace notifications (one message per pop) and by the drop
    watcher (client tracking: one invalidation per read, read again every 10 ms)."""
    import threading

    from leafpool.housekeeping.watch import DropWatcher

    out = []
    with servers.redis("--appendfsync", "everysec") as rs:
        url = rs.extra["url"]
        r = redis.Redis.from_url(url)
        pool = Pool(r)
        k = pool.tag("hot")
        for mode in ("pops alone", "keyspace notifications", "drop watcher (tracking)"):
            r.delete(k.ids)
            n = int(pops_per_s * seconds) + 10_000
            for lo in range(0, n, 10_000):
                r.rpush(k.ids, *range(lo + 1, lo + 10_001))
            pool.register("hot", "segment", 0, low_water=1, target=n, pushed_total=n)
            count = [0]
            stop = threading.Event()
            listener: Any = None
            watcher = None
            if mode == "keyspace notifications":
                r.config_set("notify-keyspace-events", "Kl")
                ps = redis.Redis.from_url(url, protocol=2).pubsub(  # type: ignore[no-untyped-call]
                    ignore_subscribe_messages=True
                )
                ps.subscribe(f"__keyspace@0__:{k.ids}")
                listener = threading.Thread(target=_listen, args=(ps, stop, count), daemon=True)
                listener.start()
            elif mode == "drop watcher (tracking)":
                watcher = DropWatcher(pool, lambda due: None).start()
                watcher.ready.wait(10)
                listener = watcher._thread
            cpu0 = _thread_cpu_ms(listener) if listener else 0.0
            redis0 = _redis_cpu_ms(r)
            t0 = time.monotonic()
            subprocess.run(
                [sys.executable, "-c", POPPER, url, k.ids, str(pops_per_s), str(seconds)],
                check=True,
                preexec_fn=die_with_parent(),
            )
            elapsed = time.monotonic() - t0
            redis_ms = _redis_cpu_ms(r) - redis0
            cpu = (_thread_cpu_ms(listener) - cpu0) if listener else 0.0
            if watcher is not None:
                count[0] = watcher.stats.invalidations
                watcher.stop()
            stop.set()
            if mode == "keyspace notifications":
                listener.join(5)
                ps.close()
                r.config_set("notify-keyspace-events", "")
            out.append(Trigger(mode, count[0] / elapsed, cpu / elapsed, redis_ms / elapsed))
        r.close()
    return out


# -- tables -----------------------------------------------------------------------------------


def _ms(values: list[float]) -> float:
    return statistics.median(values)


def main(console: Console, sizes: BurstSizes) -> None:
    step_bench.main(console, sizes.steps)
    if sizes.before_now:
        before_now(console, sizes)
    else:
        console.print("bursts before/now (1,000 -> 50,000 IDs/s, issue 10's paths): in a full "
                      "run only")
    other_sections(console, sizes)


def before_now(console: Console, sizes: BurstSizes) -> None:
    rows = bursts(sizes)
    table = Table(
        title=f"Bursts to {BURST_RATE:,} IDs/s on one tag ({CLIENTS} client "
        f"processes, next_ids({BATCH}), policy wait; MariaDB, table step "
        f"1,000; {sizes.burst_s:g} s of burst; at s: when the longest pop began, from "
        "the burst's start)",
        caption=CAPTION,
    )
    for col in (
        "path",
        "from",
        "PoolEmpty",
        "longest pop ms",
        "at s",
        f"pops > {SLOW_MS:g} ms",
        "p99 ms",
        "empty hits",
        "resized after s",
        "target after",
        "IDs/s served in burst",
        "allocations",
        "step after",
        f"Redis events > {STALL_MS} ms",
        "AOF rewrites",
    ):
        left = col in ("path", "from") or col.startswith("Redis events")
        table.add_column(col, justify="left" if left else "right")
    for row in rows:
        rep = row.report
        lat = sorted(rep.latencies_ms) or [0.0]
        table.add_row(
            row.name,
            row.start,
            str(rep.pool_empty),
            f"{lat[-1]:.1f}",
            f"{rep.longest_at:+.2f}",
            str(rep.slow),
            f"{lat[int(0.99 * (len(lat) - 1))]:.2f}",
            str(row.empty_hits),
            "-" if row.resize_s is None else f"{row.resize_s:.2f}",
            f"{row.target_after:,}",
            f"{row.burst_ids_per_s:,.0f}",
            str(row.allocations),
            f"{row.step:,}",
            row.stalls,
            str(row.aof_rewrites),
        )
    console.print(table)
    for row in rows:
        if row.report.slow_at:
            starts = ", ".join(f"{at:+.2f}" for at in sorted(row.report.slow_at))
            console.print(f"{row.name}, from {row.start}: pops over {SLOW_MS:g} ms began at "
                          f"{starts} s from the burst's start")


def other_sections(console: Console, sizes: BurstSizes) -> None:
    trig = Table(
        title=f"Hearing the drops of one tag popped {BURST_RATE:,} times a second "
        f"(single LPOPs, {sizes.trigger_s:g} s)"
    )
    for col in ("how", "messages/s", "listener CPU ms/s", "Redis CPU ms/s"):
        trig.add_column(col, justify="left" if col == "how" else "right")
    for t in triggers(sizes.trigger_s):
        trig.add_row(
            t.name,
            f"{t.messages_per_s:,.0f}",
            f"{t.listener_cpu_ms_per_s:.1f}",
            f"{t.redis_cpu_ms_per_s:.0f}",
        )
    console.print(trig)

    costs, n = sweep_costs(sizes.tags)
    sw = Table(
        title=f"One sweep of {n:,} tags (median of 5, interleaved; worker = the "
        "sweeping thread's CPU, Redis = main thread CPU from INFO)"
    )
    for col in ("what", "worker ms", "Redis ms", "worker vs before", "Redis vs before"):
        sw.add_column(col, justify="left" if col == "what" else "right")
    base = costs[0]
    for c in costs:
        sw.add_row(
            c.name,
            f"{_ms(c.worker_ms):.1f}",
            f"{_ms(c.redis_ms):.1f}",
            f"{_ms(c.worker_ms) / _ms(base.worker_ms):.2f}x",
            f"{_ms(c.redis_ms) / max(_ms(base.redis_ms), 1e-9):.2f}x",
        )
    console.print(sw)

    mem = Table(title=f"Redis memory of {sizes.tags:,} idle tags at the floor")
    for col in ("mode", "floor", "MB", "bytes per tag"):
        mem.add_column(col, justify="left" if col == "mode" else "right")
    for mode, floor, mb in idle_memory(sizes.tags):
        mem.add_row(mode, f"{floor:,}", f"{mb:.1f}", f"{mb * 1e6 / sizes.tags:,.0f}")
    console.print(mem)
