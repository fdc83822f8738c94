"""``python -m bench --only outage``: how long a pool rides through a database outage, and
the Redis memory it takes (issue 19; docs/design.md §3.2).

One redis-server (the shipped config) and one MariaDB on loopback; for each rate a tag of
step 1,000 with the default sizing (``LEAFPOOL_POOL_SECONDS=30``,
``LEAFPOOL_OUTAGE_SECONDS=600``). The rate is simulated on the refiller's clock (a fake
wall clock moved one second per step), everything else is real: each simulated second
plain ``LPOP key 10000`` calls take ``rate`` IDs from Redis (a tenth of a second's worth
at a time), and the real :class:`~leafpool.segment.refiller.SegmentRefiller` refills the
tag whenever its level is due (below its low-water mark or its reserve short: what the
drop watcher queues; once refills fail, below the low-water mark on the retry's
schedule), against MariaDB. After a warm-up at the rate, the memory of the tag's keys is
measured (``MEMORY USAGE``), MariaDB is killed, and the popping goes on until a second's
pops come up short: the seconds of outage survived are **measured** (simulated seconds
of real pops, every refill meanwhile failing its allocation), beside the figure
**computed** from what list and reserve held when the database went ((list + reserve) /
rate). "In the list instead" is the memory the same IDs would take as list entries (the
list's own bytes per ID): what holding the outage in the list would cost.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import redis
from rich.console import Console
from rich.table import Table

from bench import servers
from bench.measure import meant_failures
from leafpool.core.config import load_settings
from leafpool.core.errors import LeafpoolError
from leafpool.redis.pool import Pool
from leafpool.refill.retry import fast_backoff
from leafpool.segment.refiller import SegmentRefiller
from leafpool.segment.store import SegmentStore
from tests.support.servers import Server

POP_BATCH = 10_000


@dataclass(frozen=True)
class OutageSizes:
    rates: tuple[int, ...] = (3_000, 30_000)
    outage_seconds: float = 600.0  # LEAFPOOL_OUTAGE_SECONDS
    pool_seconds: float = 30.0  # LEAFPOOL_POOL_SECONDS
    warm_s: int = 90  # simulated seconds at the rate before the database goes
    step: int = 1_000


FULL = OutageSizes()
SMOKE = OutageSizes(rates=(300, 3_000), outage_seconds=4.0, pool_seconds=2.0, warm_s=4)


@dataclass
class Row:
    rate: int
    list_ids: int
    reserve_ids: int
    ranges: int
    peak: float
    list_bytes: int
    reserve_bytes: int
    state_bytes: int
    survived_s: float
    failed_refills: int
    took_s: float

    @property
    def computed_s(self) -> float:
        return (self.list_ids + self.reserve_ids) / self.rate

    @property
    def in_list_bytes(self) -> float:
        """The list's bytes per ID times every ID list and reserve hold."""
        return self.list_bytes / max(self.list_ids, 1) * (self.list_ids + self.reserve_ids)


class _Clock:
    """The refiller's wall clock, moved by the simulation."""

    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


class _Tag:
    """One tag popped at ``rate`` IDs per simulated second, in tenths of a second; after
    each tenth the tag is refilled when due, as the drop watcher would queue it; while
    its refills fail, again only below its low-water mark and after the retry's backoff
    (leafpool.refill.retry: 0.25 s doubling to 1 s)."""

    SLICES = 10

    def __init__(self, r: redis.Redis, pool: Pool, refiller: SegmentRefiller, tag: str,
                 rate: int, clock: _Clock) -> None:
        self.r, self.pool, self.refiller, self.tag = r, pool, refiller, tag
        self.rate, self.clock = rate, clock
        self.key = pool.tag(tag).ids
        self.failed = 0
        self._in_row = 0
        self._next_try = 0.0

    def second(self) -> int:
        """Pop a second's demand, refilling as it goes; the IDs got (fewer: it ran dry)."""
        got = 0
        for i in range(self.SLICES):
            want = self.rate * (i + 1) // self.SLICES - got
            while want > 0:
                ids = self.r.lpop(self.key, min(POP_BATCH, want))
                if not ids:  # dry: this tenth's demand unmet
                    break
                got += len(ids)  # type: ignore[arg-type]
                want -= len(ids)  # type: ignore[arg-type]
            self.clock.now += 1.0 / self.SLICES
            self._refill_if_due()
        return got

    def _refill_if_due(self) -> None:
        level = self.pool.levels([self.tag])[0]
        if self._in_row:  # failing: the fast retry's schedule, below low-water only
            if not (level.known and level.below_low_water()) or self.clock.now < self._next_try:
                return
        elif not level.due():
            return
        try:
            self.refiller.refill(self.tag)
            self._in_row = 0
        except LeafpoolError:
            self.failed += 1
            self._next_try = self.clock.now + fast_backoff(self._in_row)
            self._in_row += 1


