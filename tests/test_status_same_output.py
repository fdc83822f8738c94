"""The status and the /metrics exposition read in chunks of packed commands and parsed
from the raw replies (leafpool.status.status_from, ManyTags.status_reads), and the JSON
written from a template, give, byte for byte, what the code before them gave: the
reference below is that code, kept as it was (each tag's snapshot read with redis-py's own
pipeline, its whole state hash parsed, the exposition written a sample at a time, each
status's JSON by ``json.dumps``), run on the same real Redis holding 620 tags in varied
states (more than one pipeline's chunk)."""

from __future__ import annotations

import copy
import json
import math
import random
import time
import types
from dataclasses import fields

import pytest
import redis
from prometheus_client.utils import floatToGoString

import leafpool.status as status_module
from leafpool.core.errors import LeafpoolError
from leafpool.metric_families import COUNTERS, GAUGES
from leafpool.metrics import DB_UP, PoolCollector, _build_info_text, _header, db_up, pool_text
from leafpool.redis.pool import Pool, Snapshot
from leafpool.refill.sizing import rate_now
from leafpool.status import (
    STATUS_COLUMNS,
    TagStatus,
    plain_table,
    pool_status,
    status_detail,
    status_row,
    tag_status,
)
from leafpool.status_json import status_json

NOW_MS = 1_700_000_100_000.0

# -- the reference: the code before, as it was --------------------------------------------


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


def _seconds_left(ready: int, rate: float, pushed: int) -> float | None:
    if ready == 0 and pushed > 0:
        return 0.0
    return ready / rate if rate > 0 else None


def reference_status(snap: Snapshot, now_ms: float | None = None) -> TagStatus:
    """The parsed state (plain dict reads: a status of 10,000 tags parses 400,000 fields),
    the rate brought up to ``now_ms`` (default: this host's clock)."""
    state, hits = snap.state, snap.hits  # what clients count is in hits (before: state)
    get = state.get
    measured = float(get("rate") or 0.0)
    peak = _opt_float(state, "peak_rate") or measured
    measured_ms = _opt_int(state, "rate_ts_ms")
    rate = measured
    if measured_ms is not None:
        consumed = _int(state, "pushed_total") - snap.length - _int(state, "rate_consumed")
        now = time.time() * 1000 if now_ms is None else now_ms
        rate = rate_now(measured, consumed, (now - measured_ms) / 1000)
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
        seconds_left=_seconds_left(ready, rate, _int(state, "pushed_total")),
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
        peak_rate=peak,
        list_seconds=snap.length / peak if peak > 0 else None,
        reserve_seconds=reserve_size / peak if peak > 0 else None,
        db_unreachable_ms=_opt_int(state, "db_unreachable_ms"),
        dry_since_ms=_opt_int(state, "dry_since_ms"),
        last_dry_ms=_opt_int(state, "last_dry_ms"),
        dry_events=_int(state, "dry_events"),
        dry_ms=_int(state, "dry_ms"),
        last_heal=get("last_heal", ""),
        worker_ids=[w for w in get("worker_ids", "").split(",") if w],
        lease_state=get("lease_state", ""),
        backwards_events=_int(state, "backwards_events"),
        last_backwards_ms=_opt_int(state, "last_backwards_ms"),
        last_backwards_offset_ms=_opt_int(state, "last_backwards_offset_ms"),
        time_bits_years_left=_opt_float(state, "time_bits_years_left"),
        table_step=_int(state, "table_step"),
        measured_rate=measured,
        rate_measured_ms=measured_ms,
    )


def reference_statuses(pool: Pool, now_ms: float) -> list[TagStatus]:
    return [reference_status(pool.snapshot(tag), now_ms) for tag in pool.tags()]


def reference_json(statuses: list[TagStatus]) -> str:
    """status_json before: ``json.dumps`` of each status's fields."""
    if not statuses:
        return "[]\n"
    return "[\n" + ",\n".join(json.dumps(st.as_dict()) for st in statuses) + "\n]\n"


