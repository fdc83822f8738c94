"""Demand steps on one tag, leafpool beside a model of Leaf's double buffer (issue 30,
item 2; part of ``python -m bench --only burst``).

Each scenario starts one redis-server's tag of its own with a real ``celery -A workers
worker -B -c 2`` and the shipped defaults (the drop watcher, burst sizing), MariaDB with
table step 1,000. Client processes call ``next_ids(50)`` with the ``wait`` policy at the
old rate, then at the new one: 100 -> 5,000 IDs/s (50x), 100 -> 50,000 IDs/s (500x) and
50,000 -> 100 IDs/s (back down). Measured from the step on:

- **empty pops**: calls that found the list short and waited for the refill (the client's
  empty-pool path: it counts an empty hit and blocks in ``BLPOP``); *empty s* is the wall
  time during which at least one client was waiting (the union of the waits), *waited s*
  the waits added up;
- **sized after**: until the tag's ``target`` is at least 90 % of what the new demand asks
  (``rate x POOL_SECONDS`` within floor and ceiling);
- **ready after**: until the list holds the low-water mark of that target
  (``POOL_SECONDS x LOW_WATER_RATIO`` = 15 s of the new demand: a pool sized for it and not
  due a refill); Leaf's model is ready when what its buffer holds covers the same 15 s;
- on the step down, the IDs **held** at the end beyond what the new demand's pool holds
  (its target), in the list and in the reserve, and the IDs a restart would **lose**: none
  for leafpool (a worker restart loses nothing: the list and the reserve ranges are in
  Redis, with ``appendfsync always``; they are only older, out of order with newer
  segments elsewhere), both segments for Leaf (they live in its server's memory);
- when the drop watcher first moved reserve IDs into the list after the step, and how many
  it moved in all (the state's ``watch_pushed``: a tag read below its low-water mark with
  no refill running gets them at once, before its refill task is queued, docs/design.md
  §3.7);
- the latencies of the database allocations (the state's ``last_alloc_ms``, read every
  10 ms: one per allocation seen, several back-to-back ones show as the last) and the
  refills (the refill lock held, to 10 ms), which the Leaf model is fed.

The model (``bench.leaf_model``) runs the same demand curve (warm-up, step) twice: a new
buffer (Leaf's init at the clients' start, as the benchmark's tag is new) and a buffer
settled at the old rate (the step Leaf's rule reaches after long service there).
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from rich.console import Console
from rich.table import Table
from sqlalchemy import text

from bench import leaf_model, servers
from bench.measure import met
from leafpool.core.config import Settings
from leafpool.core.keys import TagKeys
from leafpool.redis.pool import Pool
from leafpool.refill.sizing import pool_target
from leafpool.segment.store import SegmentStore

ROOT = Path(__file__).resolve().parent.parent
BATCH = 50
CLIENTS = 4
TABLE_STEP = 1000
POLL_S = 0.01

_DEFAULTS = Settings.model_fields
POOL_SECONDS = float(_DEFAULTS["pool_seconds"].default)
POOL_FLOOR = int(_DEFAULTS["pool_floor"].default)
POOL_CEILING = int(_DEFAULTS["pool_ceiling"].default)
#: ready: the list holds this many seconds of the new demand (the low-water mark of a
#: pool sized for it)
HEADROOM_S = POOL_SECONDS * float(_DEFAULTS["low_water_ratio"].default)

SCENARIOS: tuple[tuple[str, int, int], ...] = (
    ("50x up", 100, 5_000),
    ("500x up", 100, 50_000),
    ("back down", 50_000, 100),
)


@dataclass(frozen=True)
class StepSizes:
    warm_s: float = 10.0  # at the old rate
    step_s: float = 20.0  # at the new rate


FULL = StepSizes()
QUICK = StepSizes(warm_s=8.0, step_s=10.0)
SMOKE = StepSizes(warm_s=0.5, step_s=1.0)


# -- a tag of its own with a real worker ------------------------------------------------------


@contextlib.contextmanager
def tag_with_worker(
    name: str, extra: dict[str, str], index: int, url: str, db_url: str
) -> Iterator[tuple[redis.Redis, TagKeys, str, str]]:
    """One tag (``burst{index}``: its own key prefix and broker database) in MariaDB with
    table step 1,000, and ``celery -A workers worker -B -c 2`` with ``extra`` settings,
    until its first refill; yields the Redis client, the tag's keys, the prefix and the
    tag. The worker is stopped and its home removed afterwards."""
    prefix, tag = f"burst{index}", f"burst{index}"
    store = SegmentStore.from_url(db_url)
    store.init_schema()
    with store.engine.begin() as conn:  # this tag alone: the last one's workers are
        conn.execute(text("DELETE FROM leaf_alloc"))  # gone, its row is not needed
    store.add_tag(tag, step=TABLE_STEP)
    home = Path(tempfile.mkdtemp(prefix="leafpool-burst-"))
    base = url.rsplit("/", 1)[0]
    path = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEAFPOOL_")}
    env.update(
        {
            "LEAFPOOL_REDIS_URL": url,
            "LEAFPOOL_BROKER_URL": f"{base}/{index + 1}",
            "LEAFPOOL_DATABASE_URL": db_url,
            "LEAFPOOL_KEY_PREFIX": prefix,
            "LEAFPOOL_HOME": str(home),
            "PYTHONPATH": os.pathsep.join(path),
            **extra,
        }
    )
    r = redis.Redis.from_url(url)
    k = Pool(r, prefix).tag(tag)
    try:  # the worker is stopped before its home goes
        with servers.celery_worker(env, home, name.split()[0]):
            servers.wait_until(
                lambda: bool(r.hget(k.state, "refills")) and not r.exists(k.lock),
                60,
                f"{name}: first fill",
            )
            yield r, k, prefix, tag
    finally:
        r.close()
        store.engine.dispose()
        shutil.rmtree(home, ignore_errors=True)


# -- clients ----------------------------------------------------------------------------------


@dataclass
class StepClientReport:
    calls: int = 0
    ids: int = 0
    pool_empty: int = 0  # PoolEmpty: waited the whole LEAFPOOL_EMPTY_WAIT_SECONDS
    errors: int = 0
    waits: list[tuple[float, float]] = field(default_factory=list)  # wall clock, from, to


def paced(phases: list[tuple[float, int]], start: float, index: int = 0,
          clients: int = CLIENTS) -> Iterator[None]:
    """Each call's turn, slept until: ``phases`` of (seconds, IDs/s) from ``start`` (wall
    clock, shared by the processes), ``BATCH`` IDs a call, the ``clients`` processes'
    calls interleaved (this one is ``index``). Each phase starts on time: a late call
    catches up at once but never carries into the next phase; a rate of 0 is a pause."""
    phase_start = start
    for seconds, rate in phases:
        end = phase_start + seconds
        if rate > 0:
            interval = BATCH * clients / rate  # the clients together: one every BATCH/rate s
            first = phase_start + index * interval / clients
            k = 0
            while (t := first + k * interval) < end:  # no sum of intervals drifting
                now = time.time()
                if t > now:
                    time.sleep(t - now)
                yield
                k += 1
        phase_start = end


def _step_client(url: str, prefix: str, tag: str, index: int, gate: Any, start_at: Any,
                 phases: list[tuple[float, int]], out: Any) -> None:
    """Pop ``next_ids(BATCH)`` at each phase's rate (client ``index``'s share), paced from
    ``start_at`` (wall clock, shared by the processes, set once every client is connected
    and has said so on ``out``; ``gate`` opens then); late calls catch up at once. Each
    call that finds the list short is timed from its first pop to its IDs."""
    from leafpool.client import Client
    from leafpool.core.config import load_settings
    from leafpool.core.errors import LeafpoolError, PoolEmpty

    report = StepClientReport()
    began = 0.0

    class Timed(Client):
        def _on_empty(self, tag: str, n: int, got: list[int]) -> list[int]:
            try:
                return super()._on_empty(tag, n, got)
            finally:
                report.waits.append((began, time.time()))

    client = Timed(settings=load_settings(redis_url=url, key_prefix=prefix), policy="wait")
    client.redis.ping()
    out.put(None)  # connected: the start is set once every client is
    gate.wait()
    for _ in paced(phases, start_at.value, index):
        began = time.time()
        try:
            report.ids += len(client.next_ids(tag, BATCH))
        except PoolEmpty:
            report.pool_empty += 1
        except LeafpoolError:
            report.errors += 1
        report.calls += 1
    client.close()
    out.put(report)


# -- one scenario ------------------------------------------------------------------------------


@dataclass
class Sample:
    t: float  # seconds from the step
    length: int
    target: int
    allocations: int
    last_alloc_ms: float
    step: int
    locked: bool
    consumed: int  # pushed_total - length, read at once
    watch_pushed: int = 0  # IDs the drop watcher moved from the reserve into the list



@dataclass
class StepRow:
    name: str
    old: int
    new: int
    calls: int = 0
    empty_pops: int = 0
    empty_s: float = 0.0
    waited_s: float = 0.0
    longest_wait_s: float = 0.0
    pool_empty: int = 0
    errors: int = 0
    empty_hits: int = 0
    sized_s: float | None = None
    ready_s: float | None = None
    first_refill_s: float | None = None  # from the step until a refill held the lock
    first_move_s: float | None = None  # ... until the drop watcher moved reserve IDs
    moved: int = 0  # IDs the drop watcher moved from the reserve into the list, after it
    dry_s: float | None = None  # from the step until a sample found the list empty
    waits_span: tuple[float, float] | None = None  # the first wait's start, the last's end
    served_per_s: float = 0.0
    allocations: int = 0  # during the step
    step_after: int = 0
    target_after: int = 0
    list_after: int = 0
    reserve_after: int = 0
    alloc_ms: list[float] = field(default_factory=list)  # the whole run's, as seen
    refill_s: list[float] = field(default_factory=list)  # refills after the step
    leaf: leaf_model.LeafFigures | None = None
    leaf_settled: leaf_model.LeafFigures | None = None

    @property
    def new_target(self) -> int:
        return pool_target(self.new, POOL_SECONDS, POOL_FLOOR, POOL_CEILING)


def union_s(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by at least one of ``intervals``."""
    total, end = 0.0, float("-inf")
    for lo, hi in sorted(intervals):
        if hi <= end:
            continue
        total += hi - max(lo, end)
        end = hi
    return total