def _memory(r: redis.Redis, key: str) -> int:
    return int(r.memory_usage(key, samples=0) or 0)


def one_rate(url: str, db: Server, rate: int, sizes: OutageSizes) -> Row:
    started = time.monotonic()
    r = redis.Redis.from_url(url)
    pool = Pool(r)
    tag = f"outage{rate}"
    settings = load_settings(redis_url=url, database_url=db.extra["url"],
                             outage_seconds=sizes.outage_seconds,
                             pool_seconds=sizes.pool_seconds)
    store = SegmentStore.from_url(db.extra["url"])
    try:
        store.init_schema()
        store.add_tag(tag, step=sizes.step)
        clock = _Clock()
        sim = _Tag(r, pool, SegmentRefiller(pool, store, settings, wall=clock), tag, rate, clock)
        sim.refiller.refill(tag)
        for _ in range(sizes.warm_s):
            sim.second()
        snap = pool.snapshot(tag)
        k = pool.tag(tag)
        row = Row(rate, snap.length, snap.reserve_size, len(snap.reserve),
                  snap.float("peak_rate"), _memory(r, k.ids), _memory(r, k.reserve),
                  _memory(r, k.state), 0.0, 0, 0.0)
        db.kill()  # SIGKILL: every allocation from now on fails
        try:
            seconds = 0
            limit = 2 * row.computed_s + 60
            with meant_failures("leafpool.refill.base"):  # every allocation fails
                while seconds < limit:
                    got = sim.second()
                    if got < rate:
                        row.survived_s = seconds + got / rate
                        break
                    seconds += 1
            row.failed_refills = sim.failed
        finally:
            db.start(timeout=60)
    finally:
        store.engine.dispose()
    row.took_s = time.monotonic() - started
    return row


def _mb(n: float) -> str:
    return f"{n / 1e6:,.2f} MB" if n >= 1e5 else f"{n / 1e3:,.1f} KB"


def table(rows: list[Row], sizes: OutageSizes) -> Table:
    t = Table(title=f"Database outage at a steady rate (LEAFPOOL_OUTAGE_SECONDS="
                    f"{sizes.outage_seconds:g}, POOL_SECONDS={sizes.pool_seconds:g}, step "
                    f"{sizes.step:,}; MariaDB killed after {sizes.warm_s} s at the rate)",
              caption="refills failed: the allocations MariaDB did not answer while down, "
                      "as this section means them to")
    for col in ("IDs/s", "list IDs", "reserve IDs (ranges)", "survived, measured",
                "computed", "refills failed", "Redis: list / reserve / state",
                "in the list instead", "run"):
        t.add_column(col, justify="right")
    for row in rows:
        t.add_row(f"{row.rate:,}", f"{row.list_ids:,}", f"{row.reserve_ids:,} ({row.ranges})",
                  f"{row.survived_s:,.1f} s", f"{row.computed_s:,.1f} s",
                  f"{row.failed_refills:,}",
                  f"{_mb(row.list_bytes)} / {_mb(row.reserve_bytes)} / {_mb(row.state_bytes)}",
                  _mb(row.in_list_bytes), f"{row.took_s:.0f} s")
    return t


def main(console: Console, sizes: OutageSizes) -> list[Row]:
    with servers.redis() as redis_server, servers.mariadb() as db:
        rows = [one_rate(redis_server.extra["url"], db, rate, sizes) for rate in sizes.rates]
    console.print(table(rows, sizes))
    return rows
