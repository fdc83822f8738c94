"""Mode mysql against a real MariaDB: NotFound9's leaf_workerid_alloc table, reuse after
restart, worker IDs never above 1023 (recycle expired rows or refuse), fencing through
the claim token, self-fencing on a missed renew, the clock check, MySQL down at start."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine

from leafpool.config import Settings, load_settings
from leafpool.errors import (
    BackendUnavailable,
    ClockMovedBackwards,
    ConfigurationError,
    WorkerIdUnavailable,
)
from leafpool.registry import LeasedGenerator, open_registry
from leafpool.registry.mysql import DDL, MySqlRegistry
from leafpool.snowflake import decode, wall_clock_ms
from tests.clocks import FakeMsClock
from tests.services import ROOT, free_port

Factory = Callable[..., MySqlRegistry]


def _settings(url: str, tmp_path: Path, **overrides: object) -> Settings:
    values: dict[str, object] = {
        "snowflake_mode": "mysql", "database_url": url, "snowflake_name": "t",
        "snowflake_cache_dir": str(tmp_path / "cache"),
        "snowflake_lease_seconds": 30, "snowflake_renew_seconds": 5,
    }
    values.update(overrides)
    return load_settings(**values)


@pytest.fixture
def db(mysql_url: str) -> Iterator[Engine]:
    engine = create_engine(mysql_url)
    yield engine
    engine.dispose()


@pytest.fixture
def make(mysql_url: str, tmp_path: Path) -> Iterator[Factory]:
    made: list[MySqlRegistry] = []

    def factory(identity: str, clock: FakeMsClock | None = None, cache: str = "cache",
                url: str = mysql_url, **kw: object) -> MySqlRegistry:
        settings = _settings(url, tmp_path, snowflake_cache_dir=str(tmp_path / cache))
        clock = clock or FakeMsClock(wall_clock_ms())
        reg = open_registry(settings, identity, clock=clock, sleep=clock.sleep,
                            monotonic=clock.monotonic, background=False, **kw)
        assert isinstance(reg, MySqlRegistry)
        made.append(reg)
        return reg

    yield factory
    for reg in made:
        reg.release()


def rows(db: Engine) -> dict[int, dict[str, object]]:
    with db.connect() as conn:
        result = conn.execute(text("SELECT * FROM leaf_workerid_alloc ORDER BY id"))
        return {r.id: dict(r._mapping) for r in result}


def test_shipped_ddl_is_the_one_the_registry_creates() -> None:
    shipped = (ROOT / "leafpool" / "sql" / "mysql" / "leaf_workerid_alloc.sql").read_text()
    statement = "\n".join(line for line in shipped.splitlines()
                          if not line.startswith("--")).strip().rstrip(";")
    assert " ".join(statement.split()) == " ".join(DDL.split())
    for column in ("`id` bigint(20) NOT NULL AUTO_INCREMENT", "`ip_port` varchar(127) NOT NULL",
                   "`max_timestamp` bigint(20) DEFAULT NULL",
                   "UNIQUE KEY `idx_ipport` (`ip_port`)"):
        assert column in DDL  # NotFound9's columns, unchanged


def test_claim_creates_the_table_and_a_row_per_identity(make: Factory, db: Engine) -> None:
    a, b = make("host-a:w:0"), make("host-b:w:0")
    assert a.claim().worker_id == 1
    assert b.claim().worker_id == 2
    table = rows(db)
    assert table[1]["ip_port"] == "host-a:w:0" and table[1]["ip"] == "host-a"
    assert table[1]["port"] == a.token and table[1]["update_time"] is not None
    assert abs(int(table[1]["max_timestamp"]) - wall_clock_ms()) < 60_000  # type: ignore[call-overload]


def test_reuse_after_restart(make: Factory, db: Engine) -> None:
    a = make("host-a:w:0")
    assert a.claim().worker_id == 1
    make("host-b:w:0").claim()
    target = wall_clock_ms() + 2_000
    a.record_high_water(target)
    assert rows(db)[1]["max_timestamp"] == target
    assert json.loads(a.cache.path.read_text())["last_timestamp"] == target
    a.release(last_emitted_ms=target - 2_000)
    assert rows(db)[1]["update_time"] is None  # released: recyclable at once
    again = make("host-a:w:0", cache="other-cache")
    lease = again.claim()
    assert (lease.worker_id, lease.source) == (1, "mysql")
    assert lease.last_timestamp_ms >= target - 2_000


def test_record_high_water_never_lowers_and_renews(make: Factory, db: Engine) -> None:
    a = make("host-a:w:0")
    a.claim()
    with db.begin() as conn:
        conn.execute(text("UPDATE leaf_workerid_alloc SET update_time = NOW() - INTERVAL 20 "
                          "SECOND, max_timestamp = 5"))
    a._high_water = 0  # a stale in-process mark: the database keeps the larger value
    a.record_high_water(3)
    row = rows(db)[1]
    assert row["max_timestamp"] == 5
    with db.connect() as conn:
        age = conn.execute(text("SELECT TIMESTAMPDIFF(SECOND, update_time, NOW()) FROM "
                                "leaf_workerid_alloc")).scalar_one()
    assert age < 20  # the lease was renewed (it was 20 s old)


def test_identity_held_by_a_live_process_is_refused(make: Factory) -> None:
    make("host-a:w:0").claim()
    with pytest.raises(WorkerIdUnavailable) as err:
        make("host-a:w:0").claim()
    assert "identity in use" in str(err.value)


def test_crashed_previous_process_is_taken_over_and_fenced(make: Factory,
                                                          db: Engine) -> None:
    old = make("host-a:w:0")
    old.claim()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    record = json.loads(old.cache.path.read_text())
    record["pid"] = int(gone.stdout)  # the cache file's writer has exited
    old.cache.path.write_text(json.dumps(record))
    new = make("host-a:w:0")
    assert new.claim().worker_id == 1
    assert rows(db)[1]["port"] == new.token
    with pytest.raises(WorkerIdUnavailable) as err:  # the old holder's token is stale
        old.record_high_water(wall_clock_ms() + 1_000)
    assert "taken over" in str(err.value)


def test_clock_behind_the_recorded_timestamp_is_refused(make: Factory, db: Engine) -> None:
    now = wall_clock_ms()
    a = make("host-a:w:0")
    a.claim()
    a.record_high_water(now + 60_000)
    a.release()
    before = rows(db)[1]
    behind = make("host-a:w:0", clock=FakeMsClock(now + 1_000), cache="fresh-cache")
    with pytest.raises(ClockMovedBackwards) as err:
        behind.claim()
    assert err.value.offset_ms == 59_000 and "MySQL leaf_workerid_alloc id=1" in str(err.value)
    assert rows(db)[1] == before  # the refused claim changed nothing


def test_worker_ids_never_pass_1023_expired_rows_are_recycled(make: Factory,
                                                              db: Engine) -> None:
    make("first:w:0").claim()  # creates the table and row 1
    with db.begin() as conn:
        conn.execute(text(
            "INSERT INTO leaf_workerid_alloc (id, ip, port, ip_port, max_timestamp, "
            "create_time, update_time) VALUES "
            + ",".join(f"({i}, 'h', 'tok', 'other:{i}:0', {1000 + i}, NOW(), NOW())"
                       for i in range(2, 1024))))
    late = make("late:w:0")
    with pytest.raises(WorkerIdUnavailable) as err:
        late.claim()
    assert "all 1023 worker IDs" in str(err.value) and "leased by live processes" in str(err.value)
    assert max(rows(db)) == 1023
    old_mark = wall_clock_ms() - 10_000
    with db.begin() as conn:  # row 700's holder stopped renewing an hour ago
        conn.execute(text("UPDATE leaf_workerid_alloc SET update_time = NOW() - INTERVAL 1 "
                          f"HOUR, max_timestamp = {old_mark} WHERE id = 700"))
    lease = late.claim()
    assert (lease.worker_id, lease.last_timestamp_ms) == (700, old_mark)  # mark carried
    table = rows(db)
    assert table[700]["ip_port"] == "late:w:0" and max(table) == 1023
    gen = LeasedGenerator(late, late.settings, clock=late.clock, sleep=late.sleep)
    gen.start()
    assert decode(gen.next_id()).timestamp_ms > old_mark


def test_recycled_row_fences_its_former_holder(make: Factory, db: Engine) -> None:
    a = make("host-a:w:0")
    a.claim()
    with db.begin() as conn:  # a fills 1; everything else is held
        conn.execute(text(
            "INSERT INTO leaf_workerid_alloc (id, ip, port, ip_port, max_timestamp, "
            "create_time, update_time) VALUES "
            + ",".join(f"({i}, 'h', 'tok', 'other:{i}:0', 0, NOW(), NOW())"
                       for i in range(2, 1024))))
        conn.execute(text("UPDATE leaf_workerid_alloc SET update_time = NOW() - INTERVAL 1 "
                          "HOUR WHERE id = 1"))  # a missed its renews past the lease
    b = make("host-b:w:0")
    assert b.claim().worker_id == 1
    with pytest.raises(WorkerIdUnavailable) as err:
        a.record_high_water(wall_clock_ms() + 1_000)
    assert "taken over" in str(err.value)
    with pytest.raises(WorkerIdUnavailable):
        a.check()


def test_missed_renew_self_fences_until_a_renew_succeeds(make: Factory) -> None:
    clock = FakeMsClock(wall_clock_ms())
    a = make("host-a:w:0", clock=clock)
    a.claim()
    a.check()
    clock.advance(a.deadline.fence_after_s * 1000 + 1)
    with pytest.raises(WorkerIdUnavailable) as err:
        a.check()
    assert "not renewed" in str(err.value)
    a.tick()
    a.check()


def test_mysql_down_at_start_uses_the_cached_lease(make: Factory, tmp_path: Path) -> None:
    now = wall_clock_ms()
    a = make("host-a:w:0", clock=FakeMsClock(now))
    a.claim()
    a.record_high_water(now + 1_000)
    cached = json.loads(a.cache.path.read_text())
    assert cached["lease_until"] == now + int(a.deadline.fence_after_s * 1000)
    a._close()  # the process dies without releasing
    a._lease = None
    down = f"mysql+pymysql://u:p@127.0.0.1:{free_port()}/x"

    behind = make("host-a:w:0", clock=FakeMsClock(now + 500), url=down)
    with pytest.raises(ClockMovedBackwards) as err:
        behind.claim()
    assert "cache file" in str(err.value)

    clock = FakeMsClock(now + 1_001)
    reg = make("host-a:w:0", clock=clock, url=down)
    lease = reg.claim()
    assert (lease.worker_id, lease.source, lease.last_timestamp_ms) == (1, "cache", now + 1_000)
    assert reg.degraded
    reg.record_high_water(now + 2_000)  # within the cached lease: cache file only
    assert json.loads(reg.cache.path.read_text())["last_timestamp"] == now + 2_000
    clock.advance(cached["lease_until"] - clock.now + 1)  # the cached lease runs out
    with pytest.raises(WorkerIdUnavailable) as err2:
        reg.check()
    assert "not renewed" in str(err2.value)
    reg._lease = None

    expired = make("host-a:w:0", clock=FakeMsClock(cached["lease_until"] + 10), url=down)
    with pytest.raises(WorkerIdUnavailable) as err3:
        expired.claim()
    assert "cannot be used" in str(err3.value)


def test_driver_errors_are_wrapped(make: Factory) -> None:
    reg = make("host-a:w:0", url=f"mysql+pymysql://u:p@127.0.0.1:{free_port()}/x",
               cache="empty")
    with pytest.raises(WorkerIdUnavailable) as err:  # no database and no cache file
        reg.claim()
    assert "MySQL unreachable" in str(err.value)
    assert isinstance(err.value.__cause__, BackendUnavailable)
    assert err.value.__cause__.__cause__ is not None  # the driver's error, kept


def test_sqlite_url_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    with pytest.raises(ConfigurationError) as err:
        open_registry(_settings(url, tmp_path), "h:n:0")
    assert err.value.field == "LEAFPOOL_DATABASE_URL"
    assert re.search("MySQL", str(err.value))
