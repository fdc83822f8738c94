"""The checker of a nemesis run: reads the run directory (tests/support/nemesis_history.py)
and says, per tag, what the clients were handed and whether leafpool kept its promises.

- **duplicates** (G1): an ID handed out more than once (counted as extra copies). A
  ``PoolEmpty``'s partial IDs count as handed out: the caller holds them.
- **inversions** (G2): a segment call that began after another call of the same tag had
  ended must get only larger IDs (the calls' real-time order, across every client);
  counted as the calls that got an ID at or below the largest ID of a call that ended
  before they began, plus the calls whose own IDs are not strictly increasing. For a
  snowflake tag the same rule per worker ID (the 10 bits decoded with
  :mod:`leafpool.core.snowflake_layout`): each worker's IDs increase.
- **availability**: the share of the 1-second windows of the run (from the first fault to
  the end of the heal) in which the tag served at least one ID; also leaving out the
  windows that overlap a Redis master down or paused with no failover completed yet (the
  master's fault until it ended or Sentinel switched the master, whichever came first).
- **availability by empty-pool policy**: the same share leaving out the master outages,
  counting only the calls of the clients with one ``LEAFPOOL_EMPTY_POLICY`` (a client
  is named ``client-<i>-<policy>``): what an application with that policy saw of the
  tag (issue 32 item 5, ``wait`` against ``reserve``).
- **pauses**: every stretch longer than the threshold between two calls that served the
  tag, with the faults in progress during it, the failovers, the clients' errors, and how
  long the pause outlived the last of those faults.
- **gaps**: ``pushed_total - (handed out + gaps + uncounted + ready)`` per tag from
  Redis's counts once the clients stopped (README "Lost replies"), ``uncounted`` being
  the gaps the clients could not count (Redis unreachable) and said so in their logs
  (``gap of N ID(s) not counted``): 0 when every ID is accounted for; negative when IDs
  counted as a gap came back (a pop too few replicas acknowledged was dropped, then lost
  with its master; a lost reply counts the IDs asked for); positive when IDs went
  missing uncounted.
"""

from __future__ import annotations

import bisect
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from leafpool.core.snowflake_layout import MAX_WORKER_ID, WORKER_SHIFT
from tests.support.nemesis_faults import MASTER_KINDS
from tests.support.nemesis_history import (
    ACCOUNTING,
    META,
    Call,
    Event,
    read_calls,
    read_events,
    read_json,
)

PAUSE_THRESHOLD_S = 5.0
EXAMPLES = 5


@dataclass(frozen=True)
class Interval:
    start: float
    end: float
    what: str  # "master-pause redis-6380", "failover", ...


@dataclass
class Pause:
    tag: str
    start: float
    end: float
    open_end: bool  # still paused when the run ended
    faults: list[Interval] = field(default_factory=list)
    failovers: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    #: the tag's calls in flight during the pause: 0 means no client asked (the pause is
    #: the clients', not the tag's)
    asked: int = 0

    @property
    def length(self) -> float:
        return self.end - self.start

    @property
    def outlived_s(self) -> float | None:
        """Seconds the pause lasted after the last fault in progress during it had ended
        (None: no fault was in progress; negative: it ended before the faults did)."""
        return self.end - max(f.end for f in self.faults) if self.faults else None


