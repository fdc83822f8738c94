"""The previous release beside the current code on one Redis and one MariaDB database
(docs/reference/compatibility.md: release N+1's processes run beside release N's during a
rollout, in either order, and N can be rolled back to from N+1).

The previous release is taken from the repository's own history (tests/support/
releases.py: ``git archive`` of its commit, run with ``PYTHONPATH`` pointing there; a clone
without it skips, and fails under ``CI=true``). Each scenario is an operator's rollout
with real ``celery -A workers worker|beat`` processes of both releases and a client
process of each release popping two tags (one segment, one snowflake in mode ``mysql``)
throughout:

- ``workers-first``: the previous release's worker and beat serve; the current
  ``leafpool db init``; a current worker starts and the previous one stops (the previous
  beat queues, the current worker refills); a current beat starts and stands by; the
  previous beat stops and the current one takes over;
- ``beat-first``: the same with the beat replaced first (the current beat queues, the
  previous worker refills), then the worker;
- ``rollback``: the current release serves; the previous release's worker replaces the
  current one, then its beat replaces the current beat.

Asserted in each: no ID twice, each client's IDs strictly increasing per tag, every tag
refilled by whichever release remains after the other's process stopped (a refill that
pushed IDs, in the remaining worker's log), no pause over 2 s (the longest gap between
successful pops on a tag, all clients merged), no lock taken over as a former master's and
no write refused as stale (issue 29: the new beat took the old beat's lock, a new worker
an old worker's refill lock mid-refill), and a standby beat of either release standing
by while the other holds the lock. Each scenario prints its figures.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path

import pytest
import redis

from leafpool.core.version import __version__
from tests.support import services
from tests.support.processes import ROOT, Proc, leafpool_env
from tests.support.releases import Release, previous_release

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("mixed-versions")]

SEGMENT, SNOWFLAKE = "mixseg", "mixsf"
TAGS = (SEGMENT, SNOWFLAKE)
MAX_PAUSE_S = 2.0
WAIT_S = 60.0
BEAT_LOCK = "leafpool:beat:lock"
CLIENT = ROOT / "tests" / "support" / "mixed_client.py"
REFILLED = re.compile(r"Task leafpool\.refill_(?:segment|snowflake)s?\[[^\]]+\] succeeded in "
                      r"[\d.e-]+s: \{'tag': '([\w.-]+)', 'pushed': ([1-9]\d*)")
#: a refill task that ran to the end, whatever it pushed
RAN = re.compile(r"Task leafpool\.refill_(?:segment|snowflake)s?\[[^\]]+\] succeeded in "
                 r"[\d.e-]+s: \{'tag': '([\w.-]+)', 'pushed': (\d+)")


@dataclass
class Side:
    """One release's processes: its environment (its code first on the path) and name."""

    version: str
    env: dict[str, str]

    def cli(self, *args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "leafpool.cli", *args], env=self.env,
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{self.version}: leafpool {' '.join(args)}: {done.stderr}"
        return done.stdout


