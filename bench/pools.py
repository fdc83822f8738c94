"""Pool benchmarks (issue: segment-mode pools). Every figure in one run, side by side:

- pops: plain LPOP, LPOP 100, Client.next_id, Client.next_ids(100), Redis INCR, and a
  MariaDB Flickr-style ticket server, on the shipped Redis config (appendfsync always)
  and on appendfsync everysec;
- LPOP latency while refills run continuously, at chunk sizes 1,000 and 10,000;
- refill throughput of one refiller, against what one client pops;
- Redis memory per pooled ID against a bare list of the same IDs;
- the durability cost with many clients (redis-benchmark, 50 connections).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pymysql
import redis

from bench import servers
from bench.measure import Result, interleaved
from leafpool.children import die_with_parent
from leafpool.client import Client
from leafpool.core.config import load_settings
from leafpool.redis.lock import RefillLock
from leafpool.redis.pool import Pool, Range
from leafpool.segment.refiller import SegmentRefiller
from leafpool.segment.store import SegmentStore

ROOT = Path(__file__).resolve().parent.parent
TAG = "bench"
IDS_KEY = f"leafpool:{{{TAG}}}:ids"
ROUNDS = 3


def prefill(r: redis.Redis, count: int, start: int = 1_000_000) -> None:
    """Fill the bench pool fast (setup, not measured)."""
    r.delete(IDS_KEY)
    batch = 10_000
    pipe = r.pipeline(transaction=False)
    for lo in range(start, start + count, batch):
        pipe.rpush(IDS_KEY, *range(lo, min(lo + batch, start + count)))
        if len(pipe) >= 20:
            pipe.execute()
    pipe.execute()


class _EveryStringParsed(Pool):
    """The batch pop before it read a contiguous run from its two ends: every decimal
    string parsed (the baseline of issue 10's next_ids target)."""

    def pop_many(self, tag: str, count: int) -> list[int]:
        raw = self.redis.lpop(self.tag(tag).ids, count)
        return list(map(int, raw)) if raw else []  # type: ignore[call-overload]


def pops(url: str, label: str, single_ops: int, batch_ops: int) -> list[Result]:
    r = redis.Redis.from_url(url)
    Pool(r).register(TAG, "segment", 0)
    client = Client(r, settings=load_settings(redis_url=url), policy="raise")
    before = Client(r, settings=load_settings(redis_url=url), policy="raise")
    before.pool = _EveryStringParsed(r)
    cases: list[tuple[Result, Callable[[], object], int]] = [
        (Result(f"{label}: LPOP (redis-py)", 1), lambda: r.lpop(IDS_KEY), single_ops),
        (Result(f"{label}: Client.next_id", 1), lambda: client.next_id(TAG), single_ops),
        (Result(f"{label}: LPOP count 100 (redis-py)", 100), lambda: r.lpop(IDS_KEY, 100),
         batch_ops),
        (Result(f"{label}: Client.next_ids(100)", 100), lambda: client.next_ids(TAG, 100),
         batch_ops),
        (Result(f"{label}: Client.next_ids(100), every string parsed (before)", 100),
         lambda: before.next_ids(TAG, 100), batch_ops),
        (Result(f"{label}: INCR (not durable as an ID source)", 1),
         lambda: r.incr("bench:counter"), single_ops),
    ]
    need = 2 * single_ops + 3 * 100 * batch_ops + 1000
    return interleaved(cases, ROUNDS, before_round=lambda: prefill(r, need))


def ticket_server(ops: int) -> list[Result]:
    with servers.mariadb() as db:
        conn = pymysql.connect(host="127.0.0.1", port=db.port, user="leafpool",
                               password="leafpool", database="leafpool", autocommit=True)
        with conn.cursor() as cur:
            cur.execute("CREATE TABLE tickets64 (id bigint unsigned NOT NULL auto_increment,"
                        " stub char(1) NOT NULL default '', PRIMARY KEY (id),"
                        " UNIQUE KEY stub (stub)) ENGINE=InnoDB")
        cur = conn.cursor()

        def ticket() -> int:
            cur.execute("REPLACE INTO tickets64 (stub) VALUES ('a')")
            cur.execute("SELECT LAST_INSERT_ID()")
            return int(cur.fetchone()[0])  # type: ignore[index]

        result = interleaved([(Result("MariaDB ticket server (REPLACE INTO + "
                                      "LAST_INSERT_ID)", 1), ticket, ops)], ROUNDS)
        conn.close()
        return result


def _refiller_env(url: str, db_url: str, chunk: int, pool: int, home: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEAFPOOL_")}
    path = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env.update({"LEAFPOOL_REDIS_URL": url, "LEAFPOOL_DATABASE_URL": db_url,
                "LEAFPOOL_CHUNK_SIZE": str(chunk), "LEAFPOOL_POOL_FLOOR": str(pool),
                "LEAFPOOL_POOL_CEILING": str(pool), "LEAFPOOL_LOW_WATER_RATIO": "0.9",
                "LEAFPOOL_HOME": home,
                "PYTHONPATH": os.pathsep.join(path)})
    return env


DRAINER = """
import sys, time, redis
r = redis.Redis.from_url(sys.argv[1]); key = sys.argv[2]
while True:
    r.lpop(key, 10000)
    time.sleep(0.05)
"""


CHUNKS = (0, 100, 1000, 10_000)


def _evalsha_stats(r: redis.Redis) -> tuple[int, int]:
    stats = r.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0)), int(stats.get("usec", 0))


