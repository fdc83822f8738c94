"""The locks against a real Redis: one holder, a fencing token, extension at a third of
the TTL, a release that never frees someone else's lock, an acquire or release repeated
after a lost reply, a lock written on a former master taken over, and a beat lock whose
holder died taken over at once (its presence), never a live one's, with the previous
release's script still seeing it held."""

from __future__ import annotations

import sys
from pathlib import Path

import redis

from leafpool.redis import scripts
from leafpool.redis.lock import BeatLock, RefillLock, clean_identity, describe, written_here
from tests.support import services
from tests.support.clocks import FakeWallClock
from tests.support.processes import Proc, leafpool_env

WAIT = 10.0

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


# -- the beat lock's presence (docs/design.md §3.1) ------------------------------------------

BEAT = "leafpool:beat:lock"
#: lock_acquire.lua as the previous release shipped it: its beat must still see a lock
#: that announces its holder's presence as held
RELEASED_ACQUIRE = (Path(__file__).parent / "released" / "lock_acquire.lua").read_text()


def _subscribers(r: redis.Redis, channel: str) -> int:
    return int(r.pubsub_numsub(channel)[0][1])


def _holder_process(redis_url: str, identity: str) -> Proc:
    """A process that takes the beat lock with ``identity`` and holds it (as a beat does)
    until it is killed."""
    code = ("import sys, threading, redis; from leafpool.redis.lock import BeatLock; "
            "lock = BeatLock(redis.Redis.from_url(sys.argv[1]), sys.argv[2], 60, sys.argv[3]); "
            "assert lock.acquire(); print('held', flush=True); threading.Event().wait()")
    return Proc([sys.executable, "-c", code, redis_url, BEAT, identity], leafpool_env())


def test_a_beat_lock_whose_holder_died_is_taken_over_at_once_and_a_live_one_never(
    r: redis.Redis, redis_url: str
) -> None:
    """A beat announces itself: its value names its identity, and it is subscribed to its
    presence channel while it holds the lock. Another beat (a standby, or the same host's
    beat restarted) is refused while the holder lives, and takes the lock over (code 4)
    the moment the holder's process is killed: its subscription goes with its
    connection. No waiting out the lock's 60 s TTL."""
    holder = _holder_process(redis_url, "host-a")
    try:
        assert holder.wait_line("held", 30) == "held"
        value = r.get(BEAT)
        assert value is not None
        nonce, rest = value.decode().split("/", 1)
        assert rest == f"host-a@{_replid(r)}"
        assert _subscribers(r, f"{BEAT}:{nonce}") == 1
        standby = BeatLock(r, BEAT, 60, identity="host-b")
        assert not standby.acquire()  # alive: never taken over
        assert describe(standby.holder) == "the beat on host-a"
        assert r.get(BEAT) == value
        holder.kill()  # SIGKILL: the kernel closes its connections
        services.wait_until(lambda: _subscribers(r, f"{BEAT}:{nonce}") == 0, WAIT,
                            "Redis dropping the dead holder's subscription")
        assert standby.acquire()  # at once, with the dead holder's TTL still running
        assert standby.took_over_from == value.decode()
        assert r.get(BEAT) == standby.token and b"/host-b@" in standby.token
        assert r.pttl(BEAT) > 50_000
    finally:
        holder.kill()


def test_a_beat_whose_presence_went_announces_it_again_and_keeps_its_lock(
    r: redis.Redis,
) -> None:
    """The holder's presence connection closed while it lives (Redis dropped it: CLIENT
    KILL here): its next renewal subscribes again, so a standby still finds it present;
    if a standby took the lock over in between, the renewal fails and the holder stands
    by."""
    lock = BeatLock(r, BEAT, 60, identity="host-a")
    assert lock.acquire() and lock.announced
    channel = lock.channel(lock.token.decode().split("/", 1)[0])
    gone = lambda: _subscribers(r, channel) == 0  # noqa: E731
    r.client_kill_filter(_type="pubsub")  # Redis closes the holder's presence connection
    services.wait_until(gone, WAIT, "Redis dropping the subscription")
    assert lock.extend() and _subscribers(r, channel) == 1
    assert not BeatLock(r, BEAT, 60, identity="host-b").acquire()
    r.client_kill_filter(_type="pubsub")
    services.wait_until(gone, WAIT, "Redis dropping the subscription")
    other = BeatLock(r, BEAT, 60, identity="host-b")
    assert other.acquire()  # the gap: taken over
    assert not lock.extend() and not lock.held
    lock.release()
    assert r.get(BEAT) == other.token


