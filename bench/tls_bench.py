"""TLS benchmark (issue 18): what TLS to Redis costs a pop.

One redis-server (the shipped config, ``appendfsync always``) listening on a plain port
and, beside it, a TLS port with client certificates required (a throwaway CA made with
``openssl``, tests/support/tls.py). In one run, rounds interleaved, over each port:
plain ``LPOP`` and ``LPOP 100`` (redis-py), ``Client.next_id`` and
``Client.next_ids(tag, 100)``, and a new connection with one ``PING`` (what a handshake
costs a client that does not keep its connections). The ratios are TLS over TCP, round by
round (the median, and the range over the rounds).
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
from collections.abc import Callable
from pathlib import Path

import redis
from rich.console import Console
from rich.table import Table

from bench import pools
from bench.measure import Result, interleaved
from leafpool.client import Client
from leafpool.core.config import load_settings
from leafpool.redis.pool import Pool
from tests.support import servers
from tests.support.tls import Pki, make_pki

ROUNDS = 5
TAG = pools.TAG


def _cases(url: str, label: str, tls: dict[str, object], pki: Pki, single: int, batch: int,
           connects: int) -> list[tuple[Result, Callable[[], object], int]]:
    r = redis.Redis.from_url(url, **tls)
    env = {k.removeprefix("LEAFPOOL_").lower(): v for k, v in pki.settings_env().items()}
    settings = load_settings(redis_url=url, **(env if tls else {}))  # type: ignore[arg-type]
    client = Client(settings=settings, policy="raise")

    def connect_ping() -> None:
        with redis.Redis.from_url(url, **tls) as fresh:
            fresh.ping()

    return [
        (Result(f"{label}: LPOP (redis-py)", 1), lambda: r.lpop(pools.IDS_KEY), single),
        (Result(f"{label}: Client.next_id", 1), lambda: client.next_id(TAG), single),
        (Result(f"{label}: LPOP count 100 (redis-py)", 100),
         lambda: r.lpop(pools.IDS_KEY, 100), batch),
        (Result(f"{label}: Client.next_ids(100)", 100), lambda: client.next_ids(TAG, 100),
         batch),
        (Result(f"{label}: new connection + PING", 1), connect_ping, connects),
    ]


def _ratio(tls: Result, tcp: Result) -> tuple[float, float, float]:
    """TLS/TCP IDs/s: the median of the rounds' ratios, and their range."""
    ratios = [a / b for a, b in zip(tls.rates, tcp.rates, strict=True)]
    return statistics.median(ratios), min(ratios), max(ratios)


def main(console: Console, single: int, batch: int, connects: int) -> None:
    home = Path(tempfile.mkdtemp(prefix="leafpool-bench-tls-"))
    try:
        pki = make_pki(home / "pki")
        tls_port = servers.free_port()
        server = servers.redis_server(
            tls_args=lambda port: [*pki.tls_args(tls_port), "--port", str(port)])
        try:
            plain = f"redis://127.0.0.1:{server.port}/0"
            secure = f"rediss://127.0.0.1:{tls_port}/0"
            options = {k: v for k, v in pki.client_options().items() if k != "ssl"}
            admin = redis.Redis.from_url(plain)
            Pool(admin).register(TAG, "segment", 0)
            cases = (_cases(plain, "TCP", {}, pki, single, batch, connects)
                     + _cases(secure, "TLS", options, pki, single, batch, connects))
            need = 2 * 2 * single + 2 * 2 * 100 * batch + 1000
            results = interleaved(cases, ROUNDS,
                                  before_round=lambda: pools.prefill(admin, need))
            admin.close()
        finally:
            server.stop()
    finally:
        shutil.rmtree(home, ignore_errors=True)

    table = Table(title=f"TLS (mutual, TLS 1.3) against plain TCP, one redis-server, "
                        f"median of {ROUNDS} interleaved rounds")
    for col in ("case", "IDs/s", "p50 us", "p99 us"):
        table.add_column(col, justify="right" if col != "case" else "left")
    for r in results:
        table.add_row(r.name, f"{r.ids_per_s:,.0f}", f"{r.pct_us(0.5):.1f}",
                      f"{r.pct_us(0.99):.1f}")
    console.print(table)
    by = {r.name: r for r in results}
    ratios = Table(title="TLS / TCP, IDs/s (median of the rounds' ratios, and their range)")
    for col in ("what", "TLS / TCP", "range"):
        ratios.add_column(col)
    for what in ("LPOP (redis-py)", "Client.next_id", "LPOP count 100 (redis-py)",
                 "Client.next_ids(100)", "new connection + PING"):
        median, low, high = _ratio(by[f"TLS: {what}"], by[f"TCP: {what}"])
        ratios.add_row(what, f"{median:.2f}x", f"{low:.2f}-{high:.2f}x")
    console.print(ratios)
