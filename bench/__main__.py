"""``python -m bench [--quick | --smoke] [--only SECTION]``: every benchmark in one run,
printed as tables with ratios against the baselines named in the issues.

``--quick`` runs fewer operations; ``--smoke`` runs every section with tiny sizes in
seconds, to prove the benchmarks run (its figures mean nothing): the test suite runs it
with only what the ``bench`` extra installs (tests/system/test_bench_imports.py)."""

from __future__ import annotations

import argparse
import platform
import time
from dataclasses import dataclass, field

from rich.console import Console
from rich.table import Table

from bench import measure, pools, servers
from bench.measure import Result, met

console = Console(width=200)


def _fmt_rate(value: float) -> str:
    return f"{value:,.0f}"


def pop_table(results: list[Result]) -> Table:
    table = Table(title="IDs/s and latency per call (one client process, median of "
                        f"{pools.ROUNDS} interleaved rounds)")
    for col in ("case", "IDs/s", "p50 us", "p99 us", "p999 us"):
        table.add_column(col, justify="right" if col != "case" else "left")
    for r in results:
        table.add_row(r.name, _fmt_rate(r.ids_per_s), f"{r.pct_us(0.5):.1f}",
                      f"{r.pct_us(0.99):.1f}", f"{r.pct_us(0.999):.1f}")
    return table


@dataclass(frozen=True)
class Sizes:
    single: int = 20_000  # single-ID operations per case and round
    batch: int = 4_000  # batch operations per case and round
    refill: int = 300_000  # IDs one refiller pushes per round
    fill: int = 100_000  # IDs pooled before LPOP latency is measured during refills
    settle_s: float = 30.0  # ... or after this long
    memory: int = 100_000  # IDs pooled to measure memory per ID (multiple of 10,000)
    redis_requests: int = 100_000  # redis-benchmark requests
    snowflake_rounds: int = 5
    snowflake_round_s: float = 0.25
    http: list[str] = field(default_factory=list)  # http_bench arguments
    http_micro: list[str] = field(default_factory=list)  # http_micro arguments
    repl_single: int = 3_000  # replication: next_id calls per configuration and round
    repl_batch: int = 1_000  # replication: next_ids(100) calls per configuration and round
    repl_rounds: int = 5
    tls_single: int = 10_000  # TLS: single-ID pops per case and round
    tls_batch: int = 2_000  # TLS: 100-ID pops per case and round
    tls_connects: int = 300  # TLS: new connections per case and round

    @property
    def tickets(self) -> int:
        return max(1000, self.single // 10) if self.single >= 1000 else self.single


FULL = Sizes()
QUICK = Sizes(single=5_000, batch=1_000, repl_single=1_000, repl_batch=300, repl_rounds=3)
SMOKE = Sizes(single=200, batch=20, refill=2_000, fill=1_000, settle_s=3.0, memory=10_000,
              redis_requests=1_000, snowflake_rounds=1, snowflake_round_s=0.01,
              http=["--duration", "0.3", "--batch", "10", "--connections", "4", "--rounds", "1"],
              http_micro=["--requests", "300", "--tasks", "4", "--rounds", "1"],
              repl_single=30, repl_batch=5, repl_rounds=1, tls_single=50, tls_batch=5,
              tls_connects=3)


def snowflake_section(sizes: Sizes) -> None:
    from bench import snowflake_bench

    snowflake_bench.main(sizes.snowflake_rounds, sizes.snowflake_round_s)


def replication_section(sizes: Sizes) -> None:
    from bench import replication

    replication.main(console, sizes.repl_single, sizes.repl_batch, sizes.repl_rounds)


def http_section(sizes: Sizes) -> None:
    from bench import http_bench, http_micro

    http_bench.main(sizes.http)
    http_micro.main(sizes.http_micro)  # the path's own CPU, in process (issue 30)


def burst_section(sizes: Sizes, size: str) -> None:
    from bench import burst_bench

    burst_bench.main(console, {"smoke": burst_bench.SMOKE, "quick": burst_bench.QUICK}
                     .get(size, burst_bench.FULL))


def tags_section(size: str) -> None:
    from bench import tags_bench

    tags_bench.main(console, {"smoke": tags_bench.SMOKE, "quick": tags_bench.QUICK}
                    .get(size, tags_bench.FULL))


def tls_section(sizes: Sizes) -> None:
    from bench import tls_bench

    tls_bench.main(console, sizes.tls_single, sizes.tls_batch, sizes.tls_connects)


def outage_section(size: str) -> None:
    from bench import outage_bench

    outage_bench.main(console, outage_bench.SMOKE if size == "smoke" else outage_bench.FULL)


def multidc_section(size: str) -> None:
    from bench import multidc_bench

    multidc_bench.main(console, {"smoke": multidc_bench.SMOKE, "quick": multidc_bench.QUICK}
                       .get(size, multidc_bench.FULL))


def galera_section(size: str) -> None:
    from bench import galera_bench

    galera_bench.main(console, {"smoke": 1, "quick": 2}.get(size, 3))


def orm_section(size: str) -> None:
    from bench import orm_bench

    orm_bench.main(console, {"smoke": orm_bench.SMOKE, "quick": orm_bench.QUICK}
                   .get(size, orm_bench.FULL))


def failover_section(size: str) -> None:
    from bench import failover_bench

    failover_bench.main(console, failover_bench.SMOKE if size == "smoke"
                        else failover_bench.FULL)


def pipeline_section(size: str) -> None:
    from bench import pipeline_bench

    pipeline_bench.main(console, {"smoke": pipeline_bench.SMOKE, "quick": pipeline_bench.QUICK}
                        .get(size, pipeline_bench.FULL))


def nemesis_section(size: str, args: argparse.Namespace) -> None:
    from bench import nemesis_bench

    nemesis_bench.main(console, {"smoke": None, "quick": nemesis_bench.QUICK}
                       .get(size, nemesis_bench.FULL), args)


def main() -> None:
    from bench import nemesis_bench

    parser = argparse.ArgumentParser(prog="python -m bench")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="fewer operations")
    size.add_argument("--smoke", action="store_true",
                      help="every section with tiny sizes, in seconds: proves the benchmarks "
                           "run; the figures mean nothing")
    parser.add_argument("--only", choices=["", "pools", "replication", "snowflake", "http",
                                           "burst", "tags", "tls", "outage", "multidc", "galera",
                                           "orm", "failover", "nemesis", "pipeline"],
                        default="", help="one section")
    nemesis_bench.add_arguments(parser)
    args = parser.parse_args()
    if not args.smoke:
        run(args)
        return
    measure.SMOKE_RUN = True  # no target judged on figures that mean nothing
    console.print(SMOKE_BANNER, style="bold reverse", highlight=False)
    try:
        run(args)
    finally:
        console.print(SMOKE_BANNER, style="bold reverse", highlight=False)


