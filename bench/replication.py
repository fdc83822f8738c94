"""Replication benchmark (issue: Redis high availability): what failover-safe pops cost.

In one run, side by side, single-ID pops (``Client.next_id``) and 100-ID pops
(``Client.next_ids(tag, 100)``), IDs/s and latency per call, for:

1. one node, ``appendfsync always`` (the shipped ``ops/redis/redis.conf``), no acknowledgement;
2. one node, ``appendfsync everysec``, no acknowledgement;
3. master + 1 replica, ``everysec``, ``LEAFPOOL_POP_REPLICAS=1`` (every pop is
   ``LPOP`` + ``WAIT 1 <LEAFPOOL_POP_WAIT_MS>`` in one round trip);
4. master + 1 replica, ``always``, ``LEAFPOOL_POP_REPLICAS=1``;
5. a Redis Cluster (3 masters with 1 replica each), ``always``, ``LEAFPOOL_POP_REPLICAS=1``;
6. master + 2 replicas, ``always``, ``LEAFPOOL_POP_REPLICAS=1`` (one of two: not safe under a
   sequence of faults, docs/design.md §7.1);
7. master + 2 replicas, ``always``, every replica (``all``: the shipped setting).

Every topology runs at once on loopback (tests/support/topologies.py, stopped at the end); rounds
of the seven are interleaved so that a noisy machine weighs on all of them alike, and each
ratio against row 1 is taken round by round (the median, and the range over the rounds).
Before each round every pool is topped up the way a refiller does it (fenced pushes under
the refill lock, above the high-water mark, not measured) and the replicas are waited
for, so no measured pop finds an empty pool or a replica busy catching up. A pop its
replica did not acknowledge in time is dropped by the client and retried (the retry is in
the measured call; the dropped IDs are counted in the table).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import TypeVar, cast

import redis
from rich.console import Console
from rich.table import Table

from bench.measure import Result, interleaved
from leafpool.client import Client
from leafpool.core.config import load_settings
from leafpool.redis import replicas
from leafpool.redis.pool import Pool, Range
from tests.support import topologies

BATCH = 100
PUSH_CHUNK = 10_000  # IDs per fenced push while filling (setup, not measured)
WARMUP = 20  # calls of each kind per client before the first round (connections, scripts)

Top = TypeVar("Top", bound=topologies.Topology)


@dataclass
class Lane:
    """One kind of call on one configuration: its own tag (so its drops are its own) and
    its measurements."""

    tag: str
    result: Result
    next_start: int = 1  # the first ID of the next fill (above the high-water mark)
    dropped: int = 0  # IDs popped but not acknowledged by enough replicas in time

    def fill(self, filler: redis.Redis, target: int) -> None:
        """Top the pool up to ``target`` IDs: fenced pushes from a reserve range above the
        high-water mark, as a refiller does."""
        pool = Pool(filler)
        missing = target - int(filler.llen(pool.tag(self.tag).ids))
        if missing <= 0:
            return
        lock = pool.refill_lock(self.tag, 60_000)
        if not lock.acquire():
            raise RuntimeError(f"{self.tag}: refill lock busy")
        head = Range(self.next_start, self.next_start + missing)
        pool.append_reserve(self.tag, lock.token, head)
        now_ms = int(time.time() * 1000)
        while head.size:
            n = min(PUSH_CHUNK, head.size)
            pool.push(self.tag, lock.token, head, n, now_ms)
            head = Range(head.start + n, head.end)
        lock.release()
        self.next_start = head.end


@dataclass
class Config:
    """One configuration under test: the product's client, a plain client of the same
    topology that fills its pools, and the two kinds of call measured on it."""

    label: str
    client: Client
    filler: redis.Redis
    replicas: int  # replicas that must have the fill before a round starts
    single: Lane = field(init=False)
    batch: Lane = field(init=False)

    def __post_init__(self) -> None:
        self.single = Lane("repl-one", Result(f"{self.label}: next_id", 1))
        self.batch = Lane("repl-batch", Result(f"{self.label}: next_ids({BATCH})", BATCH))
        for lane in self.lanes:
            Pool(self.filler).register(lane.tag, "segment", 0)

    @property
    def lanes(self) -> tuple[Lane, Lane]:
        return self.single, self.batch

    def cases(self, single_ops: int,
              batch_ops: int) -> list[tuple[Result, Callable[[], object], int]]:
        client, one, many = self.client, self.single.tag, self.batch.tag
        return [(self.single.result, lambda: client.next_id(one), single_ops),
                (self.batch.result, lambda: client.next_ids(many, BATCH), batch_ops)]

    def fill(self, single: int, batch: int) -> None:
        """Top up both pools (to ``single`` and ``batch`` IDs), then wait until the
        replicas have every ID pushed."""
        self.single.fill(self.filler, single)
        self.batch.fill(self.filler, batch)
        for lane in self.lanes if self.replicas else ():
            node = replicas.node_of(self.filler, Pool(self.filler).tag(lane.tag).ids)
            synced = int(node.execute_command(  # type: ignore[no-untyped-call]
                "WAIT", self.replicas, 60_000))
            if synced < self.replicas:
                raise RuntimeError(f"{self.label}: {synced} of {self.replicas} replicas "
                                   "have the fill after 60 s")

    def read_dropped(self) -> None:
        for lane in self.lanes:
            state = Pool(self.filler).tag(lane.tag).state
            lane.dropped = int(self.filler.hget(state, "unacked_ids") or 0)  # type: ignore[arg-type]


LABELS = (
    "1 node, always (shipped)",
    "1 node, everysec",
    "master + replica, everysec, ack 1",
    "master + replica, always, ack 1",
    "Cluster 3 x (1 + 1), always, ack 1",
    "master + 2 replicas, always, ack 1",
    "master + 2 replicas, always, ack all (2)",
)


@contextmanager
def _configs() -> Iterator[list[Config]]:
    """The topologies and their clients; every server is stopped on the way out."""
    with ExitStack() as stack:

        def started(top: Top) -> Top:
            stack.callback(top.stop)
            return top

        def config(label: str, filler: redis.Redis, acks: int, **settings: object) -> Config:
            stack.callback(filler.close)
            client = Client(settings=load_settings(pop_replicas=str(acks), **settings),
                            policy="raise")
            stack.callback(client.close)
            return Config(label, client, filler, acks)

        always = started(topologies.replicated(0, appendfsync="always"))
        everysec = started(topologies.replicated(0, appendfsync="everysec"))
        pair_everysec = started(topologies.replicated(1, appendfsync="everysec"))
        pair_always = started(topologies.replicated(1, appendfsync="always"))
        cluster = started(topologies.cluster(3, 1, appendfsync="always"))
        # one group each: the lanes' tags are the same names in every configuration
        trio = started(topologies.replicated(2, appendfsync="always"))
        trio_all = started(topologies.replicated(2, appendfsync="always"))
        yield [
            config(LABELS[0], always.master.client(), 0, redis_url=always.master.url),
            config(LABELS[1], everysec.master.client(), 0, redis_url=everysec.master.url),
            config(LABELS[2], pair_everysec.master.client(), 1,
                   redis_url=pair_everysec.master.url),
            config(LABELS[3], pair_always.master.client(), 1,
                   redis_url=pair_always.master.url),
            # Celery cannot use a Cluster: the settings require a separate broker (a
            # setting only: nothing here talks to a broker)
            config(LABELS[4], cast(redis.Redis, cluster.client()), 1, redis_url=cluster.url,
                   redis_cluster=True, broker_url=always.master.url),
            config(LABELS[5], trio.master.client(), 1, redis_url=trio.master.url),
            config(LABELS[6], trio_all.master.client(), 2, redis_url=trio_all.master.url),
        ]


def measure(single_ops: int, batch_ops: int, rounds: int) -> list[Config]:
    """``rounds`` interleaved rounds of ``single_ops`` next_id and ``batch_ops``
    next_ids(100) calls on each configuration."""

    def target(ids: int) -> int:
        return ids + ids // 5 + 10 * BATCH  # slack for pops retried after a drop

    single, batch = target(single_ops), target(BATCH * batch_ops)
    with _configs() as configs:
        for c in configs:
            c.fill(single + WARMUP, batch + WARMUP * BATCH)
            for _ in range(WARMUP):
                c.client.next_id(c.single.tag)
                c.client.next_ids(c.batch.tag, BATCH)
        cases = [case for c in configs for case in c.cases(single_ops, batch_ops)]

        def top_up() -> None:
            for c in configs:
                c.fill(single, batch)

        interleaved(cases, rounds, before_round=top_up)
        for c in configs:
            c.read_dropped()
    return configs


# -- tables ------------------------------------------------------------------------------

def ratio(result: Result, base: Result) -> tuple[float, float, float]:
    """IDs/s of ``result`` over ``base``, round by round: (median, lowest, highest)."""
    per_round = [a / b for a, b in zip(result.rates, base.rates, strict=True)]
    return statistics.median(per_round), min(per_round), max(per_round)


def _fmt_ratio(r: tuple[float, float, float]) -> str:
    mid, lo, hi = r
    return f"{mid:.2f}x" if lo == hi else f"{mid:.2f}x ({lo:.2f}-{hi:.2f})"


def results_table(configs: list[Config], rounds: int) -> Table:
    table = Table(title=f"Replication: IDs/s and latency per call (one client process, "
                        f"{rounds} interleaved rounds; vs row 1: ratio per round, median "
                        "(range)); ack 1 = LEAFPOOL_POP_REPLICAS=1")
    for col in ("#", "configuration", "call", "IDs/s", "vs row 1", "p50 us", "p99 us",
                "p999 us", "IDs dropped"):
        table.add_column(col, justify="left" if col in ("configuration", "call") else "right")
    for k, call in enumerate(("next_id", f"next_ids({BATCH})")):
        if k:
            table.add_section()
        base = configs[0].lanes[k].result
        for i, c in enumerate(configs, 1):
            lane = c.lanes[k]
            r = lane.result
            table.add_row(str(i), c.label, call, f"{r.ids_per_s:,.0f}",
                          _fmt_ratio(ratio(r, base)), f"{r.pct_us(0.5):,.0f}",
                          f"{r.pct_us(0.99):,.0f}", f"{r.pct_us(0.999):,.0f}",
                          f"{lane.dropped:,}")
    return table


def answers_table(configs: list[Config]) -> Table:
    one_always, one_everysec, ack_everysec, ack_always, ack_cluster, one_of_two, all_of_two \
        = configs
    table = Table(title="Replication: what failover-safe pops cost (IDs/s ratios, median of "
                        "the per-round ratios)",
                  caption="[3] keeps G1 through a failover, not through a master that loses "
                          "power and restarts as master before one (README: Redis durability "
                          "and high availability); [4] and [5] keep it through both")
    for col in ("question", "next_id", f"next_ids({BATCH})"):
        table.add_column(col)

    def row(question: str, a: Config, b: Config, verdict: Callable[[float], str]) -> None:
        cells = []
        for la, lb in ((a.single, b.single), (a.batch, b.batch)):
            mid = ratio(la.result, lb.result)[0]
            cells.append(f"{mid:.2f}x: {verdict(mid)}")
        table.add_row(question, *cells)

    def cost(x: float) -> str:
        return f"{(1 - x) * 100:.0f} % fewer IDs/s" if x < 1 else \
            f"{(x - 1) * 100:.0f} % more IDs/s"

    def cheaper(x: float) -> str:
        return "yes, cheaper" if x > 1.05 else "no, dearer" if x < 0.95 else "about even"

    row("failover-safe, everysec + ack [3] vs shipped single node [1]",
        ack_everysec, one_always, cost)
    row("failover-safe, always + ack [4] vs shipped single node [1]",
        ack_always, one_always, cost)
    row("Cluster, always + ack [5] vs shipped single node [1]", ack_cluster, one_always, cost)
    row("is everysec + replica ack [3] cheaper than fsync always alone [1]?",
        ack_everysec, one_always, cheaper)
    row("price of the ack on top of everysec: [3] vs [2]", ack_everysec, one_everysec, cost)
    row("price of fsync always, no replica: [1] vs [2]", one_always, one_everysec, cost)
    row("price of every replica (safe under any sequence of faults): [7] vs [6]",
        all_of_two, one_of_two, cost)
    return table


def main(console: Console, single_ops: int, batch_ops: int, rounds: int) -> None:
    configs = measure(single_ops, batch_ops, rounds)
    console.print(results_table(configs, rounds))
    console.print(answers_table(configs))