def _sample(r: redis.Redis, k: TagKeys, at: float) -> Sample:
    pipe = r.pipeline(transaction=True)
    pipe.llen(k.ids)
    pipe.hmget(k.state, ["target", "allocations", "last_alloc_ms", "step", "pushed_total",
                         "watch_pushed"])
    pipe.exists(k.lock)
    length, (target, allocations, alloc_ms, step, pushed, moved), locked = pipe.execute()
    return Sample(time.time() - at, int(length), int(target or 0), int(allocations or 0),
                  float(alloc_ms or 0), int(step or 0), bool(locked),
                  int(pushed or 0) - int(length), int(moved or 0))


def _reserve_ids(r: redis.Redis, k: TagKeys) -> int:
    total = 0
    for raw in r.lrange(k.reserve, 0, -1):
        lo, _, hi = (raw.decode() if isinstance(raw, bytes) else raw).partition(":")
        total += int(hi) - int(lo)
    return total


def run_scenario(name: str, old: int, new: int, index: int, url: str, db_url: str,
                 sizes: StepSizes) -> StepRow:
    row = StepRow(name, old, new)
    with tag_with_worker(name, {}, index, url, db_url) as (r, k, prefix, tag):
        phases = [(sizes.warm_s, old), (sizes.step_s, new)]
        ctx = mp.get_context("spawn")
        out, gate, start_at = ctx.Queue(), ctx.Event(), ctx.Value("d", 0.0)
        clients = [ctx.Process(target=_step_client,
                               args=(url, prefix, tag, i, gate, start_at, phases, out))
                   for i in range(CLIENTS)]
        for p in clients:
            p.start()
        for _ in clients:  # started and connected (spawned processes import for a while)
            out.get(timeout=120)
        start = time.time() + 0.2
        step_at = start + sizes.warm_s
        start_at.value = start
        gate.set()
        samples: list[Sample] = [_sample(r, k, step_at)]
        row.alloc_ms.append(samples[0].last_alloc_ms)  # the first fill's last allocation
        hits0 = 0
        at_step: Sample | None = None
        while time.time() < step_at + sizes.step_s:
            s = _sample(r, k, step_at)
            if s.allocations != samples[-1].allocations:
                row.alloc_ms.append(s.last_alloc_ms)
            if at_step is None and s.t >= 0:
                at_step = samples[-1]
                hits0 = int(r.hget(k.hits, "empty_hits") or 0)
            samples.append(s)
            time.sleep(POLL_S)
        reports: list[StepClientReport] = [out.get(timeout=120) for _ in clients]
        for p in clients:
            p.join(30)
        row.empty_hits = int(r.hget(k.hits, "empty_hits") or 0) - hits0
        row.list_after = int(r.llen(k.ids))
        row.reserve_after = _reserve_ids(r, k)
        last = _sample(r, k, step_at)
        row.target_after, row.step_after = last.target, last.step
    first = at_step or samples[0]
    row.served_per_s = (last.consumed - first.consumed) / sizes.step_s  # none after it
    waits = []
    for rep in reports:
        row.calls += rep.calls
        row.pool_empty += rep.pool_empty
        row.errors += rep.errors
        waits += [(lo - step_at, hi - step_at) for lo, hi in rep.waits if lo >= step_at]
    row.empty_pops = len(waits)
    row.empty_s = union_s(waits)
    row.waited_s = sum(hi - lo for lo, hi in waits)
    row.longest_wait_s = max((hi - lo for lo, hi in waits), default=0.0)
    if waits:
        row.waits_span = (min(lo for lo, _ in waits), max(hi for _, hi in waits))
    _timeline(row, samples, at_step)
    latencies = [ms / 1000 for ms in row.alloc_ms if ms > 0] or [0.0]
    model = [leaf_model.Phase(sizes.warm_s, old), leaf_model.Phase(sizes.step_s, new)]
    for settled in (False, True):
        figures = leaf_model.simulate(model, batch=BATCH, table_step=TABLE_STEP,
                                      latencies_s=latencies, step_at=sizes.warm_s,
                                      headroom_s=HEADROOM_S, settled=settled)
        if settled:
            row.leaf_settled = figures
        else:
            row.leaf = figures
    return row


