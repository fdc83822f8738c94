"""The seeded nemesis (tests/support/nemesis.py; issue 28 item 1, issue 33 item 4): a short
combined-fault run against real processes on loopback, and the checker
(tests/support/nemesis_checker.py) on hand-written histories, so that each of its checks
can be seen to fail.

The run: Redis master + 2 replicas + 3 sentinels (shipped redis.conf and sentinel.conf
timings), MariaDB, two Celery workers and a beat, four client processes (two ``wait``, two
``reserve``) with ``LEAFPOOL_POP_REPLICAS=all``; a fixed seed's schedule of faults every
4-8 s for 45 s (workers, beat, the Redis master and replicas, MariaDB, killed or paused),
then at least 20 s healed. Asserted: no ID handed out twice, no segment ID out of the
calls' real-time order, each snowflake worker's IDs in order, every tag serving again
after the heal. Availability is printed, not asserted (issue 28 item 2 is about it)."""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path

import pytest
from rich.console import Console

from tests.support import services
from tests.support.nemesis import RunConfig, run
from tests.support.nemesis_checker import (
    check,
    check_run,
    duplicates,
    inversions,
    pauses,
    snowflake_inversions,
)
from tests.support.nemesis_faults import CLOCK_KINDS, KINDS, FaultSpec, Nemesis, schedule
from tests.support.nemesis_history import (
    EVENTS,
    HISTORY,
    META,
    Call,
    Event,
    EventLog,
    LineWriter,
    call_record,
    read_events,
    write_json,
)
from tests.support.nemesis_links import Fence, Link, fence_unusable
from tests.support.nemesis_procs import (
    CommandProcess,
    Managed,
    SentinelProcess,
    Supervisor,
    faketime_library,
)
from tests.support.nemesis_report import cause, print_report
from tests.support.servers import NotInstalled
from tests.support.topologies import Node, sentinel_group, shipped_sentinel_debug

T0 = 1_700_000_000.0
SEED = 3  # 8 faults of 8 kinds (a beat paused among them): the master paused 7.5 s, killed 4.4 s


def _call(start: float, end: float, *ids: int, tag: str = "t", client: str = "c",
          err: str | None = None) -> Call:
    return Call(client, T0 + start, T0 + end, tag, "ids", max(len(ids), 1), ids, err)


def _sf(ms: int, worker: int, seq: int = 0) -> int:
    return ms << 22 | worker << 12 | seq


# -- the checker on hand-written histories ---------------------------------------------

def test_an_id_handed_out_twice_is_a_duplicate() -> None:
    calls = [_call(0, 1, 1, 2), _call(2, 3, 3, 4), _call(4, 5, 4, 5)]
    assert duplicates(calls) == (1, [4])
    assert duplicates(calls[:2]) == (0, [])


def test_a_call_that_began_after_another_ended_must_get_larger_ids() -> None:
    ordered = [_call(0, 1, 1, 2), _call(2, 3, 3), _call(4, 5, 4, 5)]
    assert inversions(ordered) == (0, [])
    late = [_call(0, 1, 5, 6), _call(2, 3, 3, 4)]  # began after 5-6 was handed out
    count, examples = inversions(late)
    assert count == 1 and "got 3 after" in examples[0]
    # overlapping calls may get their IDs in either order: no real-time order between them
    assert inversions([_call(0, 2, 5), _call(1, 3, 3)]) == (0, [])
    # only the calls that ended before one began count: 3 overlaps the call that got 5
    assert inversions([_call(0, 1, 1), _call(0.5, 3, 5), _call(1.5, 4, 3)])[0] == 0
    # ... and the largest ID among them, not the last one's to end (5, not 9)
    assert inversions([_call(0, 1, 9), _call(0.5, 3, 5), _call(3.5, 4, 8)])[0] == 1
    assert inversions([_call(0, 1, 3, 2)])[0] == 1  # out of order within the call


def test_snowflake_ids_must_increase_per_worker_not_across_workers() -> None:
    interleaved = [_call(0, 1, _sf(10, 1), _sf(5, 2)), _call(2, 3, _sf(11, 1), _sf(6, 2))]
    count, _, per_worker = snowflake_inversions(interleaved)
    assert count == 0 and per_worker == {1: 2, 2: 2}
    back = [_call(0, 1, _sf(10, 1), _sf(5, 2)), _call(2, 3, _sf(9, 1), _sf(6, 2))]
    count, examples, _ = snowflake_inversions(back)
    assert count == 1 and examples[0].startswith("worker 1:")


