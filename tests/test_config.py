import pytest

from leafpool.config import load_settings
from leafpool.errors import ConfigurationError


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
    with pytest.raises(ConfigurationError, match="pool_floor=10 must not exceed"):
        load_settings()