@dataclass
class TagReport:
    tag: str
    mode: str
    calls: int = 0
    failed: int = 0
    handed_out: int = 0
    duplicates: int = 0
    duplicate_examples: list[int] = field(default_factory=list)
    inversions: int = 0
    inversion_examples: list[str] = field(default_factory=list)
    worker_ids: dict[int, int] = field(default_factory=dict)  # snowflake: IDs per worker
    windows: int = 0
    served_windows: int = 0
    kept_windows: int = 0  # not overlapping a master outage
    served_kept_windows: int = 0
    #: policy -> (windows kept, served by that policy's clients)
    by_policy: dict[str, tuple[int, int]] = field(default_factory=dict)
    pauses: list[Pause] = field(default_factory=list)
    longest: Pause | None = None
    after_heal_s: float | None = None  # first serve after the heal began
    accounting: dict[str, int] = field(default_factory=dict)

    @property
    def availability(self) -> float:
        return self.served_windows / self.windows if self.windows else 0.0

    @property
    def availability_kept(self) -> float:
        return self.served_kept_windows / self.kept_windows if self.kept_windows else 0.0

    def availability_of(self, policy: str) -> float | None:
        """The share of the kept windows (no master outage) in which a client with this
        empty-pool policy got an ID of the tag; None when no such client asked."""
        kept, served = self.by_policy.get(policy, (0, 0))
        return served / kept if kept else None

    @property
    def balance(self) -> int | None:
        a = self.accounting
        if not a:
            return None
        return a["pushed_total"] - (self.handed_out + a["gaps"] + a.get("uncounted", 0)
                                    + a["ready"])


@dataclass
class Report:
    seed: int | None
    pop_replicas: str | None
    start: float
    end: float
    heal: float | None
    tags: list[TagReport]
    faults: Counter[str]
    skipped: int
    failovers: list[float]
    master_outages: list[Interval]
    restarts: Counter[str]
    exits_by_itself: Counter[str]
    errors: dict[str, Counter[str]]
    heal_timeout: str | None = None

    @property
    def duplicates(self) -> int:
        return sum(t.duplicates for t in self.tags)

    @property
    def inversions(self) -> int:
        return sum(t.inversions for t in self.tags)

    @property
    def handed_out(self) -> int:
        return sum(t.handed_out for t in self.tags)

    def tag(self, name: str) -> TagReport:
        return next(t for t in self.tags if t.tag == name)

    def rel(self, t: float) -> float:
        """Seconds since the run's span began (the first fault)."""
        return t - self.start


# -- the checks, on plain values (the unit tests use them on hand-written histories) -----

def duplicates(calls: Iterable[Call]) -> tuple[int, list[int]]:
    seen = Counter(i for c in calls for i in c.ids)
    extra = sum(n - 1 for n in seen.values() if n > 1)
    return extra, sorted(i for i, n in seen.items() if n > 1)[:EXAMPLES]


def _worker(i: int) -> int:
    return (i >> WORKER_SHIFT) & MAX_WORKER_ID


def inversions(calls: Sequence[Call]) -> tuple[int, list[str]]:
    """Calls that got an ID at or below one a call that ended before they began got, or
    whose own IDs are not strictly increasing (see the module's docstring)."""
    bad: list[str] = []
    ops = [c for c in calls if c.ids]
    for c in ops:
        if any(b <= a for a, b in pairwise(c.ids)):
            bad.append(f"{c.client} at {c.start:.3f}: IDs out of order within the call")
    by_end = sorted(ops, key=lambda c: c.end)
    ends = [c.end for c in by_end]
    best: Call | None = None
    j = 0
    for c in sorted(ops, key=lambda c: c.start):
        k = bisect.bisect_left(ends, c.start)  # calls that ended strictly before c began
        while j < k:
            if best is None or max(by_end[j].ids) > max(best.ids):
                best = by_end[j]
            j += 1
        if best is not None and min(c.ids) <= max(best.ids):
            bad.append(f"{c.client} [{c.start:.3f}-{c.end:.3f}] got {min(c.ids)} after "
                       f"{best.client} [{best.start:.3f}-{best.end:.3f}] got {max(best.ids)}")
    return len(bad), bad[:EXAMPLES]