def test_a_pause_is_reported_with_the_fault_in_progress_and_the_master_outage_left_out(
) -> None:
    calls = [_call(s, s + 0.1, s + 1) for s in range(30) if not 10 <= s < 20]
    calls.append(_call(12, 14, err="BackendUnavailable"))
    events = [Event(T0, "phase", {"phase": "faults"}),
              Event(T0 + 10.5, "fault-start", {"id": 1, "kind": "master-kill",
                                               "target": "redis-1"}),
              Event(T0 + 16, "sentinel", {"type": "+switch-master"}),
              Event(T0 + 18, "fault-end", {"id": 1}),
              Event(T0 + 25, "phase", {"phase": "heal"}),
              Event(T0 + 30, "phase", {"phase": "end"})]
    report = check(calls, events, {"t": "segment"})
    tag = report.tag("t")
    assert [(round(report.rel(p.start), 1), round(p.length, 1)) for p in tag.pauses] == \
        [(9.1, 11.0)]
    pause = tag.pauses[0]
    assert [f.what for f in pause.faults] == ["master-kill redis-1"]
    assert pause.failovers == [T0 + 16] and pause.errors == Counter(BackendUnavailable=1)
    assert pause.asked == 2  # the failing call and the one that ended the pause
    assert pause.outlived_s == pytest.approx(2.1)
    assert "outlived the faults by 2.1 s" in cause(report, pause)
    # 30 windows, 10 without a serve; the master was down 10.5-16 (the failover ended
    # it, not the restart at 18): windows 10 to 15 are left out
    assert (tag.windows, tag.served_windows) == (30, 20)
    assert (tag.kept_windows, tag.served_kept_windows) == (24, 20)
    assert tag.after_heal_s == pytest.approx(0.1)


def test_availability_is_told_apart_by_the_clients_empty_pool_policy() -> None:
    """Issue 32 item 5: what ``wait`` clients saw of a tag against ``reserve`` clients; a
    client whose name has no policy counts for the tag only."""
    calls = [_call(s, s + 0.1, 2 * s + 1, client="client-0-reserve") for s in range(20)]
    calls += [_call(s + 0.5, s + 0.6, 2 * s + 2, client="client-1-wait") for s in range(5)]
    calls += [_call(s + 0.5, s + 0.6, err="PoolEmpty", client="client-1-wait")
              for s in range(5, 20)]
    calls += [_call(0.2, 0.3, 100, client="http")]
    events = [Event(T0, "phase", {"phase": "faults"}), Event(T0 + 20, "phase", {"phase": "end"})]
    tag = check(calls, events, {"t": "segment"}).tag("t")
    assert tag.by_policy == {"reserve": (20, 20), "wait": (20, 5)}
    assert tag.availability_of("wait") == 0.25 and tag.availability_of("reserve") == 1.0
    assert tag.availability_of("raise") is None


def test_a_tag_that_stops_for_good_is_still_paused_at_the_end() -> None:
    found = pauses("t", [T0 + s for s in range(10)], T0, T0 + 30, threshold=5.0)
    assert len(found) == 1 and found[0].open_end and found[0].length == pytest.approx(21)