SMOKE_BANNER = ("SMOKE RUN: tiny sizes to prove the benchmarks run; its figures are NOT "
                "measurements (the README's Performance section has those)")


def run(args: argparse.Namespace) -> None:
    sizes = SMOKE if args.smoke else QUICK if args.quick else FULL
    sections = {"replication": replication_section, "snowflake": snowflake_section,
                "http": http_section, "tls": tls_section}
    size_name = "smoke" if args.smoke else "quick" if args.quick else "full"
    if args.only == "burst":
        burst_section(sizes, size_name)
        return
    if args.only == "tags":
        tags_section(size_name)
        return
    if args.only == "outage":
        outage_section(size_name)
        return
    if args.only == "multidc":
        multidc_section(size_name)
        return
    if args.only == "galera":
        galera_section(size_name)
        return
    if args.only == "orm":
        orm_section(size_name)
        return
    if args.only == "failover":
        failover_section(size_name)
        return
    if args.only == "nemesis":
        nemesis_section(size_name, args)
        return
    if args.only == "pipeline":
        pipeline_section(size_name)
        return
    if args.only in sections:
        sections[args.only](sizes)
        return
    single, batch = sizes.single, sizes.batch
    started = time.monotonic()
    console.print(f"leafpool benchmarks on {platform.node()} ({platform.machine()}, "
                  f"Python {platform.python_version()})")

    with servers.redis() as durable, servers.redis("--appendfsync", "everysec") as everysec:
        results = pools.pops(durable.extra["url"], "fsync always", single, batch)
        results += pools.pops(everysec.extra["url"], "everysec", single, batch)
        results += pools.ticket_server(sizes.tickets)
        latency, pushed, busy = pools.latency_during_refills(
            durable.extra["url"], single * 2, "fsync always", sizes.fill, sizes.settle_s)
        lat2, pushed2, busy2 = pools.latency_during_refills(
            everysec.extra["url"], single * 2, "everysec", sizes.fill, sizes.settle_s)
        latency += lat2
        pushed += pushed2
        busy += busy2
        refill = pools.refill_throughput(durable.extra["url"], sizes.refill)
        memory = pools.memory_per_id(durable.extra["url"], sizes.memory)
        many_durable = pools.redis_benchmark(durable.port, sizes.redis_requests)
        many_everysec = pools.redis_benchmark(everysec.port, sizes.redis_requests)

    console.print(pop_table(results))
    by = {r.name: r for r in results}

    def ratio(a: str, b: str) -> float:
        return by[a].ids_per_s / by[b].ids_per_s

    targets = Table(title="Targets (ratios measured in this run)")
    for col in ("what", "measured", "target", "met"):
        targets.add_column(col)
    rows = []
    for label in ("fsync always", "everysec"):
        rows.append((f"{label}: next_id / plain LPOP",
                     ratio(f"{label}: Client.next_id", f"{label}: LPOP (redis-py)"), 0.9))
        rows.append((f"{label}: next_ids(100) / LPOP count 100",
                     ratio(f"{label}: Client.next_ids(100)",
                           f"{label}: LPOP count 100 (redis-py)"), 0.9))
        rows.append((f"{label}: next_ids(100) before (every string parsed) / LPOP count 100",
                     ratio(f"{label}: Client.next_ids(100), every string parsed (before)",
                           f"{label}: LPOP count 100 (redis-py)"), 0.9))
    client_rate = by["fsync always: LPOP (redis-py)"].ids_per_s
    rows.append(("refill IDs/s / one client's LPOP IDs/s (fsync always)",
                 refill.ids_per_s / client_rate, 10.0))
    for name, value, target in rows:
        targets.add_row(name, f"{value:.2f}x", f">= {target:g}x", met(value >= target))
    for r in latency:
        p999 = r.pct_us(0.999)
        targets.add_row(f"{r.name}: LPOP p999", f"{p999:.0f} us", "< 1000 us", met(p999 < 1000))
    for name, pooled, bare in memory:
        targets.add_row(f"memory per pooled ID, {name}", f"{pooled:.2f} B (bare list "
                        f"{bare:.2f} B)", "within 10 %", met(pooled <= bare * 1.1))
    console.print(targets)

    lat = Table(title="LPOP latency while refills run (a drainer takes ~200k IDs/s)")
    for col in ("case", "IDs pushed/s meanwhile", "Redis busy per push us", "p50 us",
                "p99 us", "p999 us", "max us"):
        lat.add_column(col)
    for r, rate, us in zip(latency, pushed, busy, strict=True):
        lat.add_row(r.name, _fmt_rate(rate), f"{us:.0f}" if us else "-",
                    f"{r.pct_us(0.5):.1f}", f"{r.pct_us(0.99):.1f}",
                    f"{r.pct_us(0.999):.1f}", f"{max(r.samples_ns) / 1000:.0f}")
    console.print(lat)

    other = Table(title="Refill and durability")
    other.add_column("what")
    other.add_column("figure", justify="right")
    other.add_row("one refiller, IDs pushed/s (chunk 1,000, fsync always)",
                  _fmt_rate(refill.ids_per_s))
    other.add_row("redis-benchmark LPOP, 50 clients, fsync always (req/s)",
                  _fmt_rate(many_durable))
    other.add_row("redis-benchmark LPOP, 50 clients, everysec (req/s)",
                  _fmt_rate(many_everysec))
    other.add_row("durability cost, 1 client: LPOP fsync always / everysec",
                  f"{ratio('fsync always: LPOP (redis-py)', 'everysec: LPOP (redis-py)'):.2f}x")
    other.add_row("durability cost, 50 clients: fsync always / everysec",
                  f"{many_durable / many_everysec:.2f}x")
    console.print(other)

    if args.only == "":
        replication_section(sizes)
        tls_section(sizes)
        snowflake_section(sizes)
        http_section(sizes)
        burst_section(sizes, size_name)
        tags_section(size_name)
        outage_section(size_name)
        multidc_section(size_name)
        galera_section(size_name)
        orm_section(size_name)
        failover_section(size_name)
        pipeline_section(size_name)
        if args.smoke:
            nemesis_section(size_name, args)
        else:  # three seeds of 10 minutes: asked for by name only
            console.print("nemesis: not in a run of every section (30 min): "
                          "python -m bench --only nemesis")
    console.print(f"total {time.monotonic() - started:.0f} s")


if __name__ == "__main__":
    main()
