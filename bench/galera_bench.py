"""``python -m bench --only galera``: how long the segment store pauses when the Galera
node it uses is SIGKILLed (issue 19, item 6; docs/design.md §7.4).

A 3-node MariaDB Galera cluster on loopback (tests/support/mariadb_topologies.py:
Debian's galera-4, Galera's default timeouts) and one redis-server; leafpool's store on a
``LEAFPOOL_DATABASE_URL`` naming the three nodes, under the load of the failover test
(tests/support/id_load.py): two clients popping a tag through leafpool's client (about
2,000 IDs/s), a refiller refilling it, two threads allocating another tag straight from
the store. Each round SIGKILLs the node in use and measures from the kill to the first
allocation committed after it (the pause), the longest time between two pops, and the
IDs handed out twice (0 expected); the killed node is started again (it rejoins the
cluster) before the next round.

Most of the pause is Galera's: the surviving nodes hold every commit until they declare
the killed node gone (``evs.suspect_timeout``, 5 s by default); leafpool's move to the
next host costs a refused connection on loopback.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from bench import servers
from bench.measure import meant_failures
from leafpool.core.config import Settings, load_settings
from tests.support import mariadb_topologies as mt
from tests.support.id_load import Load, Record, RecordingStore

TAG, DIRECT = "order", "direct"
STEP = 1_000
POOL = 40_000  # list target: ~20 s of the clients' demand, more than the pause


@dataclass(frozen=True)
class Round:
    killed: int
    moved_to: int
    pause_s: float  # kill -> first allocation committed after it
    pop_gap_s: float  # longest time between two pops, the kill included
    handed_out: int
    duplicates: int


def _settings(redis_url: str, database_url: str) -> Settings:
    return load_settings(redis_url=redis_url, database_url=database_url, pool_floor=POOL,
                         pool_ceiling=POOL, reserve_seconds=1, outage_seconds=0,
                         max_step=STEP)


def _port(store: RecordingStore) -> int:
    with store.engine.connect() as conn:
        return int(conn.exec_driver_sql("SELECT @@port").scalar_one())


def one_round(cluster: mt.Galera, redis_url: str, first: bool) -> Round:
    record = Record()
    store = RecordingStore.open(cluster.url(), record)
    if first:
        store.init_schema()
        store.add_tag(TAG, step=STEP)
        store.add_tag(DIRECT, step=10)
    load = Load(_settings(redis_url, cluster.url()), store, TAG, clients=2, batch=10,
                pace_s=0.01, direct_tag=DIRECT, allocators=2).start()
    try:
        load.wait_until(lambda: len(record.pops) >= 50, 60, "pops")
        in_use = cluster.node_on(_port(store))
        # the node killed on purpose: refills fail, the store moves on, both in the table
        with meant_failures("leafpool.refill.base", "leafpool.database.hosts"):
            killed = load.now()
            in_use.kill()
            load.wait_until(lambda: record.first_allocation_after(killed, DIRECT) is not None,
                            60, "an allocation after the kill")
            served = len(record.pops)
            load.wait_until(lambda: len(record.pops) >= served + 100, 60, "pops after it")
    finally:
        load.stop()
    moved_to = _port(store)
    store.engine.dispose()
    cluster.restart(in_use)
    return Round(in_use.port, moved_to, record.first_allocation_after(killed, DIRECT) or 0.0,
                 record.longest_pop_gap(), len(record.handed_out()), record.duplicates())


def table(rounds: list[Round]) -> Table:
    out = Table(title="Galera: the node in use SIGKILLed under load (3 nodes on loopback, "
                      "Galera's default timeouts)")
    for col in ("round", "node killed", "store moved to", "pause: kill -> next allocation",
                "longest time between pops", "IDs handed out", "duplicates"):
        out.add_column(col, justify="right")
    for i, r in enumerate(rounds, 1):
        out.add_row(str(i), f":{r.killed}", f":{r.moved_to}", f"{r.pause_s:.2f} s",
                    f"{r.pop_gap_s:.3f} s", f"{r.handed_out:,}", str(r.duplicates))
    return out


def main(console: Console, rounds: int) -> list[Round]:
    with servers.redis() as redis_server, mt.galera(3) as cluster:
        done = [one_round(cluster, redis_server.extra["url"], i == 0) for i in range(rounds)]
    console.print(table(done))
    return done
