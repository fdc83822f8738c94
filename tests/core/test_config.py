"""Settings: defaults, and every malformed value refused when the settings are loaded,
naming the variable, by the library, the ``leafpool`` CLI and ``celery -A workers``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis
import typer

from leafpool.cli import reports_errors
from leafpool.core.config import MAX_BACKWARDS_MS, Settings, load_settings
from leafpool.core.errors import ConfigurationError, InvalidInput, LeafpoolError
from leafpool.core.snowflake_layout import MAX_TIMESTAMP, wall_clock_ms

ROOT = Path(__file__).resolve().parents[2]
FLOAT_FIELDS = sorted(name for name, f in Settings.model_fields.items() if f.annotation is float)


def test_defaults_follow_the_design(monkeypatch: pytest.MonkeyPatch) -> None:
    s = load_settings()
    assert s.redis_url == "redis://127.0.0.1:6379/0"
    assert s.broker_url == s.redis_url
    assert s.key_prefix == "leafpool"
    assert s.database_url.startswith("sqlite:///")
    assert s.snowflake_mode == "local"


def test_broker_defaults_to_the_redis_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEAFPOOL_REDIS_URL", "redis://127.0.0.1:7000/2")
    assert load_settings().broker_url == "redis://127.0.0.1:7000/2"


def test_zk_hosts_select_zk_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEAFPOOL_ZK_HOSTS", "127.0.0.1:2181")
    assert load_settings().snowflake_mode == "zk"


@pytest.mark.parametrize("name,value", [
    ("LEAFPOOL_POOL_FLOOR", "abc"),
    ("LEAFPOOL_CHUNK_SIZE", "0"),
    ("LEAFPOOL_EMPTY_POLICY", "sometimes"),
    ("LEAFPOOL_KEY_PREFIX", "a:b"),
    ("LEAFPOOL_LOW_WATER_RATIO", "1.5"),
])
def test_a_malformed_variable_is_named_with_its_value(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    assert info.value.field == name
    assert f"{name}={value!r}" in str(info.value)


def test_floor_above_ceiling_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEAFPOOL_POOL_FLOOR", "10")
    monkeypatch.setenv("LEAFPOOL_POOL_CEILING", "5")
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    assert info.value.field == "LEAFPOOL_POOL_FLOOR"
    assert "must not exceed LEAFPOOL_POOL_CEILING=5" in str(info.value)


# -- item: settings validated once, at start ------------------------------------------------

def future_epoch() -> str:
    return str(wall_clock_ms() + 86_400_000)


# (variable, value, a phrase of the complaint); each of these was accepted at load before
# and failed only later: at the first pop, inside a refill, at the first snowflake refill
BAD_VALUES = [
    ("LEAFPOOL_EMPTY_WAIT_SECONDS", "inf", "finite"),
    ("LEAFPOOL_EMPTY_WAIT_SECONDS", "1e9", "less than or equal to 300"),
    ("LEAFPOOL_POOL_SECONDS", "inf", "finite"),
    ("LEAFPOOL_POOL_SECONDS", "nan", "finite"),
    ("LEAFPOOL_POOL_SECONDS", "1e308", "less than or equal"),
    ("LEAFPOOL_RESERVE_SECONDS", "-inf", "finite"),
    ("LEAFPOOL_TAG_SYNC_SECONDS", "1e12", "less than or equal"),
    ("LEAFPOOL_SNOWFLAKE_LOCAL_MAP", "garbage", "identity=worker_id"),
    ("LEAFPOOL_SNOWFLAKE_LOCAL_MAP", "a=1,b=1", "duplicate"),
    ("LEAFPOOL_SNOWFLAKE_MAX_BACKWARDS_MS", str(MAX_BACKWARDS_MS + 1), "less than or equal"),
    ("LEAFPOOL_SNOWFLAKE_MAX_BACKWARDS_MS", "999999999", "less than or equal"),
    ("LEAFPOOL_REDIS_URL", "localhost:6379", "Redis URL"),
    ("LEAFPOOL_DATABASE_URL", "postgresql://leaf:pw@db/leaf", "SQLite or MySQL"),
    ("LEAFPOOL_DATABASE_URL", "mysql://leaf:pw@db/leaf", "not installed"),
    ("LEAFPOOL_STEP_GROW_SECONDS", "3600", "must not exceed LEAFPOOL_STEP_SHRINK_SECONDS"),
    ("LEAFPOOL_HTTP_TOKENS", "tok=bad tag", "allowed characters"),
    ("LEAFPOOL_HTTP_COALESCE_MAX", "-1", "greater than or equal to 0"),
    ("LEAFPOOL_HTTP_COALESCE_MAX", "10001", "less than or equal to 10000"),
    ("LEAFPOOL_HTTP_COALESCE_MAX", "many", "integer"),
    ("LEAFPOOL_SNOWFLAKE_NAME", "../etc", "A-Z a-z 0-9"),
    ("LEAFPOOL_REFILL_BATCH_SIZE", "0", "greater than or equal to 1"),
    ("LEAFPOOL_REFILL_BATCH_SIZE", "10001", "less than or equal to 10000"),
    ("LEAFPOOL_REFILL_BATCH_THREADS", "0", "greater than or equal to 1"),
    ("LEAFPOOL_REFILL_BATCH_THREADS", "lots", "integer"),
]


@pytest.mark.parametrize("name,value,why", BAD_VALUES)
def test_bad_values_are_refused_at_load_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str, why: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    assert info.value.field == name
    assert why in str(info.value)
    assert str(info.value).startswith(f"{name}=")


def test_a_snowflake_epoch_in_the_future_is_refused_at_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LEAFPOOL_SNOWFLAKE_EPOCH", future_epoch())
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    assert info.value.field == "LEAFPOOL_SNOWFLAKE_EPOCH"
    assert "future" in str(info.value)
    # (an epoch whose 41 time bits are used up is refused the same way, but none >= 0 is
    # before 2039: the generator's own check covers it, tests/snowflake/test_generator.py)
    assert wall_clock_ms() - 0 < MAX_TIMESTAMP


@pytest.mark.parametrize("field", FLOAT_FIELDS)
@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "1e400"])
def test_every_float_setting_must_be_finite(
    monkeypatch: pytest.MonkeyPatch, field: str, value: str
) -> None:
    name = f"LEAFPOOL_{field.upper()}"
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    assert info.value.field == name
    assert "finite" in str(info.value)


def test_a_password_in_a_refused_url_is_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEAFPOOL_DATABASE_URL", "postgresql://leaf:s3cret@db/leaf")
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    assert "s3cret" not in str(info.value)
    assert "postgresql://leaf:***@db/leaf" in str(info.value)


def test_the_largest_allowed_values_load(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEAFPOOL_SNOWFLAKE_MAX_BACKWARDS_MS", str(MAX_BACKWARDS_MS))
    monkeypatch.setenv("LEAFPOOL_EMPTY_WAIT_SECONDS", "300")
    monkeypatch.setenv("LEAFPOOL_DATABASE_URL", "mysql+pymysql://leaf:pw@db/leaf")
    monkeypatch.setenv("LEAFPOOL_REDIS_URL", "rediss://app:pw@redis.internal:6380/0")
    s = load_settings()
    assert s.snowflake_max_backwards_ms == MAX_BACKWARDS_MS
    assert s.empty_wait_seconds == 300


def test_parsed_forms_are_kept_with_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEAFPOOL_SNOWFLAKE_LOCAL_MAP", "h:n:0=1, h:n:1=2")
    monkeypatch.setenv("LEAFPOOL_HTTP_TOKENS", "a=x,y;b=*")
    s = load_settings()
    assert dict(s.local_map or {}) == {"h:n:0": 1, "h:n:1": 2}
    assert s.token_policy.lookup("a") == (True, frozenset({"x", "y"}))
    assert s.token_policy.lookup("b") == (True, None)
    assert load_settings(snowflake_local_map=" 7 ").local_map == 7
    empty = load_settings(snowflake_local_map="", http_tokens="")
    assert empty.local_map is None and not empty.token_policy.enabled


def test_configuration_error_is_an_operator_fault_not_bad_input() -> None:
    exc = ConfigurationError("LEAFPOOL_POOL_SECONDS", "inf", "a finite number")
    assert isinstance(exc, LeafpoolError) and not isinstance(exc, InvalidInput)
    assert (exc.field, exc.value, exc.allowed) == ("LEAFPOOL_POOL_SECONDS", "inf",
                                                   "a finite number")
    assert str(exc) == "LEAFPOOL_POOL_SECONDS='inf' is not valid: a finite number"


def test_cli_exits_2_for_a_configuration_error_raised_inside_a_command() -> None:
    @reports_errors
    def command() -> None:
        raise ConfigurationError("LEAFPOOL_SNOWFLAKE_LOCAL_MAP", "a=1", "has no entry for h:n:0")

    with pytest.raises(typer.Exit) as info:
        command()
    assert info.value.exit_code == 2


# -- entry points: the CLI and the Celery app refuse to start --------------------------------

def _env(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEAFPOOL_")}
    env["PYTHONPATH"] = str(ROOT)
    env["LEAFPOOL_HOME"] = os.environ["LEAFPOOL_HOME"]
    env.update(values)
    return env


def _connections(r: redis.Redis) -> int:
    return int(r.info("stats")["total_connections_received"])


@pytest.mark.parametrize("name,value", [
    ("LEAFPOOL_EMPTY_WAIT_SECONDS", "inf"),
    ("LEAFPOOL_POOL_SECONDS", "nan"),
    ("LEAFPOOL_SNOWFLAKE_LOCAL_MAP", "garbage"),
    pytest.param("LEAFPOOL_SNOWFLAKE_EPOCH", future_epoch(), id="epoch-in-the-future"),
    ("LEAFPOOL_SNOWFLAKE_MAX_BACKWARDS_MS", "60000"),
])
def test_cli_exits_2_naming_the_variable_before_touching_redis(
    redis_url: str, r: redis.Redis, name: str, value: str
) -> None:
    before = _connections(r)
    done = subprocess.run(
        [sys.executable, "-m", "leafpool.cli", "status"], cwd=ROOT, capture_output=True,
        text=True, timeout=120, env=_env(LEAFPOOL_REDIS_URL=redis_url, **{name: value}),
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"{name}=" in done.stderr
    assert "Traceback" not in done.stderr
    assert _connections(r) == before  # (this test's client reuses its one connection)


def test_celery_app_refuses_to_load_naming_the_variable() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "workers", "report"], cwd=ROOT,
        capture_output=True, text=True, timeout=120,
        env=_env(LEAFPOOL_EMPTY_WAIT_SECONDS="inf"),
    )
    assert done.returncode != 0, done.stdout
    output = done.stdout + done.stderr
    assert "Unable to load celery application" in output
    assert "ConfigurationError: LEAFPOOL_EMPTY_WAIT_SECONDS='inf' is not valid" in output


# -- the drop watcher and burst sizing (docs/design.md §3.2, §3.7) ------------------------------

@pytest.mark.parametrize("name,value", [
    ("LEAFPOOL_WATCH", "sometimes"),
    ("LEAFPOOL_WATCH_INTERVAL_MS", "0"),
    ("LEAFPOOL_WATCH_INTERVAL_MS", "5000"),
    ("LEAFPOOL_WATCH_SWEEP_SECONDS", "0"),
    ("LEAFPOOL_WATCH_SWEEP_SECONDS", "inf"),
    ("LEAFPOOL_BURST_SIZING", "maybe"),
    ("LEAFPOOL_POOL_FLOOR", "0"),
])
def test_a_malformed_watch_or_sizing_setting_is_named_with_its_value(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigurationError) as info:
        load_settings()
    assert info.value.field == name
    assert f"{name}={value!r}" in str(info.value)


def test_watch_and_sizing_defaults() -> None:
    s = load_settings()
    assert (s.watch, s.burst_sizing, s.pool_floor) == (True, True, 200)
    assert (s.watch_interval_ms, s.watch_sweep_seconds, s.sweep_seconds) == (10, 30.0, 1.0)


def test_the_dc_settings_default_to_one_site_and_are_read_from_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    one = load_settings()
    assert (one.dc_id, one.dc_count, one.dc_segments) == (0, 1, "shared")
    monkeypatch.setenv("LEAFPOOL_DC_ID", "3")
    monkeypatch.setenv("LEAFPOOL_DC_COUNT", "4")
    monkeypatch.setenv("LEAFPOOL_DC_SEGMENTS", "own")
    dc = load_settings()
    assert (dc.dc_id, dc.dc_count, dc.dc_segments) == (3, 4, "own")


@pytest.mark.parametrize(("overrides", "variable", "says"), [
    ({"dc_id": 2, "dc_count": 2}, "LEAFPOOL_DC_ID", "below LEAFPOOL_DC_COUNT=2"),
    ({"dc_count": 3}, "LEAFPOOL_DC_COUNT", "a power of two"),
    ({"dc_count": 2048}, "LEAFPOOL_DC_COUNT", "1024"),
    ({"dc_segments": "both"}, "LEAFPOOL_DC_SEGMENTS", "'shared' or 'own'"),
])
def test_a_dc_setting_out_of_range_is_refused_naming_it(
        overrides: dict[str, object], variable: str, says: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        load_settings(**overrides)
    assert variable in str(caught.value) and says in str(caught.value)
