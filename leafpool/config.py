"""Settings: read from the environment (prefix ``LEAFPOOL_``) in this one place and
validated once. A malformed value raises :class:`~leafpool.errors.ConfigurationError`
naming the variable and the value."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from leafpool.errors import ConfigurationError

MAX_STEP = 1_000_000
MAX_ID = 2**63 - 1


def default_home() -> Path:
    return Path(os.environ.get("LEAFPOOL_HOME", Path.home() / ".leafpool"))


class Settings(BaseSettings):
    """Every tunable of leafpool. Field ``foo`` is read from ``LEAFPOOL_FOO``."""

    model_config = SettingsConfigDict(env_prefix="LEAFPOOL_", extra="ignore", frozen=True)

    # where things live
    database_url: str = ""
    redis_url: str = "redis://127.0.0.1:6379/0"
    broker_url: str = ""
    key_prefix: str = "leafpool"

    # pool sizing (design.md section 3)
    pool_seconds: float = Field(30.0, gt=0)
    pool_floor: int = Field(2_000, ge=1)
    pool_ceiling: int = Field(1_000_000, ge=1)
    low_water_ratio: float = Field(0.5, gt=0, lt=1)
    chunk_size: int = Field(1_000, ge=1, le=100_000)
    reserve_seconds: float = Field(60.0, gt=0)
    rate_smoothing: float = Field(0.3, gt=0, le=1)

    # dynamic step (Leaf: 15 and 30 minutes)
    step_grow_seconds: float = Field(15 * 60, gt=0)
    step_shrink_seconds: float = Field(30 * 60, gt=0)
    max_step: int = Field(MAX_STEP, ge=1, le=MAX_STEP)

    # refill lock and retries
    lock_ttl_ms: int = Field(30_000, ge=100)
    refill_retry_max: int = Field(20, ge=0)
    refill_retry_backoff_max: float = Field(30.0, gt=0)

    # schedules
    tag_sync_seconds: float = Field(60.0, gt=0)
    sweep_seconds: float = Field(1.0, gt=0)
    visibility_timeout: int = Field(300, ge=1)

    # client policy on an empty pool
    empty_policy: Literal["raise", "wait", "reserve"] = "wait"
    empty_wait_seconds: float = Field(2.0, ge=0)

    # snowflake (design.md section 4)
    snowflake_mode: Literal["zk", "zk_recycle", "mysql", "local"] | None = None
    zk_hosts: str = ""
    snowflake_name: str = "leafpool"
    snowflake_epoch: int = Field(1288834974657, ge=0)
    snowflake_random_sequence: int = Field(100, ge=0, le=4096)
    snowflake_batch_seconds: float = Field(2.0, gt=0)
    snowflake_max_backwards_ms: int = Field(5, ge=0)
    snowflake_peer_skew_ms: int = Field(5_000, ge=0)
    snowflake_report_seconds: float = Field(3.0, gt=0)
    # a start whose clock is behind the recorded timestamp by at most this waits for the
    # clock to pass it (a restart after a crash, within the window recorded ahead)
    snowflake_start_wait_ms: int = Field(3_000, ge=0, le=60_000)
    snowflake_lease_seconds: float = Field(30.0, gt=0)
    snowflake_renew_seconds: float = Field(10.0, gt=0)
    snowflake_exhaustion_warn_days: int = Field(365, ge=0)
    snowflake_local_map: str = ""
    snowflake_cache_dir: str = ""

    # HTTP
    http_host: str = "127.0.0.1"
    http_port: int = Field(8080, ge=1, le=65535)
    http_max_count: int = Field(1_000, ge=1)
    http_tokens: str = ""

    @field_validator("key_prefix")
    @classmethod
    def _prefix_chars(cls, value: str) -> str:
        if not value or any(c in value for c in "{}: \t\n"):
            raise ValueError("a non-empty prefix without braces, colons or spaces")
        return value

    @model_validator(mode="after")
    def _fill_defaults(self) -> Settings:
        if self.pool_floor > self.pool_ceiling:
            raise ValueError(
                f"pool_floor={self.pool_floor} must not exceed pool_ceiling={self.pool_ceiling}"
            )
        if not self.database_url:
            home = default_home()
            object.__setattr__(self, "database_url", f"sqlite:///{home / 'leafpool.sqlite3'}")
        if not self.broker_url:
            object.__setattr__(self, "broker_url", self.redis_url)
        if self.snowflake_mode is None:
            object.__setattr__(self, "snowflake_mode", "zk" if self.zk_hosts else "local")
        if not self.snowflake_cache_dir:
            object.__setattr__(self, "snowflake_cache_dir", str(default_home() / "snowflake"))
        return self


def load_settings(**overrides: object) -> Settings:
    """Read and validate the settings; wrap pydantic's error in ConfigurationError."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = err.get("loc") or ()
        field = str(loc[0]) if loc else "settings"
        env = f"LEAFPOOL_{field.upper()}" if loc else "LEAFPOOL_*"
        value = os.environ.get(env, err.get("input"))
        raise ConfigurationError(env, value, err.get("msg", "invalid")) from exc


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once."""
    return load_settings()
