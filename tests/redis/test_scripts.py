"""The Lua scripts' shared decimal helper and the fence's refusal of anything that is not
a canonical non-negative decimal (so the fence does not depend on every caller's
formatting)."""

from __future__ import annotations

import pytest
import redis

from leafpool.core.keys import Keys
from leafpool.redis import scripts

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
        assert source.count("local function gt(") == (1 if "gt(" in raw else 0), path.name
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
