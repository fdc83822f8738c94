"""The pool's Prometheus families, as data: each per-tag gauge and counter is a name, a
help text and the :class:`~leafpool.status.TagStatus` field (or reader) it comes from.
:mod:`leafpool.metrics` turns them into samples on every scrape; the Grafana dashboard
and the README use these names, and a test keeps them in step."""

from __future__ import annotations

from collections.abc import Callable

from leafpool.status import TagStatus

LABELS = ["tag", "mode"]
MODES = ("segment", "snowflake")

Reader = Callable[[TagStatus], float | None]


def _seconds(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000


def _positive(value: float) -> float | None:
    return float(value) if value else None  # 0: not measured yet


# (metric name, help, reader of TagStatus) for the per-tag gauges; None: not exported
GAUGES: list[tuple[str, str, Reader]] = [
    (
        "leafpool_pool_ids",
        "IDs ready in the list (LLEN leafpool:{TAG}:ids)",
        lambda s: float(s.length),
    ),
    (
        "leafpool_pool_target_ids",
        "Pool target: consumption rate x LEAFPOOL_POOL_SECONDS, within floor and ceiling",
        lambda s: _positive(s.target),
    ),
    (
        "leafpool_pool_low_water_ids",
        "A refill starts when the list is below this",
        lambda s: _positive(s.low_water),
    ),
    (
        "leafpool_pool_reserve_ids",
        "IDs allocated from the database, not yet pushed (segment mode)",
        lambda s: float(s.reserve_size),
    ),
    ("leafpool_pool_reserve_ranges", "Ranges in the reserve list", lambda s: float(len(s.reserve))),
    ("leafpool_pool_pops_per_second", "Smoothed consumption rate, IDs/s", lambda s: s.rate),
    (
        "leafpool_pool_seconds_left",
        "Seconds until list + reserve run out at the current rate (0 once both are empty "
        "after IDs were pushed, whatever the rate; absent at rate 0 otherwise)",
        lambda s: s.seconds_left,
    ),
    (
        "leafpool_pool_peak_pops_per_second",
        "The tag's recent peak rate, IDs/s (a maximum halving every hour): the reserve "
        "holds LEAFPOOL_OUTAGE_SECONDS of it",
        lambda s: _positive(s.peak_rate),
    ),
    (
        "leafpool_pool_list_peak_seconds",
        "Seconds of the recent peak demand the list holds",
        lambda s: s.list_seconds,
    ),
    (
        "leafpool_pool_reserve_peak_seconds",
        "Seconds of the recent peak demand the reserve holds: a database outage this long "
        "is ridden through, after the list's",
        lambda s: s.reserve_seconds,
    ),
    (
        "leafpool_pool_dry_since_timestamp_seconds",
        "Unix time the list was found empty after IDs were pushed (absent while it holds IDs)",
        lambda s: _seconds(s.dry_since_ms),
    ),
    (
        "leafpool_db_unreachable_since_timestamp_seconds",
        "Unix time the tag's allocations started failing for want of the database (absent "
        "once one succeeds)",
        lambda s: _seconds(s.db_unreachable_ms),
    ),
    (
        "leafpool_pool_counter_behind",
        "1 while the tag's last refill was refused with CounterBehind (leaf_alloc.max_id "
        "below the pool's mark; `leafpool status TAG` shows the fix)",
        lambda s: (1.0 if s.counter_behind else 0.0) if s.mode == "segment" else None,
    ),
    (
        "leafpool_db_last_heal_timestamp_seconds",
        "Unix time a refill last moved the tag's rewound counter up (absent before any heal)",
        lambda s: _seconds(s.last_heal_ms),
    ),
    (
        "leafpool_pool_step",
        "Current segment step (dynamic, Leaf's rule)",
        lambda s: _positive(s.step),
    ),
    (
        "leafpool_pool_max_id",
        "max_id of the tag's last segment (leaf_alloc.max_id)",
        lambda s: None if s.max_id is None else float(s.max_id),
    ),
    (
        "leafpool_pool_refill_locked",
        "1 while a refiller holds the tag's lock",
        lambda s: 1.0 if s.locked else 0.0,
    ),
    (
        "leafpool_pool_last_refill_timestamp_seconds",
        "Unix time of the last refill",
        lambda s: _seconds(s.last_refill_ms),
    ),
    (
        "leafpool_pool_last_error_timestamp_seconds",
        "Unix time of the last refill error",
        lambda s: _seconds(s.last_error_ms),
    ),
    (
        "leafpool_db_alloc_last_seconds",
        "Duration of the last database allocation (UPDATE max_id + SELECT, one transaction)",
        lambda s: _seconds(s.last_alloc_ms),
    ),
    (
        "leafpool_snowflake_last_clock_backwards_timestamp_seconds",
        "Unix time of the last clock-backwards event of a generator filling the tag",
        lambda s: _seconds(s.last_backwards_ms),
    ),
    (
        "leafpool_snowflake_last_clock_backwards_offset_seconds",
        "How far the clock moved back in the last clock-backwards event",
        lambda s: _seconds(s.last_backwards_offset_ms),
    ),
    (
        "leafpool_snowflake_worker_ids",
        "Snowflake worker IDs that have refilled the tag",
        lambda s: float(len(s.worker_ids)) if s.mode == "snowflake" else None,
    ),
    (
        "leafpool_snowflake_time_bits_years_left",
        "Years until the 41 time bits of the "
        "generator that last filled the tag run out (LEAFPOOL_SNOWFLAKE_EPOCH)",
        lambda s: s.time_bits_years_left,
    ),
]

# (metric name without _total, help, TagStatus counter, the modes that keep it)
COUNTERS: list[tuple[str, str, str, tuple[str, ...]]] = [
    ("leafpool_pool_pushed_ids", "IDs pushed into the list", "pushed_total", MODES),
    ("leafpool_pool_refills", "Refills that completed", "refills", MODES),
    (
        "leafpool_pool_refill_failures",
        "Refills that failed (backend down, stale write, exhausted)",
        "refill_failures",
        MODES,
    ),
    (
        "leafpool_pool_empty_hits",
        "Times a leafpool client found the list empty (plain LPOPs of an empty list are not "
        "seen: see leafpool_pool_dry_seconds)",
        "empty_hits",
        MODES,
    ),
    (
        "leafpool_pool_dry_seconds",
        "Seconds the list was empty after IDs were pushed, over its ended dry periods",
        "dry_seconds",
        MODES,
    ),
    (
        "leafpool_pool_reserve_takes",
        "IDs clients took straight from the reserve (empty-pool policy 'reserve')",
        "reserve_takes",
        ("segment",),
    ),
    (
        "leafpool_db_allocations",
        "Segments allocated from the database",
        "allocations",
        ("segment",),
    ),
    (
        "leafpool_db_heals",
        "Rewound leaf_alloc counters a refill moved up to the tag's mark by a "
        "compare-and-set (LEAFPOOL_COUNTER_BEHIND=heal)",
        "heals",
        ("segment",),
    ),
    (
        "leafpool_redis_failovers",
        "Redis master changes a refill of the tag noticed (a new replication ID)",
        "failovers",
        MODES,
    ),
    (
        "leafpool_pool_unacked_ids",
        "IDs dropped, never handed out, because fewer than "
        "LEAFPOOL_POP_REPLICAS replicas acknowledged their pop in time",
        "unacked_ids",
        MODES,
    ),
    (
        "leafpool_pool_gap_ids",
        "IDs popped and never handed out: a pop whose reply was lost (the IDs it asked "
        "for), a request cancelled or an HTTP client gone after its pop, an unacknowledged "
        "replica pop (pushed = handed out + gaps + ready, for leafpool's own clients)",
        "gaps",
        MODES,
    ),
    (
        "leafpool_pool_lost_replies",
        "Pops whose reply was lost or whose request was cancelled once sent (each counted "
        "in the gaps with the IDs it asked for: an upper bound)",
        "lost_replies",
        MODES,
    ),
    (
        "leafpool_snowflake_clock_backwards",
        "Clock-backwards events of the generators filling the tag",
        "backwards_events",
        ("snowflake",),
    ),
]
