"""Per-tag status, read from Redis: :class:`TagStatus` is the one parsed shape of a
tag's keys, and what ``leafpool status``, the status page and the metrics show."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from leafpool.core.durations import fmt_ago, fmt_duration
from leafpool.redis.pool import Pool, Snapshot


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
    # rewound counters moved up to the tag's mark (docs/design.md §7.3)
    heals: int = 0
    last_heal_ms: int | None = None
    # Redis: the node serving the tag, failovers seen, IDs dropped for want of replicas
    redis_node: str = ""
    failovers: int = 0
    last_failover_ms: int | None = None
    unacked_ids: int = 0
    # IDs popped and never handed out (docs/design.md §7.2), and the pops among them whose
    # reply was lost (each counted with the IDs it asked for)
    gaps: int = 0
    lost_replies: int = 0
    # snowflake tags
    worker_ids: list[str] = field(default_factory=list)
    lease_state: str = ""
    backwards_events: int = 0
    last_backwards_ms: int | None = None
    last_backwards_offset_ms: int | None = None
    time_bits_years_left: float | None = None

    def as_dict(self) -> dict[str, object]:
        """The fields by name, in declaration order (a shallow copy: ``asdict``'s deep copy
        cost more than the rest of a 10,000-tag status together)."""
        out = dict(self.__dict__)
        out["reserve"], out["worker_ids"] = list(self.reserve), list(self.worker_ids)
        return out


def _int(state: dict[str, str], name: str) -> int:
    value = state.get(name)
    return int(value) if value else 0


def _opt_int(state: dict[str, str], name: str) -> int | None:
    value = state.get(name)
    return int(value) if value else None


def _opt_float(state: dict[str, str], name: str) -> float | None:
    try:
        value = state.get(name)
        return float(value) if value else None
    except ValueError:
        return None


def tag_status(snap: Snapshot) -> TagStatus:
    """The parsed state (plain dict reads: a status of 10,000 tags parses 400,000 fields)."""
    state, hits = snap.state, snap.hits  # what clients count is in hits (before: state)
    get = state.get
    rate = float(get("rate") or 0.0)
    reserve_size = snap.reserve_size
    ready = snap.length + reserve_size
    return TagStatus(
        tag=snap.tag,
        mode=get("mode", "?"),
        length=snap.length,
        target=_int(state, "target"),
        low_water=_int(state, "low_water"),
        reserve=[r.encode() for r in snap.reserve],
        reserve_size=reserve_size,
        step=_int(state, "step"),
        max_id=_opt_int(state, "max_id"),
        rate=rate,
        seconds_left=(ready / rate) if rate > 0 else None,
        last_refill_ms=_opt_int(state, "last_refill_ms"),
        last_refill_result=get("last_refill_result", ""),
        last_error=get("last_error", ""),
        last_error_ms=_opt_int(state, "last_error_ms"),
        empty_hits=_int(state, "empty_hits") + _int(hits, "empty_hits"),
        reserve_takes=_int(state, "reserve_takes"),
        pushed_total=_int(state, "pushed_total"),
        refills=_int(state, "refills"),
        refill_failures=_int(state, "refill_failures"),
        locked=snap.locked,
        hwm=get("hwm", ""),
        allocations=_int(state, "allocations"),
        last_alloc_ms=_opt_float(state, "last_alloc_ms"),
        heals=_int(state, "heals"),
        last_heal_ms=_opt_int(state, "last_heal_ms"),
        redis_node=get("redis_node", ""),
        failovers=_int(state, "failovers"),
        last_failover_ms=_opt_int(state, "last_failover_ms"),
        unacked_ids=_int(state, "unacked_ids") + _int(hits, "unacked_ids"),
        gaps=_int(state, "gaps") + _int(hits, "gaps"),
        lost_replies=_int(state, "lost_replies") + _int(hits, "lost_replies"),
        worker_ids=[w for w in get("worker_ids", "").split(",") if w],
        lease_state=get("lease_state", ""),
        backwards_events=_int(state, "backwards_events"),
        last_backwards_ms=_opt_int(state, "last_backwards_ms"),
        last_backwards_offset_ms=_opt_int(state, "last_backwards_offset_ms"),
        time_bits_years_left=_opt_float(state, "time_bits_years_left"),
    )


def pool_status(pool: Pool, tags: list[str] | None = None) -> list[TagStatus]:
    names = tags if tags is not None else pool.tags()
    return [tag_status(s) for s in pool.snapshots(names)]


# -- ``leafpool status``: the rows, as JSON or as a table --------------------------------------

STATUS_COLUMNS = (
    "tag",
    "mode",
    "ready/target",
    "reserve",
    "step/workers",
    "max_id",
    "pops/s",
    "left",
    "refilled",
    "result",
    "empty",
    "gaps",
    "last error",
)
#: up to this many tags ``leafpool status`` draws a rich table; beyond, plain aligned
#: columns (rich measures every cell: 10,000 tags took seconds)
RICH_TABLE_ROWS = 200


def status_row(r: TagStatus) -> list[str]:
    """One tag's cells under :data:`STATUS_COLUMNS`."""
    return [
        r.tag,
        r.mode,
        f"{r.length:,}/{r.target:,}",
        f"{r.reserve_size:,}",
        f"{r.step:,}" if r.mode == "segment" else f"w {','.join(r.worker_ids) or '-'}",
        "-" if r.max_id is None else str(r.max_id),
        f"{r.rate:,.1f}",
        fmt_duration(r.seconds_left),
        fmt_ago(r.last_refill_ms),
        r.last_refill_result,
        str(r.empty_hits),
        str(r.gaps),
        f"{r.last_error} ({fmt_ago(r.last_error_ms)})" if r.last_error else "",
    ]


def plain_table(rows: Sequence[Sequence[str]], columns: Sequence[str] = STATUS_COLUMNS) -> str:
    """Left-aligned columns two spaces apart, a header line first."""
    widths = [max([len(c), *(len(row[i]) for row in rows)]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines += [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    return "\n".join(lines) + "\n"


def status_json(statuses: Sequence[TagStatus]) -> str:
    """A JSON array, one tag per line (``json.dumps`` with ``indent`` runs in pure Python:
    seconds for 10,000 tags)."""
    if not statuses:
        return "[]\n"
    return "[\n" + ",\n".join(json.dumps(st.as_dict()) for st in statuses) + "\n]\n"