def test_the_run_files_round_trip_and_gaps_are_accounted(tmp_path: Path) -> None:
    """What the client processes and the nemesis write is what the checker reads; a last
    line cut short by a kill is skipped; a gap a client could not count (and logged) is
    accounted for."""
    writer = LineWriter(tmp_path / HISTORY / "client-0.jsonl")
    writer.write(call_record(T0, T0 + 0.1, "t", "ids", 2, [1, 2], None))
    writer.write(call_record(T0 + 1, T0 + 1.1, "t", "id", 1, [], "PoolEmpty", "empty"))
    writer.write(call_record(T0 + 2, T0 + 2.1, "t", "ids", 3, [3, 4], "PoolEmpty", "x"))
    writer.close()
    with open(tmp_path / HISTORY / "client-0.jsonl", "a") as fh:
        fh.write('{"s": 1')  # cut short
    events = EventLog(tmp_path / EVENTS)
    events.log("phase", t=T0, phase="faults")
    events.log("phase", t=T0 + 3, phase="end")
    events.close()
    write_json(tmp_path / META, {"tags": {"t": "segment"}, "config": {"seed": 7}})
    write_json(tmp_path / "accounting.json",
               {"t": {"pushed_total": 10, "gaps": 3, "ready": 2, "unacked_ids": 0}})
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "client-0-wait.log").write_text(
        "t: gap of 1 ID(s) not counted: redis: t: count: No master found for 'leafpool'\n")
    report = check_run(tmp_path)
    tag = report.tag("t")
    assert (report.seed, tag.calls, tag.failed, tag.handed_out) == (7, 3, 2, 4)
    assert tag.accounting["uncounted"] == 1
    assert tag.balance == 10 - (4 + 3 + 1 + 2) == 0  # every ID pushed accounted for
    assert report.errors == {"client-0": Counter(PoolEmpty=2)}


def test_the_same_seed_gives_the_same_schedule_and_every_kind_comes_once_first() -> None:
    kinds = list(KINDS.values())
    first = schedule(5, 300.0, kinds)
    assert first == schedule(5, 300.0, kinds)
    assert first != schedule(6, 300.0, kinds)
    assert {s.kind for s in first[:len(kinds)]} == set(KINDS)  # one deck dealt whole
    gaps = [b.at - a.at for a, b in pairwise(first)]
    assert all(6.0 <= g <= 12.0 for g in gaps) and first[-1].at < 300.0
    for spec in first:
        low, high = KINDS[spec.kind].duration_s
        assert low <= spec.duration_s <= high


class FakeProcess(Managed):
    """A process of the nemesis's bookkeeping only (no process behind it)."""

    def __init__(self, name: str, role: str) -> None:
        super().__init__(name, role)
        self.up, self.stopped = True, False
        self.log: list[str] = []

    def alive(self) -> bool:
        return self.up

    def pid(self) -> int | None:
        return None

    def kill(self) -> None:
        self.up = False
        self.log.append("kill")

    def pause(self) -> None:
        self.stopped = True
        self.log.append("pause")

    def resume(self) -> None:
        self.stopped = False
        self.log.append("resume")

    def start(self) -> None:
        self.up = True
        self.log.append("start")

    def stop(self) -> None:
        self.up = False


class FakeTargets:
    def __init__(self, *procs: FakeProcess) -> None:
        self.procs = procs

    def candidates(self, role: str) -> list[Managed]:
        return [p for p in self.procs if p.role == role and p.alive()]


def test_a_killed_process_is_held_down_then_restarted_and_its_fault_ends_at_the_restart(
    tmp_path: Path,
) -> None:
    """Driven by explicit clock readings: the kill holds the worker down for the fault's
    duration, the supervisor restarts it after its own delay, the fault ends then; a
    process that exits by itself is restarted too, and said so; a fault whose every
    target is busy is skipped."""
    w1, w2 = FakeProcess("worker-1", "worker"), FakeProcess("worker-2", "worker")
    events = EventLog(tmp_path / EVENTS)
    supervisor = Supervisor([w1, w2], events, random.Random(1), delay_s=(1.0, 1.0))
    specs = [FaultSpec(1.0, "worker-kill", 4.0, 0), FaultSpec(2.0, "worker-pause", 3.0, 0),
             FaultSpec(3.0, "worker-pause", 3.0, 0)]
    nemesis = Nemesis(specs, KINDS, FakeTargets(w1, w2), supervisor, events, started=0.0)
    supervisor.on_restart = nemesis.on_restart
    for now in (0.5, 1.0, 2.0, 3.0, 4.9):
        nemesis.tick(now)
        supervisor.tick(now)
    assert w1.log == ["kill"] and not w1.alive()  # held for 4 s from 1.0
    assert w2.log == ["pause"]  # the second fault; the third found no worker free
    for now in (5.0, 5.5, 6.0, 6.1):
        nemesis.tick(now)
        supervisor.tick(now)
    assert w1.log == ["kill", "start"] and w2.log == ["pause", "resume"]
    assert nemesis.open == {}
    w2.up = False  # exits by itself (a Celery worker on a broker failover)
    for now in (7.0, 8.0):
        supervisor.tick(now)
    events.close()
    evs = read_events(tmp_path)
    assert [(e.ev, e.get("proc") or e.get("target") or e.get("kind")) for e in evs] == [
        ("fault-start", "worker-1"), ("exited", "worker-1"), ("fault-start", "worker-2"),
        ("skip", "worker-pause"), ("fault-end", "worker-2"), ("restart", "worker-1"),
        ("fault-end", "worker-1"), ("exited", "worker-2"), ("restart", "worker-2")]
    assert [e.get("by") for e in evs if e.ev == "exited"] == ["fault", "itself"]


