"""100,000 tags on one Redis (issue 30, item 4): ``python -m bench --only tags``.

In one run, on its own redis-server (the pools), a second redis-server (the Celery
broker, so the pools' Redis CPU is the pools' alone) and MariaDB, N segment rows are
inserted into ``leaf_alloc`` with SQL (step 1,000), as a Leaf user would, and:

- the tag sync (``leafpool.housekeeping.sync.sync_tags``, called here): the first sync of
  the N rows into an empty Redis, then a pass with nothing new; later a pass with nothing
  new over the filled pools (every state hash full): wall time, this process's CPU,
  Redis CPU;
- the first fill: one ``celery -A workers worker -B -c 2`` started, the time until every
  tag has had IDs;
- 1 % of the tags busy all along: popped by client processes of their own (a thread here
  would share the GIL with the measurements), each busy tag ``LPOP key 2`` once a second;
  their empty pops counted from the moment every tag is filled;
- with every tag filled: Redis ``used_memory`` in total and per tag (and ``MEMORY USAGE``
  of one idle tag's keys, by kind); one sweep (``sweep.sweep``), one /metrics scrape
  (``metrics.render``, what the HTTP endpoint runs), ``leafpool status --json`` and the
  plain table (processes of their own);
- the worker's CPU (the Celery worker, its pool processes and the beat process, from
  ``/proc``) over a minute with the busy tags popped, then over a quiet minute (the
  poppers stopped): the worker's idle cost.

Redis CPU is ``INFO cpu`` (used_cpu_user + used_cpu_sys of the pools' redis-server)
before and after each step. The 10,000-tag comparisons with the paths before (one task
per tag, the per-tag sync, rich's JSON) are in docs/reference/performance.md; at 100,000
tags they would take minutes each.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pymysql
import redis
from rich.console import Console
from rich.table import Table
from sqlalchemy import text

from bench import servers
from bench.measure import met
from leafpool.children import die_with_parent
from leafpool.redis.pool import Pool
from leafpool.segment.store import SegmentStore

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class TagsSizes:
    tags: int = 100_000  # segment rows in leaf_alloc
    busy_share: float = 0.01  # of them popped all along
    busy_count: int = 2  # IDs per pop (LPOP key 2)
    busy_pops_s: float = 1.0  # pops a second per busy tag
    poppers: int = 2  # client processes popping the busy tags
    fill_timeout_s: float = 300.0
    busy_cpu_s: float = 60.0  # the worker's CPU measured this long with the busy tags popped
    quiet_s: float = 60.0  # ... and this long with nothing popped
    status_runs: int = 2  # each ``leafpool status`` (its own process) is run this often

    @property
    def busy(self) -> int:
        return max(1, round(self.tags * self.busy_share))

    @property
    def busy_rate(self) -> float:
        """IDs/s popped from the busy tags together."""
        return self.busy * self.busy_count * self.busy_pops_s


FULL = TagsSizes()
QUICK = TagsSizes(tags=10_000, fill_timeout_s=120.0, busy_cpu_s=30.0, quiet_s=30.0)
SMOKE = TagsSizes(
    tags=300, busy_share=0.02, poppers=1, fill_timeout_s=60.0, busy_cpu_s=2.0, quiet_s=3.0,
    status_runs=1,
)

#: issue 30's targets
FILL_TARGET_S = 150.0
MEMORY_TARGET_B = 200e6
IDLE_CPU_TARGET = 0.01  # of one core
STATUS_TARGET_S = 5.0


# -- measuring -------------------------------------------------------------------------------


def redis_cpu(r: redis.Redis) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


@dataclass
class Cost:
    wall_s: float = 0.0
    cpu_s: float = 0.0  # this process
    redis_cpu_s: float = 0.0
    child_cpu_s: float = 0.0  # the processes this process waited for meanwhile


@contextmanager
def measured(r: redis.Redis) -> Iterator[Cost]:
    cost = Cost()
    kids0 = _children_cpu()
    redis0, cpu0, t0 = redis_cpu(r), time.process_time(), time.perf_counter()
    yield cost
    cost.wall_s = time.perf_counter() - t0
    cost.cpu_s = time.process_time() - cpu0
    cost.redis_cpu_s = redis_cpu(r) - redis0
    cost.child_cpu_s = _children_cpu() - kids0


def _children_cpu() -> float:
    times = os.times()
    return times.children_user + times.children_system


_TICK = os.sysconf("SC_CLK_TCK")


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        out.setdefault(ppid, []).append(int(entry))
    return out


def tree_cpu(root: int) -> dict[int, tuple[str, float]]:
    """CPU seconds (user + system) of ``root`` and its descendants, by pid, with each
    one's process title."""
    kids = _children()
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        pids.append(pid)
        todo += kids.get(pid, [])
    out = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                title = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        out[pid] = (title, (int(fields[11]) + int(fields[12])) / _TICK)
    return out


