"""Power loss on a replicated master (issue 11, case c, replicated): the master's machine
loses power and comes back before Sentinel acts, and its replica follows it.

Replica-acknowledged pops (``LEAFPOOL_POP_REPLICAS=1``) do not cover this case by
themselves. The replica acknowledged the pop (it holds it in memory), but the master
restarts at once as master, from its own AOF, before any failover could promote the
replica; the replica then resynchronises from the restarted master (a new replication
history: a full resync) and throws its copy of the pop away. What the master's AOF lost,
the whole group lost. So the master's fsync policy decides, as on a single node
(test_durability.py):

* ``appendfsync everysec``: the acknowledged pop was not yet fsynced; the restarted
  master serves those IDs again, the replica follows it, and the next pops hand the same
  IDs out a second time, through the same client, acknowledged by the same replica;
* the shipped ``ops/redis/redis.conf`` (``appendfsync always``): the pop was fsynced
  before Redis replied; nothing comes back.

The scenario, deterministic as in test_durability.py:

1. a master whose data directory is a LazyFS mount (tests/support/lazyfs.py), one replica in a
   throwaway directory; the pool filled, in sync on the replica, and fsynced on the
   master (the file system reports nothing unsynced);
2. one ``next_ids(tag, 10)`` of a client with ``pop_replicas="1"``: ``LPOP`` and ``WAIT
   1`` in one round trip, the IDs handed out once the replica has them;
3. the power loss: SIGSTOP the master until every thread of it is stopped (its
   background fsync thread too: nothing more reaches the disk), drop what was not
   fsynced, SIGKILL; the replica, alive, still holds the pop (read from it then);
4. the master restarted at once on the same port and directory, as master (no Sentinel);
   bounded polling until the replica's link is up, it follows the restarted master's
   replication ID and has its offset;
5. ``next_ids(tag, 10)`` again on the same client.

Whether the pop reached the disk is read from the backing directory (the "disk": it
holds exactly what was fsynced). Under everysec, if Redis's once-a-second fsync ran in the
instant between the reply and the SIGSTOP, the round proves nothing and is repeated on
fresh directories and processes (at most ``ROUNDS`` rounds; 20 of 20 rounds in a row
showed the hazard when this test was written, each replica resync a full one).
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from leafpool.client import Client
from leafpool.core.config import load_settings
from leafpool.redis.lock import RefillLock
from leafpool.redis.pool import Pool, Range
from tests.support import services
from tests.support import topologies as t
from tests.support.lazyfs import FileState, LazyFS
from tests.support.servers import NotInstalled

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

TAG = "order"
POOL = Range(1, 1001)
POP = 10
ROUNDS = 3


@pytest.fixture(autouse=True)
def _requirements() -> None:
    """Skip when FUSE or redis-server cannot be used here (fail under CI=true)."""
    services.require_fuse()
    if shutil.which("redis-server") is None:
        services.missing("redis-server")


# -- the topology: a master on the "disk", restartable there, and its replica -------------

class MasterOnDisk(t.Replicated):
    """A master whose data directory (``--dir``) is ``disk``, and one replica of it in a
    throwaway directory. The master's own directory (its config copy and log) is a
    throwaway one too; only its data lives on ``disk``, so :meth:`restart_master` finds
    there what survived."""

    def __init__(self, disk: Path, appendfsync: str | None) -> None:
        super().__init__()
        self.disk = disk
        self.appendfsync = appendfsync

    def _master_argv(self, port: int, home: Path) -> list[str]:
        binary = shutil.which("redis-server")
        if binary is None:
            raise NotInstalled("redis-server")
        own = home / "redis.conf"  # a copy: the shipped file is never rewritten
        shutil.copyfile(t.REDIS_CONF, own)
        argv = [binary, str(own), "--port", str(port), "--bind", t.HOST,
                "--dir", str(self.disk), "--daemonize", "no", "--save", "",
                "--logfile", "", "--repl-diskless-sync-delay", "0"]
        return argv + (["--appendfsync", self.appendfsync] if self.appendfsync else [])

    def start(self, timeout: float = 30.0) -> None:
        self.master = self._start("data", "redis-master", self._master_argv)
        self.data.append(self.master)
        self._start_data(self.master, None, None, [])  # the shipped config
        self.wait_synced(timeout)

    @property
    def replica(self) -> t.Node:
        return self.replicas[0]

    def restart_master(self) -> None:
        """The same process again (same port, same ``--dir``), as master: no failover."""
        assert not self.master.alive()
        self.master.server.start()


def master_on(disk: Path, appendfsync: str | None) -> MasterOnDisk:
    top = MasterOnDisk(disk, appendfsync)
    try:
        top.start()
    except BaseException:
        top.stop()
        raise
    return top


def until(top: t.Topology, check: Callable[[], str | None], timeout: float, what: str) -> None:
    """Bounded polling: ``check`` says what is missing (None once reached; an exception
    counts as not yet). The timeout names the last state seen and the logs."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            missing = check()
        except Exception as exc:  # a node still starting or loading
            missing = f"{type(exc).__name__}: {exc}"
        if missing is None:
            return
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what} not reached after {timeout}s: {missing}\n{top.logs()}")
        time.sleep(0.01)


