"""Per-tag status, read from Redis: :class:`TagStatus` is the one parsed shape of a
tag's keys, and what ``leafpool status``, the status page and the metrics show."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from leafpool.pool import Pool, Snapshot


@dataclass
class TagStatus:
    tag: str
    mode: str
    length: int
    target: int
    low_water: int
    reserve: list[str]
    reserve_size: int
    step: int
    max_id: int | None
    rate: float
    seconds_left: float | None
    last_refill_ms: int | None
    last_refill_result: str
    last_error: str
    last_error_ms: int | None
    empty_hits: int
    reserve_takes: int
    pushed_total: int
    refills: int
    refill_failures: int
    locked: bool
    hwm: str
    # segment tags: database allocations
    allocations: int = 0
    last_alloc_ms: float | None = None
    # Redis: the node serving the tag, failovers seen, IDs dropped for want of replicas
    redis_node: str = ""
    failovers: int = 0
    last_failover_ms: int | None = None
    unacked_ids: int = 0
    # snowflake tags
    worker_ids: list[str] = field(default_factory=list)
    lease_state: str = ""
    backwards_events: int = 0
    last_backwards_ms: int | None = None
    last_backwards_offset_ms: int | None = None
    time_bits_years_left: float | None = None

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _opt_int(snap: Snapshot, name: str) -> int | None:
    return snap.int(name) if snap.state.get(name) else None


def _opt_float(snap: Snapshot, name: str) -> float | None:
    try:
        return float(snap.state[name]) if snap.state.get(name) else None
    except ValueError:
        return None


def tag_status(snap: Snapshot) -> TagStatus:
    rate = snap.float("rate")
    ready = snap.length + snap.reserve_size
    return TagStatus(
        tag=snap.tag,
        mode=snap.state.get("mode", "?"),
        length=snap.length,
        target=snap.int("target"),
        low_water=snap.int("low_water"),
        reserve=[r.encode() for r in snap.reserve],
        reserve_size=snap.reserve_size,
        step=snap.int("step"),
        max_id=_opt_int(snap, "max_id"),
        rate=rate,
        seconds_left=(ready / rate) if rate > 0 else None,
        last_refill_ms=_opt_int(snap, "last_refill_ms"),
        last_refill_result=snap.state.get("last_refill_result", ""),
        last_error=snap.state.get("last_error", ""),
        last_error_ms=_opt_int(snap, "last_error_ms"),
        empty_hits=snap.int("empty_hits"),
        reserve_takes=snap.int("reserve_takes"),
        pushed_total=snap.int("pushed_total"),
        refills=snap.int("refills"),
        refill_failures=snap.int("refill_failures"),
        locked=snap.locked,
        hwm=snap.state.get("hwm", ""),
        allocations=snap.int("allocations"),
        last_alloc_ms=_opt_float(snap, "last_alloc_ms"),
        redis_node=snap.state.get("redis_node", ""),
        failovers=snap.int("failovers"),
        last_failover_ms=_opt_int(snap, "last_failover_ms"),
        unacked_ids=snap.int("unacked_ids"),
        worker_ids=[w for w in snap.state.get("worker_ids", "").split(",") if w],
        lease_state=snap.state.get("lease_state", ""),
        backwards_events=snap.int("backwards_events"),
        last_backwards_ms=_opt_int(snap, "last_backwards_ms"),
        last_backwards_offset_ms=_opt_int(snap, "last_backwards_offset_ms"),
        time_bits_years_left=_opt_float(snap, "time_bits_years_left"),
    )


def pool_status(pool: Pool, tags: list[str] | None = None) -> list[TagStatus]:
    names = tags if tags is not None else pool.tags()
    return [tag_status(s) for s in pool.snapshots(names)]
