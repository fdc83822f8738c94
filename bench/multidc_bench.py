"""``python -m bench --only multidc``: a data center that reaches its database across a WAN
(issue 31 item 5; docs/design.md §12.2, mode shared).

One MariaDB on loopback and, in front of it, a latency proxy
(:class:`~tests.support.latency_proxy.LatencyProxy`) that delays every byte by the WAN's
latency each way and can cut the link. The DC is a redis-server of its own and ``celery
-A workers worker -B`` (``LEAFPOOL_DC_ID=1``, ``LEAFPOOL_DC_COUNT=2``, the shipped
defaults otherwise) whose ``LEAFPOOL_DATABASE_URL`` goes through the proxy; a client takes
a steady rate with plain ``LPOP`` calls (a tenth of a second's worth at a time).

1. **Refill latency and sizing** at 0, 50 and 100 ms each way: after ``warm_s`` seconds
   at the rate, every allocation's milliseconds (the worker's log: "segment [a, b) ...
   from the database in X ms") and those of each whole refill task that allocated
   (Celery's "succeeded in" line of the same pool process), with what the sizing chose
   as the tag's state says: the list's target and low-water mark, the reserve's target
   and what it held, the step.
2. **A partition** at 3,000 IDs/s with the defaults (``LEAFPOOL_OUTAGE_SECONDS=600``),
   the link 50 ms each way: once the reserve holds the outage budget the link is cut; the
   seconds the DC serves (until a pop finds the list empty) beside the budget, then the
   link is restored and the seconds until the DC serves again beside issue 31's 2 s. A
   full run only (the budget is 10 minutes); ``--quick`` uses a smaller budget and says
   so in the table's title; ``--smoke`` cuts the one latency's DC, tiny budgets.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from bench import servers
from bench.measure import met
from leafpool.segment.store import SegmentStore
from tests.support.latency_proxy import LatencyProxy
from tests.support.two_dcs import Dc, refill_times, wait_for, with_port

RECOVERY_SECONDS = 2.0  # issue 31 item 3: served again within 2 s of the link's return


@dataclass(frozen=True)
class MultiDcSizes:
    delays_ms: tuple[float, ...] = (0.0, 50.0, 100.0)
    rate: int = 3_000  # IDs/s, the latency part
    warm_s: float = 60.0  # seconds at the rate before the figures are read
    outage_rate: int = 3_000  # IDs/s, the partition
    outage_seconds: float = 600.0  # LEAFPOOL_OUTAGE_SECONDS in the partition
    outage_delay_ms: float = 50.0
    pool_seconds: float | None = None  # LEAFPOOL_POOL_SECONDS; None: the shipped default
    fill_timeout_s: float = 600.0  # the reserve reaching the budget before the cut
    label: str = "full"


FULL = MultiDcSizes()
QUICK = MultiDcSizes(warm_s=30.0, outage_seconds=60.0, fill_timeout_s=300.0, label="quick")
SMOKE = MultiDcSizes(delays_ms=(50.0,), rate=1_000, warm_s=2.0, outage_rate=1_000,
                     outage_seconds=2.0, pool_seconds=1.0, fill_timeout_s=60.0, label="smoke")


@dataclass
class LatencyRow:
    delay_ms: float
    allocations: list[float]
    refills: list[float]
    target: int
    low_water: int
    list_held: int
    reserve_target: int
    reserve_held: int
    step: int
    rate: float
    took_s: float


@dataclass
class OutageRow:
    rate: int
    outage_seconds: float
    list_ids: int
    reserve_ids: int
    served_s: float | None
    recovered_s: float | None
    took_s: float


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _settings(sizes: MultiDcSizes, **more: object) -> dict[str, object]:
    out: dict[str, object] = dict(more)
    if sizes.pool_seconds is not None:
        out["pool_seconds"] = sizes.pool_seconds
    return out


def _fresh_tag(url: str, tag: str) -> None:
    store = SegmentStore.from_url(url)
    try:
        store.init_schema()
        store.add_tag(tag, step=1_000)
    finally:
        store.engine.dispose()


def _start(db_url: str, db_port: int, home: Path, tag: str, delay_ms: float,
           settings: dict[str, object]) -> tuple[Dc, LatencyProxy]:
    """DC b: its Redis and worker, the database through a proxy of ``delay_ms`` each way;
    ``tag`` new in the database and filled."""
    _fresh_tag(db_url, tag)
    proxy = LatencyProxy(db_port, delay_ms=delay_ms).open()
    dc = Dc(tag, 1, 2, with_port(db_url, proxy.port), home / tag, settings)
    try:
        dc.start()
        dc.wait_filled(tag, 100, 120)
    except BaseException:
        dc.stop()
        proxy.stop()
        raise
    return dc, proxy


def one_delay(dc: Dc, tag: str, delay_ms: float, sizes: MultiDcSizes) -> LatencyRow:
    started = time.monotonic()
    dc.pop(tag, sizes.rate)
    end = time.monotonic() + sizes.warm_s
    while time.monotonic() < end:  # the load runs; nothing to wait for but the time
        time.sleep(min(1.0, max(0.0, end - time.monotonic())))
    snap = dc.snapshot(tag)
    allocations, refills = refill_times(dc.log, tag)
    return LatencyRow(delay_ms, allocations, refills, snap.int("target"),
                      snap.int("low_water"), snap.length, snap.int("reserve_target"),
                      snap.reserve_size,
                      snap.int("step"), snap.float("rate"), time.monotonic() - started)


def partition(dc: Dc, proxy: LatencyProxy, tag: str, sizes: MultiDcSizes) -> OutageRow:
    """The clients at ``outage_rate`` (those running are stopped first); once the reserve
    holds the budget the link is cut: seconds served, then seconds to serve again."""
    started = time.monotonic()
    rate = sizes.outage_rate
    dc.stop_clients()
    (popper,) = dc.pop(tag, rate)
    budget = sizes.outage_seconds * rate
    wait_for(lambda: dc.snapshot(tag).reserve_size >= budget, sizes.fill_timeout_s,
             f"the reserve holding {sizes.outage_seconds:g} s at {rate:,} IDs/s",
             lambda: dc.describe(tag), interval=0.5)
    snap = dc.snapshot(tag)
    proxy.cut()
    cut = time.monotonic()
    held_s = (snap.length + snap.reserve_size) / rate
    served: float | None = None
    recovered: float | None = None
    try:
        wait_for(lambda: popper.first_empty_after(cut) is not None, 2 * held_s + 60,
                 "the list empty after the cut", lambda: dc.describe(tag), interval=0.1)
        served = (popper.first_empty_after(cut) or cut) - cut
    except TimeoutError:
        pass
    proxy.restore()
    back = time.monotonic()
    try:
        wait_for(lambda: popper.first_served_after(back) is not None, 60,
                 "served after the link's return", lambda: dc.describe(tag))
        recovered = (popper.first_served_after(back) or back) - back
    except TimeoutError:
        pass
    return OutageRow(rate, sizes.outage_seconds, snap.length, snap.reserve_size, served,
                     recovered, time.monotonic() - started)


def latency_table(rows: list[LatencyRow], sizes: MultiDcSizes) -> Table:
    t = Table(title=f"A DC allocating across a WAN (mode shared): refill latency and sizing "
                    f"at {sizes.rate:,} IDs/s after {sizes.warm_s:g} s (celery -A workers "
                    "worker -B, shipped defaults, MariaDB behind a latency proxy)",
              caption="allocation: one atomic max_id advance, as the worker logs it; "
                      "refill: a whole refill task that allocated (Celery's 'succeeded "
                      "in'); list target / low-water, reserve target / held and step: the "
                      "tag's state")
    for col in ("latency each way", "allocations", "allocation p50 / p99 / max",
                "refill p50 / max", "list target / low-water", "reserve target / held",
                "list + reserve at the rate", "rate (state)", "step", "run"):
        t.add_column(col, justify="right")
    for r in rows:
        held_s = (r.list_held + r.reserve_held) / sizes.rate
        t.add_row(f"{r.delay_ms:g} ms", f"{len(r.allocations):,}",
                  f"{_pct(r.allocations, 0.5):.1f} / {_pct(r.allocations, 0.99):.1f} / "
                  f"{max(r.allocations, default=float('nan')):.1f} ms",
                  f"{statistics.median(r.refills) if r.refills else float('nan'):.0f} / "
                  f"{max(r.refills, default=float('nan')):.0f} ms",
                  f"{r.target:,} / {r.low_water:,}",
                  f"{r.reserve_target:,} / {r.reserve_held:,}",
                  f"{held_s:,.0f} s", f"{r.rate:,.0f}/s", f"{r.step:,}", f"{r.took_s:.0f} s")
    return t


def outage_table(row: OutageRow, sizes: MultiDcSizes) -> Table:
    budget_note = ("the shipped default" if row.outage_seconds == 600.0
                   else f"smaller than the shipped 600 s ({sizes.label} run)")
    t = Table(title=f"A DC cut off from its database (mode shared) at {row.rate:,} IDs/s, "
                    f"LEAFPOOL_OUTAGE_SECONDS={row.outage_seconds:g} ({budget_note}), link "
                    f"{sizes.outage_delay_ms:g} ms each way, cut once the reserve held the "
                    "budget")
    for col in ("what", "measured", "target", "met"):
        t.add_column(col, justify="right")
    t.add_row("list / reserve at the cut", f"{row.list_ids:,} / {row.reserve_ids:,} IDs",
              "", "")
    served = "never dry (timed out)" if row.served_s is None else f"{row.served_s:,.1f} s"
    t.add_row("served after the cut", served, f">= {row.outage_seconds:g} s (the budget)",
              met(row.served_s is not None and row.served_s >= row.outage_seconds))
    back = "not within 60 s" if row.recovered_s is None else f"{row.recovered_s:.2f} s"
    t.add_row("served again after the link's return", back,
              f"< {RECOVERY_SECONDS:g} s (issue 31)",
              met(row.recovered_s is not None and row.recovered_s < RECOVERY_SECONDS))
    t.add_row("run", f"{row.took_s:.0f} s", "", "")
    return t


def main(console: Console, sizes: MultiDcSizes) -> tuple[list[LatencyRow], OutageRow]:
    """Each latency on a DC of its own; the partition on one more, started with its
    outage budget (a smoke run cuts the last latency's DC, started with it)."""
    with servers.mariadb() as db, tempfile.TemporaryDirectory(prefix="leafpool-multidc-") as d:
        home = Path(d)
        url = db.extra["url"]
        smoke = sizes.label == "smoke"
        base = _settings(sizes, outage_seconds=sizes.outage_seconds) if smoke \
            else _settings(sizes)
        rows = []
        kept: tuple[Dc, LatencyProxy, str] | None = None
        for i, delay in enumerate(sizes.delays_ms):
            tag = f"wan{int(delay)}"
            dc, proxy = _start(url, db.port, home, tag, delay, base)
            try:
                rows.append(one_delay(dc, tag, delay, sizes))
            finally:
                if smoke and i == len(sizes.delays_ms) - 1:
                    kept = (dc, proxy, tag)
                else:
                    dc.stop()
                    proxy.stop()
        console.print(latency_table(rows, sizes))
        if kept is None:
            tag = "partition"
            dc, proxy = _start(url, db.port, home, tag, sizes.outage_delay_ms,
                               _settings(sizes, outage_seconds=sizes.outage_seconds))
            kept = (dc, proxy, tag)
        dc, proxy, tag = kept
        try:
            proxy.set_delay(sizes.outage_delay_ms)
            row = partition(dc, proxy, tag, sizes)
        finally:
            dc.stop()
            proxy.stop()
        console.print(outage_table(row, sizes))
    return rows, row
