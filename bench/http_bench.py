"""HTTP service throughput: single-ID requests/s and latency, and batch IDs/s, per core,
next to Leaf's published figure (50k QPS, TP999 1 ms, 4 cores: 12.5k QPS per core).

``python -m bench.http_bench [--duration 8] [--connections 64] [--loadgen auto|wrk|python]``

Setup: a redis-server with the shipped ``ops/redis/redis.conf`` (fsync always), one tag
pre-filled with enough IDs for the run (RPUSH, as a refill would), and the app served by
uvicorn in one worker process on a free loopback port. Load: Debian's ``wrk`` when it is
installed (``apt-get install wrk``), else an asyncio httpx client (which is then the
bottleneck, and the table says so). "Per core" divides by the CPU seconds the uvicorn
process actually used (from /proc), since the load generator and Redis share the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import redis
from rich.console import Console
from rich.table import Table
from starlette.applications import Starlette

from bench import servers
from bench.measure import met
from bench.servers import free_port, wait_until
from leafpool.children import die_with_parent
from leafpool.redis.pool import Pool

console = Console(width=170)
ROOT = Path(__file__).resolve().parent.parent  # the servers import bench.http_bench
TAG = "bench"
LEAF_QPS, LEAF_CORES, LEAF_TP999_MS = 50_000, 4, 1.0
WRK_SCRIPT = """
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "LEAFPOOL requests=%d duration_us=%d p50_us=%d p99_us=%d p999_us=%d non2xx=%d "
    .. "socket_errors=%d\\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    latency:percentile(99.9), e.status, e.connect + e.read + e.write + e.timeout))
