"""Settings: read from the environment (prefix ``LEAFPOOL_``) in this one place and
validated once, when they are loaded (every entry point loads them before doing anything
else). A malformed value raises :class:`~leafpool.core.errors.ConfigurationError` naming the
variable, the value (passwords and tokens hidden) and what is allowed; nothing later has
to re-check or re-parse a setting.

What is checked here, beyond the types:

- every float is finite (no ``inf``/``nan``) and every duration has an upper bound: a
  huge value overflows a timestamp (``time.time() + wait``), a ``timedelta`` or a Redis
  expiry, or blocks a thread for hours;
- ``LEAFPOOL_SNOWFLAKE_MAX_BACKWARDS_MS`` is at most 1,000
  (:data:`leafpool.core.snowflake_layout.MAX_BACKWARDS_MS`): the generator waits out a small clock
  step back by sleeping twice the offset *while holding its lock*, so every thread
  generating with that worker ID stalls for that long; a larger step is refused
  (:class:`~leafpool.core.errors.ClockMovedBackwards`, the refill is retried) instead;
- ``LEAFPOOL_SNOWFLAKE_EPOCH`` is not in the future and its 41 time bits are not used up;
- ``LEAFPOOL_SNOWFLAKE_LOCAL_MAP`` and ``LEAFPOOL_HTTP_TOKENS`` parse; their parsed forms
  are :attr:`Settings.local_map` and :attr:`Settings.token_policy`;
- ``LEAFPOOL_SNOWFLAKE_NAME`` is a safe path segment;
- ``LEAFPOOL_REDIS_URL`` is a Redis URL and ``LEAFPOOL_DATABASE_URL`` names a supported
  database whose driver is installed; the TLS files and the logins of the backends fit
  the URLs they serve (the base class,
  :class:`~leafpool.core.backend_settings.BackendSettings`, holds those settings).

Checks that depend on the snowflake mode in use (ZooKeeper hosts, a MySQL URL for mode
``mysql``, the renew interval against the lease) are made when the worker-ID registry is
built, in the process that generates snowflake IDs.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from leafpool.core.backend_settings import BackendSettings
from leafpool.core.errors import ConfigurationError
from leafpool.core.setting_values import DATABASE_URL_ENV as DATABASE_URL_ENV
from leafpool.core.setting_values import LOCAL_MAP_ENV as LOCAL_MAP_ENV
from leafpool.core.setting_values import REDIS_URL_ENV as REDIS_URL_ENV
from leafpool.core.setting_values import TOKENS_ENV as TOKENS_ENV
from leafpool.core.setting_values import LocalMap as LocalMap
from leafpool.core.setting_values import TokenPolicy as TokenPolicy
from leafpool.core.setting_values import check_database_url as check_database_url
from leafpool.core.setting_values import check_redis_url as check_redis_url
from leafpool.core.setting_values import hide_password as hide_password
from leafpool.core.setting_values import parse_local_map as parse_local_map
from leafpool.core.setting_values import parse_pop_replicas as parse_pop_replicas
from leafpool.core.setting_values import parse_sentinels as parse_sentinels
from leafpool.core.setting_values import parse_tokens as parse_tokens
from leafpool.core.setting_values import validate_name
from leafpool.core.snowflake_layout import MAX_BACKWARDS_MS, validate_epoch, wall_clock_ms

MAX_STEP = 1_000_000
MAX_ID = 2**63 - 1
MINUTE = 60.0
#: DC IDs and counts (docs/design.md §12): a count must divide the 1024 worker IDs
MAX_DC_COUNT = 1024
MAX_DC_ID = MAX_DC_COUNT - 1
HOUR = 3_600.0
DAY = 86_400.0

def default_home() -> Path:
    return Path(os.environ.get("LEAFPOOL_HOME", Path.home() / ".leafpool"))


# -- the settings ---------------------------------------------------------------------------

class Settings(BackendSettings):
    """Every tunable of leafpool. Field ``foo`` is read from ``LEAFPOOL_FOO``; where the
    backends are and how to log in to them is the base's
    (:class:`~leafpool.core.backend_settings.BackendSettings`)."""

    # allow_inf_nan=False: every float setting must be a finite number
    model_config = SettingsConfigDict(env_prefix="LEAFPOOL_", extra="ignore", frozen=True,
                                      allow_inf_nan=False)

    # where things live: BackendSettings
    key_prefix: str = "leafpool"
    # the Celery broker's keys and channels on Redis are prefixed with this and a colon
    # (kombu's global_keyprefix), so the worker role's ACL names them in two patterns
    broker_key_prefix: str = "leafpool-broker"

    # replica-acknowledged pops: IDs are handed out only once WAIT says this many
    # replicas have the pop (0: no acknowledgement, 'all': every replica at start)
    pop_replicas: str = "0"
    pop_wait_ms: int = Field(100, ge=1, le=60_000)

    # more than one data centre (docs/design.md §12): this deployment's DC and how many
    # the deployment was planned for. Snowflake: each DC leases worker IDs from a range of
    # its own (1024 / DC_COUNT IDs; Leaf's 10-bit layout unchanged, the DC is
    # worker_id // range); the count is fixed for the deployment's life. Segment tags:
    # "shared" (every DC's pools refill from one primary database) or "own" (each DC has a
    # database of its own and a tag's counter lives in the DC's slot of the ID space)
    dc_id: int = Field(0, ge=0, le=MAX_DC_ID)
    dc_count: int = Field(1, ge=1, le=MAX_DC_COUNT)
    dc_segments: Literal["shared", "own"] = "shared"

    # pool sizing (docs/design.md §3); rate x seconds must stay a sane integer
    pool_seconds: float = Field(30.0, gt=0, le=DAY)
    # the floor is what an idle tag holds (docs/design.md §3.2): 200 IDs of a segment or
    # snowflake tag are about 2 KB of Redis, 10,000 idle tags about 40 MB with their state
    pool_floor: int = Field(200, ge=1)
    pool_ceiling: int = Field(1_000_000, ge=1, le=100_000_000)
    low_water_ratio: float = Field(0.5, gt=0, lt=1)
    chunk_size: int = Field(1_000, ge=1, le=100_000)
    reserve_seconds: float = Field(60.0, gt=0, le=DAY)
    # the reserve also holds this many seconds of the tag's recent peak demand, so the
    # pool rides through a database outage that long (docs/design.md §3.2); 0: off
    outage_seconds: float = Field(600.0, ge=0, le=DAY)
    rate_smoothing: float = Field(0.3, gt=0, le=1)

    # dynamic step (Leaf: 15 and 30 minutes)
    step_grow_seconds: float = Field(15 * MINUTE, gt=0, le=7 * DAY)
    step_shrink_seconds: float = Field(30 * MINUTE, gt=0, le=7 * DAY)
    max_step: int = Field(MAX_STEP, ge=1, le=MAX_STEP)

    # a leaf_alloc.max_id found below the first ID the tag may hand out (its high-water
    # mark, a retired mark, its guard): moved up to it by a compare-and-set UPDATE
    # ("heal"), or refused with CounterBehind until an operator moves it ("refuse");
    # docs/design.md §7.3
    counter_behind: Literal["heal", "refuse"] = "heal"

    # refill lock and retries
    lock_ttl_ms: int = Field(30_000, ge=100, le=int(HOUR * 1000))
    refill_retry_max: int = Field(20, ge=0, le=1_000)
    refill_retry_backoff_max: float = Field(30.0, gt=0, le=HOUR)

    # schedules
    tag_sync_seconds: float = Field(60.0, gt=0, le=DAY)
    sweep_seconds: float = Field(1.0, gt=0, le=HOUR)
    visibility_timeout: int = Field(300, ge=1, le=int(7 * DAY))
    # the tag sync's first fill of new tags (docs/design.md §4): tags per refill task it
    # queues (1: one task per tag) and refills run at once inside one such task
    refill_batch_size: int = Field(100, ge=1, le=10_000)
    refill_batch_threads: int = Field(4, ge=1, le=64)

    # the drop watcher and burst sizing (docs/design.md §3.7, §3.2): the beat's process
    # watches every tag's list (client-side-caching invalidations) and queues a refill
    # when a pop takes it below its low-water mark; the sweep then only backs it up,
    # every LEAFPOOL_WATCH_SWEEP_SECONDS (LEAFPOOL_SWEEP_SECONDS without the watcher)
    watch: bool = True
    watch_interval_ms: int = Field(10, ge=1, le=1_000)
    watch_sweep_seconds: float = Field(30.0, gt=0, le=HOUR)
    # size pools by the larger of the smoothed rate and the consumption since the last
    # refill (and the watcher's recent rate); false: the smoothed rate alone
    burst_sizing: bool = True

    # client policy on an empty pool (a request waits this long at most)
    empty_policy: Literal["raise", "wait", "reserve"] = "wait"
    empty_wait_seconds: float = Field(2.0, ge=0, le=5 * MINUTE)
    # the ORM integrations (leafpool.orm, docs/design.md §1.3): how many IDs beyond what a
    # statement needs a process may take ahead and hold per tag (0: a statement takes
    # exactly its rows' IDs in one pop and nothing is held)
    orm_prefetch: int = Field(0, ge=0, le=100_000)

    # snowflake (docs/design.md §8)
    snowflake_mode: Literal["zk", "zk_recycle", "mysql", "local", "k8s"] | None = None
    snowflake_name: str = "leafpool"
    snowflake_epoch: int = Field(1288834974657, ge=0)
    snowflake_random_sequence: int = Field(100, ge=0, le=4096)
    snowflake_batch_seconds: float = Field(2.0, gt=0, le=HOUR)
    # a snowflake tag keeps this many seconds of its recent peak demand pre-generated in
    # its reserve (whole milliseconds, a range each), so its pool rides through every
    # refiller paused or its source down that long; pooled IDs then lag the clock by up to
    # about this (docs/design.md §8.7). Unset: LEAFPOOL_OUTAGE_SECONDS; 0: no reserve (a
    # batch of LEAFPOOL_SNOWFLAKE_BATCH_SECONDS, generated at the refill)
    snowflake_reserve_seconds: float | None = Field(None, ge=0, le=DAY)
    snowflake_max_backwards_ms: int = Field(5, ge=0, le=MAX_BACKWARDS_MS)
    snowflake_peer_skew_ms: int = Field(5_000, ge=0, le=int(HOUR * 1000))
    # also the window recorded ahead of the clock: a restart after a crash may wait it out
    snowflake_report_seconds: float = Field(3.0, gt=0, le=MINUTE)
    # a start whose clock is behind the recorded timestamp by at most this waits for the
    # clock to pass it (a restart after a crash, within the window recorded ahead)
    snowflake_start_wait_ms: int = Field(3_000, ge=0, le=60_000)
    snowflake_lease_seconds: float = Field(30.0, gt=0, le=HOUR)
    snowflake_renew_seconds: float = Field(10.0, gt=0, le=HOUR)
    snowflake_exhaustion_warn_days: int = Field(365, ge=0, le=36_500)
    snowflake_local_map: str = ""
    snowflake_cache_dir: str = ""
    # mode k8s (docs/design.md §8.6): worker ID = offset + the StatefulSet pod index (this
    # setting, from the apps.kubernetes.io/pod-index label; unset: HOSTNAME's trailing
    # ordinal), leased in ZooKeeper; one offset per cluster / data centre
    snowflake_worker_offset: int = Field(0, ge=0, le=1023)
    snowflake_pod_index: int | None = Field(None, ge=0, le=1023)
    # a Celery worker process claims its worker ID when it starts (and publishes its
    # readiness file), not at its first refill: set on snowflake workers
    snowflake_claim_at_start: bool = False

    # HTTP
    http_host: str = "127.0.0.1"
    http_port: int = Field(8080, ge=1, le=65535)
    http_max_count: int = Field(1_000, ge=1)
    http_tokens: str = ""
    # concurrent single-ID requests of one tag share one LPOP tag n, n at most this
    # (leafpool/redis/coalesce.py, docs/design.md §1.1); 0: one LPOP per request
    http_coalesce_max: int = Field(1_024, ge=0, le=10_000)
    # how many such pops of one tag may be in flight at once: requests arriving meanwhile
    # queue and share the next (1: one pop at a time, the fewest pops and fsyncs per
    # request; docs/design.md §1.1 has the figures)
    http_coalesce_in_flight: int = Field(1, ge=1, le=64)

    @field_validator("key_prefix", "broker_key_prefix")
    @classmethod
    def _prefix_chars(cls, value: str) -> str:
        if not value or any(c in value for c in "{}: \t\n"):
            raise ValueError("a non-empty prefix without braces, colons or spaces")
        return value

    # The validators below raise ConfigurationError themselves (pydantic passes it on
    # unchanged): their messages name the variable and hide secrets.

    @field_validator("snowflake_epoch")
    @classmethod
    def _epoch(cls, value: int) -> int:
        return validate_epoch(value, wall_clock_ms())

    @field_validator("snowflake_name")
    @classmethod
    def _snowflake_name(cls, value: str) -> str:
        return validate_name(value)

    @field_validator("snowflake_local_map")
    @classmethod
    def _local_map(cls, value: str) -> str:
        parse_local_map(value)
        return value

    @field_validator("pop_replicas")
    @classmethod
    def _pop_replicas(cls, value: str) -> str:
        parse_pop_replicas(value)
        return value.strip().lower()

    @field_validator("http_tokens")
    @classmethod
    def _tokens(cls, value: str) -> str:
        parse_tokens(value)
        return value

    @model_validator(mode="after")
    def _fill_defaults(self) -> Settings:
        if self.pool_floor > self.pool_ceiling:
            raise ConfigurationError(
                "LEAFPOOL_POOL_FLOOR", self.pool_floor,
                f"must not exceed LEAFPOOL_POOL_CEILING={self.pool_ceiling}")
        if self.step_grow_seconds > self.step_shrink_seconds:
            raise ConfigurationError(
                "LEAFPOOL_STEP_GROW_SECONDS", self.step_grow_seconds,
                f"must not exceed LEAFPOOL_STEP_SHRINK_SECONDS={self.step_shrink_seconds} "
                "(a segment cannot last both less than the one and more than the other)")
        if self.dc_id >= self.dc_count:
            raise ConfigurationError(
                "LEAFPOOL_DC_ID", self.dc_id,
                f"must be below LEAFPOOL_DC_COUNT={self.dc_count} (DCs are numbered from 0)")
        if MAX_DC_COUNT % self.dc_count:
            raise ConfigurationError(
                "LEAFPOOL_DC_COUNT", self.dc_count,
                f"a power of two from 1 to {MAX_DC_COUNT} (each DC leases an equal range of "
                "the 1024 snowflake worker IDs)")
        if not self.database_url:
            home = default_home()
            object.__setattr__(self, "database_url", f"sqlite:///{home / 'leafpool.sqlite3'}")
        self._check_backends()
        if self.snowflake_mode is None:
            object.__setattr__(self, "snowflake_mode", "zk" if self.zk_hosts else "local")
        if not self.snowflake_cache_dir:
            object.__setattr__(self, "snowflake_cache_dir", str(default_home() / "snowflake"))
        return self

    # -- parsed forms (validated at load; parsed once per value) ---------------------------

    @property
    def snowflake_reserve(self) -> float:
        """Seconds of a snowflake tag's recent peak demand kept pre-generated in its
        reserve: ``LEAFPOOL_SNOWFLAKE_RESERVE_SECONDS``, unset ``LEAFPOOL_OUTAGE_SECONDS``."""
        if self.snowflake_reserve_seconds is None:
            return self.outage_seconds
        return self.snowflake_reserve_seconds

    @property
    def local_map(self) -> LocalMap:
        """``LEAFPOOL_SNOWFLAKE_LOCAL_MAP`` parsed (see :func:`parse_local_map`)."""
        return parse_local_map(self.snowflake_local_map)

    @property
    def pop_replicas_required(self) -> int | str:
        """``LEAFPOOL_POP_REPLICAS`` parsed: a number, or ``all``."""
        return parse_pop_replicas(self.pop_replicas)

    @property
    def token_policy(self) -> TokenPolicy:
        """``LEAFPOOL_HTTP_TOKENS`` parsed (see :func:`parse_tokens`)."""
        return parse_tokens(self.http_tokens)


def _env_name(loc: tuple[Any, ...]) -> str:
    return f"LEAFPOOL_{str(loc[0]).upper()}" if loc else "LEAFPOOL_*"


def load_settings(**overrides: object) -> Settings:
    """Read and validate the settings. Any malformed value raises ConfigurationError naming
    the (first) variable, its value and what is allowed."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        errors = exc.errors()
        err = errors[0]
        env = _env_name(tuple(err.get("loc") or ()))
        field = env.removeprefix("LEAFPOOL_").lower()
        value = overrides.get(field, os.environ.get(env, err.get("input")))
        if env in (REDIS_URL_ENV, DATABASE_URL_ENV, "LEAFPOOL_BROKER_URL"):
            value = hide_password(str(value))
        elif env.endswith("_PASSWORD"):
            value = "***"
        allowed = err.get("msg", "invalid")
        others = sorted({_env_name(tuple(e.get("loc") or ())) for e in errors[1:]} - {env})
        if others:
            allowed += f" (also not valid: {', '.join(others)})"
        # the message says it all; pydantic's own report would only repeat it
        raise ConfigurationError(env, value, allowed) from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once."""
    return load_settings()
