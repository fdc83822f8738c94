"""``dry.lua`` (docs/design.md §3.8): a list at 0 after pushes is marked dry with the time
it was seen so, a list holding IDs again has its mark cleared and the period counted; a
new tag, an unregistered one and a repeat change nothing."""

from __future__ import annotations

import redis

from leafpool.redis.lock import RefillLock
from leafpool.redis.pool import Pool, Range


def _filled(pool: Pool, n: int = 3) -> RefillLock:
    lock = RefillLock(pool.redis, pool.tag("t").lock, 10_000)
    assert lock.acquire()
    pool.register("t", "segment", 0)
    pool.append_reserve("t", lock.token, Range(1, 101))
    pool.push("t", lock.token, Range(1, 101), n, 0)
    return lock


def test_a_new_tag_is_not_dry_and_an_unregistered_one_is_left_alone(
    pool: Pool, r: redis.Redis
) -> None:
    pool.register("t", "segment", 0)
    assert pool.note_dry("t", 1_000) == 0  # nothing pushed yet: not dry, only new
    assert pool.note_dry("nobody", 1_000) == 0
    assert not r.exists("leafpool:{nobody}:state")
    assert r.hget("leafpool:{t}:state", "dry_since_ms") is None


def test_dry_from_when_it_was_seen_empty_until_it_holds_ids_again(
    pool: Pool, r: redis.Redis
) -> None:
    lock = _filled(pool)
    assert pool.note_dry("t", 1_000) == 0  # holds IDs, not marked: nothing to change
    r.lpop("leafpool:{t}:ids", 3)  # a plain LPOP takes the last IDs
    assert pool.note_dry("t", 5_000) == 1
    assert pool.note_dry("t", 6_000) == 0  # a repeat (or a later look) keeps the first time
    assert r.hget("leafpool:{t}:state", "dry_since_ms") == b"5000"
    pool.push("t", lock.token, Range(4, 101), 10, 0)
    assert pool.note_dry("t", 9_500) == -1
    assert pool.note_dry("t", 9_600) == 0  # repeated after a lost reply: counted once
    state = r.hgetall("leafpool:{t}:state")
    assert state[b"dry_since_ms"] == b""
    assert (state[b"last_dry_ms"], state[b"last_dry_end_ms"]) == (b"5000", b"9500")
    assert (state[b"dry_events"], state[b"dry_ms"]) == (b"1", b"4500")


def test_a_time_that_is_not_a_decimal_is_refused(pool: Pool, r: redis.Redis) -> None:
    _filled(pool)
    r.lpop("leafpool:{t}:ids", 3)
    assert int(pool._dry(keys=[pool.tag("t").ids, pool.tag("t").state], args=["-5"])) == -7
    assert r.hget("leafpool:{t}:state", "dry_since_ms") is None
