"""The Lua scripts' shared decimal helpers, the fence's refusal of anything that is not
a canonical non-negative decimal (so the fence does not depend on every caller's
formatting), and each script's refusal of arguments that do not agree with each other
(a value it writes that does not follow from the IDs it hands out or adds): refused,
nothing written."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
import redis

from leafpool.core.keys import Keys
from leafpool.redis import scripts
from leafpool.redis.pool import Pool
from leafpool.redis.pool_common import Range

K = Keys("leafpool").tag("t")
TOKEN = b"token"


def _helper(r: redis.Redis, body: str, *args: str) -> object:
    return r.eval(scripts.expand("-- @include decimal\n" + body), 0, *args)


@pytest.mark.parametrize(
    ("value", "canonical"),
    [("0", 1), ("1", 1), ("100", 1), ("9223372036854775807", 1),
     ("", 0), ("0099", 0), ("00", 0), ("-50", 0), ("+1", 0), (" 1", 0), ("1 ", 0),
     ("1.0", 0), ("1e3", 0), ("0x10", 0), ("12345678901234567890", 0)],
)
def test_dec_accepts_only_canonical_non_negative_decimals(
    r: redis.Redis, value: str, canonical: int
) -> None:
    assert _helper(r, "return dec(ARGV[1]) and 1 or 0", value) == canonical


@pytest.mark.parametrize(("a", "b", "greater"),
                         [("100", "99", 1), ("99", "100", 0), ("100", "100", 0),
                          ("9223372036854775807", "9223372036854775806", 1)])
def test_gt_orders_canonical_decimals(r: redis.Redis, a: str, b: str, greater: int) -> None:
    assert _helper(r, "return gt(ARGV[1], ARGV[2]) and 1 or 0", a, b) == greater


def test_every_script_includes_the_helper_once_and_opens_with_its_contract() -> None:
    for path in sorted(scripts.LUA_DIR.glob("*.lua")):
        raw = path.read_text()
        assert raw.startswith(f"-- {path.name}:"), path.name
        assert "local function gt" not in raw, f"{path.name} pastes the helper"
        source = scripts.source(path.stem)
        includes = "-- @include decimal" in raw
        assert includes or "gt(" not in raw, f"{path.name} compares without the helper"
        assert source.count("local function gt(") == (1 if includes else 0), path.name
        if "-- @include chunk" in raw:  # the chunk helpers use the decimal ones, after them
            assert raw.index("-- @include decimal") < raw.index("-- @include chunk"), path.name
            assert source.count("local function chunk_fence(") == 1, path.name
        assert not scripts._INCLUDE.search(source), path.name


def test_append_reserve_refuses_a_leading_zero_start_below_the_mark(r: redis.Redis) -> None:
    r.set(K.lock, TOKEN)
    r.hset(K.state, "hwm", "100")
    code = r.eval(scripts.source("append_reserve"), 3, K.reserve, K.state, K.lock,
                  TOKEN, "0099", "0200")
    assert code == scripts.NOT_DECIMAL
    assert r.llen(K.reserve) == 0


def test_push_fresh_refuses_a_negative_id(r: redis.Redis) -> None:
    r.set(K.lock, TOKEN)
    r.hset(K.state, "hwm", "99")
    code = r.eval(scripts.source("push_fresh"), 3, K.ids, K.state, K.lock, TOKEN, "0", "-50")
    assert code == scripts.NOT_DECIMAL
    assert r.llen(K.ids) == 0


def test_push_ids_refuses_a_head_with_leading_zeros(r: redis.Redis) -> None:
    r.set(K.lock, TOKEN)
    r.hset(K.state, "hwm", "100")
    r.rpush(K.reserve, "0099:0200")
    code = r.eval(scripts.source("push_ids"), 4, K.ids, K.reserve, K.state, K.lock,
                  TOKEN, "0099:0200", "0100:0200", "0", "0099")
    assert code == scripts.NOT_DECIMAL
    assert r.llen(K.ids) == 0 and r.lindex(K.reserve, 0) == b"0099:0200"


def test_take_reserve_refuses_a_head_with_leading_zeros(r: redis.Redis) -> None:
    r.hset(K.state, "hwm", "100")
    r.rpush(K.reserve, "0099:0200")
    code = r.eval(scripts.source("take_reserve"), 3, K.ids, K.reserve, K.state,
                  "0099:0200", "0100:0200", "0099", "0099", "1")
    assert code == scripts.NOT_DECIMAL
    assert r.lindex(K.reserve, 0) == b"0099:0200" and r.hget(K.state, "hwm") == b"100"


def test_a_corrupt_high_water_mark_refuses_every_write(r: redis.Redis) -> None:
    r.set(K.lock, TOKEN)
    r.hset(K.state, "hwm", "-5")
    code = r.eval(scripts.source("append_reserve"), 3, K.reserve, K.state, K.lock,
                  TOKEN, "1", "11")
    assert code == scripts.NOT_DECIMAL


# -- the exact small-integer add (lib/decimal.lua add) ------------------------------------

MAX = 2**63 - 1
P53 = 2**53


@pytest.mark.parametrize(
    ("s", "n", "total"),
    [("0", "0", "0"), ("0", "5", "5"), ("0", "10", "10"), ("9", "1", "10"),
     ("999", "1", "1000"), ("100", "999999999", "1000000099"),
     (str(P53), "1", str(P53 + 1)), (str(P53 - 1), "2", str(P53 + 1)),
     (str(MAX - 1), "1", str(MAX)), (str(MAX), "999999999", str(MAX + 10**9 - 1)),
     ("9999999999999999999", "1", "10000000000000000000")],
)
def test_add_is_exact_across_the_64_bit_range(r: redis.Redis, s: str, n: str, total: str) -> None:
    # n as a decimal string and as a Lua number: the same sum
    assert _helper(r, "return add(ARGV[1], ARGV[2])", s, n) == total.encode()
    assert _helper(r, "return add(ARGV[1], tonumber(ARGV[2]))", s, n) == total.encode()


def test_add_takes_a_lua_number_up_to_10_9(r: redis.Redis) -> None:
    assert _helper(r, "return add(ARGV[1], 1000000000)", str(MAX)) == str(MAX + 10**9).encode()


def test_add_of_a_twenty_digit_sum_is_not_a_valid_decimal(r: redis.Redis) -> None:
    assert _helper(r, "return dec(add(ARGV[1], 1)) and 1 or 0", "9999999999999999999") == 0


@pytest.mark.parametrize(
    ("s", "n"),
    [("0099", "1"), ("-1", "1"), ("", "1"), ("12345678901234567890", "1"),  # s not canonical
     ("1", "1000000000"), ("1", "01"), ("1", "-1"), ("1", ""), ("1", "1.5")],  # n not valid
)
def test_add_refuses_what_it_cannot_add_exactly(r: redis.Redis, s: str, n: str) -> None:
    assert _helper(r, "return add(ARGV[1], ARGV[2]) == nil and 1 or 0", s, n) == 1


@pytest.mark.parametrize("n", ["-1", "1000000001", "1.5", "1e300"])
def test_add_refuses_a_lua_number_out_of_its_range(r: redis.Redis, n: str) -> None:
    assert _helper(r, "return add('1', tonumber(ARGV[1])) == nil and 1 or 0", n) == 1


def test_add_agrees_with_python_on_random_ids(r: redis.Redis) -> None:
    rng = random.Random(20240531)
    cases = [(rng.choice([rng.randrange(MAX - 10**9, MAX), rng.randrange(P53 - 10**6, P53 + 10**6),
                          rng.randrange(0, MAX)]), rng.randrange(0, 10**9))
             for _ in range(500)]
    args = [str(x) for case in cases for x in case]
    sums = _helper(r, "local out = {}\n"
                      "for i = 1, #ARGV, 2 do out[#out + 1] = add(ARGV[i], ARGV[i + 1]) end\n"
                      "return out", *args)
    assert sums == [str(s + n).encode() for s, n in cases]


# -- refusals of inconsistent arguments: nothing written -----------------------------------

NOW = "1700000000000"


def _everything(r: redis.Redis) -> dict[object, object]:
    """Every key of the database, serialized: equal before and after means nothing written."""
    return {key: r.dump(key) for key in sorted(r.keys("*"))}


def _refused(r: redis.Redis, code: int, call: Callable[[], object]) -> None:
    before = _everything(r)
    assert call() == code
    assert _everything(r) == before


def _push(r: redis.Redis, head: str, new_head: str, now: str, *ids: str) -> object:
    return r.eval(scripts.source("push_ids"), 4, K.ids, K.reserve, K.state, K.lock,
                  TOKEN, head, new_head, now, *ids)


def _take(r: redis.Redis, *args: str) -> object:
    return r.eval(scripts.source("take_reserve"), 3, K.ids, K.reserve, K.state, *args)


def _append(r: redis.Redis, *args: str) -> object:
    return r.eval(scripts.source("append_reserve"), 3, K.reserve, K.state, K.lock, TOKEN, *args)


def _fresh(r: redis.Redis, now: str, *ids: str) -> object:
    return r.eval(scripts.source("push_fresh"), 3, K.ids, K.state, K.lock, TOKEN, now, *ids)


def _record(r: redis.Redis, *args: str) -> object:
    return r.eval(scripts.source("record"), 1, K.state, *args)


def _drop(r: redis.Redis, created: str) -> object:
    return r.eval(scripts.source("drop"), len(K.all()), K.state,
                  *(key for key in K.all() if key != K.state), created)


def _tag(r: redis.Redis, hwm: int = 100, *reserve: str) -> None:
    r.set(K.lock, TOKEN)
    r.hset(K.state, mapping={"mode": "segment", "created_ms": "1000", "hwm": str(hwm),
                             "pushed_total": "100"})
    if reserve:
        r.rpush(K.reserve, *reserve)


def _ids(first: int, last: int) -> list[str]:
    return [str(i) for i in range(first, last + 1)]


@pytest.mark.parametrize(
    ("new_head", "ids"),
    [("112:201", _ids(101, 110)),              # the head after is not last + 1
     ("111:301", _ids(101, 110)),              # ... nor ends where the head ends
     ("", _ids(101, 110)),                     # "" but the chunk leaves IDs in the range
     ("201:201", _ids(101, 200)),              # not "" but the chunk uses the range up
     ("111:201", [*_ids(101, 105), "110"]),    # fewer IDs than last - first + 1
     ("111:201", [*_ids(101, 110), "110"]),    # more IDs than last - first + 1
     ("61:201", ["101", "60"])],               # last below first: would lower the mark
    ids=["head-after-off-by-one", "head-after-other-end", "empty-head-too-early",
         "head-after-used-up", "too-few-ids", "too-many-ids", "last-below-first"],
)
def test_push_ids_refuses_a_head_or_count_that_does_not_follow_from_its_ids(
    r: redis.Redis, new_head: str, ids: list[str]
) -> None:
    _tag(r, 100, "101:201", "301:401")
    _refused(r, scripts.INCONSISTENT, lambda: _push(r, "101:201", new_head, NOW, *ids))
    assert _push(r, "101:201", "111:201", NOW, *_ids(101, 110)) == 10  # the valid call


@pytest.mark.parametrize("now", ["", "-1", "1.7e12", "01700000000000", "now"])
def test_push_ids_refuses_a_now_that_is_not_a_decimal(r: redis.Redis, now: str) -> None:
    _tag(r, 100, "101:201")
    _refused(r, scripts.NOT_DECIMAL, lambda: _push(r, "101:201", "111:201", now, *_ids(101, 110)))
    assert _push(r, "101:201", "111:201", NOW, *_ids(101, 110)) == 10


@pytest.mark.parametrize(
    ("new_head", "last", "count"),
    [("111:201", "110", "11"),     # count above last - first + 1
     ("111:201", "110", "9"),      # count below it
     ("111:201", "110", "0"),
     ("112:201", "110", "10"),     # the head after is not last + 1
     ("111:301", "110", "10"),     # ... nor ends where the head ends
     ("", "110", "10"),            # "" but the take leaves IDs in the range
     ("201:201", "200", "100")],   # not "" but the take uses the range up
    ids=["count-high", "count-low", "count-zero", "head-after-off-by-one",
         "head-after-other-end", "empty-head-too-early", "head-after-used-up"],
)
def test_take_reserve_refuses_a_head_or_count_that_does_not_follow_from_first_and_last(
    r: redis.Redis, new_head: str, last: str, count: str
) -> None:
    _tag(r, 100, "101:201")
    _refused(r, scripts.INCONSISTENT, lambda: _take(r, "101:201", new_head, "101", last, count))
    assert _take(r, "101:201", "111:201", "101", "110", "10") == 1  # the valid call


@pytest.mark.parametrize("count", ["010", "-10", "10.0", "", "ten"])
def test_take_reserve_refuses_a_count_that_is_not_a_decimal(r: redis.Redis, count: str) -> None:
    _tag(r, 100, "101:201")
    _refused(r, scripts.NOT_DECIMAL, lambda: _take(r, "101:201", "111:201", "101", "110", count))
    assert _take(r, "101:201", "111:201", "101", "110", "10") == 1


APPEND_FIELDS = {"step": "1000", "table_step": "1000", "max_id": "1201", "segment_ms": NOW}


@pytest.mark.parametrize(
    "pairs",
    [[*APPEND_FIELDS.items(), ("last_alloc_ms",)],             # a field without its value
     [*{**APPEND_FIELDS, "max_id": "1200"}.items()],            # max_id is not the end
     [*{**APPEND_FIELDS, "max_id": "01201"}.items()],
     [*{**APPEND_FIELDS, "step": "999"}.items()],               # step is not end - start
     [*{**APPEND_FIELDS, "step": "01000"}.items()],
     [*{**APPEND_FIELDS, "step": "-1000"}.items()],
     [("step", "1000"), ("step", "1")]],                        # a second step, wrong
    ids=["odd-pairs", "max-id-off-by-one", "max-id-leading-zero", "step-off-by-one",
         "step-leading-zero", "step-negative", "second-step"],
)
def test_append_reserve_refuses_fields_that_do_not_follow_from_the_range(
    r: redis.Redis, pairs: list[tuple[str, ...]]
) -> None:
    _tag(r, 100, "101:201")
    flat = [x for pair in pairs for x in pair]
    _refused(r, scripts.INCONSISTENT, lambda: _append(r, "201", "1201", *flat))
    valid = [x for pair in APPEND_FIELDS.items() for x in pair]
    assert _append(r, "201", "1201", *valid) == 2  # the valid call
    assert r.hget(K.state, "max_id") == b"1201" and r.hget(K.state, "step") == b"1000"


@pytest.mark.parametrize("now", ["", "-1", "1.7e12", "01700000000000", "now"])
def test_push_fresh_refuses_a_now_that_is_not_a_decimal(r: redis.Redis, now: str) -> None:
    _tag(r, 100)
    _refused(r, scripts.NOT_DECIMAL, lambda: _fresh(r, now, "101", "105"))
    assert _fresh(r, NOW, "101", "105") == 2


@pytest.mark.parametrize(
    ("code", "args"),
    [(scripts.NOT_DECIMAL, ["x", "last_error", "e"]),           # n is not a decimal
     (scripts.NOT_DECIMAL, ["-1", "refills", "1"]),
     (scripts.INCONSISTENT, ["2", "last_error", "e"]),          # 2n + 1 > #ARGV
     (scripts.INCONSISTENT, ["1", "last_error", "e", "refills"]),  # counter without increment
     (scripts.NOT_DECIMAL, ["1", "last_error", "e", "refills", "1.5"]),
     (scripts.NOT_DECIMAL, ["1", "last_error", "e", "refills", "-1"]),
     (scripts.NOT_DECIMAL, ["1", "last_error", "e", "refills", "01"]),
     (scripts.NOT_DECIMAL, ["1", "last_error", "e", "refills", str(MAX + 1)]),
     (scripts.INCONSISTENT, ["1", "refills", "5", "refills", "1"])],  # set and incremented
    ids=["n-not-decimal", "n-negative", "n-too-large", "odd-counters", "increment-fraction",
         "increment-negative", "increment-leading-zero", "increment-above-int64",
         "set-and-incremented"],
)
def test_record_refuses_malformed_arguments(r: redis.Redis, code: int, args: list[str]) -> None:
    _tag(r, 100)
    _refused(r, code, lambda: _record(r, *args))
    assert _record(r, "1", "last_error", "e", "refills", "1") == 1  # the valid call
    assert r.hget(K.state, "last_error") == b"e"


def test_record_counts_up_to_the_largest_64_bit_increment(r: redis.Redis) -> None:
    _tag(r, 100)
    assert _record(r, "0", "big", str(MAX)) == 1
    assert r.hget(K.state, "big") == str(MAX).encode()


# -- the valid calls at the extremes: 2^63 - 1 and 2^53 --------------------------------------


def test_push_ids_and_take_reserve_up_to_the_last_64_bit_id(r: redis.Redis) -> None:
    _tag(r, MAX - 1001, f"{MAX - 1000}:{MAX - 500}", f"{MAX - 500}:{MAX}")
    assert _push(r, f"{MAX - 1000}:{MAX - 500}", "", NOW, *_ids(MAX - 1000, MAX - 501)) == 500
    assert _push(r, f"{MAX - 500}:{MAX}", f"{MAX - 10}:{MAX}", NOW,
                 *_ids(MAX - 500, MAX - 11)) == 990
    # off by one at the top: refused
    _refused(r, scripts.INCONSISTENT, lambda: _push(r, f"{MAX - 10}:{MAX}", f"{MAX - 1}:{MAX}",
                                                    NOW, *_ids(MAX - 10, MAX - 1)))
    r.delete(K.ids)
    assert _take(r, f"{MAX - 10}:{MAX}", "", str(MAX - 10), str(MAX - 1), "10") == 1
    assert r.hget(K.state, "hwm") == str(MAX - 1).encode() and r.llen(K.reserve) == 0


def test_a_head_ending_at_2_63_minus_1_is_used_up_by_its_last_id(r: redis.Redis) -> None:
    _tag(r, MAX - 11, f"{MAX - 10}:{MAX}")
    assert _push(r, f"{MAX - 10}:{MAX}", "", NOW, *_ids(MAX - 10, MAX - 1)) == 10
    assert r.hget(K.state, "hwm") == str(MAX - 1).encode() and r.llen(K.reserve) == 0


def test_push_ids_and_take_reserve_across_2_53(r: redis.Redis) -> None:
    _tag(r, P53 - 3, f"{P53 - 2}:{P53 + 8}")
    # doubles cannot tell 2^53 + 1 from 2^53: a head after of 2^53 + 1 must be refused
    _refused(r, scripts.INCONSISTENT,
             lambda: _push(r, f"{P53 - 2}:{P53 + 8}", f"{P53 + 1}:{P53 + 8}", NOW,
                           *_ids(P53 - 2, P53 + 1)))
    assert _push(r, f"{P53 - 2}:{P53 + 8}", f"{P53 + 2}:{P53 + 8}", NOW,
                 *_ids(P53 - 2, P53 + 1)) == 4
    r.delete(K.ids)
    _refused(r, scripts.INCONSISTENT,
             lambda: _take(r, f"{P53 + 2}:{P53 + 8}", f"{P53 + 4}:{P53 + 8}", str(P53 + 2),
                           str(P53 + 3), "1"))
    assert _take(r, f"{P53 + 2}:{P53 + 8}", f"{P53 + 4}:{P53 + 8}", str(P53 + 2),
                 str(P53 + 3), "2") == 1
    assert r.hget(K.state, "hwm") == str(P53 + 3).encode()


def test_append_reserve_records_a_range_ending_at_2_63_minus_1(r: redis.Redis) -> None:
    _tag(r, MAX - 2_000_001)
    start = MAX - 1_000_000
    _refused(r, scripts.INCONSISTENT,
             lambda: _append(r, str(start), str(MAX), "step", "999999", "max_id", str(MAX)))
    _refused(r, scripts.INCONSISTENT,
             lambda: _append(r, str(start), str(MAX), "step", "1000000", "max_id", str(MAX - 1)))
    assert _append(r, str(start), str(MAX), "step", "1000000", "max_id", str(MAX)) == 1
    assert r.hget(K.state, "max_id") == str(MAX).encode()


def test_the_pool_pushes_and_takes_at_the_extremes(pool: Pool, r: redis.Redis) -> None:
    """The Python callers build arguments the scripts accept, up to 2^63 - 1."""
    _tag(r, MAX - 2001)
    assert pool.append_reserve("t", TOKEN, Range(MAX - 2000, MAX - 1000), step=1000,
                               max_id=MAX - 1000) == 1
    assert pool.append_reserve("t", TOKEN, Range(MAX - 1000, MAX), step=1000, max_id=MAX) == 2
    assert pool.push("t", TOKEN, Range(MAX - 2000, MAX - 1000), 1000, 1) == 1000
    assert pool.push("t", TOKEN, Range(MAX - 1000, MAX), 990, 1) == 1990
    r.delete(K.ids)
    assert pool.take_reserve("t", Range(MAX - 10, MAX), 10) == list(range(MAX - 10, MAX))
    assert r.llen(K.reserve) == 0 and r.hget(K.state, "hwm") == str(MAX - 1).encode()
    assert pool.record("t", counts={"refills": 1}, last_error="")


# -- drop: a repeat after a lost reply ------------------------------------------------------


def test_a_repeated_drop_deletes_what_is_left_and_says_dropped(r: redis.Redis) -> None:
    _tag(r, 100, "101:201")
    r.rpush(K.ids, "1", "2")
    assert _drop(r, "1000") == 1
    assert not r.exists(*K.all())
    assert _drop(r, "1000") == 1  # the same call again (its first reply was lost)
    r.rpush(K.ids, "3")  # something left behind without a state: deleted too
    assert _drop(r, "1000") == 1
    assert not r.exists(*K.all())


def test_a_drop_keeps_a_tag_registered_again(r: redis.Redis) -> None:
    _tag(r, 100, "101:201")
    r.hset(K.state, "created_ms", "2000")
    _refused(r, 0, lambda: _drop(r, "1000"))
    r.hdel(K.state, "created_ms")  # a state without created_ms is another state than "1000"
    _refused(r, 0, lambda: _drop(r, "1000"))
    assert _drop(r, "") == 1
    assert not r.exists(*K.all())
