"""The whole pipeline near Redis's own pop rate (issue 30, item 3): ``python -m bench --only
pipeline``.

Two arms, rounds interleaved (limit, pipeline, limit, pipeline, ...) so that the machine's
noise hits both alike, on one redis-server and then on a 3-master Redis Cluster on loopback
(no replicas), each with the shipped ``ops/redis/redis.conf`` (``appendfsync always``):

- **limit**: four client processes call ``Client.next_ids(tag, 100)`` as fast as they can,
  each cycling over the tags, from lists pre-filled (outside the timed part: restored
  from the ``DUMP`` of a list a Lua loop filled once, then an AOF rewrite waited out)
  with more IDs than the run takes, nothing refilling: the Redis limit of these clients
  on this machine;
- **pipeline**: the same clients with the ``wait`` policy on tags of a real
  ``celery -A workers worker -B -c 2`` with the shipped defaults (the drop watcher in the
  beat on one Redis; the sweep every second on a Cluster, where the watcher does not run),
  SQLite, table step 100,000. Each round starts from the pools as the worker keeps them
  (the first at the floor, after the first fill), warms up, then is measured. Empty pops
  (calls that found the list short and took the empty-pool path) are counted in both
  phases; after the warm-up they must be 0.

Reported: IDs/s of each arm (median of the rounds), the ratio (target >= 0.7x), the
empty pops, and the CPU split of each measured window from ``/proc`` (the clients, the
pools' redis-server(s), the broker's redis-server, the worker's process group, everything
else on the machine), in cores (CPU seconds per wall second) and in CPU microseconds per
1,000 IDs delivered. On a Cluster the target is 1,000,000 IDs/s; the table beside it gives
the CPU one ID costs there and the rate the machine's cores would allow at that cost.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from rich.console import Console
from rich.table import Table

from bench import servers
from bench.measure import met

ROOT = Path(__file__).resolve().parent.parent
CLIENTS = 4
BATCH = 100
TABLE_STEP = 100_000
LIMIT_PREFIX = "limit"  # the limit arm's lists: a key prefix no worker knows
PIPE_PREFIX = "leafpool"  # the shipped key prefix, the worker's
RATIO_TARGET = 0.7
CLUSTER_TARGET = 1_000_000
FIRST_ID = 10_000_000_000  # the limit arm's IDs: 11 digits, like a busy tag's
CLK_TCK = os.sysconf("SC_CLK_TCK")
CORES = os.cpu_count() or 1


@dataclass(frozen=True)
class PipelineSizes:
    rounds: int = 3
    limit_s: float = 2.0  # the limit arm's timed window
    warm_s: float = 10.0  # the pipeline arm's warm-up
    measure_s: float = 5.0  # the pipeline arm's measured window
    fill_rate: int = 6_000_000  # IDs/s the limit arm's lists are sized for (x 1.3)
    cluster: bool = True
    single_tags: int = 4
    tags_per_master: int = 2


FULL = PipelineSizes()
QUICK = PipelineSizes(rounds=2, limit_s=1.5, warm_s=8.0, measure_s=3.0)
SMOKE = PipelineSizes(rounds=1, limit_s=0.3, warm_s=0.5, measure_s=0.5, fill_rate=50_000,
                      single_tags=2, tags_per_master=1)


# -- CPU from /proc ------------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str]:
    """``/proc/PID/stat`` after the command name (field 3, the state, is index 0)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    return text.rsplit(")", 1)[1].split()


def proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` (all its threads); 0 once it is gone."""
    try:
        f = _stat_fields(pid)
    except (OSError, IndexError):
        return 0.0
    return (int(f[11]) + int(f[12])) / CLK_TCK


def group_cpu_s(pgid: int) -> float:
    """CPU seconds of the live processes of process group ``pgid``."""
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            f = _stat_fields(int(entry))
        except (OSError, IndexError):
            continue
        if int(f[2]) == pgid:
            total += (int(f[11]) + int(f[12])) / CLK_TCK
    return total


def machine_cpu_s() -> tuple[float, float]:
    """The machine's busy and total CPU seconds since boot (``/proc/stat``, all cores)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    total = sum(values[:8])  # guest time is already in user
    return (total - idle) / CLK_TCK, total / CLK_TCK


GROUPS = ("clients", "redis", "broker", "workers", "other")


@dataclass
class CpuSample:
    at: float
    parts: dict[str, float]
    busy: float
    total: float


@dataclass
class Watched:
    """The processes whose CPU is split out."""

    clients: list[int]
    redis: list[int]
    broker: int | None
    worker_pgid: int | None

    def sample(self) -> CpuSample:
        busy, total = machine_cpu_s()
        return CpuSample(time.time(), {
            "clients": sum(proc_cpu_s(p) for p in self.clients),
            "redis": sum(proc_cpu_s(p) for p in self.redis),
            "broker": proc_cpu_s(self.broker) if self.broker else 0.0,
            "workers": group_cpu_s(self.worker_pgid) if self.worker_pgid else 0.0,
        }, busy, total)


def cpu_split(a: CpuSample, b: CpuSample) -> dict[str, float]:
    """CPU seconds of each group between two samples; ``other`` is the machine's busy time
    no watched process accounts for (this process, other people's work)."""
    out = {k: b.parts[k] - a.parts[k] for k in a.parts}
    out["other"] = max(0.0, (b.busy - a.busy) - sum(out.values()))
    return out


# -- clients --------------------------------------------------------------------------------


@dataclass
class Phase:
    ids: int = 0
    calls: int = 0
    empty: int = 0  # calls that found the list short: the empty-pool path (an empty hit)
    waited_s: float = 0.0  # time those calls spent in it
    pool_empty: int = 0  # PoolEmpty raised
    errors: int = 0
    wall_s: float = 0.0
    dry: bool = False  # limit arm: a pre-filled list ran out before the window's end


def _client(conf: dict[str, Any], prefix: str, tags: list[str], index: int, policy: str,
            lengths: list[float], gate: Any, start_at: Any, out: Any) -> None:
    """``next_ids(tag, BATCH)`` as fast as it can, cycling over ``tags`` from ``index``,
    through phases of ``lengths`` seconds from ``start_at`` (wall clock, shared)."""
    from leafpool.client import Client
    from leafpool.core.config import load_settings
    from leafpool.core.errors import LeafpoolError, PoolEmpty

    phases = [Phase() for _ in lengths]
    now_in = [0]

    class Counting(Client):
        def _on_empty(self, tag: str, n: int, got: list[int]) -> list[int]:
            t0 = time.perf_counter()
            try:
                return super()._on_empty(tag, n, got)
            finally:
                phase = phases[now_in[0]]
                phase.empty += 1
                phase.waited_s += time.perf_counter() - t0

    client = Counting(settings=load_settings(**conf, key_prefix=prefix), policy=policy)
    for tag in tags:  # connected to every node the tags live on before the start
        client.pool.is_known(tag)
    out.put(None)
    gate.wait()
    begin = start_at.value
    if (delay := begin - time.time()) > 0:
        time.sleep(delay)
    n, k, dry = len(tags), index, False
    for i, length in enumerate(lengths):
        phase, end = phases[i], begin + length
        now_in[0] = i
        now = time.time()
        while now < end and not dry:
            try:
                phase.ids += len(client.next_ids(tags[k % n], BATCH))
            except PoolEmpty as exc:
                phase.pool_empty += 1
                phase.ids += len(exc.partial or [])
                dry = phase.dry = policy == "raise"
            except LeafpoolError:
                phase.errors += 1
            phase.calls += 1
            k += 1
            now = time.time()
        phase.wall_s = min(now, end) - begin
        begin = end
    client.close()
    out.put((index, phases))


@dataclass
class ClientRun:
    phases: list[list[Phase]]  # per client, per phase
    cpu: list[CpuSample]  # at the start and at each phase's end


def run_clients(conf: dict[str, Any], prefix: str, tags: list[str], policy: str,
                lengths: list[float], watched: Watched,
                at_boundary: Callable[[int], None] | None = None) -> ClientRun:
    """CLIENTS processes started together once each is connected; the CPU sampled at the
    start and at each phase's end (``at_boundary(i)`` called there too)."""
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    gate = ctx.Event()
    start_at = ctx.Value("d", 0.0)
    procs = [ctx.Process(target=_client, args=(conf, prefix, tags, i, policy, lengths, gate,
                                               start_at, out), daemon=True)
             for i in range(CLIENTS)]
    for p in procs:
        p.start()
    try:
        for _ in procs:
            out.get(timeout=60)
        watched.clients = [p.pid for p in procs if p.pid is not None]
        start = time.time() + 0.2
        start_at.value = start
        gate.set()
        time.sleep(max(0.0, start - time.time()))
        samples = [watched.sample()]
        edge = start
        for i, length in enumerate(lengths):
            edge += length
            time.sleep(max(0.0, edge - time.time()))
            samples.append(watched.sample())
            if at_boundary:
                at_boundary(i)
        reports: dict[int, list[Phase]] = {}
        for _ in procs:
            index, phases = out.get(timeout=60)
            reports[index] = phases
        for p in procs:
            p.join(30)
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    return ClientRun([reports[i] for i in range(CLIENTS)], samples)


def rate(phases: list[Phase]) -> float:
    """IDs/s of the clients together in one phase: each client's IDs over its own window
    (shorter when its list ran dry), added up."""
    return sum(p.ids / p.wall_s for p in phases if p.wall_s > 0)


# -- the topologies ---------------------------------------------------------------------------

FILL_LUA = """
local key, lo, hi = KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2])
local t, n = {}, 0
for i = lo, hi - 1 do
  n = n + 1
  t[n] = i
  if n == 5000 then
    redis.call('RPUSH', key, unpack(t))
    t, n = {}, 0
  end
end
if n > 0 then redis.call('RPUSH', key, unpack(t)) end
return redis.call('LLEN', key)
"""
FILL_CALL = 20_000  # IDs per script call: a short busy spell of the node each


@dataclass
class Rig:
    """One topology with its worker running: what the arms need of it."""

    name: str
    conf: dict[str, Any]  # load_settings overrides for the clients (where Redis is)
    tags: list[str]
    admin: Any  # redis.Redis or RedisCluster: routes every key to its node
    node_of: Callable[[str], redis.Redis]  # a plain client of the node serving a key
    nodes: list[redis.Redis]  # every master
    watched: Watched
    log: Path


def template(rig: Rig, per_tag: int) -> bytes:
    """One list of ``per_tag`` IDs filled by a Lua loop on its node, as ``DUMP`` serializes
    it: each limit round restores it into every tag's list (the same IDs in each: only
    the pops are measured)."""
    key = f"{LIMIT_PREFIX}:{{template}}:ids"
    node = rig.node_of(key)
    node.delete(key)
    script = node.register_script(FILL_LUA)
    for lo in range(FIRST_ID, FIRST_ID + per_tag, FILL_CALL):
        script(keys=[key], args=[lo, min(lo + FILL_CALL, FIRST_ID + per_tag)])
    payload = node.dump(key)
    node.unlink(key)
    assert isinstance(payload, bytes)
    return payload


def _fill(rig: Rig, payload: bytes) -> float:
    """The limit arm's lists, restored from ``payload`` (a memory copy of its listpacks),
    then an AOF rewrite on every node waited out (``RESTORE`` writes the whole payload
    into the AOF): the timed window sees neither. Returns the seconds it took."""
    from leafpool.redis.pool import Pool

    t0 = time.perf_counter()
    for tag in rig.tags:
        key = f"{LIMIT_PREFIX}:{{{tag}}}:ids"
        rig.node_of(key).restore(key, 0, payload, replace=True)
    for tag in rig.tags:  # known to the pool: an empty list says "empty", not "unknown"
        Pool(rig.admin, LIMIT_PREFIX).register(tag, "segment", 0)
    for node in rig.nodes:
        with contextlib.suppress(redis.ResponseError):  # one already under way
            node.bgrewriteaof()
    servers.wait_until(lambda: not any(_rewriting(n) for n in rig.nodes), 120,
                       "AOF rewrite after the fill")
    return time.perf_counter() - t0


def _rewriting(node: redis.Redis) -> bool:
    info = node.info("persistence")
    return bool(info.get("aof_rewrite_in_progress") or info.get("aof_rewrite_scheduled"))


def _drop_limit_lists(rig: Rig) -> None:
    for tag in rig.tags:
        key = f"{LIMIT_PREFIX}:{{{tag}}}:ids"
        rig.node_of(key).unlink(key)


def _worker_env(redis_env: dict[str, str], broker_url: str, db_url: str,
                home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEAFPOOL_")}
    path = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env.update({**redis_env, "LEAFPOOL_BROKER_URL": broker_url,
                "LEAFPOOL_DATABASE_URL": db_url, "LEAFPOOL_HOME": str(home),
                "PYTHONPATH": os.pathsep.join(path)})
    return env


def _store(db_url: str, tags: list[str]) -> None:
    from leafpool.segment.store import SegmentStore

    store = SegmentStore.from_url(db_url)
    store.init_schema()
    for tag in tags:
        store.add_tag(tag, step=TABLE_STEP)
    store.engine.dispose()


def _first_fill(rig: Rig, timeout: float = 90.0) -> None:
    def filled() -> bool:
        for tag in rig.tags:
            state, lock = f"{PIPE_PREFIX}:{{{tag}}}:state", f"{PIPE_PREFIX}:{{{tag}}}:lock"
            if not rig.admin.hget(state, "refills") or rig.admin.exists(lock):
                return False
        return True

    servers.wait_until(filled, timeout, f"{rig.name}: the worker's first fill of every tag")


@contextlib.contextmanager
def single_rig(sizes: PipelineSizes, home: Path) -> Iterator[Rig]:
    tags = [f"p{i}" for i in range(sizes.single_tags)]
    with servers.redis() as pools, servers.redis() as broker:
        url = pools.extra["url"]
        db_url = f"sqlite:///{home}/single.sqlite3"
        _store(db_url, tags)
        node = redis.Redis.from_url(url)
        env = _worker_env({"LEAFPOOL_REDIS_URL": url}, broker.extra["url"], db_url, home)
        with servers.celery_worker(env, home, "single") as worker:
            assert pools.proc is not None and broker.proc is not None
            rig = Rig("one redis-server", {"redis_url": url}, tags, node, lambda _key: node,
                      [node],
                      Watched([], [pools.proc.pid], broker.proc.pid, worker.pid),
                      home / "single.log")
            _first_fill(rig)
            yield rig
        node.close()


def _spread_tags(rc: Any, masters: int, per_master: int) -> list[str]:
    """Tag names ``p0, p1, ...`` kept until each master serves ``per_master`` of them."""
    by_node: dict[str, list[str]] = {}
    i = 0
    while sum(min(len(v), per_master) for v in by_node.values()) < masters * per_master:
        tag = f"p{i}"
        node = rc.get_node_from_key(f"{{{tag}}}").name
        if len(by_node.setdefault(node, [])) < per_master:
            by_node[node].append(tag)
        i += 1
    return sorted((t for v in by_node.values() for t in v), key=lambda t: int(t[1:]))


@contextlib.contextmanager
def cluster_rig(sizes: PipelineSizes, home: Path) -> Iterator[Rig]:
    from tests.support import topologies

    # Redis's default node timeout (the topologies' 1 s is for failover tests): a node
    # starved of CPU on a loaded machine is not failed by the others mid-run
    top = topologies.cluster(3, 0, node_timeout_ms=15_000)
    try:
        with servers.redis() as broker:
            rc = top.client()
            tags = _spread_tags(rc, 3, sizes.tags_per_master)
            masters = top.masters()
            plain = {f"{topologies.HOST}:{m.port}": m.client() for m in masters}

            def node_of(key: str) -> redis.Redis:
                return plain[rc.get_node_from_key(key).name]  # type: ignore[no-untyped-call]

            db_url = f"sqlite:///{home}/cluster.sqlite3"
            _store(db_url, tags)
            conf = {"redis_url": top.url, "redis_cluster": True,
                    "broker_url": broker.extra["url"]}
            env = _worker_env({"LEAFPOOL_REDIS_URL": top.url, "LEAFPOOL_REDIS_CLUSTER": "true"},
                              broker.extra["url"], db_url, home)
            with servers.celery_worker(env, home, "cluster") as worker:
                assert broker.proc is not None
                rig = Rig("3-master Redis Cluster", conf, tags, rc, node_of,
                          list(plain.values()),
                          Watched([], [m.pid for m in masters], broker.proc.pid, worker.pid),
                          home / "cluster.log")
                _first_fill(rig)
                yield rig
            for c in plain.values():
                c.close()
            rc.close()
    finally:
        top.stop()


# -- the arms -------------------------------------------------------------------------------


@dataclass
class ArmRound:
    ids_per_s: float
    cpu: dict[str, float]  # CPU seconds of each group in the measured window
    wall_s: float
    ids: int
    busy_s: float  # the machine's busy CPU seconds in the window
    empty_warm: int = 0
    empty_measured: int = 0
    waited_warm_s: float = 0.0
    waited_measured_s: float = 0.0
    pool_empty: int = 0
    errors: int = 0
    dry: int = 0  # limit: clients whose list ran out
    fill_s: float = 0.0
    pushed_per_s: float = 0.0  # pipeline: IDs pushed by the refills in the window
    empty_hits: int = 0  # pipeline: the tags' empty_hits during the whole round


def limit_round(rig: Rig, sizes: PipelineSizes, payload: bytes) -> ArmRound:
    fill_s = _fill(rig, payload)
    try:
        run = run_clients(rig.conf, LIMIT_PREFIX, rig.tags, "raise", [sizes.limit_s],
                          rig.watched)
    finally:
        _drop_limit_lists(rig)
    phases = [c[0] for c in run.phases]
    return ArmRound(rate(phases), cpu_split(run.cpu[0], run.cpu[1]),
                    run.cpu[1].at - run.cpu[0].at, sum(p.ids for p in phases),
                    run.cpu[1].busy - run.cpu[0].busy,
                    pool_empty=sum(p.pool_empty for p in phases),
                    errors=sum(p.errors for p in phases), dry=sum(p.dry for p in phases),
                    fill_s=fill_s)


def _tag_sums(rig: Rig, name: str) -> int:
    """``name`` added up over the tags: a field of the state the refills write
    (``pushed_total``) or of the hits the clients count (``empty_hits``)."""
    from leafpool.redis.pool import Pool

    pool = Pool(rig.admin, PIPE_PREFIX)
    return sum(int(rig.admin.hget(pool.tag(t).hits if name == "empty_hits" else
                                  pool.tag(t).state, name) or 0) for t in rig.tags)


def pipeline_round(rig: Rig, sizes: PipelineSizes) -> ArmRound:
    pushed: list[tuple[float, int]] = []
    hits0 = _tag_sums(rig, "empty_hits")

    def at_boundary(_i: int) -> None:
        pushed.append((time.time(), _tag_sums(rig, "pushed_total")))

    at_boundary(-1)
    run = run_clients(rig.conf, PIPE_PREFIX, rig.tags, "wait", [sizes.warm_s, sizes.measure_s],
                      rig.watched, at_boundary)
    warm = [c[0] for c in run.phases]
    measured = [c[1] for c in run.phases]
    (t1, p1), (t2, p2) = pushed[1], pushed[2]
    return ArmRound(
        rate(measured), cpu_split(run.cpu[1], run.cpu[2]), run.cpu[2].at - run.cpu[1].at,
        sum(p.ids for p in measured), run.cpu[2].busy - run.cpu[1].busy,
        empty_warm=sum(p.empty for p in warm), empty_measured=sum(p.empty for p in measured),
        waited_warm_s=sum(p.waited_s for p in warm),
        waited_measured_s=sum(p.waited_s for p in measured),
        pool_empty=sum(p.pool_empty for p in warm + measured),
        errors=sum(p.errors for p in warm + measured),
        pushed_per_s=(p2 - p1) / (t2 - t1) if t2 > t1 else 0.0,
        empty_hits=_tag_sums(rig, "empty_hits") - hits0)


@dataclass
class TopologyResult:
    name: str
    tags: int
    limit: list[ArmRound] = field(default_factory=list)
    pipeline: list[ArmRound] = field(default_factory=list)

    @staticmethod
    def median(rounds: list[ArmRound]) -> float:
        return statistics.median(r.ids_per_s for r in rounds) if rounds else 0.0

    @property
    def ratio(self) -> float:
        limit = self.median(self.limit)
        return self.median(self.pipeline) / limit if limit else 0.0


def measure(rig: Rig, sizes: PipelineSizes, console: Console) -> TopologyResult:
    result = TopologyResult(rig.name, len(rig.tags))
    per_tag = int(sizes.fill_rate * sizes.limit_s * 1.3 / len(rig.tags)) + BATCH * CLIENTS
    t0 = time.perf_counter()
    payload = template(rig, per_tag)
    console.print(f"  {rig.name}: the limit arm's list of {per_tag:,} IDs a tag built in "
                  f"{time.perf_counter() - t0:.1f} s", highlight=False)
    for n in range(sizes.rounds):
        console.print(f"  {rig.name}: round {n + 1}/{sizes.rounds}", highlight=False)
        result.limit.append(limit_round(rig, sizes, payload))
        result.pipeline.append(pipeline_round(rig, sizes))
    return result


# -- tables ---------------------------------------------------------------------------------


def _r(v: float) -> str:
    return f"{v:,.0f}"


def _cores(r: ArmRound, group: str) -> float:
    return r.cpu[group] / r.wall_s if r.wall_s else 0.0


def _us_per_kid(r: ArmRound, group: str) -> float:
    return r.cpu[group] / r.ids * 1e9 if r.ids else 0.0


def rounds_table(res: TopologyResult) -> Table:
    t = Table(title=f"{res.name}: each round ({CLIENTS} client processes, next_ids(tag, "
                    f"{BATCH}) over {res.tags} tags; CPU in cores busy in the window)")
    for col in ("round", "arm", "IDs/s", "empty pops warm-up / measured (s waited)",
                "PoolEmpty / errors", "pushed/s", "fill s", "clients", "redis", "broker",
                "workers", "other", "machine busy"):
        t.add_column(col, justify="left" if col in ("arm", "round") else "right")
    for n, (lim, pipe) in enumerate(zip(res.limit, res.pipeline, strict=True), 1):
        for arm, r in (("limit", lim), ("pipeline", pipe)):
            empties = (f"{r.empty_warm} ({r.waited_warm_s:.2f}) / {r.empty_measured} "
                       f"({r.waited_measured_s:.2f}); empty_hits {r.empty_hits}"
                       if arm == "pipeline"
                       else f"- (ran dry: {r.dry})")
            t.add_row(str(n), arm, _r(r.ids_per_s), empties, f"{r.pool_empty} / {r.errors}",
                      _r(r.pushed_per_s) if arm == "pipeline" else "-",
                      f"{r.fill_s:.1f}" if arm == "limit" else "-",
                      *(f"{_cores(r, g):.2f}" for g in GROUPS),
                      f"{r.busy_s / r.wall_s:.2f} of {CORES}" if r.wall_s else "-")
    return t


def cost_table(results: list[TopologyResult]) -> Table:
    t = Table(title="CPU per 1,000 IDs delivered (us, median of the rounds) and the rate "
                    "the machine's cores allow at that cost")
    for col in ("topology", "arm", "clients", "redis", "broker", "workers",
                "watched total", f"IDs/s at {CORES} cores x that cost"):
        t.add_column(col, justify="left" if col in ("topology", "arm") else "right")
    for res in results:
        for arm, rounds in (("limit", res.limit), ("pipeline", res.pipeline)):
            per = {g: statistics.median(_us_per_kid(r, g) for r in rounds)
                   for g in ("clients", "redis", "broker", "workers")}
            total = sum(per.values())
            t.add_row(res.name, arm, *(f"{per[g]:.0f}" for g in per), f"{total:.0f}",
                      _r(CORES * 1e9 / total) if total else "-")
    return t


def targets_table(results: list[TopologyResult]) -> Table:
    t = Table(title="Targets (issue 30, item 3)")
    for col in ("what", "measured", "target", "met"):
        t.add_column(col)
    for res in results:
        lim, pipe = TopologyResult.median(res.limit), TopologyResult.median(res.pipeline)
        t.add_row(f"{res.name}: pipeline / limit IDs/s ({_r(pipe)} / {_r(lim)})",
                  f"{res.ratio:.2f}x", f">= {RATIO_TARGET}x", met(res.ratio >= RATIO_TARGET))
        after = sum(r.empty_measured for r in res.pipeline)
        during = sum(r.empty_warm for r in res.pipeline)
        t.add_row(f"{res.name}: empty pops after the warm-up (during it: {during})",
                  str(after), "0", met(after == 0))
        if res.name.startswith("3-master"):
            t.add_row(f"{res.name}: IDs/s delivered by the pipeline", _r(pipe),
                      f">= {CLUSTER_TARGET:,}", met(pipe >= CLUSTER_TARGET))
    return t


def main(console: Console, sizes: PipelineSizes) -> list[TopologyResult]:
    console.print(f"pipeline: {CLIENTS} clients next_ids(tag, {BATCH}) as fast as they can; "
                  f"limit (pre-filled, nothing refilling) and pipeline (celery worker -B -c 2, "
                  f"shipped defaults) interleaved, {sizes.rounds} round(s); machine: "
                  f"{CORES} cores", highlight=False)
    home = Path(tempfile.mkdtemp(prefix="leafpool-pipeline-"))
    results: list[TopologyResult] = []
    try:
        rigs: list[Callable[[PipelineSizes, Path], contextlib.AbstractContextManager[Rig]]] = [
            single_rig]
        if sizes.cluster:
            rigs.append(cluster_rig)
        for make in rigs:
            with make(sizes, home) as rig:
                res = measure(rig, sizes, console)
            results.append(res)
            console.print(rounds_table(res))
        console.print(cost_table(results))
        console.print(targets_table(results))
        console.print("CPU: /proc (user + system) of the client processes, the pools' "
                      "redis-server(s), the broker's redis-server and the worker's process "
                      "group; other = the machine's busy time none of them accounts for "
                      "(this process, other people's work on a shared machine). The cluster "
                      "runs the sweep every second instead of the drop watcher (not on a "
                      "Cluster).", highlight=False)
    finally:
        shutil.rmtree(home, ignore_errors=True)
    return results