def snowflake_inversions(calls: Sequence[Call]) -> tuple[int, list[str], dict[int, int]]:
    """:func:`inversions` per worker ID; also the IDs handed out per worker ID."""
    per: dict[int, list[Call]] = defaultdict(list)
    for c in calls:
        by_worker: dict[int, list[int]] = defaultdict(list)
        for i in c.ids:
            by_worker[_worker(i)].append(i)
        for w, ids in by_worker.items():
            per[w].append(Call(c.client, c.start, c.end, c.tag, c.op, c.n, tuple(ids), c.err))
    count, examples = 0, []
    for w, wcalls in sorted(per.items()):
        n, ex = inversions(wcalls)
        count += n
        examples += [f"worker {w}: {e}" for e in ex]
    return count, examples[:EXAMPLES], {w: sum(len(c.ids) for c in cs)
                                        for w, cs in sorted(per.items())}


POLICY = re.compile(r"^client-\d+-(\w+)$")


def policy_of(client: str) -> str | None:
    """The empty-pool policy in a client's name (``client-<i>-<policy>``), else None."""
    m = POLICY.match(client)
    return m.group(1) if m else None


def pauses(tag: str, served_at: Sequence[float], start: float, end: float,
           threshold: float = PAUSE_THRESHOLD_S) -> list[Pause]:
    """Stretches longer than ``threshold`` without a serve, between ``start`` and ``end``
    (the last one open when nothing was served before the end)."""
    times = [start, *sorted(t for t in served_at if start <= t <= end)]
    out = [Pause(tag, a, b, False) for a, b in pairwise(times)
           if b - a > threshold]
    if end - times[-1] > threshold:
        out.append(Pause(tag, times[-1], end, True))
    return out


def windows(served_at: Iterable[float], start: float, end: float,
            outages: Sequence[Interval]) -> tuple[int, int, int, int]:
    """(windows, served, windows kept, served kept): the 1-second windows from ``start``,
    those with a serve, and the same leaving out those overlapping an outage."""
    n = int(end - start)
    served = {int(t - start) for t in served_at if start <= t < start + n}
    kept = [w for w in range(n)
            if not any(o.start < start + w + 1 and start + w < o.end for o in outages)]
    return n, len(served), len(kept), len(served & set(kept))


# -- events ----------------------------------------------------------------------------

def fault_intervals(events: Sequence[Event], end: float) -> list[tuple[Interval, str]]:
    """Every fault as (interval, kind); one still open at the end lasts until ``end``."""
    started: dict[int, Event] = {}
    out: list[tuple[Interval, str]] = []
    for e in events:
        if e.ev == "fault-start":
            started[e.get("id")] = e
        elif e.ev == "fault-end" and e.get("id") in started:
            s = started.pop(e.get("id"))
            out.append((Interval(s.t, e.t, f"{s.get('kind')} {s.get('target')}"),
                        s.get("kind")))
    out += [(Interval(s.t, end, f"{s.get('kind')} {s.get('target')}"), s.get("kind"))
            for s in started.values()]
    return sorted(out, key=lambda x: x[0].start)


def failovers(events: Sequence[Event]) -> list[float]:
    return [e.t for e in events if e.ev == "sentinel" and e.get("type") == "+switch-master"]


def master_outages(faults: Sequence[tuple[Interval, str]],
                   switches: Sequence[float]) -> list[Interval]:
    """A master fault until it ended or a failover completed, whichever came first."""
    out = []
    for f, kind in faults:
        if kind in MASTER_KINDS:
            after = [t for t in switches if t > f.start]
            out.append(Interval(f.start, min([f.end, *after[:1]]), f.what))
    return out


def _phase(events: Sequence[Event], name: str) -> float | None:
    return next((e.t for e in events if e.ev == "phase" and e.get("phase") == name), None)


# -- the report ------------------------------------------------------------------------