def latency_during_refills(
    url: str, ops: int, label: str, fill: int = 100_000, settle_s: float = 30.0
) -> tuple[list[Result], list[float], list[float]]:
    """LPOP latency with no refill, then with refills running continuously at each chunk
    size (a drainer takes ~200k IDs/s in LPOPs of 10,000, so the refiller never rests).
    Each case starts once the refiller has pushed ``fill`` IDs, or after ``settle_s``."""
    r = redis.Redis.from_url(url)
    results: list[Result] = []
    pushed_rates: list[float] = []
    busy_us: list[float] = []  # Redis time per push script call (INFO commandstats)
    home = tempfile.mkdtemp(prefix="leafpool-bench-")
    for chunk in CHUNKS:
        tag = f"busy{chunk}"
        key = f"leafpool:{{{tag}}}:ids"
        procs: list[subprocess.Popen[bytes]] = []
        if chunk:
            db_url = f"sqlite:///{home}/chunk{chunk}.sqlite3"
            store = SegmentStore.from_url(db_url)
            store.init_schema()
            store.add_tag(tag, step=100_000)
            env = _refiller_env(url, db_url, chunk, 2 * fill, f"{home}/refiller{chunk}")
            # niced: on a 2-core machine the refiller and drainer would otherwise take the
            # CPU Redis and the measuring client need (in production they run elsewhere)
            nice = ["nice", "-n", "19", sys.executable]
            procs.append(subprocess.Popen(
                [*nice, "-m", "tests.support.roles", "refiller", tag], env=env,
                stdout=subprocess.DEVNULL, cwd=ROOT, preexec_fn=die_with_parent()))
            procs.append(subprocess.Popen([*nice, "-c", DRAINER, url, key],
                                          preexec_fn=die_with_parent()))
            deadline = time.monotonic() + settle_s
            while r.llen(key) < fill and time.monotonic() < deadline:
                time.sleep(0.05)  # waiting for the first fill
        prefill(r, ops + 1000)
        before = int(r.hget(f"leafpool:{{{tag}}}:state", "pushed_total") or 0)
        calls0, usec0 = _evalsha_stats(r)
        t0 = time.monotonic()
        name = (f"{label}: LPOP during refills, chunk {chunk:,}" if chunk
                else f"{label}: LPOP, no refill running")
        results += interleaved([(Result(name, 1), lambda: r.lpop(IDS_KEY), ops)], 1)
        after = int(r.hget(f"leafpool:{{{tag}}}:state", "pushed_total") or 0)
        pushed_rates.append((after - before) / (time.monotonic() - t0))
        calls1, usec1 = _evalsha_stats(r)
        busy_us.append((usec1 - usec0) / (calls1 - calls0) if calls1 > calls0 else 0.0)
        for p in procs:
            p.kill()
            p.wait()
    shutil.rmtree(home, ignore_errors=True)
    return results, pushed_rates, busy_us


def refill_throughput(url: str, target: int) -> Result:
    """IDs pushed per second by one in-process refiller filling an empty pool."""
    home = tempfile.mkdtemp(prefix="leafpool-bench-")
    settings = load_settings(redis_url=url, database_url=f"sqlite:///{home}/r.sqlite3",
                             pool_floor=target, pool_ceiling=target, chunk_size=1000,
                             reserve_seconds=1, outage_seconds=0)  # pushes, not allocations
    store = SegmentStore.from_url(settings.database_url)
    store.init_schema()
    store.add_tag("refill", step=1_000_000)
    r = redis.Redis.from_url(url)
    refiller = SegmentRefiller(Pool(r), store, settings)
    refiller.refill("refill")  # warm up: segments in the reserve
    result = Result("refill: IDs pushed/s by one refiller (chunk 1,000)", 1)
    for _ in range(ROUNDS):
        r.delete("leafpool:{refill}:ids")
        t0 = time.perf_counter()
        pushed = refiller.refill("refill").pushed
        result.rates.append(pushed / (time.perf_counter() - t0))
    shutil.rmtree(home, ignore_errors=True)
    return result


def memory_per_id(url: str, count: int = 100_000) -> list[tuple[str, float, float]]:
    """Bytes per pooled ID (MEMORY USAGE / LLEN): the pool vs a bare list of the same IDs."""
    r = redis.Redis.from_url(url)
    pool = Pool(r)
    out = []
    for digits, start in ((7, 1_000_000), (19, 1_000_000_000_000_000_000)):
        tag = f"mem{digits}"
        r.delete(*pool.tag(tag).all(), "bench:bare")
        pool.register(tag, "segment", 0)
        lock = RefillLock(r, pool.tag(tag).lock, 60_000)
        assert lock.acquire()
        pool.append_reserve(tag, lock.token, Range(start, start + count))
        for lo in range(start, start + count, 1000):
            pool.push(tag, lock.token, Range(lo, start + count), 1000, 0)
        lock.release()
        for lo in range(start, start + count, 10_000):
            r.rpush("bench:bare", *[str(i) for i in range(lo, lo + 10_000)])
        pooled = r.memory_usage(pool.tag(tag).ids, samples=0) / r.llen(pool.tag(tag).ids)
        bare = r.memory_usage("bench:bare", samples=0) / r.llen("bench:bare")
        out.append((f"{digits}-digit IDs", pooled, bare))
    return out


def redis_benchmark(port: int, requests: int = 100_000) -> float:
    """LPOP requests/s with 50 connections (redis-benchmark), after it fills its list."""
    binary = shutil.which("redis-benchmark")
    if binary is None:
        return float("nan")
    proc = subprocess.run([binary, "-p", str(port), "-q", "-n", str(requests), "-c", "50",
                           "-t", "lpush,lpop"], capture_output=True, text=True, timeout=300)
    for line in proc.stdout.replace("\r", "\n").splitlines():
        # final line: "LPOP: 98039.22 requests per second, p50=0.263 msec"
        if line.startswith("LPOP:") and "requests per second" in line:
            return float(line.split()[1])
    return float("nan")