def test_a_worker_clock_set_back_runs_behind_until_the_heal_restarts_it_right(
    tmp_path: Path,
) -> None:
    """worker-clock-back: the worker is killed and started again at once with its wall
    clock 5 s behind (libfaketime), and at the heal killed and started with the machine's
    clock; the fault ends at that restart."""
    try:
        faketime_library()
    except FileNotFoundError as exc:
        services.missing(str(exc))
    clock = ("import time, sys\n"
             "while True:\n"
             "    print(f'CLOCK {time.time() - float(sys.argv[1]):+.1f}', flush=True)\n"
             "    time.sleep(0.05)\n")
    started = time.time()
    worker = CommandProcess("worker-1", "worker", [sys.executable, "-c", clock, str(started)],
                            dict(os.environ), tmp_path / "worker.log")
    events = EventLog(tmp_path / EVENTS)
    supervisor = Supervisor([worker], events, random.Random(1), delay_s=(0.0, 0.0))
    nemesis = Nemesis([FaultSpec(0.0, "worker-clock-back", 2.0, 0)], CLOCK_KINDS,
                      FakeTargets(worker), supervisor, events, started=time.monotonic())
    supervisor.on_restart = nemesis.on_restart

    seen: dict[int, float] = {}  # per process started: how far behind its last line was

    def behind() -> float | None:
        """How far behind the running process's clock is (None before its first line)."""
        lines = worker.proc.lines
        while not lines.empty():
            line = lines.get_nowait()
            if line.startswith("CLOCK"):
                seen[worker.starts] = time.time() - started - float(line.split()[1])
        return seen.get(worker.starts)

    def turn() -> None:
        nemesis.tick()
        supervisor.tick()
        supervisor.tick()  # (a restart due now happens on the second turn)

    try:
        services.wait_until(lambda: behind() is not None, 10, "the first line")
        assert (behind() or 0.0) < 1.0
        turn()
        services.wait_until(lambda: (turn(), (behind() or 0.0) > 4.0)[1], 10,
                            "the clock 5 s behind")
        assert worker.starts == 2 and nemesis.open  # the fault in progress
        services.wait_until(lambda: (turn(), not nemesis.open)[1], 15, "the fault healed")
        assert worker.starts == 3
        services.wait_until(lambda: behind() is not None, 10, "a line after the heal")
        assert (behind() or 0.0) < 1.0, "the clock still behind after the heal"
    finally:
        worker.stop()
        events.close()
    assert [e.ev for e in read_events(tmp_path) if e.ev != "exited"] == [
        "fault-start", "restart", "restart", "fault-end"]


def test_a_partitioned_link_holds_the_bytes_and_delivers_them_when_it_mends() -> None:
    """A link cut drops nothing: it holds what was sent either way (and a new connection)
    until it mends, as a network partition shorter than TCP's retransmission timeout."""
    server = socket.create_server(("127.0.0.1", 0))
    link = Link("db-link-1", "db-link", server.getsockname()[1])
    try:
        client = socket.create_connection(("127.0.0.1", link.port), timeout=5)
        upstream, _ = server.accept()
        upstream.settimeout(5)
        client.sendall(b"before")
        assert upstream.recv(100) == b"before"
        link.pause()
        assert link.partitioned
        client.sendall(b"during")
        upstream.settimeout(0.3)
        with pytest.raises(TimeoutError):
            upstream.recv(100)
        link.resume()
        upstream.settimeout(5)
        assert upstream.recv(100) == b"during"
        upstream.sendall(b"reply")
        assert client.recv(100) == b"reply"
        client.close()
        upstream.close()
    finally:
        link.stop()
        server.close()


