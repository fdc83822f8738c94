"""Mode k8s with processes posing as StatefulSet pods (issue 20, item 3): HOSTNAME
``leafpool-snowflake-0..2``, LEAFPOOL_SNOWFLAKE_WORKER_OFFSET=100, a real ZooKeeper on
loopback, each pod its own LEAFPOOL_HOME (an emptyDir: no PersistentVolume).

- The worker IDs are 100, 101, 102.
- Pod 0 is SIGSTOPped (a node partitioned away, or force-deleted while still running);
  its replacement (same HOSTNAME) is refused while the lease is held, claims worker 100
  once it expired, and generates above everything pod 0 generated; pod 0, continued,
  generates nothing more (it is fenced) and is not ready, the replacement is.
- Pod 2 is restarted with its clock set back: a minute back is refused (nothing
  generated), a second back (a clean stop) waits for its clock to pass the mark.
- Every ID of every pod is unique.

Run with LEAFPOOL_TEST_UNSAFE_PODS=1 the pods have no lease check (tests/support/pod.py,
POD_UNSAFE): the SIGSTOP test then fails, pod 0 generating at the same time as its
replacement (and duplicates).
"""

from __future__ import annotations

import os
import queue
import signal
import sys
from array import array
from collections.abc import Iterator
from pathlib import Path

import pytest

from leafpool.core.snowflake_layout import LEAF_EPOCH_MS, decode, wall_clock_ms
from leafpool.snowflake.registry.ready import probe
from tests.support import services
from tests.support.processes import Proc, leafpool_env
from tests.support.zk_helpers import unique_name, wait_serving

OFFSET = 100
UNSAFE = os.environ.get("LEAFPOOL_TEST_UNSAFE_PODS") == "1"


class Pods:
    def __init__(self, tmp_path: Path, zk_hosts: str) -> None:
        self.tmp = tmp_path
        self.hosts = zk_hosts
        self.name = unique_name()
        self.procs: list[Proc] = []
        self.runs = 0

    def start(self, ordinal: int, **extra: str) -> tuple[Proc, Path]:
        """A pod (a new one each time: its own home, as a fresh emptyDir)."""
        self.runs += 1
        home = self.tmp / f"pod{ordinal}-run{self.runs}"
        out = home / "ids.bin"
        home.mkdir(parents=True)
        env = leafpool_env(
            home=home, snowflake_mode="k8s", zk_hosts=self.hosts, snowflake_name=self.name,
            snowflake_worker_offset=OFFSET, snowflake_lease_seconds=2,
            snowflake_renew_seconds=0.3, snowflake_random_sequence=0,
            # the window recorded ahead under a third of the lease, as the defaults (3 s of
            # 30 s): a replacement finds the former holder's mark passed (docs/design.md §8.1)
            snowflake_report_seconds=0.5,
            snowflake_cache_dir=home / "snowflake",
            raw={"HOSTNAME": f"leafpool-snowflake-{ordinal}", "POD_UNSAFE": "1" if UNSAFE else "0",
                 **extra})
        proc = Proc([sys.executable, "-m", "tests.support.pod", str(out)], env)
        self.procs.append(proc)
        return proc, out

    def stop_all(self) -> None:
        for proc in self.procs:
            if proc.alive():
                os.kill(proc.proc.pid, signal.SIGCONT)
            proc.stop()


@pytest.fixture
def pods(tmp_path: Path, zk_hosts: str) -> Iterator[Pods]:
    wait_serving(zk_hosts)
    p = Pods(tmp_path, zk_hosts)
    yield p
    p.stop_all()


def ids_in(path: Path) -> list[int]:
    data = array("q")
    if path.exists():
        data.frombytes(path.read_bytes())
    return list(data)


