"""Mode mysql through a database outage (issue 32, item 1): a holder rides through one for
as long as its lease runs. The mark its last write recorded covers the lease
(docs/design.md §8.1), so every record made meanwhile goes to the cache file alone and no
statement reaches the database; once the lease deadline passes the call tries a renew
itself and fails (the database still down), and the first call after the database is
back renews and goes on. A MariaDB of this module's own, SIGKILLed or SIGSTOPped; the
registry's clocks are fake (the driver's timeouts are real)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, event, text

from leafpool.core.config import load_settings
from leafpool.core.errors import BackendUnavailable, WorkerIdUnavailable
from leafpool.core.snowflake_layout import decode, wall_clock_ms
from leafpool.snowflake.registry import LeasedGenerator, open_registry
from leafpool.snowflake.registry.mysql import MySqlRegistry
from tests.support import services
from tests.support.clocks import FakeMsClock
from tests.support.own_mariadb import cont, fresh_database, heal, own_mariadb_fixture, stop

own_mariadb = own_mariadb_fixture()


@pytest.fixture
def holder(own_mariadb: services.Server, tmp_path: Path
           ) -> Iterator[tuple[MySqlRegistry, LeasedGenerator, FakeMsClock, list[str]]]:
    """A claimed holder (lease 30 s, renew 10 s: it fences itself 20 s after its last
    renew) and the statements its engine sends."""
    url = fresh_database(own_mariadb)
    clock = FakeMsClock(wall_clock_ms())
    settings = load_settings(snowflake_mode="mysql", database_url=url, snowflake_name="t",
                             snowflake_cache_dir=str(tmp_path / "cache"),
                             snowflake_lease_seconds=30, snowflake_renew_seconds=10)
    reg = open_registry(settings, "host-a:w:0", clock=clock, sleep=clock.sleep,
                        monotonic=clock.monotonic, background=False)
    assert isinstance(reg, MySqlRegistry)
    sent: list[str] = []

    @event.listens_for(reg.engine, "before_cursor_execute")
    def _sent(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        sent.append(statement)

    gen = LeasedGenerator(reg, settings, clock=clock, sleep=clock.sleep)
    gen.start()
    try:
        yield reg, gen, clock, sent
    finally:
        heal(own_mariadb)
        gen.close()


def db_mark(url: str, worker_id: int) -> int:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT max_timestamp FROM leaf_workerid_alloc "
                                         "WHERE id = :w"), {"w": worker_id}).scalar_one())
    finally:
        engine.dispose()


@pytest.mark.parametrize("outage", ["killed", "stopped"])
def test_a_database_outage_is_ridden_through_while_the_lease_runs(
    outage: str, own_mariadb: services.Server,
    holder: tuple[MySqlRegistry, LeasedGenerator, FakeMsClock, list[str]],
) -> None:
    reg, gen, clock, sent = holder
    ids = gen.next_batch(1_000)  # its record renews: the mark now covers the lease
    lease = gen.lease
    assert lease is not None
    url = str(reg.settings.database_url)
    covered = db_mark(url, lease.worker_id)
    fence_ms = int(reg.deadline.fence_after_s * 1000)
    if outage == "killed":
        own_mariadb.kill()
    else:
        stop(own_mariadb)
    sent.clear()
    rode = 0
    while rode + 1_000 < fence_ms:  # a refill's worth every second, for the whole lease
        clock.advance(1_000)
        rode += 1_000
        ids += gen.next_batch(1_000)
    assert rode == 19_000 and sent == []  # not one statement: the mark covered them all
    assert decode(ids[-1]).timestamp_ms <= covered
    reg.check()
    assert reg.fenced is None

    clock.advance(fence_ms - rode + 1)  # the lease deadline passed: no more without a renew
    with pytest.raises(WorkerIdUnavailable):
        reg.check()
    began = time.monotonic()
    with pytest.raises(BackendUnavailable) as err:  # the call tried a renew itself
        gen.next_batch(10)
    took = time.monotonic() - began
    print(f"\n{outage}: a call past the lease deadline failed in {took:.2f} s: {err.value}")
    assert "renew failed" in str(err.value)  # it asked the database

    if outage == "killed":
        heal(own_mariadb)
    else:
        cont(own_mariadb)
    ids += gen.next_batch(1_000)  # the first call after the database is back renews
    reg.check()
    assert ids == sorted(set(ids)) and {decode(i).worker_id for i in ids} == {lease.worker_id}
    assert db_mark(url, lease.worker_id) >= decode(ids[-1]).timestamp_ms