end
"""


@dataclass
class Run:
    name: str
    ids_per_request: int
    requests: int
    seconds: float
    p50_ms: float
    p99_ms: float
    p999_ms: float
    failed: int
    server_cpu_s: float
    redis_cpu_s: float

    @property
    def rps(self) -> float:
        return self.requests / self.seconds

    @property
    def ids_per_s(self) -> float:
        return self.rps * self.ids_per_request

    @property
    def rps_per_core(self) -> float:
        return self.requests / self.server_cpu_s if self.server_cpu_s else float("nan")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def fill(url: str, ids: int) -> None:
    """Register the tag and RPUSH ``ids`` IDs in chunks (as a refill would)."""
    client = redis.Redis.from_url(url)
    Pool(client, "leafpool").register(TAG, "segment", 0)
    key = f"leafpool:{{{TAG}}}:ids"
    start = int(client.llen(key)) + 1 + int(client.hincrby(f"leafpool:{{{TAG}}}:state",
                                                          "bench_pushed", ids)) - ids
    chunk = 10_000
    for lo in range(start, start + ids, chunk):
        client.rpush(key, *range(lo, min(lo + chunk, start + ids)))
    client.close()


#: the ASGI servers compared, each serving the same app factory in one worker process;
#: the command line that starts one on a port
SERVERS: dict[str, Callable[[int, str], list[str]]] = {
    "uvicorn": lambda port, factory: [
        sys.executable, "-m", "uvicorn", "--factory", factory,
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
        "--loop", "uvloop", "--http", "httptools", "--no-access-log",
        "--log-level", "warning"],
    "granian": lambda port, factory: [
        sys.executable, "-m", "granian", "--interface", "asgi", "--factory", factory,
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1", "--loop", "uvloop",
        "--no-ws", "--log-level", "warning"],
}


def app_before() -> Starlette:
    """The request path before issue 10, for the comparison (bench only): the app
    without the lean path in front of Starlette's router (run it with
    LEAFPOOL_HTTP_COALESCE_MAX=0: one LPOP per request)."""
    from leafpool.http import app_from_env

    app = app_from_env()
    app.lean = None
    return app


def bare_app() -> Callable[..., object]:
    """The floor of the comparison (issue 30): a bare ASGI app answering every request
    with a constant ID as ``text/plain``, the same headers as the lean path, nothing else
    (no Redis, no routing, no metrics), served by the same server with the same flags."""
    body = b"1234567890123"
    headers = [(b"cache-control", b"no-store"), (b"content-length", str(len(body)).encode()),
               (b"content-type", b"text/plain; charset=utf-8")]
    start = {"type": "http.response.start", "status": 200, "headers": headers}
    answer = {"type": "http.response.body", "body": body}

    async def app(scope: dict[str, object], receive: Callable[..., object],
                  send: Callable[..., object]) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()  # type: ignore[misc]
                kind = message["type"]
                if kind == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})  # type: ignore[misc]
                elif kind == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})  # type: ignore[misc]
                    return
        await send(start)  # type: ignore[misc]
        await send(answer)  # type: ignore[misc]

    return app


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of a process and its descendants (granian serves from a child)."""
    total, todo = 0.0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += cpu_seconds(p)
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def start_app(config: Config, redis_url: str,
              home: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The app as ``config`` says, under its server."""
    port = free_port()
    env = {**os.environ, "LEAFPOOL_REDIS_URL": redis_url, "LEAFPOOL_HOME": str(home),
           "LEAFPOOL_DATABASE_URL": f"sqlite:///{home / 'leafpool.sqlite3'}",
           "LEAFPOOL_HTTP_MAX_COUNT": "1000"}
    if not config.coalesce:
        env["LEAFPOOL_HTTP_COALESCE_MAX"] = "0"
    if config.in_flight:
        env["LEAFPOOL_HTTP_COALESCE_IN_FLIGHT"] = str(config.in_flight)
    factory = ("bench.http_bench:bare_app" if config.bare
               else "leafpool.http:app_from_env" if config.lean else "bench.http_bench:app_before")
    proc = subprocess.Popen(SERVERS[config.server](port, factory), env=env,
                            start_new_session=True, cwd=ROOT,
                            preexec_fn=die_with_parent())
    base = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        import urllib.request
        with urllib.request.urlopen(f"{base}/health", timeout=2) as resp:
            return bool(resp.status == 200)

    # bounded polling: the servers say nothing to a parent process when they serve
    wait_until(ready, 30, config.server)
    return proc, base


def stop_app(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGTERM)  # the server's session: granian's worker too
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def run_wrk(url: str, duration: float, connections: int, threads: int) -> dict[str, int]:
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(WRK_SCRIPT)
    try:
        done = subprocess.run(
            # wrk takes whole seconds only ("-d0.3s" is refused)
            ["wrk", f"-t{threads}", f"-c{connections}", f"-d{max(1, math.ceil(duration))}s",
             "--timeout", "5s",
             "-s", script.name, url],
            capture_output=True, text=True, timeout=duration + 60, check=True)
    finally:
        os.unlink(script.name)
    line = next(ln for ln in done.stdout.splitlines() if ln.startswith("LEAFPOOL "))
    return {k: int(v) for k, v in (kv.split("=") for kv in line.split()[1:])}


async def _python_load(url: str, duration: float, connections: int) -> dict[str, int]:
    import httpx

    latencies: list[int] = []
    counts = {"ok": 0, "non2xx": 0, "socket_errors": 0}
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    async with httpx.AsyncClient(limits=limits, timeout=5.0) as client:
        deadline = time.perf_counter() + duration

        async def worker() -> None:
            clock = time.perf_counter_ns
            while time.perf_counter() < deadline:
                t0 = clock()
                try:
                    resp = await client.get(url)
                except httpx.HTTPError:
                    counts["socket_errors"] += 1
                    continue
                latencies.append((clock() - t0) // 1000)
                counts["ok" if resp.status_code == 200 else "non2xx"] += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(connections)))
        elapsed = time.perf_counter() - started
    latencies.sort()

    def pct(q: float) -> int:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] if latencies else 0

    return {"requests": len(latencies), "duration_us": int(elapsed * 1e6), "p50_us": pct(0.5),
            "p99_us": pct(0.99), "p999_us": pct(0.999), "non2xx": counts["non2xx"],
            "socket_errors": counts["socket_errors"]}


def measure(name: str, url: str, ids_per_request: int, loadgen: str, duration: float,
            connections: int, server_pid: int, redis_pid: int) -> Run:
    cpu0, rcpu0 = tree_cpu_seconds(server_pid), cpu_seconds(redis_pid)
    if loadgen == "wrk":
        raw = run_wrk(url, duration, connections, threads=1)
    else:
        raw = asyncio.run(_python_load(url, duration, connections))
    return Run(name, ids_per_request, raw["requests"], raw["duration_us"] / 1e6,
               raw["p50_us"] / 1000, raw["p99_us"] / 1000, raw["p999_us"] / 1000,
               raw["non2xx"] + raw["socket_errors"], tree_cpu_seconds(server_pid) - cpu0,
               cpu_seconds(redis_pid) - rcpu0)


#: a profile's frames by where they come from (their file's path), for the summary
PARTS = (("leafpool", "leafpool"), ("starlette", "starlette"), ("uvicorn", "uvicorn"),
         ("redis-py", "redis"), ("prometheus_client", "prometheus_client"),
         ("asyncio and the event loop (uvloop)", "asyncio"))


def _part(frame: str) -> str:
    """A frame (``func (path/to/file.py:line)``, py-spy's raw format) by its package."""
    path = frame.rpartition(" (")[2]
    for name, package in PARTS:
        if path.startswith(f"{package}/") or f"/{package}/" in path:
            return name
    return "other"


def profile(server_pid: int, url: str, duration: float, connections: int,
            loadgen: str, redis_pid: int) -> Table | None:
    """py-spy's samples of the server under the single-ID load: each part's share of the
    server's time (self time: where the samples were), and leafpool's heaviest frames
    (inclusive). None when py-spy cannot run here (not installed, not allowed to trace)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        return None
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "profile.txt"
        rec = subprocess.Popen(
            [spy, "record", "-p", str(server_pid), "-d", str(max(1, math.ceil(duration))),
             "-r", "250", "--format", "raw", "-o", str(out), "--nonblocking"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        measure("profile", url, 1, loadgen, duration, connections, server_pid, redis_pid)
        if rec.wait(timeout=duration + 60) != 0 or not out.exists():
            return None
        lines = out.read_text().splitlines()
    own: dict[str, int] = {}
    ours: dict[str, int] = {}
    total = 0
    for line in lines:
        stack, _, count = line.rpartition(" ")
        n = int(count)
        frames = stack.split(";")
        total += n
        own[_part(frames[-1])] = own.get(_part(frames[-1]), 0) + n
        for frame in set(frames):
            if _part(frame) == "leafpool":
                ours[frame] = ours.get(frame, 0) + n
    if not total:
        return None
    t = Table(title=f"Where the server's time goes, single ID at {connections} connections "
                    f"(py-spy, {total:,} samples; self time by part, then leafpool's "
                    "heaviest frames, inclusive)")
    t.add_column("part or frame")
    t.add_column("share", justify="right")
    for name, n in sorted(own.items(), key=lambda kv: -kv[1]):
        t.add_row(name, f"{n / total:.1%}")
    for frame, n in sorted(ours.items(), key=lambda kv: -kv[1])[:12]:
        t.add_row(f"  {frame.split(' (')[0]} ({frame.rsplit('/', 1)[-1]}", f"{n / total:.1%}")
    return t


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # tests/system/test_bench_imports.py blocks what the extra lacks
        return False


def median_run(runs: list[Run]) -> Run:
    """One case over its rounds: the round with the median req/s per core, with each
    latency percentile the median of the rounds' (failures summed)."""
    mid = sorted(runs, key=lambda r: r.rps_per_core)[len(runs) // 2]
    med = statistics.median
    return Run(mid.name, mid.ids_per_request, mid.requests, mid.seconds,
               med(r.p50_ms for r in runs), med(r.p99_ms for r in runs),
               med(r.p999_ms for r in runs), sum(r.failed for r in runs), mid.server_cpu_s,
               mid.redis_cpu_s)


@dataclass(frozen=True)
class Config:
    """One server process: which ASGI server, whether the bare single-ID request takes
    the lean path (leafpool/http/fast.py) or Starlette's router, and whether
    single-ID requests share pops (leafpool/redis/coalesce.py)."""

    server: str
    lean: bool = True
    coalesce: bool = True
    bare: bool = False  # the bare ASGI app (bare_app), the floor
    in_flight: int = 0  # LEAFPOOL_HTTP_COALESCE_IN_FLIGHT; 0: the shipped default

    @property
    def label(self) -> str:
        if self.bare:
            return f"{self.server} bare ASGI app"
        if not self.lean and not self.coalesce:
            return f"{self.server} before"
        return (f"{self.server} {'lean' if self.lean else 'router'}"
                f"{' + coalesced' if self.coalesce else ''}"
                f"{f' ({self.in_flight} in flight)' if self.in_flight else ''}")


BASELINE = Config("uvicorn", lean=False, coalesce=False)  # the path before issue 10
BARE = Config("uvicorn", bare=True)  # the floor: issue 30 compares the default with it
#: LEAFPOOL_HTTP_COALESCE_IN_FLIGHT values measured beside the shipped one (issue 30: fewer
#: pops of a tag in flight means more requests per pop, less CPU, and a wait behind the pop
#: in flight)
IN_FLIGHT_ALSO = (4,)  # the default before issue 30


def _config(case: Run) -> str:
    return case.name.split(" | ")[0]


def table(runs: list[Run], loadgen: str, fsync: str) -> Table:
    t = Table(title=f"HTTP service, 1 worker process per server, load: {loadgen}; Redis "
                    f"appendfsync {fsync}. before: Starlette's router, one LPOP per request "
                    "(the path before issue 10); lean: the single-ID request answered in "
                    "front of the router; coalesced: concurrent requests share one LPOP. "
                    "Per core: per CPU second of the server's processes; vs before: req/s "
                    "per core against uvicorn before at the same connections")
    for col in ("server, path", "case", "req/s", "IDs/s", "p50 ms", "p99 ms", "p999 ms",
                "failed", "server CPU", "Redis CPU", "req/s per core", "vs before",
                "vs bare ASGI", "vs Leaf per core"):
        t.add_column(col, justify="left" if col in ("server, path", "case") else "right")
    leaf_per_core = LEAF_QPS / LEAF_CORES
    before = {r.name.split(" | ")[1]: r for r in runs if _config(r) == BASELINE.label}
    bare = {r.name.split(" | ")[1]: r for r in runs if _config(r) == BARE.label}
    for r in runs:
        config, case = r.name.split(" | ")
        base, floor = before.get(case), bare.get(case)
        ratio = f"{r.rps_per_core / base.rps_per_core:.2f}x" if base else "-"
        vs_bare = f"{r.rps_per_core / floor.rps_per_core:.2f}x" if floor else "-"
        t.add_row(config, case, f"{r.rps:,.0f}", f"{r.ids_per_s:,.0f}", f"{r.p50_ms:.2f}",
                  f"{r.p99_ms:.2f}", f"{r.p999_ms:.2f}", f"{r.failed:,}",
                  f"{r.server_cpu_s / r.seconds:.0%}", f"{r.redis_cpu_s / r.seconds:.0%}",
                  f"{r.rps_per_core:,.0f}", ratio, vs_bare,
                  f"{r.rps_per_core * r.ids_per_request / leaf_per_core:.2f}x")
    t.add_row("Leaf (published)", "segment, 4 cores", f"{LEAF_QPS:,}", f"{LEAF_QPS:,}", "-",
              "-", f"{LEAF_TP999_MS:.2f}", "-", f"{LEAF_CORES} cores", "-",
              f"{leaf_per_core:,.0f}", "-", "-", "1.00x")
    return t


def targets(runs: list[Run], default: Config, connections: int) -> Table:
    """Issue 10's targets for the shipped default (``leafpool serve``)."""
    t = Table(title=f"Targets: the default ({default.label}) against Leaf per core")
    for col in ("what", "measured", "target", "met"):
        t.add_column(col)
    by = {r.name: r for r in runs}
    wide = by.get(f"{default.label} | single ID, {connections} conns")
    narrow = by.get(f"{default.label} | single ID, 4 conns")
    per_core = LEAF_QPS / LEAF_CORES
    if wide:
        t.add_row(f"req/s per server core, {connections} connections",
                  f"{wide.rps_per_core:,.0f}", f">= {per_core:,.0f}",
                  met(wide.rps_per_core >= per_core))
    floor = by.get(f"{BARE.label} | single ID, {connections} conns")
    if wide and floor:
        ratio = wide.rps_per_core / floor.rps_per_core
        t.add_row(f"req/s per server core against the bare ASGI app, {connections} "
                  "connections (issue 30)", f"{ratio:.2f}x", ">= 0.50x (aim 0.60x)",
                  met(ratio >= 0.5))
    if narrow:
        t.add_row("p99 at 4 connections", f"{narrow.p99_ms:.2f} ms",
                  f"<= {LEAF_TP999_MS:g} ms", met(narrow.p99_ms <= LEAF_TP999_MS))
    return t


def watch_fsyncs(url: str) -> None:
    """Redis's latency monitor on: each fsync of 1 ms or more is recorded
    (``aof-fsync-always``: the fsync before a reply under ``appendfsync always``)."""
    client = redis.Redis.from_url(url)
    client.config_set("latency-monitor-threshold", 1)
    client.execute_command("LATENCY", "RESET")  # type: ignore[no-untyped-call]
    client.close()


def fsync_latency(url: str) -> str:
    """What the latency monitor saw of the fsyncs: its events of 1 ms or more (the last
    160 seconds' worst per second) as their count, median and worst."""
    client = redis.Redis.from_url(url)
    try:
        history = client.execute_command(  # type: ignore[no-untyped-call]
            "LATENCY", "HISTORY", "aof-fsync-always")
    finally:
        client.close()
    worst = sorted(int(ms) for _, ms in history)
    if not worst:
        return "no fsync of 1 ms or more"
    return (f"{len(worst)} seconds with an fsync of 1 ms or more; their worst: median "
            f"{statistics.median(worst):g} ms, max {worst[-1]} ms")


def fsync_arm(runs: list[Run], default: Config, args: argparse.Namespace, loadgen: str,
              fsyncs: str) -> Table:
    """The extra arm (not the headline): the default served again from a Redis at
    ``appendfsync everysec``, beside its figures at ``always`` from the rounds above, so
    the share of the fsync before each pop's reply in the latency shows."""
    by = {r.name: r for r in runs}
    arm: dict[str, list[Run]] = {}
    with servers.redis("--appendfsync", "everysec") as server, \
            tempfile.TemporaryDirectory() as home:
        assert server.proc is not None
        fill(server.extra["url"], int(60_000 * max(args.duration, 1.0) * 2 * args.rounds + 1))
        proc, base = start_app(default, server.extra["url"], Path(home))
        try:
            single = f"{base}/api/segment/get/{TAG}"
            measure("warm-up", single, 1, loadgen, min(1.0, args.duration), args.connections,
                    proc.pid, server.proc.pid)
            for _ in range(args.rounds):
                for conns in (args.connections, 4):
                    name = f"{default.label}, everysec | single ID, {conns} conns"
                    arm.setdefault(name, []).append(measure(
                        name, single, 1, loadgen, args.duration, conns, proc.pid,
                        server.proc.pid))
        finally:
            stop_app(proc)
    t = Table(title="Extra arm, not the headline: the default on a Redis at appendfsync "
                    "everysec (an fsync a second, in the background) beside appendfsync "
                    "always (an fsync before each pop's reply), measured after the rounds "
                    f"above. Redis's latency monitor during those rounds: {fsyncs}")
    for col in ("Redis", "case", "req/s", "p50 ms", "p99 ms", "p999 ms", "Redis CPU",
                "req/s per core"):
        t.add_column(col, justify="left" if col in ("Redis", "case") else "right")
    for conns in (args.connections, 4):
        case = f"single ID, {conns} conns"
        pairs = (("appendfsync always", by.get(f"{default.label} | {case}")),
                 ("appendfsync everysec", median_run(arm[f"{default.label}, everysec | {case}"])))
        for fsync, r in pairs:
            if r is not None:
                t.add_row(fsync, case, f"{r.rps:,.0f}", f"{r.p50_ms:.2f}", f"{r.p99_ms:.2f}",
                          f"{r.p999_ms:.2f}", f"{r.redis_cpu_s / r.seconds:.0%}",
                          f"{r.rps_per_core:,.0f}")
    return t


def main(argv: list[str] | None = None) -> None:
    from leafpool.http.app import DEFAULT_SERVER

    parser = argparse.ArgumentParser(prog="python -m bench.http_bench")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per case")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--batch", type=int, default=100, help="IDs per batch request")
    parser.add_argument("--rounds", type=int, default=3,
                        help="interleaved rounds; the table shows each case's median")
    parser.add_argument("--loadgen", choices=["auto", "wrk", "python"], default="auto")
    parser.add_argument("--no-profile", dest="profile", action="store_false",
                        help="skip the py-spy profile of the default (run after the rounds)")
    parser.add_argument("--fsync", choices=["always", "everysec"], default="always",
                        help="Redis appendfsync (the shipped config: always)")
    parser.add_argument("--no-fsync-arm", dest="fsync_arm", action="store_false",
                        help="skip the extra arm: the default again on a Redis at appendfsync "
                             "everysec (where the p99 at 4 connections goes, issue 30)")
    installed = [n for n in SERVERS if _installed(n)]
    parser.add_argument("--servers", default=",".join(installed),
                        help=f"ASGI servers to compare (of {', '.join(SERVERS)})")
    args = parser.parse_args(argv)
    loadgen = args.loadgen
    if loadgen == "auto":
        loadgen = "wrk" if shutil.which("wrk") else "python"
    names = [n for n in args.servers.split(",") if n]
    unknown = [n for n in names if n not in SERVERS]
    if unknown:
        parser.error(f"--servers: unknown {', '.join(unknown)} (known: {', '.join(SERVERS)})")
    impl = ", ".join(f"{m}: {'yes' if _installed(m) else 'no'}"
                     for m in ("uvloop", "httptools", "granian"))
    console.print(f"leafpool HTTP benchmark on {platform.node()} ({os.cpu_count()} cores, "
                  f"Python {platform.python_version()}; {impl}; load generator {loadgen})")
    if loadgen == "python":
        console.print("[yellow]wrk not installed: the Python load generator shares the "
                      "cores and limits the figures (apt-get install wrk)[/yellow]")
    default = Config(DEFAULT_SERVER)
    configs = [BASELINE, Config(BASELINE.server, coalesce=False),
               *(Config(n) for n in [DEFAULT_SERVER, *names]),
               *(Config(DEFAULT_SERVER, in_flight=n) for n in IN_FLIGHT_ALSO), BARE]
    configs = [c for c in dict.fromkeys(configs) if c.server in names]

    # enough IDs that no case runs the pool dry (the table reports any failed request)
    cases = len(configs) * 2 * args.rounds + 1  # + the profile
    single_ids = int(60_000 * max(args.duration, 1.0) * cases)
    batch_ids = int(15_000 * args.batch * max(args.duration, 1.0) * 2 * args.rounds)
    rounds: dict[str, list[Run]] = {}
    with servers.redis("--appendfsync", args.fsync) as server, \
            tempfile.TemporaryDirectory() as home, ExitStack() as stack:
        assert server.proc is not None
        rpid = server.proc.pid
        fill(server.extra["url"], single_ids + batch_ids)
        watch_fsyncs(server.extra["url"])
        apps = {}
        for config in configs:  # every server up at once; an idle one costs nothing
            proc, base = start_app(config, server.extra["url"], Path(home))
            stack.callback(stop_app, proc)
            apps[config] = proc, base
            # warm-up: connections, the tag's mode cache, the allocator
            measure("warm-up", f"{base}/api/segment/get/{TAG}", 1, loadgen,
                    min(1.0, args.duration), args.connections, proc.pid, rpid)
        for _ in range(args.rounds):  # interleaved: each round sees the same machine
            for config, (proc, base) in apps.items():
                single = f"{base}/api/segment/get/{TAG}"
                for conns in (args.connections, 4):
                    name = f"{config.label} | single ID, {conns} conns"
                    rounds.setdefault(name, []).append(measure(
                        name, single, 1, loadgen, args.duration, conns, proc.pid, rpid))
                if config in (BASELINE, default):
                    name = f"{config.label} | batch ?count={args.batch}, {args.connections} conns"
                    rounds.setdefault(name, []).append(measure(
                        name, f"{single}?count={args.batch}", args.batch, loadgen,
                        args.duration, args.connections, proc.pid, rpid))
        fsyncs = fsync_latency(server.extra["url"])
        spied = None
        if args.profile and default in apps:
            proc, base = apps[default]
            spied = profile(proc.pid, f"{base}/api/segment/get/{TAG}", args.duration,
                            args.connections, loadgen, rpid)
    runs = [median_run(rs) for rs in rounds.values()]
    console.print(table(runs, loadgen, args.fsync))
    console.print(targets(runs, default, args.connections))
    if args.fsync_arm and args.fsync == "always" and default in apps:
        console.print(fsync_arm(runs, default, args, loadgen, fsyncs))
    if spied is not None:
        console.print(spied)
    elif args.profile:
        console.print("[yellow]no profile: py-spy missing or not allowed to trace the "
                      "server (it needs ptrace: root, or kernel.yama.ptrace_scope 0)[/yellow]")
    if any(r.failed for r in runs):
        console.print("[red]some requests failed (non-2xx or socket errors): see 'failed'[/red]")


if __name__ == "__main__":
    main()