def reference_plain_table(rows: list[list[str]], columns: tuple[str, ...]) -> str:
    """plain_table before."""
    widths = [max([len(c), *(len(row[i]) for row in rows)]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines += [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows
    ]
    return "\n".join(lines) + "\n"


def _value(value: float) -> str:
    return repr(float(value)) if math.isfinite(value) else floatToGoString(value)  # type: ignore[no-untyped-call]


def reference_text(statuses: list[TagStatus]) -> str:
    """metrics.pool_text before, over ``statuses``, without the scrape's duration."""
    out = [
        _build_info_text(),
        _header("leafpool_up", "1 when Redis answered this scrape", "gauge"),
        "leafpool_up 1.0\n",
        _header(*DB_UP, "gauge"),
        f"{DB_UP[0]} {db_up(statuses)!r}\n",
        _header("leafpool_tags", "Tags known to the pool, by mode", "gauge"),
    ]
    modes: dict[str, int] = {}
    for st in statuses:
        modes[st.mode] = modes.get(st.mode, 0) + 1
    out += [f'leafpool_tags{{mode="{mode}"}} {float(n)!r}\n' for mode, n in sorted(modes.items())]
    labels = [f'{{tag="{st.tag}",mode="{st.mode}"}} ' for st in statuses]
    for name, doc, read in GAUGES:
        out.append(_header(name, doc, "gauge"))
        for st, label in zip(statuses, labels, strict=True):
            value = read(st)
            if value is not None:
                out.append(f"{name}{label}{_value(value)}\n")
    for name, doc, attr, kept_by in COUNTERS:
        out.append(_header(f"{name}_total", doc, "counter"))  # as prometheus-client writes it
        for st, label in zip(statuses, labels, strict=True):
            if st.mode in kept_by:
                out.append(f"{name}_total{label}{_value(getattr(st, attr))}\n")
    out.append(
        _header(
            "leafpool_snowflake_lease_state",
            "Worker-ID lease state reported by the generators filling the tag (1 = current)",
            "gauge",
        )
    )
    for st in statuses:
        if st.lease_state:
            state = st.lease_state.replace("\\", r"\\").replace('"', r"\"").replace("\n", r"\n")
            out.append(
                f'leafpool_snowflake_lease_state{{tag="{st.tag}",mode="{st.mode}",'
                f'state="{state}"}} 1.0\n'
            )
    return "".join(out)


# -- the data: 620 tags in varied states ------------------------------------------------------

INTS = ("target", "low_water", "step", "max_id", "pushed_total", "rate_consumed", "refills",
        "refill_failures", "reserve_takes", "allocations", "heals", "failovers", "unacked_ids",
        "gaps", "lost_replies", "dry_events", "dry_ms", "backwards_events", "table_step",
        "empty_hits")
TIMES = ("last_refill_ms", "last_error_ms", "last_heal_ms", "last_failover_ms",
         "db_unreachable_ms", "dry_since_ms", "last_dry_ms", "last_backwards_ms")
TEXTS = {
    "last_refill_result": ["ok", "failed: CounterBehind", "failed: DatabaseUnavailable", ""],
    "last_error": ['CounterBehind: UPDATE leaf_alloc SET max_id = 9 "quoted"\nline two',
                   "Redis é — unreachable \\ back", ""],
    "hwm": ["600", "1234567890123", ""],
    "redis_node": ["10.0.0.1:6379", ""],
    "last_heal": ["max_id 5 -> 9", ""],
    "worker_ids": ["1,2", "7", "", ",3,"],
    "lease_state": ['held "zk"\\ok', "held (zk)", "lost\nagain", ""],
}
FLOATS = {
    "rate": ["12.25", "0", "0.0", "1e-3", "3"],
    "peak_rate": ["40.5", "abc", "", "0", "inf"],
    "last_alloc_ms": ["2.50", "nope", "0.125"],
    "time_bits_years_left": ["41.500", "-1", "nan"],
}


def fill(pool: Pool, r: redis.Redis, n: int = 620) -> None:
    rng = random.Random(30)
    for i in range(n):
        tag = f"t{i:03d}"
        k = pool.tag(tag)
        if i == n - 1:  # a member of the tag set without any keys
            r.sadd(pool.keys.tags, tag)
            continue
        fields: dict[str, object] = {}
        for name in INTS:
            if rng.random() < 0.5:
                fields[name] = rng.choice([0, 1, 17, 2000, 10**12, ""])
        for name in TIMES:
            if rng.random() < 0.3:
                fields[name] = int(NOW_MS) - rng.randrange(0, 10**9)
        for name, values in {**TEXTS, **FLOATS}.items():
            if rng.random() < 0.4:
                fields[name] = rng.choice(values)
        if rng.random() < 0.5:
            fields["rate_ts_ms"] = int(NOW_MS) - rng.randrange(0, 10**7)
        pool.register(tag, rng.choice(["segment", "segment", "snowflake"]), 0)
        if fields:
            r.hset(k.state, mapping=fields)  # type: ignore[arg-type]
        if rng.random() < 0.2:
            r.hdel(k.state, "mode")  # a stray state without a mode
        if rng.random() < 0.4:
            r.hset(k.hits, mapping={name: rng.randrange(0, 50) for name in
                                    rng.sample(["empty_hits", "unacked_ids", "gaps",
                                                "lost_replies"], 2)})
        if rng.random() < 0.7:
            r.rpush(k.ids, *range(rng.randrange(1, 40)))
        start = rng.randrange(1, 10**6)
        for _ in range(rng.randrange(0, 4)):
            end = start + rng.randrange(1, 5000)
            r.rpush(k.reserve, f"{start}:{end}")
            start = end
        if rng.random() < 0.2:
            r.set(k.lock, "token")


@pytest.fixture
def frozen_status_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """leafpool.status reads NOW_MS as the time (the rates are brought up to it)."""
    monkeypatch.setattr(status_module, "time", types.SimpleNamespace(time=lambda: NOW_MS / 1000))


def test_the_status_is_what_it_was(pool: Pool, r: redis.Redis) -> None:
    fill(pool, r)
    new, ref = pool_status(pool, now_ms=NOW_MS), reference_statuses(pool, NOW_MS)
    assert len(new) == 620
    for a, b in zip(new, ref, strict=True):  # repr: every field, a nan equal to a nan
        assert repr(a) == repr(b)
    assert any(st.counter_behind for st in new) and any(st.locked for st in new)
    names = [f.name for f in fields(TagStatus)]
    assert all(list(st.__dict__) == names for st in new)  # the JSON's key order
    assert status_json(new) == reference_json(ref)
    json.loads(status_json(new))
    # one snapshot's status (the HTTP service's path) as before
    for tag in ("t000", "t001", "t002"):
        snap = pool.snapshot(tag)
        assert repr(tag_status(snap, NOW_MS)) == repr(reference_status(snap, NOW_MS))
    # the table's cells say "ago" from the clock: the reference's taken between two of ours
    # equals one of them (the clock moves by under a second between them)
    first = [*map(status_row, new), *map(status_detail, new)]
    cells = [*map(status_row, ref), *map(status_detail, ref)]
    second = [*map(status_row, new), *map(status_detail, new)]
    assert cells in (first, second)
    rows = [status_row(st) for st in new]
    assert plain_table(rows) == reference_plain_table(rows, STATUS_COLUMNS)


def test_the_exposition_is_what_it_was(pool: Pool, r: redis.Redis,
                                       frozen_status_clock: None) -> None:
    fill(pool, r)
    text = pool_text(PoolCollector(pool)).decode()
    body, _, duration = text.partition("# HELP leafpool_scrape_duration_seconds ")
    assert body == reference_text(reference_statuses(pool, NOW_MS))
    assert duration.startswith("Time this scrape") and duration.count("\n") == 3
    assert pool_text(PoolCollector(pool), b"after\n").decode().endswith("\nafter\n")


def test_an_error_reply_is_raised_and_the_connection_read_again(pool: Pool,
                                                                r: redis.Redis) -> None:
    """A tag whose state is not a hash: the read raises Redis's error (after reading the
    whole chunk), and the next status on the same client reads every reply in place."""
    fill(pool, r, 30)
    r.delete(pool.tag("t010").state)
    r.set(pool.tag("t010").state, "not a hash")
    with pytest.raises(LeafpoolError, match="WRONGTYPE"):
        pool_status(pool, now_ms=NOW_MS)
    r.delete(pool.tag("t010").state)
    assert repr(pool_status(pool, now_ms=NOW_MS)) == repr(reference_statuses(pool, NOW_MS))
    assert r.ping()


@pytest.mark.parametrize("protocol", [2, 3])
def test_either_protocol_reads_the_same(r: redis.Redis, protocol: int) -> None:
    kwargs = r.connection_pool.connection_kwargs
    client = redis.Redis(host=kwargs["host"], port=kwargs["port"], protocol=protocol)
    pool = Pool(client, "leafpool")
    fill(pool, client, 40)
    assert repr(pool_status(pool, now_ms=NOW_MS)) == repr(reference_statuses(pool, NOW_MS))
    client.close()


def test_the_json_written_in_pieces_is_the_json_at_once(pool: Pool, r: redis.Redis) -> None:
    """``leafpool status --json`` writes a chunk's statuses at a time: the same bytes as
    status_json of them all, whatever the chunks (empty ones among them)."""
    from leafpool.cli_status import json_body, status_json_parts

    fill(pool, r, 7)
    st = pool_status(pool, now_ms=NOW_MS)
    cases: list[list[list[TagStatus]]] = [
        [], [[]], [st], [st[:1], [], st[1:4], st[4:]], [[], st[:3], st[3:], []]]
    for chunks in cases:
        whole = [s for chunk in chunks for s in chunk]
        assert "".join(status_json_parts(map(json_body, chunks))) == status_json(whole)
    assert status_json([]) == "[]\n"


def test_tags_of_every_name_length_are_read_as_before(pool: Pool, r: redis.Redis) -> None:
    """The commands of a tag are packed once per name length (its name joined into them):
    names of 1 to 40 characters, and a name that is not ASCII (a tag set written by hand),
    read among each other what each tag's own snapshot reads."""
    names = ["abcdefghijklmnopqrstuvwxyz0123456789_.-X"[:n] for n in range(1, 41)]
    names += ["zé", "z%d{x}"]
    for i, tag in enumerate(names):
        pool.register(tag, "segment", 0, max_id=1000 + i, last_error=f"e{tag}")
        r.rpush(pool.tag(tag).ids, *range(i + 1))
        r.rpush(pool.tag(tag).reserve, f"{i}:{2 * i + 1}")
        if i % 3 == 0:
            r.set(pool.tag(tag).lock, "token")
        if i % 4 == 0:
            r.hset(pool.tag(tag).hits, "gaps", i)
    new = pool_status(pool, now_ms=NOW_MS)
    assert [st.tag for st in new] == sorted(names)
    assert repr(new) == repr(reference_statuses(pool, NOW_MS))
    assert [st.length for st in new] == [names.index(st.tag) + 1 for st in new]


def test_the_json_of_fields_of_other_types_is_json_dumps() -> None:
    """A status built by hand with values of types its fields do not declare (an int rate,
    a float length, a bool max_id, a str subclass, numbers among the reserve's ranges, no
    worker IDs list, an attribute more or fields out of order) is written as
    ``json.dumps`` of its fields writes it."""
    class Text(str):
        pass

    base = TagStatus("t", "segment", 1, 2, 1, ["1:2"], 1, 3, None, 0.5, None, None, "", "",
                     None, 0, 0, 0, 0, 0, False, "")
    odd: list[dict[str, object]] = [
        {"rate": 3}, {"length": 1.5}, {"max_id": True}, {"tag": Text("t\u00e9")},
        {"reserve": ["1:2", 7]}, {"worker_ids": ("1", "2")}, {"seconds_left": math.inf},
        {"peak_rate": math.nan}, {"last_alloc_ms": -math.inf}, {"locked": 1},
        {"counter_behind": None}, {"hwm": None}, {"last_error": 'a "b"\n\\ \u2603'},
        {"time_bits_years_left": 41}, {"target": 2**70}, {"reserve": []},
    ]
    for change in odd:
        st = copy.copy(base)
        st.__dict__.update(change)
        assert status_json([st]) == reference_json([st]), change
    assert status_json([base]) == reference_json([base])
    extra = copy.copy(base)
    extra.note = "x"  # type: ignore[attr-defined]
    assert status_json([extra]) == reference_json([extra])
    moved = copy.copy(base)
    del moved.tag
    moved.tag = "t"
    assert status_json([moved]) == reference_json([moved])


def test_a_plain_table_of_any_cells_is_what_it_was() -> None:
    rng = random.Random(7)
    columns = ("a", "long column", "", "c")
    for n in (0, 1, 5, 300):
        rows = [[rng.choice(["", " ", "x", "wide cell  ", "\u00e9t\u00e9", "a b"]) for _ in columns]
                for _ in range(n)]
        assert plain_table(rows, columns) == reference_plain_table(rows, columns)
    with pytest.raises(ValueError, match=r"rows of \[3, 4\] cells, not 4 \(columns: a, long"):
        plain_table([["1", "2", "3", "4"], ["1", "2", "3"]], columns)
