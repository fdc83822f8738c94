"""``python -m bench --only nemesis``: seeded combined-fault runs (issue 28 item 1, issue 33
item 4), each against a fresh deployment on loopback (tests/support/nemesis.py): Redis
master + 2 replicas + 3 sentinels from the shipped configs, MariaDB, two Celery workers
and a beat, four client processes (two ``wait``, two ``reserve``); a fault every 6-12 s
(workers, beat, Redis master and replicas, MariaDB: killed or paused; a worker partitioned
from MariaDB or from Redis; a worker's clock set back), then 30 s healed.

Per seed it prints the checker's report (tests/support/nemesis_checker.py): the faults
injected, the IDs handed out, duplicates and inversions (both must be 0), availability per
tag (share of 1-s windows served; also leaving out the windows with the Redis master down
or paused before a failover completed), every pause over 5 s with what was in progress,
the clients' errors; then one row per seed.

Options: ``--seeds N`` (default 3), ``--first-seed S`` (default 1), ``--duration S``
(the fault phase, default 600 s), ``--pop-replicas all|1|...`` (default ``all``, what we
ship; ``1`` shows the stale-promotion hazard), ``--snowflake-mode zk`` (worker IDs from
a ZooKeeper server, which is killed and paused too), ``--http`` (the HTTP service and an
HTTP client process; the service is killed too), ``--links`` (each worker reaches
MariaDB, and ZooKeeper, through a relay the nemesis partitions, and Redis behind a fence
it raises: root and iptables), ``--clock`` (a worker restarted with its clock 5 s behind,
libfaketime); both on by default where the machine can run them (``--no-links``,
``--no-clock``: off), ``--sentinels`` (two of the three
sentinels killed or paused too), ``--keep DIR`` (keep
each run's history, events and logs in DIR/seed-N; else they are removed). ``--quick``:
one seed of 180 s.
``--smoke`` does not start a deployment (a run takes minutes): it prints the report of a
hand-written history, proving the checker and the tables run.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from tests.support.nemesis import RunConfig, run
from tests.support.nemesis_checker import Report, check, check_run
from tests.support.nemesis_history import Call, Event
from tests.support.nemesis_links import fence_unusable
from tests.support.nemesis_procs import faketime_library
from tests.support.nemesis_report import print_report, print_series


@dataclass(frozen=True)
class NemesisSizes:
    seeds: int = 3
    fault_s: float = 600.0
    heal_s: float = 30.0


FULL = NemesisSizes()
QUICK = NemesisSizes(seeds=1, fault_s=180.0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("nemesis (--only nemesis)")
    group.add_argument("--seeds", type=int, default=None, help="runs, one seed each (3)")
    group.add_argument("--first-seed", type=int, default=1, help="the first seed (1)")
    group.add_argument("--duration", type=float, default=None,
                       help="seconds of faults per run (600)")
    group.add_argument("--pop-replicas", default="all",
                       help="LEAFPOOL_POP_REPLICAS of the clients (all)")
    group.add_argument("--snowflake-mode", choices=["local", "zk"], default="local",
                       help="worker IDs of the snowflake tag: local, or zk (a ZooKeeper "
                            "server joins the deployment, killed and paused too)")
    group.add_argument("--http", action="store_true",
                       help="the HTTP service and one HTTP client process join (the service "
                            "is killed too)")
    group.add_argument("--links", action=argparse.BooleanOptionalAction, default=None,
                       help="each worker reaches MariaDB (and ZooKeeper) through a relay the "
                            "nemesis partitions (db-partition, zk-partition), and Redis "
                            "behind a fence it raises (redis-partition: root and iptables); "
                            "default: on where a fence can be raised")
    group.add_argument("--clock", action=argparse.BooleanOptionalAction, default=None,
                       help="a worker is restarted with its clock 5 s behind for 10-30 s "
                            "(worker-clock-back; libfaketime, Debian package faketime); "
                            "default: on where libfaketime is installed")
    group.add_argument("--sentinels", action="store_true",
                       help="two of the three sentinels are killed or paused too "
                            "(sentinel-kill, sentinel-pause)")
    group.add_argument("--keep", type=Path, default=None,
                       help="keep each run's files in DIR/seed-N")


def smoke_report() -> Report:
    """A hand-written history of two tags with a fault and a pause (no deployment)."""
    t0 = 1_700_000_000.0
    calls = [Call("c0", t0 + i, t0 + i + 0.01, "seg", "ids", 2, (2 * i + 1, 2 * i + 2))
             for i in range(20) if not 5 <= i < 12]
    calls += [Call("c1", t0 + i, t0 + i + 0.01, "sf", "id", 1, ((i + 1) << 22 | 1 << 12,))
              for i in range(20)]
    calls.append(Call("c0", t0 + 6, t0 + 8, "seg", "id", 1, (), "BackendUnavailable"))
    events = [Event(t0, "phase", {"phase": "faults"}),
              Event(t0 + 5, "fault-start", {"id": 1, "kind": "master-pause",
                                            "target": "redis-1"}),
              Event(t0 + 9, "fault-end", {"id": 1}),
              Event(t0 + 15, "phase", {"phase": "heal"}),
              Event(t0 + 20, "phase", {"phase": "end"})]
    return check(calls, events, {"seg": "segment", "sf": "snowflake"},
                 {"config": {"seed": 0, "pop_replicas": "all"}})


def optional_kinds(console: Console, links: bool | None, clock: bool | None
                   ) -> tuple[bool, bool]:
    """The partitions and the clock faults: as asked, else every one this machine can run
    (said, with why one is left out)."""
    if links is None:
        unusable = fence_unusable()
        links = unusable is None
        if unusable is not None:
            console.print(f"nemesis: no partitions (--links): {unusable}")
    if clock is None:
        try:
            faketime_library()
            clock = True
        except FileNotFoundError as exc:
            console.print(f"nemesis: no clock faults (--clock): {exc}")
            clock = False
    return links, clock


def main(console: Console, sizes: NemesisSizes | None, args: argparse.Namespace) -> None:
    if sizes is None:
        console.print("nemesis: no deployment in --smoke (a run takes minutes; "
                      "python -m bench --only nemesis); the report of a hand-written "
                      "history instead:")
        print_report(console, smoke_report())
        return
    links, clock = optional_kinds(console, args.links, args.clock)
    seeds = args.seeds if args.seeds is not None else sizes.seeds
    fault_s = args.duration if args.duration is not None else sizes.fault_s
    reports = []
    for seed in range(args.first_seed, args.first_seed + seeds):
        cfg = RunConfig(seed=seed, fault_s=fault_s, heal_s=sizes.heal_s,
                        pop_replicas=args.pop_replicas, snowflake_mode=args.snowflake_mode,
                        http=args.http, links=links, clock=clock,
                        sentinels=args.sentinels)
        if args.keep is not None:
            run_dir = args.keep / f"seed-{seed}"
            if run_dir.exists():
                shutil.rmtree(run_dir)
        else:
            run_dir = Path(tempfile.mkdtemp(prefix=f"leafpool-nemesis-{seed}-"))
        try:
            run(cfg, run_dir, progress=lambda line: console.print(line, highlight=False))
            report = check_run(run_dir)
        finally:
            if args.keep is None:
                shutil.rmtree(run_dir, ignore_errors=True)
        print_report(console, report)
        reports.append(report)
    print_series(console, reports)
