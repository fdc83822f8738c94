"""The refill lock against a real Redis: one holder, a fencing token, extension at a
third of its TTL, and a release that never frees someone else's lock."""

from __future__ import annotations

import redis

from leafpool.redis.lock import RefillLock
from tests.support.clocks import FakeWallClock

KEY = "leafpool:{t}:lock"


def test_one_holder_at_a_time_and_its_token_is_the_keys_value(r: redis.Redis) -> None:
    first, second = RefillLock(r, KEY, 10_000), RefillLock(r, KEY, 10_000)
    assert first.acquire() and not second.acquire()
    assert r.get(KEY) == first.token
    first.release()
    assert r.get(KEY) is None and second.acquire()


def test_the_ttl_is_extended_once_a_third_of_it_has_passed(r: redis.Redis) -> None:
    clock = FakeWallClock()
    lock = RefillLock(r, KEY, 30_000, monotonic=clock)
    assert lock.acquire()
    r.pexpire(KEY, 5_000)  # as if 25 s of the 30 s had passed in Redis
    clock.advance(5)  # under a third: no extension
    lock.keep()
    assert r.pttl(KEY) <= 5_000
    clock.advance(6)  # 11 s: over a third
    lock.keep()
    assert r.pttl(KEY) > 20_000 and lock.held


def test_a_lock_taken_over_is_not_released_and_its_old_token_is_kept(r: redis.Redis) -> None:
    clock = FakeWallClock()
    mine = RefillLock(r, KEY, 30_000, monotonic=clock)
    assert mine.acquire()
    old_token = mine.token
    r.delete(KEY)  # expired ...
    other = RefillLock(r, KEY, 30_000)
    assert other.acquire()  # ... and taken by another refiller
    clock.advance(11)
    mine.keep()  # the extension finds someone else's token
    assert not mine.held
    mine.release()
    assert r.get(KEY) == other.token  # the other holder's lock stays
    assert mine.token == old_token != other.token  # writes with it are refused
