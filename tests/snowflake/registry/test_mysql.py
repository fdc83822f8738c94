"""Mode mysql against a real MariaDB, what only it does: NotFound9's leaf_workerid_alloc
table (the shipped DDL, a row per identity), the database keeping the larger mark, worker
IDs never above 1023 (expired rows recycled, or a refusal), a recycled row fencing its
former holder, MySQL down at start (the cached lease). What every mode does is in
tests/snowflake/registry/test_contract.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pymysql
import pytest
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError, OperationalError

from leafpool.core.errors import ClockMovedBackwards, WorkerIdUnavailable
from leafpool.core.snowflake_layout import decode, wall_clock_ms
from leafpool.snowflake.registry import LeasedGenerator
from leafpool.snowflake.registry.mysql import DDL, _deadlock
from tests.support import registries
from tests.support.clocks import FakeMsClock
from tests.support.registries import MySqlBackend
from tests.support.services import ROOT

my = registries.fixture("mysql")


def fill(my: MySqlBackend, max_timestamp: str = "0") -> None:
    """Rows 2..1023, each leased by a live process of its own."""
    my.execute(
        "INSERT INTO leaf_workerid_alloc (id, ip, port, ip_port, max_timestamp, "
        "create_time, update_time) VALUES "
        + ",".join(
            f"({i}, 'h', 'tok', 'other:{i}:0', {max_timestamp.format(i=i)}, NOW(), NOW())"
            for i in range(2, 1024)
        )
    )


def test_shipped_ddl_is_the_one_the_registry_creates() -> None:
    sql = ROOT / "leafpool" / "database" / "sql" / "mysql"
    shipped = (sql / "leaf_workerid_alloc.sql").read_text()
    statement = (
        "\n".join(line for line in shipped.splitlines() if not line.startswith("--"))
        .strip()
        .rstrip(";")
    )
    assert " ".join(statement.split()) == " ".join(DDL.split())
    for column in (
        "`id` bigint(20) NOT NULL AUTO_INCREMENT",
        "`ip_port` varchar(127) NOT NULL",
        "`max_timestamp` bigint(20) DEFAULT NULL",
        "UNIQUE KEY `idx_ipport` (`ip_port`)",
    ):
        assert column in DDL  # NotFound9's columns, unchanged


def test_a_lock_wait_timeout_or_deadlock_is_retried_other_errors_are_not() -> None:
    def error(kind: type[Exception], code: int) -> Exception:
        return kind("UPDATE ...", {}, pymysql.err.OperationalError(code, "..."))

    assert _deadlock(error(OperationalError, 1213)) and _deadlock(error(OperationalError, 1205))
    assert not _deadlock(error(OperationalError, 2003))  # unreachable: the cache stands in
    assert not _deadlock(error(IntegrityError, 1213))
    assert not _deadlock(OperationalError("SELECT 1", {}, Exception()))  # no code


def test_claim_creates_the_table_and_a_row_per_identity(my: MySqlBackend) -> None:
    a, b = my.open("host-a:w:0"), my.open("host-b:w:0")
    assert a.claim().worker_id == 1
    assert b.claim().worker_id == 2
    table = my.rows()
    assert table[1]["ip_port"] == "host-a:w:0" and table[1]["ip"] == "host-a"
    assert table[1]["port"] == a.token and table[1]["update_time"] is not None
    assert abs(int(table[1]["max_timestamp"]) - wall_clock_ms()) < 60_000
    a.release()
    assert my.rows()[1]["update_time"] is None  # released: recyclable at once


def test_record_high_water_never_lowers_and_renews(my: MySqlBackend) -> None:
    a = my.open("host-a:w:0")
    a.claim()
    far = wall_clock_ms() + 3_600_000
    my.execute(
        "UPDATE leaf_workerid_alloc SET update_time = NOW() - INTERVAL 20 SECOND, "
        f"max_timestamp = {far}"
    )
    a.high_water_ms = a.source_mark = 0  # stale in-process marks: a write, and the
    a.record_high_water(3)  # database keeps the larger value
    assert my.rows()[1]["max_timestamp"] == far
    with my.db.connect() as conn:
        age = conn.execute(
            text("SELECT TIMESTAMPDIFF(SECOND, update_time, NOW()) FROM leaf_workerid_alloc")
        ).scalar_one()
    assert age < 20  # the lease was renewed (it was 20 s old)


def test_worker_ids_never_pass_1023_expired_rows_are_recycled(my: MySqlBackend) -> None:
    my.open("first:w:0").claim()  # creates the table and row 1
    fill(my, "{i} + 1000")
    late = my.open("late:w:0")
    with pytest.raises(WorkerIdUnavailable) as err:
        late.claim()
    assert "all 1023 worker IDs" in str(err.value) and "leased by live processes" in str(err.value)
    assert max(my.rows()) == 1023
    old_mark = wall_clock_ms() - 10_000
    # row 700's holder stopped renewing an hour ago
    my.execute(
        "UPDATE leaf_workerid_alloc SET update_time = NOW() - INTERVAL 1 HOUR, "
        f"max_timestamp = {old_mark} WHERE id = 700"
    )
    lease = late.claim()
    assert (lease.worker_id, lease.last_timestamp_ms) == (700, old_mark)  # mark carried
    table = my.rows()
    assert table[700]["ip_port"] == "late:w:0" and max(table) == 1023
    gen = LeasedGenerator(late, late.settings, clock=late.clock, sleep=late.sleep)
    gen.start()
    assert decode(gen.next_id()).timestamp_ms > old_mark


def test_a_recycled_row_fences_its_former_holder(my: MySqlBackend) -> None:
    a = my.open("host-a:w:0")
    a.claim()
    fill(my)  # a holds 1; everything else is held
    my.execute(
        "UPDATE leaf_workerid_alloc SET update_time = NOW() - INTERVAL 1 HOUR WHERE id = 1"
    )  # a missed its renews past the lease
    b = my.open("host-b:w:0")
    assert b.claim().worker_id == 1
    with pytest.raises(WorkerIdUnavailable) as err:
        a.record_high_water(wall_clock_ms() + 1_000)
    assert "taken over" in str(err.value)
    with pytest.raises(WorkerIdUnavailable):
        a.check()


def test_mysql_down_at_start_uses_the_cached_lease(my: MySqlBackend) -> None:
    now = wall_clock_ms()
    a = my.open("host-a:w:0", FakeMsClock(now))
    a.claim()
    a.record_high_water(now + 1_000)
    cached = json.loads(a.cache.path.read_text())
    assert cached["lease_until"] == now + int(a.deadline.fence_after_s * 1000)
    a._close()  # the process dies without releasing
    a.lease = None

    behind = my.open_unreachable("host-a:w:0", clock=FakeMsClock(now + 500))
    with pytest.raises(ClockMovedBackwards) as err:
        behind.claim()
    assert "cache file" in str(err.value)

    clock = FakeMsClock(now + 1_001)
    reg = my.open_unreachable("host-a:w:0", clock=clock)
    lease = reg.claim()
    assert (lease.worker_id, lease.source, lease.last_timestamp_ms) == (1, "cache", now + 1_000)
    assert reg.degraded
    reg.record_high_water(now + 2_000)  # within the cached lease: cache file only
    record = json.loads(reg.cache.path.read_text())
    assert (record["last_timestamp"], record["lease_until"]) == (now + 2_000, cached["lease_until"])
    clock.advance(cached["lease_until"] - clock.now + 1)  # the cached lease runs out
    with pytest.raises(WorkerIdUnavailable) as err2:
        reg.check()
    assert "not renewed" in str(err2.value)
    reg.lease = None

    expired = my.open_unreachable("host-a:w:0", clock=FakeMsClock(cached["lease_until"] + 10))
    with pytest.raises(WorkerIdUnavailable) as err3:
        expired.claim()
    assert "cannot be used" in str(err3.value)


def test_a_restart_soon_after_a_crash_waits_for_the_mark_written_ahead(
    my: MySqlBackend,
) -> None:
    """The row's mark is written ahead, covering the lease (docs/design.md §8.1): the
    same identity restarted after a crash takes its row over at once but may not start
    below that mark. That is the previous holder's window, not a clock moved back: refused
    as WorkerIdUnavailable (no clock event) until the clock passes it."""
    now = wall_clock_ms()
    clock = FakeMsClock(now)
    old = my.open("host-a:w:0", clock)
    gen = LeasedGenerator(old, old.settings, clock=clock, sleep=clock.sleep)
    gen.start()
    before = gen.next_batch(100)
    ahead = my.mark(old, 1) - int(clock.now)
    assert ahead == old.ahead_ms() == 23_000
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    my.pretend_gone(old, int(gone.stdout))  # it crashed: its row and cache file linger
    clock.advance(5_000)
    new = my.open("host-a:w:0", clock)
    with pytest.raises(WorkerIdUnavailable) as err:
        new.claim()
    assert not isinstance(err.value, ClockMovedBackwards)
    assert "18000 ms ahead of this clock" in str(err.value)
    clock.advance(18_000)  # the window passed
    lease = new.claim()
    assert lease.worker_id == 1 and lease.last_timestamp_ms == now + 23_000
    after = LeasedGenerator(new, new.settings, clock=clock, sleep=clock.sleep).next_batch(100)
    assert min(after) > max(before)
    old.lease = None  # crashed: nothing to release