def wait_resynced(top: MasterOnDisk, timeout: float = 30.0) -> None:
    """The replica follows the restarted master: link up, the master's replication ID,
    its offset; and the master counts it online (a WAIT can be answered)."""

    def check() -> str | None:
        m, r = top.master.info(), top.replica.info()
        if r["master_link_status"] != "up":
            return f"replica link {r['master_link_status']}"
        if r["master_replid"] != m["master_replid"]:
            return f"replica on replid {r['master_replid']}, master {m['master_replid']}"
        if int(r["slave_repl_offset"]) < int(m["master_repl_offset"]):
            return f"replica offset {r['slave_repl_offset']} < {m['master_repl_offset']}"
        state = m.get("slave0", {}).get("state") if int(m["connected_slaves"]) else None
        return None if state == "online" else f"master sees its replica {state}"

    until(top, check, timeout, "replica resynced from the restarted master")


# -- the power loss ------------------------------------------------------------------------

def all_threads_stopped(pid: int) -> bool:
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/stat") as stat:
            if stat.read().rsplit(")", 1)[1].split()[0] not in ("T", "t"):
                return False
    return True


def power_loss(top: MasterOnDisk, fs: LazyFS) -> list[FileState]:
    """Freeze the master (nothing more reaches the disk), drop what is not fsynced, kill
    it: what survives is what was fsynced before the freeze."""
    pid = top.master.pid
    os.kill(pid, signal.SIGSTOP)
    until(top, lambda: None if all_threads_stopped(pid) else "running", 5,
          "every master thread stopped")
    lost = fs.drop_unsynced()
    top.master.kill()
    return lost


def durable_aof_bytes(fs: LazyFS) -> int:
    """The AOF on the "disk": the backing directory holds exactly what was fsynced."""
    return sum(f.stat().st_size for f in (fs.backing / "appendonlydir").glob("*.incr.aof"))


# -- one round -----------------------------------------------------------------------------

@dataclass
class Outcome:
    popped: list[int]  # handed out (acknowledged by the replica) before the power loss
    replica_before: list[int]  # the replica's list head after the power loss, master dead
    durable_before: int  # the master's AOF bytes on the "disk" when the pop was sent
    durable_after: int  # and after the power loss
    lost: list[FileState]  # what the power loss dropped
    master_after: list[int]  # the restarted master's list head
    replica_after: list[int]  # the replica's list head once resynced from it
    after: list[int]  # the same client's next pop

    def pop_reached_disk(self) -> bool:
        """The pop is the only write after the pool was fsynced: the AOF on the disk grew
        if and only if its record was fsynced before the power went."""
        return self.durable_after > self.durable_before