@dataclass
class Rollout:
    tmp: Path
    r: redis.Redis
    procs: list[Proc] = field(default_factory=list)
    clients: list[tuple[str, Proc, Path]] = field(default_factory=list)
    logs: list[Path] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)

    def _celery(self, side: Side, name: str, *argv: str) -> tuple[Proc, Path]:
        log = self.tmp / f"{name}.log"
        self.logs.append(log)
        proc = Proc([sys.executable, "-m", "celery", "-A", "workers", *argv], side.env, log)
        self.procs.append(proc)
        return proc, log

    def worker(self, side: Side, name: str) -> tuple[Proc, Path]:
        """A worker of ``side``, its node named ``name`` (a snowflake worker ID's identity
        of its own), once it is ready to take tasks."""
        proc, log = self._celery(side, name, "worker", "--loglevel=INFO", "-c", "1",
                                 "-n", f"{name}@%h")
        services.wait_until(lambda: f"{name}@" in log.read_text()
                            and " ready." in log.read_text(), WAIT_S, f"worker {name} ready")
        if side.version == __version__:  # the current release says so in its ready line
            services.wait_until(lambda: f"leafpool {__version__}: worker {name}@"
                                in log.read_text(), WAIT_S, f"{name}'s start line")
        return proc, log

    def beat(self, side: Side, name: str, standby: bool) -> tuple[Proc, Path]:
        """A beat of ``side``: it takes the beat lock, or (``standby``) finds it held by
        the other release's running beat and stands by, the holder keeping it."""
        holder = self.r.get(BEAT_LOCK)
        proc, log = self._celery(side, name, "beat", "--loglevel=INFO",
                                 "-s", str(self.tmp / f"{name}.schedule"))
        said = "ANOTHER BEAT IS RUNNING" if standby else "holds the beat lock"
        services.wait_until(lambda: said in log.read_text(), WAIT_S, f"beat {name}: {said}")
        if standby:
            assert holder is not None and self.r.get(BEAT_LOCK) == holder, (
                f"{name} took the running beat's lock")
        return proc, log

    def stop(self, proc: Proc) -> float:
        """SIGTERM, as an operator's rollout stops a process, and its exit awaited."""
        proc.stop()
        return time.monotonic()

    def beat_replaced(self, old: Proc, new_log: Path) -> None:
        """The holding beat stops; the standby one takes the lock."""
        holder = self.r.get(BEAT_LOCK)
        self.stop(old)
        services.wait_until(lambda: self.r.get(BEAT_LOCK) not in (None, holder), WAIT_S,
                            "the standby beat taking the lock")
        services.wait_until(lambda: "holds the beat lock" in new_log.read_text(), WAIT_S,
                            "the standby beat saying it holds the lock")

    def refilled_by(self, log: Path, since: int, why: str, times: int = 1,
                    moved: bool = False) -> None:
        """Every tag refilled (IDs pushed) ``times`` times by the worker writing ``log``,
        after its ``since`` first bytes (taken once the other release's process exited, or
        the new beat held the lock: ``times=2`` there, since a refill the old beat queued
        just before it stopped may still run after the switch). ``moved``: the current
        release's beat runs the drop watcher, which moves reserve IDs into a list that fell
        below its low-water mark before it queues the refill (docs/design.md §3.7), so the
        refill finds the list filled and pushes nothing; a tag whose ``watch_pushed`` grew
        since now counts as refilled by the current release too (the previous release's
        beat moves nothing: its IDs are the current beat's) once the worker of ``log`` ran
        its refills ``times`` times (finding the list filled, it pushed nothing)."""
        def watch_pushed() -> dict[str, int]:
            return {tag: int(self.r.hget(f"leafpool:{{{tag}}}:state", "watch_pushed") or 0)
                    for tag in TAGS}

        before = watch_pushed()

        def every_tag() -> bool:
            text = log.read_text()[since:]
            found = [m.group(1) for m in REFILLED.finditer(text)]
            if not moved:
                return all(found.count(tag) >= times for tag in TAGS)
            ran = [m.group(1) for m in RAN.finditer(text)]
            grew = watch_pushed()
            return all(found.count(tag) >= times
                       or (grew[tag] > before[tag] and ran.count(tag) >= times)
                       for tag in TAGS)
        started = time.monotonic()
        services.wait_until(every_tag, WAIT_S, f"every tag refilled by {log.stem} ({why})")
        self.figures.append(f"{why}: every tag refilled by {log.stem} "
                            f"{time.monotonic() - started:.1f} s later")

    def start_clients(self, sides: list[Side]) -> None:
        for side in sides:
            out = self.tmp / f"client-{side.version}.txt"
            proc = Proc([sys.executable, str(CLIENT), str(out), str(self.tmp / "stop"), *TAGS],
                        side.env, self.tmp / f"client-{side.version}.log")
            self.procs.append(proc)
            self.clients.append((side.version, proc, out))
        services.wait_until(lambda: all(_popped(out) >= 50 for _, _, out in self.clients),
                            WAIT_S, "every client popping")

    def finish(self) -> None:
        """Stop the clients and check what they got and what the processes logged."""
        (self.tmp / "stop").touch()
        for _, proc, _ in self.clients:
            proc.proc.wait(timeout=30)
            assert proc.proc.returncode == 0, proc.log.read_text()[-3000:] if proc.log else ""
        got: dict[str, list[tuple[float, int]]] = {tag: [] for tag in TAGS}
        for version, _, out in self.clients:
            mine = _read(out)
            errors = {e for tag in TAGS for _, e in mine.errors[tag]} - {"PoolEmpty"}
            assert not errors, f"client {version}: {errors}"
            for tag in TAGS:
                ids = [i for _, batch in mine.pops[tag] for i in batch]
                assert ids == sorted(ids) and len(set(ids)) == len(ids), (
                    f"client {version}: {tag}'s IDs not strictly increasing")
                got[tag] += [(t, i) for t, batch in mine.pops[tag] for i in batch]
        for tag in TAGS:
            ids = [i for _, i in got[tag]]
            assert len(ids) == len(set(ids)), f"{tag}: {len(ids) - len(set(ids))} IDs twice"
            times = sorted({t for t, _ in got[tag]})
            pause = max(b - a for a, b in pairwise(times))
            misses = sum(len(_read(out).errors[tag]) for _, _, out in self.clients)
            self.figures.append(f"{tag}: {len(ids):,} IDs, none twice, longest pause "
                                f"{pause:.2f} s, {misses} empty pops")
            assert pause <= MAX_PAUSE_S, f"{tag}: a pause of {pause:.2f} s"
        for log in self.logs:
            text = log.read_text()
            assert "former master" not in text, f"{log.name}: a lock taken over as a former "\
                "master's"
            assert "StaleWrite" not in text, f"{log.name}: a write refused as stale"
            assert "lost the beat lock" not in text, f"{log.name}: a beat lost its lock"


