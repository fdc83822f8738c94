"""Mode local, what only it does: the static map (its format, its errors, a bare number)
and the host-local allocation of an empty map, with one worker ID locked to one process
on the host. What every mode does is in tests/snowflake/registry/test_contract.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from leafpool.core.config import load_settings, parse_local_map
from leafpool.core.errors import ClockMovedBackwards, ConfigurationError, WorkerIdUnavailable
from leafpool.snowflake.registry.local import LocalRegistry
from tests.support import registries
from tests.support.clocks import T0, FakeMsClock
from tests.support.registries import LocalBackend

MAP = "host-a:node1:0=1, host-b:node1:0=2,\nhost-a:node1:1=3"


local = registries.fixture("local")


# -- the map -----------------------------------------------------------------------------


def test_map_format() -> None:
    assert parse_local_map(MAP) == {"host-a:node1:0": 1, "host-b:node1:0": 2, "host-a:node1:1": 3}
    assert parse_local_map(" 7 ") == 7
    assert parse_local_map("a=b=5") == {"a=b": 5}  # the ID follows the last '='


@pytest.mark.parametrize(
    "value,why",
    [
        ("host-a:n:0", "identity=worker_id"),
        ("=3", "identity=worker_id"),
        ("a=1024", "0 to 1023"),
        ("a=x", "0 to 1023"),
        ("1024", "0 to 1023"),
        ("a=1,b=1", "duplicate"),
        ("a=1,a=2", "twice"),
        (", ,", "no identity"),
    ],
)
def test_bad_map_names_the_variable_and_value(value: str, why: str) -> None:
    with pytest.raises(ConfigurationError) as err:
        parse_local_map(value)
    assert err.value.field == "LEAFPOOL_SNOWFLAKE_LOCAL_MAP"
    assert err.value.value == value
    assert why in str(err.value)


def test_bad_map_refused_when_the_settings_load(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as err:  # not at the first snowflake refill
        load_settings(
            snowflake_mode="local", snowflake_local_map="nope", snowflake_cache_dir=str(tmp_path)
        )
    assert err.value.field == "LEAFPOOL_SNOWFLAKE_LOCAL_MAP"


def test_the_map_gives_the_worker_id(local: LocalBackend) -> None:
    reg = local.open("host-a:node1:1", snowflake_local_map=MAP)
    assert isinstance(reg, LocalRegistry)
    assert reg.mapping is reg.settings.local_map  # parsed once, with the settings
    assert reg.worker_id_for_identity() == 3
    lease = reg.claim()
    assert (lease.worker_id, lease.source) == (3, "local-map")


def test_identity_missing_from_the_map(local: LocalBackend) -> None:
    reg = local.open("host-z:node1:0", snowflake_local_map=MAP)
    with pytest.raises(ConfigurationError) as err:
        reg.claim()
    assert err.value.field == "LEAFPOOL_SNOWFLAKE_LOCAL_MAP"
    assert "host-z:node1:0" in str(err.value)


# -- one worker ID, one process ----------------------------------------------------------


def test_a_worker_id_is_held_by_one_process_on_the_host(local: LocalBackend) -> None:
    clock = FakeMsClock(T0)
    first = local.open("host-a:node1:0", clock, snowflake_local_map="9")
    first.claim()
    first.record_high_water(T0 + 50_000)
    second = local.open("host-a:node1:1", clock, snowflake_local_map="9")
    with pytest.raises(WorkerIdUnavailable) as err:
        second.claim()
    assert "worker 9 is held by another process" in str(err.value)
    first.release()
    # the other identity now gets worker 9, above what the first one recorded for it
    with pytest.raises(ClockMovedBackwards):
        second.claim()
    clock.set(T0 + 50_000)
    assert second.claim().last_timestamp_ms == T0 + 50_000


# -- empty map: the lowest worker ID free on this host (the embedded default) ------------


def test_an_empty_map_gives_each_process_on_the_host_its_own_worker_id(local: LocalBackend) -> None:
    first = local.open("h:n:0", snowflake_local_map="")
    second = local.open("h:n:1", snowflake_local_map="")
    assert first.claim().worker_id == 0
    lease = second.claim()
    assert (lease.worker_id, lease.source) == (1, "local-host")
    first.release()
    # a restart of the second identity gets its worker ID back, even with 0 free now
    second.release()
    assert local.open("h:n:1", snowflake_local_map="").claim().worker_id == 1
    assert local.open("h:n:2", snowflake_local_map="").claim().worker_id == 0
    # the same identity twice: the second process takes another worker ID
    assert local.open("h:n:2", snowflake_local_map="").claim().worker_id == 2
