"""The locks against a real Redis: one holder, a fencing token, extension at a third of
the TTL, a release that never frees someone else's lock, an acquire or release repeated
after a lost reply, and a lock written on a former master taken over."""

from __future__ import annotations

import redis

from leafpool.redis import scripts
from leafpool.redis.lock import BeatLock, RefillLock
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


# -- lost replies and failovers (docs/design.md §3.1) ----------------------------------------


def _acquire(r: redis.Redis, nonce: str, ttl_ms: int = 10_000) -> tuple[int, bytes]:
    script = r.register_script(scripts.source("lock_acquire"))
    code, value = script(keys=[KEY], args=[nonce, ttl_ms])
    return int(code), value


def _replid(r: redis.Redis) -> str:
    return str(r.info("replication")["master_replid"])


def test_an_acquire_repeated_with_its_own_nonce_finds_the_lock_its_own(r: redis.Redis) -> None:
    """The repeat of an acquire whose reply was lost: code 2, the same token, the TTL set
    again; another nonce is refused while it is held."""
    first = _acquire(r, "a1", 10_000)
    assert first == (1, f"a1@{_replid(r)}".encode())
    r.pexpire(KEY, 500)
    assert _acquire(r, "a1", 10_000) == (2, first[1])
    assert r.pttl(KEY) > 5_000
    assert _acquire(r, "b2") == (0, first[1])
    assert r.get(KEY) == first[1]


def test_a_lock_written_on_a_former_master_is_taken_over_at_once(r: redis.Redis) -> None:
    """A value naming another replication ID was written before a failover (or a restart)
    promoted this node: taken over (code 3), not waited out; the former holder's token no
    longer fences anything."""
    former = b"c3@" + b"0" * 40
    r.set(KEY, former, px=30_000)
    lock = RefillLock(r, KEY, 10_000)
    assert lock.acquire() and lock.took_over_from == former.decode()
    assert r.get(KEY) == lock.token != former
    assert lock.token.endswith(_replid(r).encode())


def test_malformed_acquire_arguments_write_nothing(r: redis.Redis) -> None:
    for nonce, ttl in (("", 1000), ("X-Y", 1000), ("a" * 65, 1000), ("ab", 0), ("ab", "1e3"),
                       ("ab", 3_600_001)):
        assert _acquire(r, nonce, ttl)[0] == -7, (nonce, ttl)
    assert r.exists(KEY) == 0


def test_a_release_repeated_after_a_lost_reply_finds_the_lock_free(r: redis.Redis) -> None:
    release = r.register_script(scripts.source("lock_release"))
    lock = RefillLock(r, KEY, 10_000)
    assert lock.acquire()
    assert release(keys=[KEY], args=[lock.token]) == 1
    assert release(keys=[KEY], args=[lock.token]) == 2  # the repeat: already free
    other = RefillLock(r, KEY, 10_000)
    assert other.acquire()
    assert release(keys=[KEY], args=[lock.token]) == 0 and r.get(KEY) == other.token


def test_the_beat_lock_is_one_holder_and_a_former_masters_holder_is_taken_over(
    r: redis.Redis,
) -> None:
    first, second = BeatLock(r, KEY, 15), BeatLock(r, KEY, 15)
    assert first.acquire() and not second.acquire() and first.extend()
    r.set(KEY, b"d4@" + b"1" * 40, px=15_000)  # as the promoted replica has it
    assert second.acquire() and not first.extend()
