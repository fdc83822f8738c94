"""Issue 34, item 2: two sentinel camps demoted each other's master and left the group with
no master for 18 s. In the nemesis run that showed it, one sentinel finished its own
failover (epoch 5) by timeout after the two others had started a newer one (epoch 6) and
promoted another node; each side then turned the other's master into a replica.

The precondition is a failover still running when a newer epoch starts. A failover, once
its leader has seen the promotion, runs until every replica is reconfigured or
failover-timeout passes; a newer failover of the node it promoted can start no sooner
than down-after after that node stopped answering. With the former failover-timeout of
10 s against down-after 5 s the two overlapped whenever the promoted node failed soon
after its promotion while a replica could not be reconfigured (paused, cut off). The
shipped failover-timeout is below down-after less an INFO period (ops/redis/sentinel.conf
says why), so the first failover has ended, by timeout if need be, before anyone may call
its master down: the two cannot overlap.

The first test makes exactly that sequence with the shipped timings and SENTINEL DEBUG
periods: a replica paused across a failover (its reconfiguration cannot finish), the
promoted master paused right after, and asserts that the first failover ended before the
newer one was tried. Against failover-timeout 10000 it fails: the first leader was still
reconfiguring when the newer epoch began. The second test makes a split's end state by
hand (the two live nodes replicating each other) and asserts a master is back within
Sentinel's own failover time: a switch resets each sentinel's failover delay, so the
group heals like after any master fault."""

from __future__ import annotations

import re
import time
from datetime import datetime

import pytest
import redis

from tests.support import topologies
from tests.support.nemesis_deploy import shipped_sentinel_timings
from tests.support.topologies import HOST, SentinelGroup, shipped_sentinel_debug

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

#: the election, the promotion and this test's polling, beyond down-after and INFO
SLACK_S = 5.0
EVENT = re.compile(r"^\d+:X (\d+ \w+ \d+ [\d:.]+) [#*] (\S+) (.*)$")


def _debug_period(name: str) -> float:
    args = shipped_sentinel_debug()
    return int(args[args.index(name) + 1]) / 1000


def _events(group: SentinelGroup) -> list[tuple[datetime, int, str, str]]:
    """Every sentinel's events, in time order: (time, sentinel port, event, rest)."""
    out = []
    for s in group.sentinels:
        for line in s.log.read_text().splitlines():
            m = EVENT.match(line)
            if m:
                when = datetime.strptime(m.group(1), "%d %b %Y %H:%M:%S.%f")
                out.append((when, s.port, m.group(2), m.group(3)))
    return sorted(out)


def _shipped_group() -> SentinelGroup:
    t = shipped_sentinel_timings()
    return topologies.sentinel_group(
        2, 3, down_after_ms=t.down_after_ms, failover_timeout_ms=t.failover_timeout_ms,
        parallel_syncs=t.parallel_syncs, debug=shipped_sentinel_debug())


def test_a_failover_that_cannot_reconfigure_a_replica_ends_before_a_newer_one_starts() -> None:
    """The first failover's leader cannot finish reconfiguring the other replica: that
    replica is paused while the leader sends it REPLICAOF, and the node it is to follow
    stops answering as soon as the sentinels agree on it (the replica then answers the
    sentinels, but its link to the new master stays down). That new master is failed over
    again down-after later, in a newer epoch."""
    group = _shipped_group()
    try:
        old = group.master
        late = group.live_replicas()[1]
        late.command("CONFIG", "SET", "replica-priority", "0")  # the first one promotes the other
        old.kill()

        def master_called_down() -> str | None:
            down = [e for e in _events(group) if e[2] == "+sdown" and e[3].startswith("master")]
            return None if down else "no +sdown of the master yet"

        topologies._wait(master_called_down, 30, "the master called down")
        late.pause()  # before the promotion: the leader's REPLICAOF waits in its socket
        promoted = group.wait_failover(old, timeout=60)
        promoted.pause()  # the new master stops answering at once
        late.resume()  # it follows the promoted node, which does not answer: not done
        late.command("CONFIG", "SET", "replica-priority", "100")
        group.master = late

        def newer_master() -> str | None:
            if late.role() == "master" and all(
                    group.master_addr(s)[1] == late.port for s in group.sentinels):
                return None
            return f":{late.port} is {late.role()}"

        topologies._wait(newer_master, 60, "the newer failover", interval=0.2)
        events = _events(group)
        promoted_at, leader = next((e[0], e[1]) for e in events if e[2] == "+promoted-slave")
        timeline = "\n".join(f"{e[0]:%H:%M:%S.%f} :{e[1]} {e[2]} {e[3]}" for e in events
                              if e[0] >= promoted_at)
        held = [e for e in events if e[2] in ("+slave-reconf-sent", "+slave-reconf-inprog")
                and e[3].startswith(f"slave 127.0.0.1:{late.port} ")]
        assert held, f"the late replica was never being reconfigured:\n{timeline}"
        first_end = next((e for e in events
                          if e[1] == leader and e[2].startswith("+failover-end")), None)
        newer = next(e for e in events if e[2] == "+try-failover" and e[0] > promoted_at)
        assert first_end is not None and first_end[0] < newer[0], (
            f"the failover that promoted :{promoted.port} was still running when a newer "
            f"one was tried at {newer[0]:%H:%M:%S.%f}:\n{timeline}")
    finally:
        group.stop()


def _master_back(group: SentinelGroup) -> str | None:
    """None once a quorum of sentinels names a node that answers ROLE master."""
    votes: dict[int, int] = {}
    try:
        for s in group.live_sentinels():
            port = group.master_addr(s)[1]
            votes[port] = votes.get(port, 0) + 1
        for port, n in votes.items():
            if n >= group.quorum and group.node_at((HOST, port)).role() == "master":
                return None
        roles = {n.port: n.role() for n in group.data if n.alive()}
    except redis.RedisError as exc:  # the node a sentinel names may be the dead one
        return f"sentinels name {votes}: {exc!r}"
    return f"sentinels name {votes}, roles {roles}"


def test_two_camps_demoting_each_others_master_cost_no_more_than_a_failover() -> None:
    t = shipped_sentinel_timings()
    info_s = _debug_period("info-period")
    group = _shipped_group()
    try:
        old = group.master
        old.kill()
        promoted = group.wait_failover(old, timeout=60)
        other = next(n for n in group.live_replicas() if n.port != promoted.port)
        # the split's end state: each camp made the other's master a replica
        other.command("REPLICAOF", HOST, str(promoted.port))
        promoted.command("REPLICAOF", HOST, str(other.port))
        split = time.monotonic()
        bound = t.down_after_ms / 1000 + 2 * info_s + SLACK_S
        last = ""
        while time.monotonic() - split < 60:
            state = _master_back(group)
            if state is None:
                break
            last = state
            time.sleep(0.1)
        took = time.monotonic() - split
        assert took <= bound, (
            f"no master for {took:.1f} s after the split (bound {bound:.1f} s: down-after "
            f"{t.down_after_ms} ms, INFO every {info_s:g} s, failover-timeout "
            f"{t.failover_timeout_ms} ms); last: {last}")
    finally:
        group.stop()
