"""Per-tag status, read from Redis: :class:`TagStatus` is the one parsed shape of a
tag's keys, and what ``leafpool status``, the status page and the metrics show: the
pools, how many seconds of demand they hold and have left, whether the database answers
their allocations and whether a list is dry (docs/design.md §3.8)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

from leafpool.core.collector import collector_paused
from leafpool.core.durations import fmt_ago, fmt_duration
from leafpool.refill.sizing import rate_now

if TYPE_CHECKING:  # the CLI's start needs no redis-py
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
    rate: float  # IDs/s now (refill.sizing.rate_now): 0 for a pool nobody pops
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
    # the outage budget (docs/design.md §3.2): the recent peak rate, and the seconds of it
    # the list and the reserve hold (None before any rate was measured)
    peak_rate: float = 0.0
    list_seconds: float | None = None
    reserve_seconds: float | None = None
    # the database (docs/design.md §3.8): allocations failing since (None: the last one
    # succeeded); a last refill refused with CounterBehind (its fix SQL is in last_error),
    # read from last_refill_result (a factory, so __init__ puts it in its place in as_dict)
    db_unreachable_ms: int | None = None
    counter_behind: bool = field(init=False, default_factory=bool)
    # the list at 0 after pushes since (None: not dry), the last dry period, and how
    # often and how long it was dry in all (plain LPOPs of an empty list are not seen)
    dry_since_ms: int | None = None
    last_dry_ms: int | None = None
    dry_events: int = 0
    dry_ms: int = 0
    # the last heal's "max_id A -> B" (docs/design.md §7.3; absent before any heal)
    last_heal: str = ""
    # snowflake tags
    worker_ids: list[str] = field(default_factory=list)
    lease_state: str = ""
    backwards_events: int = 0
    last_backwards_ms: int | None = None
    last_backwards_offset_ms: int | None = None
    time_bits_years_left: float | None = None
    # segment tags: the table's step, the floor the step in use (``step``) grows from
    table_step: int = 0
    # the rate the last refill measured, and when (``rate`` is it brought up to now)
    measured_rate: float = 0.0
    rate_measured_ms: int | None = None

    def __post_init__(self) -> None:
        self.counter_behind = self.last_refill_result == "failed: CounterBehind"

    @property
    def dry_seconds(self) -> float:
        """Seconds the list was dry, over its ended dry periods."""
        return self.dry_ms / 1000

    def as_dict(self) -> dict[str, object]:
        """The fields by name, in declaration order (a shallow copy: ``asdict``'s deep copy
        cost more than the rest of a 10,000-tag status together)."""
        out = dict(self.__dict__)
        out["reserve"], out["worker_ids"] = list(self.reserve), list(self.worker_ids)
        return out


#: the fields of what clients count (the ``hits`` hash) a status adds to the state's
HIT_FIELDS = ("empty_hits", "unacked_ids", "gaps", "lost_replies")


def _str(value: bytes | str | None) -> str:
    return "" if value is None else value.decode() if isinstance(value, bytes) else value


def _opt_float(value: bytes | str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None


def tag_status(snap: Snapshot, now_ms: float | None = None) -> TagStatus:
    """A snapshot's status (:func:`status_from` on its fields), the rate brought up to
    ``now_ms`` (default: this host's clock)."""
    hits = snap.hits.get
    return status_from(snap.tag, snap.length, [r.encode() for r in snap.reserve],
                       {name.encode(): value for name, value in snap.state.items()},
                       snap.locked, [hits(f) for f in HIT_FIELDS], now_ms)


def _ranges(reserve: Sequence[bytes | str]) -> tuple[list[str], int]:
    """The reserve's ``start:end`` ranges as :meth:`Range.encode` writes them, and the IDs
    they hold (what ``Range.decode`` of each gives, without a Range each)."""
    texts: list[str] = []
    size = 0
    add = texts.append
    for raw in reserve:
        start, _, end = (raw.decode() if isinstance(raw, bytes) else raw).partition(":")
        first, last = int(start), int(end)
        size += last - first
        add(f"{first}:{last}")
    return texts, size


def status_from(tag: str, length: int, reserve: Sequence[bytes | str],
                state: Mapping[bytes, bytes | str], locked: bool,
                hits: Sequence[bytes | str | None], now_ms: float | None = None) -> TagStatus:
    """A tag's status from its keys as read: the reserve's ``start:end`` ranges, the state
    hash (field names as bytes, values bytes or str: the 42 fields shown are picked), the
    values of :data:`HIT_FIELDS` (None: absent), the rate brought up to ``now_ms``
    (default: this host's clock). Numbers are parsed from the bytes (``int`` and ``float``
    take bytes), only text decoded: 100,000 tags are 4.6 M fields."""
    get = state.get
    mode, rate_, peak_rate, rate_ts_ms = get(b"mode"), get(b"rate"), get(b"peak_rate"), get(
        b"rate_ts_ms")
    pushed_total, rate_consumed, last_refill_result = get(b"pushed_total"), get(
        b"rate_consumed"), get(b"last_refill_result")
    hit_empty, hit_unacked, hit_gaps, hit_lost = hits
    texts, reserve_size = _ranges(reserve)
    measured = float(rate_ or 0.0)
    peak = _opt_float(peak_rate) or measured
    measured_ms = int(rate_ts_ms) if rate_ts_ms else None
    pushed = int(pushed_total) if pushed_total else 0
    rate = measured
    if measured_ms is not None:
        consumed = pushed - length - (int(rate_consumed) if rate_consumed else 0)
        now = time.time() * 1000 if now_ms is None else now_ms
        rate = rate_now(measured, consumed, (now - measured_ms) / 1000)
    ready = length + reserve_size
    result = _str(last_refill_result)
    # one dict display in declaration order (as_dict's and the JSON's), not __init__'s 62
    # keyword arguments (a third of this function); tests/test_status_same_output.py checks
    st = object.__new__(TagStatus)
    st.__dict__ = {
        "tag": tag, "mode": "?" if mode is None else _str(mode), "length": length,
        "target": int(v) if (v := get(b"target")) else 0,
        "low_water": int(v) if (v := get(b"low_water")) else 0,
        "reserve": texts, "reserve_size": reserve_size,
        "step": int(v) if (v := get(b"step")) else 0,
        "max_id": int(v) if (v := get(b"max_id")) else None, "rate": rate,
        "seconds_left": _seconds_left(ready, rate, pushed),
        "last_refill_ms": int(v) if (v := get(b"last_refill_ms")) else None,
        "last_refill_result": result, "last_error": _str(get(b"last_error")),
        "last_error_ms": int(v) if (v := get(b"last_error_ms")) else None,
        "empty_hits": ((int(v) if (v := get(b"empty_hits")) else 0)
                       + (int(hit_empty) if hit_empty else 0)),
        "reserve_takes": int(v) if (v := get(b"reserve_takes")) else 0, "pushed_total": pushed,
        "refills": int(v) if (v := get(b"refills")) else 0,
        "refill_failures": int(v) if (v := get(b"refill_failures")) else 0, "locked": locked,
        "hwm": _str(get(b"hwm")), "allocations": int(v) if (v := get(b"allocations")) else 0,
        "last_alloc_ms": _opt_float(get(b"last_alloc_ms")),
        "heals": int(v) if (v := get(b"heals")) else 0,
        "last_heal_ms": int(v) if (v := get(b"last_heal_ms")) else None,
        "redis_node": _str(get(b"redis_node")),
        "failovers": int(v) if (v := get(b"failovers")) else 0,
        "last_failover_ms": int(v) if (v := get(b"last_failover_ms")) else None,
        "unacked_ids": ((int(v) if (v := get(b"unacked_ids")) else 0)
                        + (int(hit_unacked) if hit_unacked else 0)),
        "gaps": (int(v) if (v := get(b"gaps")) else 0) + (int(hit_gaps) if hit_gaps else 0),
        "lost_replies": ((int(v) if (v := get(b"lost_replies")) else 0)
                         + (int(hit_lost) if hit_lost else 0)),
        "peak_rate": peak, "list_seconds": length / peak if peak > 0 else None,
        "reserve_seconds": reserve_size / peak if peak > 0 else None,
        "db_unreachable_ms": int(v) if (v := get(b"db_unreachable_ms")) else None,
        "counter_behind": result == "failed: CounterBehind",
        "dry_since_ms": int(v) if (v := get(b"dry_since_ms")) else None,
        "last_dry_ms": int(v) if (v := get(b"last_dry_ms")) else None,
        "dry_events": int(v) if (v := get(b"dry_events")) else 0,
        "dry_ms": int(v) if (v := get(b"dry_ms")) else 0,
        "last_heal": _str(get(b"last_heal")),
        "worker_ids": [w for w in _str(get(b"worker_ids")).split(",") if w],
        "lease_state": _str(get(b"lease_state")),
        "backwards_events": int(v) if (v := get(b"backwards_events")) else 0,
        "last_backwards_ms": int(v) if (v := get(b"last_backwards_ms")) else None,
        "last_backwards_offset_ms": (int(v) if (v := get(b"last_backwards_offset_ms"))
                                     else None),
        "time_bits_years_left": _opt_float(get(b"time_bits_years_left")),
        "table_step": int(v) if (v := get(b"table_step")) else 0, "measured_rate": measured,
        "rate_measured_ms": measured_ms,
    }
    return st


def _seconds_left(ready: int, rate: float, pushed: int) -> float | None:
    """Seconds until list + reserve run out at ``rate``: 0 when both are empty after IDs
    were pushed (dry, whatever the rate); None when nothing is consumed (idle or new)."""
    if ready == 0 and pushed > 0:
        return 0.0
    return ready / rate if rate > 0 else None


def pool_status(pool: Pool, tags: list[str] | None = None, now_ms: float | None = None
                ) -> list[TagStatus]:
    """Every tag's status (or ``tags``'), read in chunked round trips
    (:meth:`~leafpool.redis.pool_many.ManyTags.status_reads`), the rates brought up to
    ``now_ms`` (default: this host's clock), the garbage collector paused."""
    with collector_paused():
        names = tags if tags is not None else pool.tags()
        now_ms = time.time() * 1000 if now_ms is None else now_ms
        return [status_from(tag, int(length), reserve, state, bool(locked), hits, now_ms)
                for tag, (length, reserve, state, locked, hits) in zip(
                    names, pool.status_reads(names, HIT_FIELDS), strict=True)]


# -- ``leafpool status``: the rows, as JSON or as a table --------------------------------------

STATUS_COLUMNS = (
    "tag", "mode", "ready/target", "reserve", "step/workers", "max_id", "pops/s", "held@peak",
    "left", "refilled", "result", "empty", "gaps", "last error",
)
#: up to this many tags ``leafpool status`` draws a rich table; beyond, plain aligned
#: columns (rich measures every cell: 10,000 tags took seconds)
RICH_TABLE_ROWS = 200


def stamp(ms: int, clock: Callable[[], float] = time.time) -> str:
    """A wall-clock time as the local date and time, and how long ago."""
    when = datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S")
    return f"{when} ({fmt_ago(ms, clock)})"


def held(r: TagStatus) -> str:
    """Seconds of the recent peak demand in the list and in the reserve: ``31s+10m``."""
    if r.list_seconds is None or r.reserve_seconds is None:
        return "-"
    return f"{fmt_duration(r.list_seconds)}+{fmt_duration(r.reserve_seconds)}"


def empty_cell(r: TagStatus, clock: Callable[[], float] = time.time) -> str:
    """Empty hits counted by leafpool's clients, and since when the list is dry (plain
    LPOPs of an empty list are not counted: nothing in Redis sees them)."""
    if r.dry_since_ms is None:
        return str(r.empty_hits)
    return f"dry {fmt_ago(r.dry_since_ms, clock)}, {r.empty_hits} hits"


def error_text(r: TagStatus, clock: Callable[[], float] = time.time) -> str:
    """The last error in full, after "database unreachable since T" while allocations
    fail (and what the counter's fix is, with CounterBehind: in the error)."""
    text = f"{r.last_error} ({fmt_ago(r.last_error_ms, clock)})" if r.last_error else ""
    if r.db_unreachable_ms is not None:
        return f"database unreachable since {stamp(r.db_unreachable_ms, clock)}: {text}"
    return text


def step_cell(r: TagStatus) -> str:
    """A segment tag's step in use, and the table step it grew from when they differ
    (``4,000 (table 1,000)``); a snowflake tag's worker IDs."""
    if r.mode != "segment":
        return f"w {','.join(r.worker_ids) or '-'}"
    now = r.step or r.table_step
    if r.table_step and now != r.table_step:
        return f"{now:,} (table {r.table_step:,})"
    return f"{now:,}"


#: said below the table when a step in use differs from its table step
STEP_NOTE = ("step: the step allocations use now; it grows from the table step (`leafpool "
             "tag list`, `leafpool tag step`) while segments are used up fast and halves back "
             "when they last long, never below it (Leaf's dynamic step)")


def footnotes(statuses: Sequence[TagStatus]) -> list[str]:
    """What ``leafpool status`` says below the table (table and plain formats)."""
    return [STEP_NOTE] if any(map(grown, statuses)) else []


def grown(r: TagStatus) -> bool:  # a segment tag's step in use is not its table step
    return r.mode == "segment" and bool(r.table_step) and r.step not in (0, r.table_step)


def status_row(r: TagStatus) -> list[str]:
    """One tag's cells under :data:`STATUS_COLUMNS`."""
    return [
        r.tag,
        r.mode,
        f"{r.length:,}/{r.target:,}",
        f"{r.reserve_size:,}",
        step_cell(r),
        "-" if r.max_id is None else str(r.max_id),
        f"{r.rate:,.1f}",
        held(r),
        fmt_duration(r.seconds_left),
        fmt_ago(r.last_refill_ms),
        r.last_refill_result,
        empty_cell(r),
        str(r.gaps),
        error_text(r),
    ]


def notices(statuses: Sequence[TagStatus], clock: Callable[[], float] = time.time
            ) -> list[str]:
    """What ``leafpool status`` and /cache say above the table: the database unreachable
    (since its first tag's first failure), the dry tags, the counters behind."""
    out = []
    down = sorted((r for r in statuses if r.db_unreachable_ms is not None),
                  key=lambda r: r.db_unreachable_ms or 0)
    if down:
        tags = ", ".join(r.tag for r in down[:10]) + (", ..." if len(down) > 10 else "")
        out.append(f"database unreachable since {stamp(down[0].db_unreachable_ms or 0, clock)}"
                   f": allocations failing for {len(down)} tag(s): {tags}")
    for r in statuses:
        if r.dry_since_ms is not None:
            out.append(f"{r.tag}: dry since {stamp(r.dry_since_ms, clock)}")
        if r.counter_behind:
            out.append(f"{r.tag}: counter behind, nothing allocated; the fix: "
                       f"`leafpool status {r.tag}`")
    return out


def status_detail(r: TagStatus, clock: Callable[[], float] = time.time) -> str:
    """One tag, a field a line, nothing cut (``leafpool status TAG``): the last error in
    full (CounterBehind's fix SQL), the database and dry marks, the outage budget."""
    def at(ms: int | None) -> str:
        return "-" if ms is None else stamp(ms, clock)

    lines = [
        ("tag", f"{r.tag} ({r.mode})"),
        ("ready/target", f"{r.length:,}/{r.target:,} (low-water {r.low_water:,})"),
        ("reserve", f"{r.reserve_size:,} IDs in {len(r.reserve)} range(s) "
                    f"{' '.join(r.reserve[:4])}{' ...' if len(r.reserve) > 4 else ''}"),
        ("rate", f"{r.rate:,.1f}/s now, {r.peak_rate:,.1f}/s recent peak"),
        ("held at the peak", f"list {fmt_duration(r.list_seconds)}, "
                             f"reserve {fmt_duration(r.reserve_seconds)}"),
        ("left at the rate now", fmt_duration(r.seconds_left)),
        ("step / max_id / hwm", f"{r.step:,} / {'-' if r.max_id is None else r.max_id} / "
                                f"{r.hwm or '-'}"),
        ("database", "answering" if r.db_unreachable_ms is None
         else f"unreachable since {at(r.db_unreachable_ms)}"),
        ("dry", "no" if r.dry_since_ms is None else f"since {at(r.dry_since_ms)}"),
        ("dry before", f"{r.dry_events} time(s), {fmt_duration(r.dry_ms / 1000)} in all, "
                       f"last from {at(r.last_dry_ms)}"),
        ("empty hits", f"{r.empty_hits} (leafpool clients; plain LPOPs of an empty list "
                       "are not seen)"),
        ("last refill", f"{at(r.last_refill_ms)}: {r.last_refill_result or '-'}"),
        ("refills / failures", f"{r.refills} / {r.refill_failures}"),
        ("heals", f"{r.heals}" + (f", last {at(r.last_heal_ms)}: {r.last_heal}"
                                   if r.last_heal_ms is not None else "")),
        ("gaps", f"{r.gaps} ({r.lost_replies} lost replies)"),
        ("last error", f"{at(r.last_error_ms)}\n  {r.last_error}" if r.last_error else "-"),
    ]
    width = max(len(name) for name, _ in lines)
    return "".join(f"{name.ljust(width)}  {value}\n" for name, value in lines)


def plain_table(rows: Sequence[Sequence[str]], columns: Sequence[str] = STATUS_COLUMNS) -> str:
    """Left-aligned columns two spaces apart, a header line first."""
    if any(len(row) != len(columns) for row in rows):
        raise ValueError(f"rows of {sorted({len(row) for row in rows})} cells, not "
                         f"{len(columns)} (columns: {', '.join(columns)})")
    # by map over the columns and each row's cells (a generator a row and a column was a
    # third of a 100,000-tag table)
    by_column = list(zip(*rows, strict=True)) if rows else [()] * len(columns)
    widths = [max(len(c), max(map(len, cells), default=0))
              for c, cells in zip(columns, by_column, strict=True)]
    lines = ["  ".join(map(str.ljust, columns, widths)).rstrip()]
    lines += ["  ".join(map(str.ljust, row, widths)).rstrip() for row in rows]
    return "\n".join(lines) + "\n"