@dataclass
class _Record:
    pops: dict[str, list[tuple[float, list[int]]]]
    errors: dict[str, list[tuple[float, str]]]


def _read(out: Path) -> _Record:
    rec = _Record({tag: [] for tag in TAGS}, {tag: [] for tag in TAGS})
    text = out.read_text()
    lines = text.splitlines()
    if not text.endswith("\n"):
        lines = lines[:-1]  # a line being written
    for line in lines:
        parts = line.split()
        if line.startswith("#") or len(parts) < 3:
            continue
        t, tag = float(parts[0]), parts[1]
        if parts[2] == "-":
            rec.errors[tag].append((t, parts[3] if len(parts) > 3 else "?"))
        else:
            rec.pops[tag].append((t, [int(x) for x in parts[2:]]))
    return rec


def _popped(out: Path) -> int:
    if not out.exists():
        return 0
    rec = _read(out)
    return min(len(rec.pops[tag]) for tag in TAGS)


@pytest.fixture
def rollout(tmp_path: Path, r: redis.Redis) -> Iterator[Rollout]:
    ro = Rollout(tmp_path, r)
    yield ro
    (tmp_path / "stop").touch()
    for proc in ro.procs:
        proc.kill()


@pytest.fixture
def sides(tmp_path: Path, redis_url: str, mysql_url: str) -> tuple[Side, Side]:
    """(the previous release, the current code), with one set of settings."""
    release: Release = previous_release(tmp_path / "previous")
    base = leafpool_env(
        redis_url=redis_url, database_url=mysql_url, snowflake_mode="mysql",
        snowflake_name=f"mix{tmp_path.name[-8:].replace('-', '')}",
        snowflake_cache_dir=str(tmp_path / "cache"), pool_floor=1000, pool_ceiling=4000,
        tag_sync_seconds=3600)
    current = Side(__version__, {**base, "PYTHONPATH": str(ROOT), "PYTHONSAFEPATH": "1"})
    return Side(release.version, release.env(base)), current


def _setup(side: Side) -> None:
    side.cli("db", "init")
    side.cli("tag", "add", SEGMENT, "--step", "1000")
    side.cli("tag", "add", SNOWFLAKE, "--mode", "snowflake")