def check(calls: Sequence[Call], events: Sequence[Event], tags: dict[str, str],
          meta: dict[str, Any] | None = None, accounting: dict[str, dict[str, int]] | None = None,
          threshold: float = PAUSE_THRESHOLD_S) -> Report:
    """The report of a run from its calls, events and tags (``{tag: mode}``)."""
    meta = meta or {}
    start = _phase(events, "faults") or min(c.start for c in calls)
    end = _phase(events, "end") or max(c.end for c in calls)
    heal = _phase(events, "heal")
    faults = fault_intervals(events, end)
    switches = failovers(events)
    outages = master_outages(faults, switches)
    errors: dict[str, Counter[str]] = defaultdict(Counter)
    for c in calls:
        if c.err:
            errors[c.client][c.err] += 1
    reports = []
    for tag, mode in tags.items():
        mine = [c for c in calls if c.tag == tag]
        r = TagReport(tag, mode, calls=len(mine), failed=sum(1 for c in mine if c.err))
        r.handed_out = sum(len(c.ids) for c in mine)
        r.duplicates, r.duplicate_examples = duplicates(mine)
        if mode == "snowflake":
            r.inversions, r.inversion_examples, r.worker_ids = snowflake_inversions(mine)
        else:
            r.inversions, r.inversion_examples = inversions(mine)
        served = [c.end for c in mine if c.served]
        r.windows, r.served_windows, r.kept_windows, r.served_kept_windows = windows(
            served, start, end, outages)
        for policy in sorted({pol for c in mine if (pol := policy_of(c.client))}):
            by = [c.end for c in mine if c.served and policy_of(c.client) == policy]
            _, _, kept, served_kept = windows(by, start, end, outages)
            r.by_policy[policy] = (kept, served_kept)
        r.pauses = pauses(tag, served, start, end, threshold)
        for p in r.pauses:
            p.faults = [f for f, _ in faults if f.start < p.end and f.end > p.start]
            p.failovers = [t for t in switches if p.start <= t <= p.end]
            p.errors = Counter(c.err for c in mine if c.err and p.start <= c.end <= p.end)
            p.asked = sum(1 for c in mine if c.start < p.end and c.end > p.start)
        r.longest = max(r.pauses, key=lambda p: p.length, default=None)
        if heal is not None:
            after = [t for t in served if t >= heal]
            r.after_heal_s = min(after) - heal if after else None
        r.accounting = (accounting or {}).get(tag, {})
        reports.append(r)
    config = meta.get("config", {})
    return Report(
        seed=config.get("seed"), pop_replicas=config.get("pop_replicas"), start=start,
        end=end, heal=heal, tags=reports, faults=Counter(k for _, k in faults),
        skipped=sum(1 for e in events if e.ev == "skip"), failovers=switches,
        master_outages=outages,
        restarts=Counter(e.get("proc") for e in events if e.ev == "restart"),
        exits_by_itself=Counter(e.get("proc") for e in events
                                if e.ev == "exited" and e.get("by") == "itself"),
        errors=dict(errors),
        heal_timeout=next((str(e.get("missing")) for e in events if e.ev == "heal-timeout"),
                          None))


UNCOUNTED = re.compile(r"^(\S+): gap of (\d+) ID\(s\) not counted")


def uncounted(run_dir: Path) -> Counter[str]:
    """Per tag, the gaps the clients logged as not counted (Redis unreachable)."""
    out: Counter[str] = Counter()
    for path in (run_dir / "logs").glob("client-*.log"):
        for line in path.read_text(errors="replace").splitlines():
            if m := UNCOUNTED.match(line):
                out[m.group(1)] += int(m.group(2))
    return out


def check_run(run_dir: Path, threshold: float = PAUSE_THRESHOLD_S) -> Report:
    """:func:`check` on the files of a run directory."""
    meta = read_json(run_dir / META)
    accounting = read_json(run_dir / ACCOUNTING)
    for tag, n in uncounted(run_dir).items():
        if tag in accounting:
            accounting[tag]["uncounted"] = n
    return check(read_calls(run_dir), read_events(run_dir), meta.get("tags", {}), meta,
                 accounting, threshold)