_PING = """
import sys, redis
try:
    print(redis.Redis(port=int(sys.argv[1]), socket_connect_timeout=1, socket_timeout=1).ping())
except redis.RedisError as exc:
    print(type(exc).__name__)
"""


def _ping_as(argv_of: Callable[[list[str]], list[str]], port: int) -> str:
    """What a process started with ``argv_of(command)`` gets for a PING of ``port``."""
    command = argv_of([sys.executable, "-c", _PING, str(port)])
    done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    return done.stdout.strip() or done.stderr[-500:]


def test_a_fenced_process_reaches_no_redis_port_until_the_fence_lifts(
    redis_server: services.Server,
) -> None:
    """The Redis partition (``redis-partition``): while the fence is up, the process behind
    it (its group ID) cannot reach the node's port, its connect dropped until its timeout;
    other processes still can; once it lifts, the fenced one can again."""
    unusable = fence_unusable()
    if unusable is not None:
        services.unavailable(unusable)
    port = redis_server.port
    fence = Fence("redis-link-1", "redis-link", 61999, [port])
    try:
        assert _ping_as(fence.argv, port) == "True"
        fence.pause()
        assert fence.partitioned
        assert _ping_as(fence.argv, port) == "TimeoutError"
        assert _ping_as(list, port) == "True"  # only the fenced process is cut off
        fence.resume()
        assert _ping_as(fence.argv, port) == "True"
    finally:
        fence.stop()


def _periods(sentinel: Node) -> dict[str, int]:
    """A sentinel's periods in ms (``SENTINEL DEBUG`` without arguments), by lower-case
    name."""
    raw = sentinel.command("SENTINEL", "DEBUG")
    pairs = raw.items() if isinstance(raw, dict) else zip(raw[::2], raw[1::2], strict=True)
    return {(k.decode() if isinstance(k, bytes) else str(k)).lower(): int(v) for k, v in pairs}


def test_a_killed_sentinel_comes_back_with_the_periods_the_shipped_config_names() -> None:
    """``sentinel-kill``: the supervisor restarts a sentinel from the config file it
    rewrote (it still knows the master), and sets the ``SENTINEL DEBUG`` periods again, as
    compose does at each start: they are runtime knobs, lost with the process (a
    returning master would otherwise wait 8 s, not 2 s, to be made a replica)."""
    debug = shipped_sentinel_debug()
    group = sentinel_group(1, 3, debug=debug)
    try:
        sentinel = SentinelProcess(group.sentinels[1], debug)
        assert sentinel.role == "sentinel"
        sentinel.kill()
        assert not sentinel.alive()
        sentinel.start()
        assert sentinel.alive() and sentinel.starts == 2
        periods = _periods(sentinel.node)
        wanted = dict(zip(debug[::2], map(int, debug[1::2]), strict=True))
        assert {k: periods[k] for k in wanted} == wanted, periods
        assert group.master_addr(sentinel.node)[1] == group.master.port
    finally:
        group.stop()


# -- the run ---------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_seeded_combined_fault_run_repeats_nothing_and_every_tag_serves_after_the_heal(
    tmp_path: Path,
) -> None:
    cfg = RunConfig(seed=SEED, fault_s=45.0, heal_s=20.0, gap_s=(4.0, 8.0))
    run_dir = tmp_path / "run"
    try:
        run(cfg, run_dir)
    except NotInstalled as exc:
        services.missing(exc.what)
    report = check_run(run_dir)
    print_report(Console(width=200), report)
    assert sum(report.faults.values()) >= 6, "too few faults fired for the run to mean much"
    assert report.faults["master-kill"] + report.faults["master-pause"] >= 1
    for tag in report.tags:
        assert tag.handed_out > 1000, f"{tag.tag}: hardly any IDs handed out"
        assert tag.duplicates == 0, f"{tag.tag}: handed out twice: {tag.duplicate_examples}"
        assert tag.inversions == 0, f"{tag.tag}: out of order: {tag.inversion_examples}"
        assert tag.after_heal_s is not None, f"{tag.tag} never served again after the heal"
    if report.tag("sf").worker_ids:
        assert len(report.tag("sf").worker_ids) >= 1
    assert report.heal_timeout is None, report.heal_timeout