def _timeline(row: StepRow, samples: list[Sample], at_step: Sample | None) -> None:
    """Sized, ready, the first refill after the step and the refills' durations."""
    after = [s for s in samples if s.t >= 0]
    want = 0.9 * row.new_target
    row.allocations = (after[-1].allocations - (at_step or after[0]).allocations
                       if after else 0)
    moved_before = (at_step or after[0]).watch_pushed if after else 0
    row.moved = after[-1].watch_pushed - moved_before if after else 0
    locked_from: float | None = None
    was_locked = at_step.locked if at_step else False
    for s in after:
        if row.sized_s is None and (s.target >= want if row.new > row.old
                                    else s.target <= 1.1 * row.new_target):
            row.sized_s = s.t
        if row.ready_s is None and s.length >= HEADROOM_S * row.new:
            row.ready_s = s.t
        if row.dry_s is None and s.length == 0:
            row.dry_s = s.t
        if row.first_move_s is None and s.watch_pushed > moved_before:
            row.first_move_s = s.t
        if s.locked and not was_locked:
            locked_from = s.t
            if row.first_refill_s is None:
                row.first_refill_s = s.t
        elif was_locked and not s.locked and locked_from is not None:
            row.refill_s.append(s.t - locked_from)
        was_locked = s.locked