def size(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


def lines(proc: Proc) -> list[str]:
    """Every line the pod printed so far (without waiting)."""
    while True:
        try:
            proc.seen.append(proc.lines.get_nowait())
        except queue.Empty:
            return proc.seen


def ready_ids(home: Path) -> list[int]:
    ready, _ = probe(home / "snowflake" / next(
        p.name for p in (home / "snowflake").iterdir() if p.name.startswith("ready-")),
        wall_clock_ms())
    return [r.worker_id for r in ready]


def test_a_stopped_pod_and_its_replacement_never_generate_at_once(pods: Pods) -> None:
    started = [pods.start(i) for i in range(3)]
    claimed = [int(proc.wait_line("CLAIMED", 30).split()[1]) for proc, _ in started]
    assert claimed == [OFFSET, OFFSET + 1, OFFSET + 2]
    (old, old_out), *_ = started
    services.wait_until(lambda: size(old_out) > 0, 10, "pod 0 generating")
    assert ready_ids(old_out.parent) == [OFFSET]

    # its replacement, same HOSTNAME, refused while pod 0 holds the lease; started before
    # pod 0 freezes: a start slower than pod 0's 2 s session would never be refused
    new, new_out = pods.start(0)
    if not UNSAFE:  # (an unsafe one takes the lease over at once)
        new.wait_line("WAITING", 30)
    os.kill(old.proc.pid, signal.SIGSTOP)  # pod 0 frozen, its lease still held
    frozen = size(old_out)
    new.wait_line("CLAIMED", 30)  # once pod 0's session expired (2 s)
    waited = any(line.startswith("WAITING") for line in lines(new))
    services.wait_until(lambda: size(new_out) > 8_000, 10, "the replacement generating")
    assert ready_ids(new_out.parent) == [OFFSET]
    assert ready_ids(old_out.parent) == []  # its lease unconfirmed: not ready

    os.kill(old.proc.pid, signal.SIGCONT)
    services.wait_until(
        lambda: size(old_out) > frozen or any(x.startswith("FENCED") for x in lines(old)),
        15, "pod 0 fenced (or generating again)")
    grown = size(old_out) - frozen
    for proc, _ in [*started, (new, new_out)]:
        os.kill(proc.proc.pid, signal.SIGTERM)
    for proc, _ in [*started, (new, new_out)]:
        proc.proc.wait(20)
    assert grown == 0, (
        f"pod 0 generated {grown // 8} IDs after SIGCONT, at the same time as its "
        "replacement holding worker 100")
    assert any(x.startswith("FENCED") for x in lines(old))
    old_ids, new_ids = ids_in(old_out), ids_in(new_out)
    everything = [i for _, out in [*started, (new, new_out)] for i in ids_in(out)]
    assert len(everything) == len(set(everything)), "duplicate IDs"
    # the replacement starts above everything pod 0 generated (the mark in ZooKeeper)
    assert min(new_ids) > max(old_ids)
    assert {decode(i, LEAF_EPOCH_MS).worker_id for i in old_ids + new_ids} == {OFFSET}
    assert waited, f"the replacement was never refused while pod 0 held the lease: {lines(new)}"


def test_a_pod_restarted_with_its_clock_set_back(pods: Pods) -> None:
    first, first_out = pods.start(2, COUNT="3000")
    assert first.wait_line("CLAIMED", 30) == f"CLAIMED {OFFSET + 2}"
    first.wait_line("DONE", 30)  # released cleanly: the mark is its last ID's time
    first.proc.wait(20)
    before = ids_in(first_out)

    far, far_out = pods.start(2, COUNT="3000", POD_CLOCK_OFFSET_MS="-60000")
    assert "clock moved backwards" in far.wait_line("REFUSED", 30)
    assert far.proc.wait(20) == 3 and ids_in(far_out) == []

    near, near_out = pods.start(2, COUNT="3000", POD_CLOCK_OFFSET_MS="-1000")
    near.wait_line("CLAIMED", 30)  # within LEAFPOOL_SNOWFLAKE_START_WAIT_MS: waited
    near.wait_line("DONE", 30)
    after = ids_in(near_out)
    assert len(after) == 3000 and min(after) > max(before)
    assert len(set(before + after)) == len(before) + len(after)
    assert {decode(i, LEAF_EPOCH_MS).worker_id for i in before + after} == {OFFSET + 2}
