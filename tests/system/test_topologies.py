"""Replicated Redis topologies on loopback (tests/support/topologies.py) and the hazard
they exist to show: replication is asynchronous, so a pop the master acknowledged can be
missing on the replica that gets promoted, and the promoted node hands that ID out again.
Plain redis-py here, no leafpool code: this is the ground the replica-acknowledged pops
stand on.

The hazard tests promote the replica by hand (``REPLICAOF NO ONE``, what Sentinel sends)
rather than through sentinels. Which replica gets promoted, and when, is then the test's
choice and not Sentinel's, whose selection may reject a replica that was unreachable
(SIGSTOPped) for a while. Either way the promoted node serves the data it had. The test
uses two processes on two cores instead of five, and Sentinel's own promotion is tested
separately below.

The replica lags through :func:`tests.support.topologies.stall`, not SIGSTOP alone: on loopback
the pop reaches a stopped replica's socket buffer and survives the master's SIGKILL. Run
with a bare SIGSTOP, the hazard test fails (the promoted replica pops 2, not 1).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import redis
from redis.sentinel import Sentinel

from leafpool.children import die_with_parent
from tests.support import servers, services
from tests.support import topologies as t

if TYPE_CHECKING:
    from tests.support.topology_fixtures import Topologies

pytest_plugins = ["tests.support.topology_fixtures"]

pytestmark = pytest.mark.timeout(60)

IDS = "leafpool:{t}:ids"
N = 2000


def _fill(top: t.Replicated) -> None:
    with top.master.client() as c:
        c.rpush(IDS, *range(1, N + 1))
    top.wait_synced()


# -- the topologies come up and behave --------------------------------------------------

def test_replicas_follow_the_master(topologies: Topologies) -> None:
    top = topologies.replicated(2)
    _fill(top)
    for replica in top.replicas:
        with replica.client() as c:
            assert c.lrange(IDS, 0, -1) == [str(i).encode() for i in range(1, N + 1)]
            with pytest.raises(redis.ReadOnlyError):
                c.lpop(IDS)


def test_sentinel_promotes_a_replica_when_the_master_is_killed(
        redis_sentinel_group: t.SentinelGroup) -> None:
    group = redis_sentinel_group
    old = group.master
    assert group.master_addr() == old.addr
    _fill(group)
    sentinel = Sentinel(group.sentinel_addrs, socket_timeout=2)  # type: ignore[no-untyped-call]
    client = sentinel.master_for(group.master_name,  # type: ignore[no-untyped-call]
                                 socket_timeout=2)
    assert client.lpop(IDS) == b"1"
    group.wait_synced()

    killed_at = time.monotonic()
    old.kill()
    new = group.wait_failover(old, timeout=30)
    print(f"sentinel failover after SIGKILL: {time.monotonic() - killed_at:.2f}s")

    assert new is not old and new in group.data and new.role() == "master"
    assert group.current_master() is new
    # the client follows by itself: it asks the sentinels again on a connection error
    popped = None
    for _ in range(100):
        try:
            popped = client.lpop(IDS)
            break
        except redis.ConnectionError:
            time.sleep(0.1)
    assert popped == b"2"
    [other] = group.live_replicas()
    group.wait_synced()
    assert other.info()["master_port"] == new.port
    with other.client() as c:
        assert c.lindex(IDS, 0) == b"3"


def test_sentinel_fails_over_a_paused_master_and_demotes_it_when_it_resumes(
        topologies: Topologies) -> None:
    group = topologies.sentinel_group(1, 3)
    old = group.master
    paused_at = time.monotonic()
    old.pause()
    with pytest.raises(redis.TimeoutError):
        old.client(socket_timeout=0.2).ping()
    new = group.wait_failover(old, timeout=20)
    print(f"sentinel failover after SIGSTOP: {time.monotonic() - paused_at:.2f}s")
    assert new is not old
    old.resume()
    # the sentinels reconfigure the old master as a replica of the new one once it has been
    # reporting itself master for a while (8 s, fixed in Sentinel)
    group.wait_synced(timeout=30)
    assert old.role() == "slave"
    assert old.info()["master_port"] == new.port


def _tags_per_master(c: t.Cluster) -> dict[int, int]:
    per_master = {}
    for m in c.masters():
        with m.client() as direct:
            per_master[m.port] = len(direct.keys("leafpool:*"))
    return per_master


def test_cluster_spreads_hash_tagged_keys_over_the_masters(redis_cluster: t.Cluster) -> None:
    keys = [f"leafpool:{{tag{n}}}:ids" for n in range(30)]
    with redis_cluster.client() as rc:
        for n, key in enumerate(keys):
            rc.rpush(key, n, n + 1000)
        per_master = _tags_per_master(redis_cluster)
        assert len(per_master) == 3
        assert all(count > 0 for count in per_master.values()), per_master
        assert sum(per_master.values()) == 30
        for n, key in enumerate(keys):
            assert rc.lrange(key, 0, -1) == [str(n).encode(), str(n + 1000).encode()]


def test_cluster_promotes_the_replica_of_a_killed_master(redis_cluster: t.Cluster) -> None:
    keys = [f"leafpool:{{tag{n}}}:ids" for n in range(30)]
    with redis_cluster.client() as rc:
        for n, key in enumerate(keys):
            rc.rpush(key, n)
            # a write acknowledged by the replica too: it survives the failover
            rc.execute_command("WAIT", 1, 5000, target_nodes=rc.get_node_from_key(key))
    victim = redis_cluster.masters()[0]
    replica = redis_cluster.replicas_of(victim)[0]
    killed_at = time.monotonic()
    redis_cluster.kill_master(victim)
    promoted = redis_cluster.wait_promotion(victim, timeout=30)
    print(f"cluster promotion after SIGKILL: {time.monotonic() - killed_at:.2f}s")
    assert promoted is replica
    assert victim.port not in {m.port for m in redis_cluster.masters()}
    with redis_cluster.client() as rc:
        for n, key in enumerate(keys):
            assert rc.lrange(key, 0, -1) == [str(n).encode()]


# -- the hazard --------------------------------------------------------------------------

def _crash_and_promote(top: t.Replicated, replica: t.Node) -> int:
    """SIGKILL the master, resume the stalled replica and promote it; returns the
    replication offset the replica had reached."""
    top.master.kill()
    replica.resume()
    top.promote(replica)
    # REPLICAOF NO ONE keeps the offset and starts a new history right after it
    return int(replica.info()["second_repl_offset"]) - 1


def test_hazard_an_acknowledged_pop_is_handed_out_again_after_failover(
        redis_replicated: t.Replicated) -> None:
    top = redis_replicated
    _fill(top)
    replica = top.replicas[0]
    stalled_at = top.stall(replica)

    with top.master.client() as c:
        assert c.lpop(IDS) == b"1"  # acknowledged: appendfsync always, on the master's disk
        popped_at = int(top.master.info()["master_repl_offset"])
    reached = _crash_and_promote(top, replica)
    assert reached <= stalled_at < popped_at

    with replica.client() as c:
        assert c.lpop(IDS) == b"1", "the promoted replica hands out the acknowledged ID again"


def test_wait_confirmed_pop_is_never_handed_out_again(redis_replicated: t.Replicated) -> None:
    """The recipe: LPOP and ``WAIT 1 ms`` in one round trip (a pipeline: inside MULTI, WAIT
    does not block, see below); the IDs are used only when WAIT says the replica has the
    pop."""
    top = redis_replicated
    _fill(top)
    replica = top.replicas[0]
    with top.master.client() as c:
        confirmed = c.pipeline(transaction=False).lpop(IDS).wait(1, 10_000).execute()
        assert confirmed == [b"1", 1]

        top.stall(replica)
        refused = c.pipeline(transaction=False).lpop(IDS).wait(1, 300).execute()
        assert refused == [b"2", 0], "WAIT must report the stalled replica did not confirm"
    _crash_and_promote(top, replica)

    with replica.client() as c:
        remaining = c.lrange(IDS, 0, -1)
    assert b"1" not in remaining, "a WAIT-confirmed pop was handed out again"
    # the refused ID comes back: a client that had used it would have handed it out twice
    assert remaining == [str(i).encode() for i in range(2, N + 1)]


def test_wait_inside_multi_does_not_wait(redis_replicated: t.Replicated) -> None:
    """Inside MULTI/EXEC, WAIT returns at once with the replicas that had acknowledged
    before the transaction: never the pop it contains, even with a healthy replica. The
    pop and its WAIT go in one pipeline, not one transaction."""
    top = redis_replicated
    _fill(top)
    with top.master.client() as c:
        assert c.pipeline(transaction=True).lpop(IDS).wait(1, 10_000).execute() == [b"1", 0]
        assert c.pipeline(transaction=False).lpop(IDS).wait(1, 10_000).execute() == [b"2", 1]


def test_a_port_taken_before_the_node_binds_it_is_replaced(
        topologies: Topologies, monkeypatch: pytest.MonkeyPatch) -> None:
    """free_port() only finds a port free at that moment: another process may take it before
    redis-server binds it. The node is started again on another port, and a port answered
    by someone else's Redis is not taken for the node."""
    with t.replicated(0) as squatter:
        ports = iter([squatter.master.port])
        real = servers.free_port
        monkeypatch.setattr("tests.support.topologies.free_port",
                            lambda: next(ports, None) or real())
        top = topologies.replicated(0)
        assert top.master.port != squatter.master.port
        assert int(top.master.info("server")["process_id"]) == top.master.pid
        assert "Address already in use" in (top.dirs[0] / "redis-master.log").read_text()