def fill(master: t.Node) -> None:
    """POOL in the tag's ready list, the way a refiller puts it there (fenced writes)."""
    with master.client() as r:
        pool = Pool(r)
        lock = RefillLock(r, pool.tag(TAG).lock, 10_000)
        assert lock.acquire()
        pool.register(TAG, "segment", 0)
        pool.append_reserve(TAG, lock.token, POOL)
        assert pool.push(TAG, lock.token, POOL, POOL.size, 0) == POOL.size
        lock.release()


def head(node: t.Node) -> list[int]:
    """The first POP IDs of the tag's ready list on ``node``."""
    with node.client() as r:
        return [int(v) for v in r.lrange(Pool(r).tag(TAG).ids, 0, POP - 1)]


def pops_through_a_power_loss(tmp: Path, appendfsync: str | None) -> Outcome:
    with LazyFS(tmp / "disk", tmp / "mnt") as fs, \
            master_on(fs.mountpoint, appendfsync) as top:
        fill(top.master)
        top.wait_synced()
        client = Client(settings=load_settings(
            redis_url=top.master.url, pop_replicas="1", pop_wait_ms=5000,
            empty_wait_seconds=5))
        try:
            until(top, lambda: None if not fs.unsynced() else "unsynced data", 10,
                  "the filled pool fsynced on the master")
            durable_before = durable_aof_bytes(fs)
            popped = client.next_ids(TAG, POP)  # LPOP + WAIT 1: the replica has them
            lost = power_loss(top, fs)
            durable_after = durable_aof_bytes(fs)
            replica_before = head(top.replica)
            top.restart_master()
            wait_resynced(top)
            master_after, replica_after = head(top.master), head(top.replica)
            after = client.next_ids(TAG, POP)
        finally:
            client.close()
        return Outcome(popped, replica_before, durable_before, durable_after, lost,
                       master_after, replica_after, after)


FIRST = list(range(1, POP + 1))
NEXT = list(range(POP + 1, 2 * POP + 1))


def test_everysec_master_hands_replica_acknowledged_ids_out_again(tmp_path: Path) -> None:
    """The hazard is real even with replica acknowledgement: under ``appendfsync
    everysec`` on the master, a pop the replica acknowledged is undone by the master's
    power loss, the replica follows the restarted master, and the same IDs are handed out
    again."""
    for attempt in range(ROUNDS):
        outcome = pops_through_a_power_loss(tmp_path / f"round{attempt}", "everysec")
        if not outcome.pop_reached_disk():
            break
    else:
        pytest.fail(f"in {ROUNDS} rounds the pop reached the master's disk before the power "
                    "loss (Redis's per-second fsync ran between the reply and the SIGSTOP "
                    "every time)")
    assert outcome.popped == FIRST
    assert outcome.replica_before == [x + POP for x in FIRST], "the replica had the pop"
    assert any("appendonlydir" in s.path for s in outcome.lost), outcome.lost
    assert outcome.master_after == FIRST, "the restarted master lacks the pop"
    assert outcome.replica_after == FIRST, "the replica lost it in the resync"
    assert outcome.after == outcome.popped  # the same 10 IDs, handed out twice


def test_shipped_config_master_never_hands_an_id_out_again(tmp_path: Path) -> None:
    """ops/redis/redis.conf (``appendfsync always``) on the master: the pop is fsynced
    before the master replies (before the replica is even sent it), so its power loss
    drops nothing of the AOF, the replica resyncs to the same state, and the pool goes on
    after the popped IDs."""
    outcome = pops_through_a_power_loss(tmp_path, None)
    assert outcome.popped == FIRST
    assert not set(outcome.after) & set(outcome.popped), "an ID was handed out twice"
    assert outcome.after == NEXT
    assert outcome.pop_reached_disk()
    assert [s for s in outcome.lost if "appendonlydir" in s.path] == []
    assert outcome.replica_before == NEXT
    assert outcome.master_after == NEXT
    assert outcome.replica_after == NEXT