def test_the_previous_releases_beat_sees_an_announced_lock_as_held(r: redis.Redis) -> None:
    """Compatibility during a rollout: the previous release's lock_acquire.lua finds a
    lock of this release held (code 0) and leaves it alone, and its extend and release
    (the same scripts) compare the whole value as before. This release's beat waits out a
    lock of the previous release's (no presence to ask), and takes it once it is free."""
    new = BeatLock(r, BEAT, 60, identity="host-a")
    assert new.acquire()
    released = r.register_script(RELEASED_ACQUIRE)
    code, value = released(keys=[BEAT], args=["0dd", 60_000])
    assert (int(code), value) == (0, new.token)
    assert new.extend() and r.get(BEAT) == new.token
    new.release()
    code, old_value = released(keys=[BEAT], args=["0dd", 15_000])  # the old beat holds
    assert int(code) == 1 and b"/" not in old_value
    standby = BeatLock(r, BEAT, 60, identity="host-b")
    assert not standby.acquire() and standby.holder == old_value.decode()
    assert "announces no presence" in describe(standby.holder)
    r.delete(BEAT)  # the old beat's lock expires
    assert standby.acquire()


def test_a_malformed_identity_writes_nothing(r: redis.Redis) -> None:
    script = r.register_script(scripts.source("lock_acquire"))
    for identity in ("", "a b", "a@b", "a/b", "x" * 256):
        assert script(keys=[BEAT], args=["ab", 1000, identity])[0] == -7, identity
    assert r.exists(BEAT) == 0
    assert clean_identity("pod name/1@x") == "pod-name-1-x"
    assert clean_identity("") == "beat" and len(clean_identity("h" * 300)) == 255


def test_a_lock_of_an_unrecognised_format_is_held_not_a_former_masters(r: redis.Redis) -> None:
    """A value that names no replication ID is not a lock left on a former master: it is
    another holder's, waited out by its TTL. Builds before the ``nonce@replid`` form
    (pre-0.1.0 builds) held the refill lock and the beat lock with redis-py's ``Lock``: a
    bare token, no ``@``. Taking it over at once let a rollout's new beat take the beat
    lock from the running old one, and a new worker an old worker's refill lock
    mid-refill (issue 29). A ``@`` followed by what is no replication ID (40 hex
    digits) is not one either. The sweep's and the watcher's reading
    (:func:`written_here`) agree: such a lock is a running refill."""
    old = r.lock(KEY, timeout=30)  # redis-py's Lock: SET NX PX with a uuid token
    assert old.acquire(blocking=False)
    token = r.get(KEY)
    assert token is not None and b"@" not in token
    lock = RefillLock(r, KEY, 10_000)
    assert not lock.acquire() and lock.holder == token.decode()
    assert r.get(KEY) == token and written_here(token, _replid(r))
    old.release()  # redis-py's own compare-and-delete still finds its token
    assert lock.acquire()
    lock.release()
    for value in (b"c3@", b"c3@replica-1", b"c3@" + b"g" * 40, b"c3@" + b"0" * 39, b"plain"):
        r.set(KEY, value, px=30_000)
        assert _acquire(r, "d4") == (0, value), value
        assert written_here(value, _replid(r)), value
        beat = BeatLock(r, BEAT, 60, identity="host-c")
        r.set(BEAT, value, px=30_000)
        assert not beat.acquire() and r.get(BEAT) == value, value
    assert not written_here(b"c3@" + b"0" * 40, _replid(r))  # a former master's, as before