def test_missing_redis_skips_or_fails_under_ci(monkeypatch: pytest.MonkeyPatch,
                                               tmp_path: Path) -> None:
    from tests.support.topology_fixtures import Topologies  # loaded as a plugin by now

    monkeypatch.setenv("PATH", str(tmp_path))
    outcome = pytest.fail.Exception if services.IN_CI else pytest.skip.Exception
    with pytest.raises(outcome, match="redis-server is not installed"):
        Topologies().replicated(1)


def test_no_node_outlives_the_process_that_started_it() -> None:
    """SIGKILL of the starting process (no stop, no atexit) takes every node with it."""
    script = ("from tests.support import topologies as t\n"
              "top = t.sentinel_group(1, 1)\n"
              "print(*[n.pid for n in top.processes], flush=True)\n"
              "print(*top.dirs, flush=True)\n"
              "input()\n")
    with subprocess.Popen([sys.executable, "-c", script], cwd=servers.ROOT,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                          preexec_fn=die_with_parent(signal.SIGKILL)) as parent:
        assert parent.stdout is not None
        pids = [int(p) for p in parent.stdout.readline().split()]
        dirs = parent.stdout.readline().split()
        assert len(pids) == 3 and all(_running(pid) for pid in pids)
        parent.kill()
        parent.wait(timeout=10)
    try:
        servers.wait_until(lambda: not any(_running(pid) for pid in pids), 10,
                           "nodes gone with their parent")
    finally:
        for d in dirs:  # what the killed process had no chance to remove
            shutil.rmtree(d, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_cluster_promotion_is_found_after_it_happened(redis_cluster: t.Cluster) -> None:
    """wait_promotion needs no snapshot from kill_master: a paused master's replica is found
    once promoted, and again when asked after the failover is over."""
    victim = redis_cluster.masters()[1]
    replica = redis_cluster.replicas_of(victim)[0]
    victim.pause()
    assert redis_cluster.wait_promotion(victim, timeout=30) is replica
    assert redis_cluster.wait_promotion(victim, timeout=30) is replica