@dataclass
class WorkerCpu:
    seconds: float  # wall seconds measured over
    total_s: float = 0.0  # CPU seconds of the whole tree
    by_process: dict[str, float] = field(default_factory=dict)  # title -> CPU seconds

    @property
    def share(self) -> float:
        """Of one core."""
        return self.total_s / self.seconds if self.seconds else 0.0


def worker_cpu(root: int, seconds: float, beat: int | None) -> WorkerCpu:
    before = tree_cpu(root)
    t0 = time.monotonic()
    time.sleep(seconds)
    after = tree_cpu(root)
    out = WorkerCpu(time.monotonic() - t0)
    for pid, (title, cpu) in after.items():
        used = cpu - before.get(pid, (title, 0.0))[1]
        name = ("worker main process (consumer)" if pid == root
                else "beat process (schedule, drop watcher)" if pid == beat
                else "pool processes (the tasks: sync, sweeps, refills)")
        out.by_process[name] = out.by_process.get(name, 0.0) + used
        out.total_s += used
    return out


def beat_pid(r: redis.Redis, root: int) -> int | None:
    """The worker's child that runs the beat (no process titles here: every process of
    the worker has the same command line): the one owning the pools' Redis connection
    with tracking on (the drop watcher's, ``CLIENT LIST`` flag ``t``)."""
    ports = {int(c["addr"].rsplit(":", 1)[1]) for c in r.client_list()
             if "t" in c.get("flags", "")}
    inodes = set()
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(name) as f:
            for line in list(f)[1:]:
                cols = line.split()
                if int(cols[1].rsplit(":", 1)[1], 16) in ports:
                    inodes.add(cols[9])
    for pid in _children().get(root, []):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:[") and link[8:-1] in inodes:
                return pid
    return None


POPPER = """
import signal, sys, time, redis
r = redis.Redis.from_url(sys.argv[1]); count = int(sys.argv[2]); interval = float(sys.argv[3])
keys = sys.stdin.read().split()
pops = empty = ids = 0; stop = False
def on_usr1(*_):
    global pops, empty, ids, t0
    pops, empty, ids, t0 = 0, 0, 0, time.monotonic()
def on_term(*_):
    global stop
    stop = True
signal.signal(signal.SIGUSR1, on_usr1); signal.signal(signal.SIGTERM, on_term)
t0 = time.monotonic(); next_at = time.monotonic()
print("ready", flush=True)
i = 0
while not stop:
    got = r.lpop(keys[i], count)
    i = (i + 1) % len(keys)
    pops += 1; ids += len(got or []); empty += not got
    next_at += interval
    delay = next_at - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    else:
        next_at = time.monotonic()  # behind: no burst to catch up
print(pops, empty, ids / (time.monotonic() - t0), flush=True)
"""


class BusyPoppers:
    """Processes popping ``LPOP key count`` from each busy tag ``pops_s`` times a second,
    the tags spread over the processes and each process's pops evenly over the second;
    empty pops counted from :meth:`count` on."""

    def __init__(self, url: str, keys: list[str], sizes: TagsSizes) -> None:
        self.procs = []
        shares = [keys[i :: sizes.poppers] for i in range(sizes.poppers)]
        for share in shares:
            interval = 1 / (len(share) * sizes.busy_pops_s)
            proc = subprocess.Popen(
                [sys.executable, "-c", POPPER, url, str(sizes.busy_count), str(interval)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                preexec_fn=die_with_parent(signal.SIGKILL),
            )
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write("\n".join(share))
            proc.stdin.close()
            proc.stdin = None
            proc.stdout.readline()  # ready
            self.procs.append(proc)
        self.pops = self.empty = 0
        self.rate = 0.0
        self.stopped = False

    def count(self) -> None:
        for proc in self.procs:
            proc.send_signal(signal.SIGUSR1)

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        for proc in self.procs:
            proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            out, _ = proc.communicate(timeout=30)
            pops, empty, rate = out.split()
            self.pops += int(pops)
            self.empty += int(empty)
            self.rate += float(rate)


# -- the worker ------------------------------------------------------------------------------


def worker_env(
    pool_url: str, broker_url: str, db_url: str, home: Path, **settings: str
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEAFPOOL_")}
    path = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env.update(
        {
            "LEAFPOOL_REDIS_URL": pool_url,
            "LEAFPOOL_BROKER_URL": broker_url,
            "LEAFPOOL_DATABASE_URL": db_url,
            "LEAFPOOL_HOME": str(home),
            "LEAFPOOL_SNOWFLAKE_MODE": "local",
            "PYTHONPATH": os.pathsep.join(path),
        }
    )
    env.update({f"LEAFPOOL_{k.upper()}": v for k, v in settings.items()})
    return env


# -- the database ----------------------------------------------------------------------------


def fresh_mysql(server_url: str, name: str) -> str:
    base, _, _ = server_url.rpartition("/")
    host_port = base.rsplit("@", 1)[1]
    host, port = host_port.split(":")
    conn = pymysql.connect(
        host=host, port=int(port), user="leafpool", password="leafpool", autocommit=True
    )
    with conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE {name}")
    conn.close()
    return f"{base}/{name}"


def insert_tags(store: SegmentStore, n: int) -> list[str]:
    """N segment rows in leaf_alloc (step 1,000) inserted with SQL; their names."""
    names = [f"s{i:06d}" for i in range(n)]
    with store.engine.begin() as conn:
        for lo in range(0, n, 2000):
            conn.execute(
                text(
                    "INSERT INTO leaf_alloc(biz_tag, max_id, step) VALUES "
                    + ",".join(f"('{t}', 1, 1000)" for t in names[lo : lo + 2000])
                )
            )
    return names


# -- the run ---------------------------------------------------------------------------------


@dataclass
class Run:
    tags: int
    busy: int
    sync_first: Cost | None = None
    sync_nothing_new: Cost | None = None
    sync_filled: Cost | None = None
    filled: int = 0
    fill_s: float | None = None  # until every tag had IDs (None: not within the timeout)
    busy_pops: int = 0
    busy_empty: int = 0
    busy_rate: float = 0.0
    reads: dict[str, Cost] = field(default_factory=dict)
    status_slowest: dict[str, float] = field(default_factory=dict)
    memory_total: int = 0
    memory_idle_tag: dict[str, int] = field(default_factory=dict)  # key kind -> bytes
    cpu_busy: WorkerCpu | None = None
    cpu_quiet: WorkerCpu | None = None


def sync_passes(run: Run, db_url: str) -> None:
    """The first sync of every row into an empty Redis, then a pass with nothing new (a
    Redis of its own: the worker's first fill below starts from an empty pool, as after
    an insert of N rows)."""
    from leafpool.housekeeping.sync import sync_tags

    store = SegmentStore.from_url(db_url)
    with servers.redis() as server:
        r = redis.Redis.from_url(server.extra["url"])
        pool = Pool(r)
        with measured(r) as run.sync_first:
            added = len(sync_tags(pool, store).added)
        assert added == run.tags, (added, run.tags)
        with measured(r) as run.sync_nothing_new:
            added = len(sync_tags(pool, store).added)
        assert added == 0, added
    store.engine.dispose()


def fill_and_measure(run: Run, sizes: TagsSizes, db_url: str, names: list[str],
                     home: Path, console: Console) -> None:
    from leafpool.housekeeping.sync import sync_tags

    with servers.redis() as pools_redis, servers.redis() as broker:
        url = pools_redis.extra["url"]
        r = redis.Redis.from_url(url)
        pool = Pool(r)
        before = int(r.info("memory")["used_memory"])
        env = worker_env(url, broker.extra["url"], db_url, home)
        busy = names[:: max(1, len(names) // run.busy)][: run.busy]
        poppers = BusyPoppers(url, [pool.tag(t).ids for t in busy], sizes)
        try:
            with servers.celery_worker(env, home, "fill") as worker:
                started = time.monotonic()
                deadline = started + sizes.fill_timeout_s
                # the tags are filled roughly in the order the sync queued them (the
                # rows' order): the first 2,000 not yet seen with IDs are read, the next
                # at once when all of them have IDs (100,000 LLENs a poll would cost
                # this process a second of CPU the worker shares)
                waiting = list(names)
                while waiting and time.monotonic() < deadline:
                    head = waiting[:2000]
                    lengths = _lengths(r, pool, head)
                    left = [n for n, length in zip(head, lengths, strict=True) if not length]
                    waiting = left + waiting[2000:]
                    if not waiting:
                        run.fill_s = time.monotonic() - started
                    elif left:
                        time.sleep(0.5)
                if waiting:
                    lengths = _lengths(r, pool, waiting)
                    waiting = [n for n, length in zip(waiting, lengths, strict=True)
                               if not length]
                run.filled = len(names) - len(waiting)
                poppers.count()
                console.print(f"  filled {run.filled:,}/{run.tags:,} in "
                              f"{time.monotonic() - started:.0f} s", highlight=False)
                used = int(r.info("memory")["used_memory"])
                run.memory_total = used - before
                busy_set = set(busy)
                idle = next(n for n in reversed(names) if n not in busy_set)
                for key in pool.tag(idle).all():
                    run.memory_idle_tag[key.rsplit(":", 1)[1]] = int(
                        r.memory_usage(key, samples=0) or 0)
                run.memory_idle_tag["set member (leafpool:tags)"] = round(
                    int(r.memory_usage(pool.keys.tags, samples=0) or 0) / max(r.scard(
                        pool.keys.tags), 1))
                read_costs(run, r, pool, env, sizes)
                store = SegmentStore.from_url(db_url)
                with measured(r) as run.sync_filled:
                    added = len(sync_tags(pool, store).added)
                assert added == 0, added
                store.engine.dispose()
                beat = beat_pid(r, worker.pid)
                run.cpu_busy = worker_cpu(worker.pid, sizes.busy_cpu_s, beat)
                poppers.stop()
                run.cpu_quiet = worker_cpu(worker.pid, sizes.quiet_s, beat)
        finally:
            poppers.stop()
        run.busy_pops, run.busy_empty, run.busy_rate = (
            poppers.pops, poppers.empty, poppers.rate)


def _lengths(r: redis.Redis, pool: Pool, names: list[str]) -> list[int]:
    out: list[int] = []
    for lo in range(0, len(names), 2000):
        pipe = r.pipeline(transaction=False)
        for name in names[lo : lo + 2000]:
            pipe.llen(pool.tag(name).ids)
        out += pipe.execute()
    return out


def read_costs(run: Run, r: redis.Redis, pool: Pool, env: dict[str, str],
               sizes: TagsSizes) -> None:
    from leafpool.housekeeping.sweep import sweep
    from leafpool.metrics import make_registry, render

    with measured(r) as run.reads["one sweep (sweep.sweep)"]:
        sweep(pool, 5)
    registry = make_registry(pool)
    with measured(r) as run.reads["one /metrics scrape (metrics.render)"]:
        render(registry)
    status = [sys.executable, "-m", "leafpool.cli", "status", "--json"]
    for name, argv in (("leafpool status --json", status),
                       ("leafpool status (plain table)", [*status[:-1], "--format", "plain"])):
        runs = []
        for _ in range(sizes.status_runs):
            with measured(r) as cost:
                subprocess.run(argv, env=env, cwd=ROOT, check=True, capture_output=True)
            runs.append(cost)
        runs.sort(key=lambda c: c.wall_s)
        label = f"{name} (its own process; median of {sizes.status_runs})"
        run.reads[label] = runs[(len(runs) - 1) // 2]
        run.status_slowest[label] = runs[-1].wall_s


# -- the report -------------------------------------------------------------------------------


def main(console: Console, sizes: TagsSizes) -> None:
    home = Path(tempfile.mkdtemp(prefix="leafpool-bench-tags-"))
    run = Run(sizes.tags, sizes.busy)
    with servers.mariadb() as db:
        db_url = fresh_mysql(db.extra["url"], "tags_bench")
        store = SegmentStore.from_url(db_url)
        store.init_schema()
        names = insert_tags(store, sizes.tags)
        store.engine.dispose()
        sync_passes(run, db_url)
        fill_and_measure(run, sizes, db_url, names, home, console)
    report(console, run, sizes)
    shutil.rmtree(home, ignore_errors=True)  # kept when a run fails: its worker logs


def report(console: Console, run: Run, sizes: TagsSizes) -> None:
    n = run.tags
    console.print(
        f"{n:,} segment tags (rows in leaf_alloc, step 1,000, inserted with SQL), one "
        f"`celery -A workers worker -B -c 2`; {run.busy:,} busy tags "
        f"({sizes.busy_share:.0%}) popped `LPOP key {sizes.busy_count}` "
        f"{sizes.busy_pops_s:g}/s each by {sizes.poppers} client process(es): "
        f"{sizes.busy_rate:,.0f} IDs/s in all (measured {run.busy_rate:,.0f}); "
        "the rest idle. Figures from a machine shared with other work unless said otherwise.",
        highlight=False,
    )
    targets = Table(title=f"{n:,} tags on one Redis: issue 30's targets")
    for col in ("what", "measured", "target", "met"):
        targets.add_column(col, justify="left" if col == "what" else "right")
    took = f"{run.fill_s:.1f} s" if run.fill_s is not None else (
        f"> {sizes.fill_timeout_s:.0f} s ({run.filled:,}/{n:,} filled)")
    targets.add_row("time until every tag has IDs (from the worker's start)", took,
                    f"<= {FILL_TARGET_S:.0f} s",
                    met(run.fill_s is not None and run.fill_s <= FILL_TARGET_S))
    # the memory and the idle CPU mean what they say only once every tag is filled: before,
    # the memory leaves out the lists not yet filled and the "quiet" minute is the fill's
    unfinished = "not judged: the fill did not finish"
    filled = run.fill_s is not None
    partly = "" if filled else f", only {run.filled:,} of {n:,} filled"
    targets.add_row(f"Redis used_memory of the tags (measured after the fill{partly})",
                    f"{run.memory_total / 1e6:,.1f} MB", f"< {MEMORY_TARGET_B / 1e6:.0f} MB",
                    met(run.memory_total < MEMORY_TARGET_B) if filled else unfinished)
    targets.add_row("  per tag", f"{run.memory_total / n:,.0f} B", "", "")
    if run.cpu_quiet:
        targets.add_row(f"worker's idle CPU (worker + pool + beat processes, a quiet "
                        f"{run.cpu_quiet.seconds:.0f} s)",
                        f"{run.cpu_quiet.share:.2%} of a core", f"< {IDLE_CPU_TARGET:.0%}",
                        met(run.cpu_quiet.share < IDLE_CPU_TARGET) if filled else unfinished)
    for name, c in run.reads.items():
        if name.startswith("leafpool status"):
            targets.add_row(f"{name}, wall", f"{c.wall_s:,.2f} s (its CPU "
                            f"{c.child_cpu_s:,.2f} s; slowest {run.status_slowest[name]:,.2f} s)",
                            f"< {STATUS_TARGET_S:.0f} s", met(c.wall_s < STATUS_TARGET_S))
    console.print(targets)

    costs = Table(title=f"{n:,} tags: one operation each (wall time, this process's CPU, "
                  "Redis CPU from INFO cpu; while the busy tags are popped)")
    for col in ("operation", "wall", "client CPU (this process or the CLI's)", "Redis CPU"):
        costs.add_column(col, justify="left" if col == "operation" else "right")

    def row(name: str, c: Cost | None) -> None:
        if c is None:
            return
        cpu = c.child_cpu_s if name.startswith("leafpool status") else c.cpu_s
        costs.add_row(name, f"{c.wall_s * 1000:,.0f} ms", f"{cpu * 1000:,.0f} ms",
                      f"{c.redis_cpu_s * 1000:,.0f} ms")

    row(f"tag sync, first ({n:,} new rows into an empty Redis)", run.sync_first)
    row("tag sync, nothing new (right after the first)", run.sync_nothing_new)
    row("tag sync, nothing new (the pools filled, states full)", run.sync_filled)
    for name, c in run.reads.items():
        row(name, c)
    console.print(costs)

    other = Table(title="the busy tags, Redis memory by key, the worker's CPU by process")
    other.add_column("what")
    other.add_column("figure", justify="right")
    other.add_row("busy tags' pops / empty, from the fill's end",
                  f"{run.busy_pops:,} / {run.busy_empty:,}")
    for kind, size in run.memory_idle_tag.items():
        other.add_row(f"an idle tag's {kind} (MEMORY USAGE)", f"{size:,} B")
    for label, cpu in (("busy tags popped", run.cpu_busy), ("quiet", run.cpu_quiet)):
        if cpu is None:
            continue
        other.add_row(f"worker CPU, {label} ({cpu.seconds:.0f} s), in all",
                      f"{cpu.total_s:,.2f} s ({cpu.share:.2%} of a core)")
        for proc, used in sorted(cpu.by_process.items()):
            other.add_row(f"  {proc}", f"{used:,.2f} s")
    console.print(other)
