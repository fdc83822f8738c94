"""Mode local (static map), and what every mode shares: identities, the cache file, the
clock check at start, release, and LeasedGenerator."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from leafpool.config import Settings, load_settings, parse_local_map
from leafpool.errors import (
    ClockMovedBackwards,
    ConfigurationError,
    InvalidArgument,
    WorkerIdUnavailable,
)
from leafpool.registry import LeasedGenerator, open_registry
from leafpool.registry.cache import CacheFile, CacheRecord
from leafpool.registry.identity import safe_identity, unsafe_identity
from leafpool.registry.local import LocalRegistry
from leafpool.snowflake import decode
from tests import services
from tests.clocks import T0, FakeMsClock

MAP = "host-a:node1:0=1, host-b:node1:0=2,\nhost-a:node1:1=3"


@pytest.fixture
def settings(tmp_path: Path) -> Callable[..., Settings]:
    def make(**overrides: object) -> Settings:
        values: dict[str, object] = {
            "snowflake_mode": "local",
            "snowflake_local_map": MAP,
            "snowflake_cache_dir": str(tmp_path / "cache"),
            "snowflake_name": "t",
        }
        values.update(overrides)
        return load_settings(**values)

    return make


def registry(settings: Settings, identity: str, clock: FakeMsClock, **kw: object) -> LocalRegistry:
    reg = open_registry(settings, identity, clock=clock, sleep=clock.sleep,
                        monotonic=clock.monotonic, background=False, **kw)
    assert isinstance(reg, LocalRegistry)
    return reg


# -- the map -----------------------------------------------------------------------------

def test_map_format() -> None:
    assert parse_local_map(MAP) == {"host-a:node1:0": 1, "host-b:node1:0": 2,
                                    "host-a:node1:1": 3}
    assert parse_local_map(" 7 ") == 7
    assert parse_local_map("a=b=5") == {"a=b": 5}  # the ID follows the last '='


@pytest.mark.parametrize("value,why", [
    ("host-a:n:0", "identity=worker_id"),
    ("=3", "identity=worker_id"),
    ("a=1024", "0 to 1023"),
    ("a=x", "0 to 1023"),
    ("1024", "0 to 1023"),
    ("a=1,b=1", "duplicate"),
    ("a=1,a=2", "twice"),
    (", ,", "no identity"),
])
def test_bad_map_names_the_variable_and_value(value: str, why: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        parse_local_map(value)
    assert err.value.field == "LEAFPOOL_SNOWFLAKE_LOCAL_MAP"
    assert err.value.value == value
    assert why in str(err.value)


def test_bad_map_refused_when_the_settings_load(settings: Callable[..., Settings]) -> None:
    with pytest.raises(ConfigurationError) as err:
        settings(snowflake_local_map="nope")  # not at the first snowflake refill
    assert err.value.field == "LEAFPOOL_SNOWFLAKE_LOCAL_MAP"


def test_the_registry_uses_the_parsed_map(settings: Callable[..., Settings]) -> None:
    s = settings()
    reg = open_registry(s, "host-a:node1:1")
    assert isinstance(reg, LocalRegistry)
    assert reg.mapping is s.local_map
    assert reg.worker_id_for_identity() == 3


def test_identity_missing_from_the_map(settings: Callable[..., Settings]) -> None:
    reg = registry(settings(), "host-z:node1:0", FakeMsClock())
    with pytest.raises(ConfigurationError) as err:
        reg.claim()
    assert "host-z:node1:0" in str(err.value)


# -- identities --------------------------------------------------------------------------

@pytest.mark.parametrize("identity", [
    "host-a:celery@node-1:0", "../../etc/passwd:x:0", "h/o/s/t:n:1", "naïve:n:2", "a%2D:b:3",
    ".", "..",
])
def test_safe_identity_is_a_reversible_plain_name(identity: str) -> None:
    safe = safe_identity(identity)
    assert "/" not in safe and "-" not in safe and safe not in {".", ".."}
    assert all(c.isascii() and (c.isalnum() or c in "_.:@%") for c in safe)
    assert unsafe_identity(safe) == identity


def test_distinct_identities_never_share_a_safe_form() -> None:
    names = ["a-b:n:0", "a_b:n:0", "a%2Db:n:0", "a.b:n:0", "a b:n:0"]
    assert len({safe_identity(n) for n in names}) == len(names)


def test_cache_file_stays_inside_the_cache_dir(settings: Callable[..., Settings],
                                               tmp_path: Path) -> None:
    reg = registry(settings(snowflake_local_map="5"), "../../evil:n:0", FakeMsClock())
    reg.claim()
    assert reg.cache.path.parent == tmp_path / "cache" / "t"
    assert reg.cache.path.exists()
    reg.release()


@pytest.mark.parametrize("identity", ["", "   ", "x" * 128, "a\nb"])
def test_bad_identity_refused(settings: Callable[..., Settings], identity: str) -> None:
    with pytest.raises(Exception) as err:
        open_registry(settings(), identity)
    assert "identity" in str(err.value)


# -- claim, cache file, restart ----------------------------------------------------------

def test_claim_writes_the_cache_file_atomically(settings: Callable[..., Settings]) -> None:
    clock = FakeMsClock()
    reg = registry(settings(), "host-b:node1:0", clock)
    lease = reg.claim()
    assert (lease.worker_id, lease.source, lease.mode) == (2, "local-map", "local")
    data = json.loads(reg.cache.path.read_text())
    assert data["worker_id"] == 2 and data["last_timestamp"] == T0
    assert data["identity"] == "host-b:node1:0"
    reg.record_high_water(T0 + 500)
    assert json.loads(reg.cache.path.read_text())["last_timestamp"] == T0 + 500
    leftovers = [p.name for p in reg.cache.path.parent.iterdir()
                 if not p.name.endswith((".json", ".lock"))]
    assert leftovers == []
    reg.record_high_water(T0 + 100)  # never lowered
    assert json.loads(reg.cache.path.read_text())["last_timestamp"] == T0 + 500
    reg.release()


def test_restart_reuses_the_id_above_the_recorded_timestamp(
        settings: Callable[..., Settings]) -> None:
    clock = FakeMsClock()
    with LeasedGenerator(registry(settings(), "host-a:node1:1", clock), settings(),
                         clock=clock, sleep=clock.sleep) as gen:
        first = gen.next_batch(1000)
        recorded = json.loads(gen.registry.cache.path.read_text())["last_timestamp"]  # type: ignore[attr-defined]
        assert recorded >= max(decode(i).timestamp_ms for i in first)
    clock.advance(5)
    gen2 = LeasedGenerator(registry(settings(), "host-a:node1:1", clock), settings(),
                           clock=clock, sleep=clock.sleep)
    lease = gen2.start()
    assert lease.worker_id == 3
    second = gen2.next_batch(1000)
    assert min(second) > max(first)
    assert decode(second[0]).timestamp_ms > lease.last_timestamp_ms
    gen2.close()


def test_clock_behind_the_cache_file_is_refused(settings: Callable[..., Settings]) -> None:
    clock = FakeMsClock()
    reg = registry(settings(), "host-a:node1:0", clock)
    reg.claim()
    reg.record_high_water(T0 + 60_000)
    reg.release()  # no last_emitted: the recorded window stays
    behind = registry(settings(), "host-a:node1:0", FakeMsClock(T0 + 1_000))
    with pytest.raises(ClockMovedBackwards) as err:
        behind.claim()
    assert err.value.offset_ms == 59_000 and err.value.worker_id == 1
    assert "cache file" in str(err.value) and str(reg.cache.path) in str(err.value)
    assert behind.lease is None
    later = registry(settings(), "host-a:node1:0", FakeMsClock(T0 + 60_000))
    assert later.claim().last_timestamp_ms == T0 + 60_000
    later.release()


def test_start_wait_waits_out_a_small_gap(settings: Callable[..., Settings]) -> None:
    clock = FakeMsClock()
    reg = registry(settings(), "host-a:node1:0", clock)
    reg.claim()
    reg.record_high_water(T0 + 3_000)
    reg.release()
    clock2 = FakeMsClock(T0 + 1_000)
    waiting = registry(settings(), "host-a:node1:0", clock2, start_wait_ms=5_000)
    lease = waiting.claim()
    assert lease.last_timestamp_ms == T0 + 3_000 and clock2() >= T0 + 3_000
    assert sum(clock2.sleeps) == pytest.approx(2.0)
    waiting.release()


def test_release_with_last_emitted_drops_the_window(settings: Callable[..., Settings]) -> None:
    clock = FakeMsClock()
    reg = registry(settings(), "host-a:node1:0", clock)
    reg.claim()
    reg.record_high_water(T0 + 3_000)
    clock.advance(10)
    reg.release(last_emitted_ms=T0 + 5)
    assert json.loads(reg.cache.path.read_text())["last_timestamp"] == T0 + 10
    again = registry(settings(), "host-a:node1:0", clock)  # a quick restart is not refused
    assert again.claim().last_timestamp_ms == T0 + 10
    again.release()


def test_corrupt_cache_file_refuses_the_start(settings: Callable[..., Settings]) -> None:
    reg = registry(settings(), "host-a:node1:0", FakeMsClock())
    reg.cache.path.parent.mkdir(parents=True)
    reg.cache.path.write_text("{not json")
    with pytest.raises(WorkerIdUnavailable) as err:
        reg.claim()
    assert "corrupt" in str(err.value) and str(reg.cache.path) in str(err.value)


def test_cache_record_round_trip(tmp_path: Path) -> None:
    cache = CacheFile(tmp_path / "sub" / "x.json")
    assert cache.read() is None
    record = CacheRecord(worker_id=3, last_timestamp=5, identity="a", mode="local",
                         token="t", lease_until=9, updated_at=4, pid=123)
    cache.write(record)
    assert cache.read() == record
    assert sorted(p.name for p in cache.path.parent.iterdir()) == ["x.json"]


# -- one worker ID, one process ----------------------------------------------------------

def test_a_worker_id_is_held_by_one_process_on_the_host(
        settings: Callable[..., Settings]) -> None:
    clock = FakeMsClock()
    bare = settings(snowflake_local_map="9")
    first = registry(bare, "host-a:node1:0", clock)
    first.claim()
    first.record_high_water(T0 + 50_000)
    second = registry(bare, "host-a:node1:1", clock)
    with pytest.raises(WorkerIdUnavailable) as err:
        second.claim()
    assert "worker 9 is held by another process" in str(err.value)
    first.release()
    # the other identity now gets worker 9, above what the first one recorded for it
    with pytest.raises(ClockMovedBackwards):
        second.claim()
    clock.set(T0 + 50_000)
    assert second.claim().last_timestamp_ms == T0 + 50_000
    second.release()


def test_check_and_record_need_a_claim(settings: Callable[..., Settings]) -> None:
    reg = registry(settings(), "host-a:node1:0", FakeMsClock())
    with pytest.raises(WorkerIdUnavailable):
        reg.check()
    with pytest.raises(WorkerIdUnavailable):
        reg.record_high_water(T0)
    reg.claim()
    reg.check()
    assert reg.claim() is reg.lease  # idempotent while held
    for bad in (-1, 1.5, True, "5"):
        with pytest.raises(InvalidArgument):
            reg.record_high_water(bad)  # type: ignore[arg-type]
    reg.release()
    with pytest.raises(WorkerIdUnavailable):
        reg.check()


def test_tick_reports_the_clock_to_the_cache(settings: Callable[..., Settings]) -> None:
    clock = FakeMsClock()
    reg = registry(settings(), "host-a:node1:0", clock)
    reg.claim()
    clock.advance(3_000)
    reg.tick()
    assert json.loads(reg.cache.path.read_text())["last_timestamp"] == T0 + 3_000
    reg.release()


def test_background_ticker_runs_and_stops(settings: Callable[..., Settings]) -> None:
    reg = open_registry(settings(snowflake_report_seconds=0.05), "host-a:node1:0")
    reg.claim()
    ticker = reg._ticker
    assert ticker is not None and ticker._thread.is_alive()
    reg.release()  # stops the ticker; under load its thread may need a moment to end
    services.wait_until(lambda: not ticker._thread.is_alive(), 30, "the ticker thread ended")


# -- empty map: the lowest worker ID free on this host (the embedded default) ------------

def test_an_empty_map_gives_each_process_on_the_host_its_own_worker_id(
    settings: Callable[..., Settings]
) -> None:
    clock = FakeMsClock()
    s = settings(snowflake_local_map="")
    first = registry(s, "h:n:0", clock)
    second = registry(s, "h:n:1", clock)
    assert first.claim().worker_id == 0
    lease = second.claim()
    assert (lease.worker_id, lease.source) == (1, "local-host")
    first.release()
    # a restart of the second identity gets its worker ID back, even with 0 free now
    second.release()
    again = registry(s, "h:n:1", clock)
    assert again.claim().worker_id == 1
    assert registry(s, "h:n:2", clock).claim().worker_id == 0