def _filled(r: redis.Redis) -> Callable[[], bool]:
    return lambda: all(r.llen(f"leafpool:{{{tag}}}:ids") >= 1000 for tag in TAGS)


def _low_water_met(r: redis.Redis) -> Callable[[], bool]:
    def check() -> bool:
        for tag in TAGS:
            low = int(r.hget(f"leafpool:{{{tag}}}:state", "low_water") or 0)
            if not low or r.llen(f"leafpool:{{{tag}}}:ids") < low:
                return False
        return True
    return check


def _size(log: Path) -> int:
    return len(log.read_text())


def test_workers_first_rollout(rollout: Rollout, sides: tuple[Side, Side],
                               r: redis.Redis) -> None:
    prev, cur = sides
    _setup(prev)
    old_worker, _ = rollout.worker(prev, "prev1")
    old_beat, _ = rollout.beat(prev, "prevbeat", standby=False)
    services.wait_until(_filled(r), WAIT_S, "both tags filled by the previous release")
    rollout.start_clients([prev, cur])
    cur.cli("db", "init")  # the new release's schema step, beside the running release
    _, new_worker_log = rollout.worker(cur, "cur1")
    rollout.stop(old_worker)
    rollout.refilled_by(new_worker_log, _size(new_worker_log), "previous worker stopped")
    _, new_beat_log = rollout.beat(cur, "curbeat", standby=True)
    rollout.beat_replaced(old_beat, new_beat_log)
    rollout.refilled_by(new_worker_log, _size(new_worker_log), "previous beat stopped", times=2,
                        moved=True)
    services.wait_until(_low_water_met(r), WAIT_S, "every pool at its low-water mark")
    rollout.finish()
    assert "ANOTHER BEAT IS RUNNING" in new_beat_log.read_text()
    print("workers first:", "; ".join(rollout.figures))


def test_beat_first_rollout(rollout: Rollout, sides: tuple[Side, Side],
                            r: redis.Redis) -> None:
    prev, cur = sides
    _setup(prev)
    old_worker, old_worker_log = rollout.worker(prev, "prev1")
    old_beat, _ = rollout.beat(prev, "prevbeat", standby=False)
    services.wait_until(_filled(r), WAIT_S, "both tags filled by the previous release")
    rollout.start_clients([prev, cur])
    cur.cli("db", "init")
    _, new_beat_log = rollout.beat(cur, "curbeat", standby=True)
    rollout.beat_replaced(old_beat, new_beat_log)
    # the current beat queues, the previous release's worker refills
    rollout.refilled_by(old_worker_log, _size(old_worker_log), "previous beat stopped", times=2,
                        moved=True)
    _, new_worker_log = rollout.worker(cur, "cur1")
    rollout.stop(old_worker)
    rollout.refilled_by(new_worker_log, _size(new_worker_log), "previous worker stopped",
                        moved=True)
    services.wait_until(_low_water_met(r), WAIT_S, "every pool at its low-water mark")
    rollout.finish()
    print("beat first:", "; ".join(rollout.figures))


def test_rollback_to_the_previous_release(rollout: Rollout, sides: tuple[Side, Side],
                                          r: redis.Redis) -> None:
    prev, cur = sides
    _setup(cur)
    new_worker, _ = rollout.worker(cur, "cur1")
    new_beat, _ = rollout.beat(cur, "curbeat", standby=False)
    services.wait_until(_filled(r), WAIT_S, "both tags filled by the current release")
    rollout.start_clients([prev, cur])
    _, old_worker_log = rollout.worker(prev, "prev1")
    rollout.stop(new_worker)
    # the current beat queues, the previous release's worker refills
    rollout.refilled_by(old_worker_log, _size(old_worker_log), "current worker stopped",
                        moved=True)
    _, old_beat_log = rollout.beat(prev, "prevbeat", standby=True)
    rollout.beat_replaced(new_beat, old_beat_log)
    rollout.refilled_by(old_worker_log, _size(old_worker_log), "current beat stopped", times=2)
    services.wait_until(_low_water_met(r), WAIT_S, "every pool at its low-water mark")
    rollout.finish()
    print("rollback:", "; ".join(rollout.figures))
