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
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import redis
from rich.console import Console
from rich.table import Table

from bench import servers
from bench.servers import free_port, wait_until
from leafpool.children import die_with_parent
from leafpool.pool import Pool

console = Console(width=150)
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


def start_app(redis_url: str, home: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "LEAFPOOL_REDIS_URL": redis_url, "LEAFPOOL_HOME": str(home),
           "LEAFPOOL_DATABASE_URL": f"sqlite:///{home / 'leafpool.sqlite3'}",
           "LEAFPOOL_HTTP_MAX_COUNT": "1000"}
    argv = [sys.executable, "-m", "uvicorn", "--factory", "leafpool.http:app_from_env",
            "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
            "--no-access-log", "--log-level", "warning"]
    proc = subprocess.Popen(argv, env=env, start_new_session=True,
                            preexec_fn=die_with_parent())
    base = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        import urllib.request
        with urllib.request.urlopen(f"{base}/health", timeout=2) as resp:
            return bool(resp.status == 200)

    # bounded polling: uvicorn says nothing to a parent process when it starts serving
    wait_until(ready, 30, "uvicorn")
    return proc, base


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
    cpu0, rcpu0 = cpu_seconds(server_pid), cpu_seconds(redis_pid)
    if loadgen == "wrk":
        raw = run_wrk(url, duration, connections, threads=1)
    else:
        raw = asyncio.run(_python_load(url, duration, connections))
    return Run(name, ids_per_request, raw["requests"], raw["duration_us"] / 1e6,
               raw["p50_us"] / 1000, raw["p99_us"] / 1000, raw["p999_us"] / 1000,
               raw["non2xx"] + raw["socket_errors"], cpu_seconds(server_pid) - cpu0,
               cpu_seconds(redis_pid) - rcpu0)


def table(runs: list[Run], loadgen: str, fsync: str) -> Table:
    t = Table(title=f"HTTP service, uvicorn 1 worker process, load: {loadgen}; Redis "
                    f"appendfsync {fsync}; per core = per CPU second of the uvicorn process")
    for col in ("case", "req/s", "IDs/s", "p50 ms", "p99 ms", "p999 ms", "failed",
                "server CPU", "req/s per core", "IDs/s per core", "vs Leaf per core"):
        t.add_column(col, justify="left" if col == "case" else "right")
    leaf_per_core = LEAF_QPS / LEAF_CORES
    for r in runs:
        t.add_row(r.name, f"{r.rps:,.0f}", f"{r.ids_per_s:,.0f}", f"{r.p50_ms:.2f}",
                  f"{r.p99_ms:.2f}", f"{r.p999_ms:.2f}", f"{r.failed:,}",
                  f"{r.server_cpu_s / r.seconds:.0%}", f"{r.rps_per_core:,.0f}",
                  f"{r.rps_per_core * r.ids_per_request:,.0f}",
                  f"{r.rps_per_core * r.ids_per_request / leaf_per_core:.2f}x")
    t.add_row("Leaf (published): segment, 4 cores", f"{LEAF_QPS:,}", f"{LEAF_QPS:,}", "-", "-",
              f"{LEAF_TP999_MS:.2f}", "-", f"{LEAF_CORES} cores", f"{leaf_per_core:,.0f}",
              f"{leaf_per_core:,.0f}", "1.00x")
    return t


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.http_bench")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds per case")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--batch", type=int, default=100, help="IDs per batch request")
    parser.add_argument("--loadgen", choices=["auto", "wrk", "python"], default="auto")
    parser.add_argument("--fsync", choices=["always", "everysec"], default="always",
                        help="Redis appendfsync (the shipped config: always)")
    args = parser.parse_args(argv)
    loadgen = args.loadgen
    if loadgen == "auto":
        loadgen = "wrk" if shutil.which("wrk") else "python"
    impl = ", ".join(f"{m}: {'yes' if importlib.util.find_spec(m) else 'no'}"
                     for m in ("uvloop", "httptools"))
    console.print(f"leafpool HTTP benchmark on {platform.node()} ({os.cpu_count()} cores, "
                  f"Python {platform.python_version()}; {impl}; load generator {loadgen})")
    if loadgen == "python":
        console.print("[yellow]wrk not installed: the Python load generator shares the "
                      "cores and limits the figures (apt-get install wrk)[/yellow]")

    # enough IDs that no case runs the pool dry (the table reports any failed request)
    single_ids = int(40_000 * args.duration * 2)
    batch_ids = int(15_000 * args.batch * args.duration)
    with servers.redis("--appendfsync", args.fsync) as server, \
            tempfile.TemporaryDirectory() as home:
        assert server.proc is not None
        fill(server.extra["url"], single_ids + batch_ids)
        proc, base = start_app(server.extra["url"], Path(home))
        try:
            single = f"{base}/api/segment/get/{TAG}"
            batch = f"{base}/api/segment/get/{TAG}?count={args.batch}"
            # warm-up: connections, the tag's mode cache, the allocator
            measure("warm-up", single, 1, loadgen, min(1.0, args.duration), args.connections,
                    proc.pid, server.proc.pid)
            runs = [
                measure(f"single ID: GET /api/segment/get/{{tag}}, {args.connections} conns",
                        single, 1, loadgen, args.duration, args.connections, proc.pid,
                        server.proc.pid),
                measure("single ID, 4 connections (shallow queue)", single, 1,
                        loadgen, args.duration, 4, proc.pid, server.proc.pid),
                measure(f"batch: ?count={args.batch}, {args.connections} conns", batch,
                        args.batch, loadgen,
                        args.duration, args.connections, proc.pid, server.proc.pid),
            ]
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    console.print(table(runs, loadgen, args.fsync))
    for r in runs:
        console.print(f"{r.name}: Redis used {r.redis_cpu_s / r.seconds:.0%} of a core")
    if any(r.failed for r in runs):
        console.print("[red]some requests failed (non-2xx or socket errors): see 'failed'[/red]")


if __name__ == "__main__":
    main()
