"""Power loss on a single Redis node (issue 11, case c): which fsync policy keeps G1.

A process crash loses nothing under either policy (the kernel keeps what Redis wrote), so
test_crash.py cannot tell ``appendfsync everysec`` from ``always``. A power loss can: here
Redis's data directory is on LazyFS (tests/support/lazyfs.py), which drops every byte not yet
fsynced. The power loss is faithful and deterministic:

1. fill a pool (the refiller's fenced writes) and wait until the file system reports
   nothing unsynced: the pool is on the "disk";
2. one ``LPOP key 10`` (what ``Client.next_ids`` sends), acknowledged to the client;
3. SIGSTOP redis-server (every thread, its background fsync thread included, so nothing
   more reaches the disk), drop everything not fsynced, then SIGKILL it;
4. restart redis-server on the same directory and pop again.

Under ``everysec`` the pop's AOF record waits for the once-a-second background fsync (or
is not even written while an fsync is in progress: Redis postpones the write up to two
seconds and replies all the same). The hazard's precondition is read from the "disk" (the
backing directory holds exactly what was fsynced): the AOF there did not grow between the
pop and the power loss. If Redis's per-second fsync ran in the few milliseconds between
the reply and the SIGSTOP, the round proves nothing and is repeated on fresh directories
(at most three rounds; the pop follows a fresh fsync by milliseconds, so one round is the
rule: 30 of 30 in a row showed the hazard when this test was written).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from leafpool.redis.lock import RefillLock
from leafpool.redis.pool import Pool, Range
from tests.support import services
from tests.support.lazyfs import FileState, LazyFS

pytestmark = pytest.mark.slow

TAG = "order"
POOL = Range(1, 1001)
POP = 10


@pytest.fixture(autouse=True)
def _fuse() -> None:
    """Skip when FUSE cannot be used here (fail under CI=true, which must provide it)."""
    services.require_fuse()


@dataclass
class Outcome:
    popped: list[int]  # acknowledged to the client before the power loss
    durable_before: int  # AOF bytes on the "disk" when the pop was sent
    durable_after: int  # AOF bytes on the "disk" after the power loss
    lost: list[FileState]  # what the power loss dropped (files, size before, durable size)
    after: list[int]  # the same pop after the restart

    def pop_reached_disk(self) -> bool:
        """The pop is the only write after the pool was fsynced: the AOF on the disk
        grew if and only if its record was fsynced before the power went."""
        return self.durable_after > self.durable_before


@contextmanager
def redis_on(directory: Path, extra_args: list[str]) -> Iterator[services.Server]:
    """The shipped ops/redis/redis.conf with its data directory on ``directory``."""
    server = services.redis_server(extra_args=["--dir", str(directory), *extra_args])
    try:
        yield server
    finally:
        server.kill()  # before the file system goes: nothing may hold the mount
        server.stop()  # its own directory (config, log) goes too


def fill(pool: Pool) -> None:
    """Put POOL into the tag's ready list the way a refiller does (fenced writes)."""
    lock = RefillLock(pool.redis, pool.tag(TAG).lock, 10_000)
    assert lock.acquire()
    pool.register(TAG, "segment", 0)
    pool.append_reserve(TAG, lock.token, POOL)
    assert pool.push(TAG, lock.token, POOL, POOL.size, 0) == POOL.size
    lock.release()


def all_threads_stopped(pid: int) -> bool:
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/stat") as stat:
            if stat.read().rsplit(")", 1)[1].split()[0] not in ("T", "t"):
                return False
    return True


def durable_aof_bytes(fs: LazyFS) -> int:
    """The AOF on the "disk": the backing directory holds exactly what was fsynced."""
    return sum(f.stat().st_size for f in (fs.backing / "appendonlydir").glob("*.incr.aof"))


def power_loss(server: services.Server, fs: LazyFS) -> list[FileState]:
    """Freeze redis-server (nothing more reaches the disk), drop what is not fsynced,
    and kill it: what survives is what was fsynced before the freeze."""
    assert server.proc is not None
    pid = server.proc.pid
    os.kill(pid, signal.SIGSTOP)
    services.wait_until(lambda: all_threads_stopped(pid), 5, "redis-server stopped",
                        interval=0.001)
    lost = fs.drop_unsynced()
    server.kill()
    return lost


def pops_through_a_power_loss(tmp: Path, appendfsync: str | None) -> Outcome:
    extra = ["--appendfsync", appendfsync] if appendfsync else []
    with LazyFS(tmp / "disk", tmp / "mnt") as fs, redis_on(fs.mountpoint, extra) as server:
        pool = Pool(redis.Redis(port=server.port))
        fill(pool)
        services.wait_until(lambda: not fs.unsynced(), 10, "the filled pool fsynced",
                            interval=0.002)
        durable_before = durable_aof_bytes(fs)
        popped = pool.pop_many(TAG, POP)
        assert popped == list(range(1, POP + 1))
        lost = power_loss(server, fs)
        durable_after = durable_aof_bytes(fs)
        server.start()
        after = Pool(redis.Redis(port=server.port)).pop_many(TAG, POP)
        return Outcome(popped, durable_before, durable_after, lost, after)

def test_everysec_hands_acknowledged_ids_out_again_after_a_power_loss(tmp_path: Path) -> None:
    """The hazard is real: under ``appendfsync everysec`` a pop acknowledged to the client
    is undone by a power loss, and the next pop hands the same IDs out again."""
    for attempt in range(3):
        outcome = pops_through_a_power_loss(tmp_path / f"round{attempt}", "everysec")
        if not outcome.pop_reached_disk():
            break
    else:
        pytest.fail("in 3 rounds the pop reached the disk before the power loss (Redis's "
                    "per-second fsync ran between the reply and the SIGSTOP every time)")
    assert outcome.after == outcome.popped  # the same 10 IDs, handed out twice


def test_shipped_config_never_hands_an_acknowledged_id_out_again(tmp_path: Path) -> None:
    """ops/redis/redis.conf (``appendfsync always``): the pop is fsynced before Redis
    replies, so a power loss right after the reply finds nothing to drop in the AOF and
    the pool goes on after the popped IDs."""
    outcome = pops_through_a_power_loss(tmp_path, None)
    assert outcome.pop_reached_disk()
    assert [s for s in outcome.lost if "appendonlydir" in s.path] == []
    assert not set(outcome.after) & set(outcome.popped)
    assert outcome.after == list(range(POP + 1, 2 * POP + 1))
