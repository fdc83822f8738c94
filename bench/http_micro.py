"""The HTTP single-ID path's own CPU, without the network (issue 30): an in-process uvloop
loop calls the ASGI app ``app(scope, receive, send)`` for ``GET /api/segment/get/{tag}``
from many concurrent tasks against a real redis-server, and the same harness calls the
bare ASGI app of :mod:`bench.http_bench`. What is left of the server (uvicorn's parser,
its transport) is a few dict lookups here, so the difference of the two per-request CPU
figures is what leafpool's path costs, pop included (redis-py, hiredis, the loop's
wake-ups for the reply); ``--profile`` prints cProfile's summary of where it goes.

``python -m bench.http_micro [--requests 60000] [--tasks 64] [--rounds 3] [--profile]
[--fsync always|everysec]``

The receive and send are uvicorn's own (its httptools request cycle, ``run_asgi``
included) over a transport that counts the bytes written instead of sending them. A
task sends its next request once the previous one was answered, as a keep-alive
connection does.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import logging
import os
import pstats
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import redis
from rich.console import Console
from rich.table import Table
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from bench import servers
from bench.http_bench import TAG, bare_app, fill

console = Console(width=170)
App = Callable[[dict[str, Any], Callable[[], Awaitable[dict[str, Any]]],
                Callable[[dict[str, Any]], Awaitable[None]]], Awaitable[None]]
PATH = f"/api/segment/get/{TAG}"


class Transport(asyncio.Transport):
    """What uvicorn's request cycle asks of its transport: the response is counted, not
    sent."""

    def __init__(self) -> None:
        super().__init__()
        self.written = 0
        self.status = b""  # of the last response

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += len(data)
        if data[:5] == b"HTTP/":
            self.status = bytes(data[9:12])

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _cycle(scope: dict[str, Any], transport: Transport, flow: FlowControl) -> RequestResponseCycle:
    """uvicorn's (httptools) request cycle as it stands when the app is called for a GET:
    headers and the (empty) body parsed, the message event set."""
    event = asyncio.Event()
    cycle = RequestResponseCycle(
        scope=scope, transport=transport, flow=flow, logger=_LOG, access_logger=_LOG,  # type: ignore[arg-type]
        access_log=False, default_headers=[], message_event=event,
        expect_100_continue=False, keep_alive=True, on_response=_nothing)
    cycle.more_body = False
    event.set()
    return cycle


def _nothing() -> None:
    pass


_LOG = logging.getLogger(__name__)


def _scope() -> dict[str, Any]:
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "1.1", "server": ("127.0.0.1", 8000),
            "client": ("127.0.0.1", 50000), "scheme": "http", "method": "GET",
            "root_path": "", "path": PATH, "raw_path": PATH.encode(), "query_string": b"",
            "headers": [(b"host", b"127.0.0.1:8000"), (b"user-agent", b"wrk")],
            "state": {}}


async def _load(app: App, requests: int, tasks: int) -> tuple[int, int]:
    """``requests`` requests from ``tasks`` tasks; (answered 200, other)."""
    template = _scope()
    left = [requests]
    ok = [0, 0]

    async def worker() -> None:
        transport = Transport()
        flow = FlowControl(transport)
        while left[0] > 0:
            left[0] -= 1
            transport.status = b""
            cycle = _cycle(dict(template), transport, flow)
            await cycle.run_asgi(app)  # type: ignore[arg-type]
            ok[0 if cycle.response_complete and transport.status == b"200" else 1] += 1

    await asyncio.gather(*(worker() for _ in range(tasks)))
    return ok[0], ok[1]


def _leafpool_app(redis_url: str, home: Path) -> tuple[App, Any]:
    os.environ.update({"LEAFPOOL_REDIS_URL": redis_url, "LEAFPOOL_HOME": str(home),
                       "LEAFPOOL_DATABASE_URL": f"sqlite:///{home / 'leafpool.sqlite3'}"})
    from leafpool.core.config import get_settings
    from leafpool.http.app import create_app

    get_settings.cache_clear()
    app = create_app(get_settings())
    return app, app.router.lifespan_context(app)  # type: ignore[return-value]


def lpops(redis_url: str) -> int:
    """LPOPs Redis has run so far."""
    client = redis.Redis.from_url(redis_url)
    try:
        stats = client.info("commandstats")
    finally:
        client.close()
    return int(stats.get("cmdstat_lpop", {}).get("calls", 0))


async def _measure(app: App, requests: int, tasks: int,
                   profiler: cProfile.Profile | None = None) -> tuple[float, float, int]:
    """(CPU us per request, wall s, failed) of one run."""
    await _load(app, min(2_000, requests), tasks)  # warm-up: connections, the mode cache
    cpu0, wall0 = time.process_time(), time.perf_counter()
    if profiler is not None:
        profiler.enable()
    ok, failed = await _load(app, requests, tasks)
    if profiler is not None:
        profiler.disable()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return cpu / (ok + failed) * 1e6, wall, failed


async def _run(args: argparse.Namespace, redis_url: str, home: Path) -> None:
    app, lifespan = _leafpool_app(redis_url, home)
    bare: App = bare_app()  # type: ignore[assignment]
    ours: list[float] = []
    floor: list[float] = []
    failed = 0
    pops: list[int] = []
    async with lifespan:
        for _ in range(args.rounds):  # interleaved: each round sees the same machine
            before = lpops(redis_url)
            us, _wall, bad = await _measure(app, args.requests, args.tasks)
            pops.append(lpops(redis_url) - before)
            ours.append(us)
            failed += bad
            us, _wall, _ = await _measure(bare, args.requests, args.tasks)
            floor.append(us)
        # CPU time, not wall: a write that wakes Redis on a busy machine waits its turn
        profiler = cProfile.Profile(time.thread_time) if args.profile else None
        if profiler is not None:
            await _measure(app, args.requests, args.tasks, profiler)
    med = statistics.median
    t = Table(title=f"HTTP single-ID path in process (uvloop, {args.tasks} tasks, "
                    f"{args.requests:,} requests a round, median of {args.rounds} rounds; "
                    f"Redis appendfsync {args.fsync}): CPU of this process per request")
    for col in ("app", "us per request", "rounds (us)", "requests per LPOP", "failed"):
        t.add_column(col, justify="left" if col == "app" else "right")
    per_pop = (args.requests + min(2_000, args.requests)) / max(1, med(pops))
    t.add_row("leafpool (lean path, coalesced)", f"{med(ours):.1f}",
              " ".join(f"{u:.1f}" for u in ours), f"{per_pop:.1f}", f"{failed:,}")
    t.add_row("bare ASGI app", f"{med(floor):.1f}", " ".join(f"{u:.1f}" for u in floor), "-",
              "0")
    t.add_row("leafpool's own (difference)", f"{med(ours) - med(floor):.1f}", "", "", "")
    console.print(t)
    if profiler is not None:
        out = io.StringIO()
        stats = pstats.Stats(profiler, stream=out)
        stats.sort_stats(args.sort).print_stats(args.top)
        console.print(f"cProfile (CPU time) of one leafpool round ({args.requests:,} "
                      f"requests; cProfile inflates small calls), by {args.sort}:")
        console.print(out.getvalue(), markup=False, highlight=False)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.http_micro")
    parser.add_argument("--requests", type=int, default=60_000, help="requests per round")
    parser.add_argument("--tasks", type=int, default=64, help="concurrent requests")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true",
                        help="one more leafpool round under cProfile, and its summary")
    parser.add_argument("--sort", default="tottime", help="cProfile's sort key")
    parser.add_argument("--top", type=int, default=30, help="cProfile's rows")
    parser.add_argument("--fsync", choices=["always", "everysec"], default="always",
                        help="Redis appendfsync (the shipped config: always)")
    args = parser.parse_args(argv)
    import uvloop

    with servers.redis("--appendfsync", args.fsync) as server, \
            tempfile.TemporaryDirectory() as home:
        fill(server.extra["url"], (args.rounds + 2) * (args.requests + 2_000) + 10_000)
        uvloop.run(_run(args, server.extra["url"], Path(home)))


if __name__ == "__main__":
    main()