def steps(sizes: StepSizes, first_index: int = 0) -> list[StepRow]:
    rows = []
    with servers.redis() as rs, servers.mariadb() as db:
        for i, (name, old, new) in enumerate(SCENARIOS):
            rows.append(run_scenario(name, old, new, first_index + i, rs.extra["url"],
                                     db.extra["url"], sizes))
    return rows


# -- tables ------------------------------------------------------------------------------------


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _ms_summary(values: list[float]) -> str:
    values = [v for v in values if v > 0]
    if not values:
        return "-"
    return (f"{len(values)}: median {statistics.median(values):.1f}, "
            f"max {max(values):.1f}")


def main(console: Console, sizes: StepSizes) -> list[StepRow]:
    rows = steps(sizes)
    table = Table(
        title=f"Demand steps on one tag ({CLIENTS} client processes, next_ids({BATCH}), "
        f"policy wait; the shipped defaults; MariaDB, table step {TABLE_STEP:,}; "
        f"{sizes.warm_s:g} s at the old rate, {sizes.step_s:g} s at the new one; figures "
        "from the step on)",
        caption="Leaf: the model (bench/leaf_model.py). "
        f"ready: the IDs ready to hand out cover {HEADROOM_S:g} s of the new demand "
        "(leafpool: the list; Leaf: the current segment's rest and the next one if "
        "loaded). Leaf new: its buffer's init at the clients' start; Leaf settled: the step "
        "its 15-minute rule reaches at the old rate. Leaf's requests wait for the load here "
        "(Leaf itself answers an error after ~10 ms).",
    )
    for col in ("scenario", "who", "empty pops", "empty s", "longest wait s",
                "sized after s", "ready after s", "held after: list + reserve",
                "beyond new target", "lost on restart", "allocations", "step after"):
        table.add_column(col, justify="left" if col in ("scenario", "who") else "right")
    for row in rows:
        down = row.new < row.old
        held = row.list_after + row.reserve_after
        table.add_row(
            f"{row.name}: {row.old:,} -> {row.new:,}/s", "leafpool", str(row.empty_pops),
            f"{row.empty_s:.3f}", f"{row.longest_wait_s:.3f}",
            _s(row.sized_s), _s(row.ready_s),
            f"{row.list_after:,} + {row.reserve_after:,}",
            f"{held - row.new_target:,}" if down else "", "0" if down else "",
            str(row.allocations), f"{row.step_after:,}")
        for who, f in (("Leaf, new", row.leaf), ("Leaf, settled", row.leaf_settled)):
            assert f is not None
            table.add_row(
                "", who, str(f.empty_pops), f"{f.empty_s:.3f}",
                f"{f.longest_wait_s:.3f}", "", _s(f.ready_s), f"{f.held_at_end:,}",
                f"{f.held_at_end - row.new_target:,}" if down else "",
                f"{f.lost_on_restart:,}" if down else "", str(f.loads),
                f"{f.step_at_end:,}")
    console.print(table)

    diag = Table(title="Where the time went (leafpool; times from the step; the list and the "
                 "lock read every 10 ms; the Leaf model is fed the allocation latencies, "
                 "in the order seen)")
    for col in ("scenario", "IDs/s served", "calls", "waited s (Leaf new)", "PoolEmpty",
                "empty hits", "waits from-to s", "list empty at s", "first refill at s",
                "watcher moved: first at s, IDs", "refills s", "allocation ms (all seen)",
                "target after"):
        diag.add_column(col, justify="left" if col == "scenario" else "right")
    for row in rows:
        refills = ", ".join(f"{x:.2f}" for x in row.refill_s[:8])
        if len(row.refill_s) > 8:
            refills += f" (+{len(row.refill_s) - 8})"
        leaf_waited = row.leaf.waited_s if row.leaf else 0.0
        diag.add_row(row.name, f"{row.served_per_s:,.0f}", f"{row.calls:,}",
                     f"{row.waited_s:.3f} ({leaf_waited:.3f})", str(row.pool_empty),
                     str(row.empty_hits),
                     "-" if row.waits_span is None else
                     f"{row.waits_span[0]:.3f}-{row.waits_span[1]:.3f}",
                     _s(row.dry_s), _s(row.first_refill_s),
                     f"{_s(row.first_move_s)}, {row.moved:,}", refills or "-",
                     _ms_summary(row.alloc_ms), f"{row.target_after:,}")
    console.print(diag)

    targets = Table(title="Targets (issue 30: bursts)")
    for col in ("what", "measured", "target", "met"):
        targets.add_column(col)
    by = {row.name: row for row in rows}
    if "50x up" in by:
        row = by["50x up"]
        targets.add_row("50x step: empty pops", str(row.empty_pops), "0",
                        met(row.empty_pops == 0))
    if "500x up" in by:
        row = by["500x up"]
        targets.add_row("500x step: seconds of empty pops", f"{row.empty_s:.3f} s", "< 1 s",
                        met(row.empty_s < 1.0))
    for row in rows:
        for who, f in (("new", row.leaf), ("settled", row.leaf_settled)):
            assert f is not None
            targets.add_row(f"{row.name}: empty s, leafpool vs Leaf model ({who})",
                            f"{row.empty_s:.3f} s vs {f.empty_s:.3f} s", "<= Leaf's",
                            met(row.empty_s <= f.empty_s))
    console.print(targets)
    return rows
