"""What happened during each long pause of a nemesis run, from its files: ``python -m
tests.support.nemesis_explain RUN_DIR [--threshold S] [--tag TAG]``.

For every pause the checker found (tests/support/nemesis_checker.py) it prints, in time
order and in seconds since the first fault: the nemesis's events (faults, restarts,
Sentinel's events), the clients' most frequent error messages, and the warnings and errors
of the processes' logs (Celery workers and beat, the HTTP service, Redis, Sentinel,
MariaDB) from a few seconds before the pause to its end. The cause of a pause is read
there; the run's report names only what was in progress."""

from __future__ import annotations

import argparse
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

from tests.support.nemesis_checker import Pause, Report, check_run
from tests.support.nemesis_history import Call, Event, read_calls, read_events

BEFORE_S = 5.0
#: Celery: ``[2026-11-27 07:47:30,178: WARNING/MainProcess] ...``
CELERY_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}): (\w+)/")
#: Redis and Sentinel: ``1234:M 27 Nov 2026 07:47:30.195 # ...`` (``#`` warning, ``*`` notice)
REDIS_LINE = re.compile(r"^\d+:[XCSM] (\d\d? \w{3} \d{4} \d\d:\d\d:\d\d)\.(\d{3}) ([.\-*#]) ")
#: MariaDB: ``2026-11-27  7:47:30 0 [Warning] ...``
MARIADB_LINE = re.compile(r"^(\d{4}-\d\d-\d\d +\d\d?:\d\d:\d\d) \d+ \[(\w+)\]")
QUIET = ("INFO", "DEBUG", "Note")
#: Redis notices that say nothing about a pause (persistence housekeeping)
REDIS_NOISE = re.compile(r"AOF|RDB|Fork CoW|history file|Background|[Ll]oading|"
                         r"Sentinel new configuration saved|Flushing old data|"
                         r"Discarding previously cached|Configuration loaded|oO0OoO0O|"
                         r"Running mode|Server initialized|Ready to accept|version=")


def log_lines(path: Path) -> Iterator[tuple[float, str]]:
    """(time, line) of the warnings and errors of one log, and of Sentinel's and Redis's
    notices (a failover, a sync, a role change), with the wall-clock time of each."""
    with open(path, errors="replace") as fh:
        for line in fh:
            line = line.rstrip()
            if m := CELERY_LINE.match(line):
                if m.group(3) in QUIET:
                    continue
                t = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S"))
                yield t + int(m.group(2)) / 1000, line
            elif m := REDIS_LINE.match(line):
                if m.group(3) == "." or REDIS_NOISE.search(line):
                    continue
                t = time.mktime(time.strptime(m.group(1), "%d %b %Y %H:%M:%S"))
                yield t + int(m.group(2)) / 1000, line
            elif (m := MARIADB_LINE.match(line)) and m.group(2) not in QUIET:
                t = time.mktime(time.strptime(re.sub(" +", " ", m.group(1)),
                                              "%Y-%m-%d %H:%M:%S"))
                yield t, line


def _event_text(e: Event) -> str:
    if e.ev == "sentinel":
        return f"sentinel {e.get('type')} {e.get('data')}"
    return f"{e.ev} " + " ".join(f"{k}={v}" for k, v in e.data.items() if k != "at")


def explain(run_dir: Path, report: Report, pause: Pause, calls: list[Call],
            events: list[Event], max_lines: int = 60) -> list[str]:
    """The lines that tell what happened around ``pause``."""
    start, end = pause.start - BEFORE_S, pause.end
    out = [f"== {pause.tag}: paused {pause.length:.1f} s from {report.rel(pause.start):.1f} s"
           f"{' (still at the end)' if pause.open_end else ''}"]
    timeline: list[tuple[float, str]] = [
        (e.t, _event_text(e)) for e in events if start <= e.t <= end]
    for path in sorted((run_dir / "logs").glob("*.log")):
        timeline += [(t, f"{path.stem}: {line[:220]}") for t, line in log_lines(path)
                     if start <= t <= end]
    timeline.sort()
    if len(timeline) > max_lines:
        skipped = len(timeline) - max_lines
        half = max_lines // 2
        timeline = [*timeline[:half], (timeline[half][0], f"... {skipped} lines ..."),
                    *timeline[-half:]]
    out += [f"{report.rel(t):8.2f}  {text}" for t, text in timeline]
    messages = Counter(f"{c.err}: {c.msg}" for c in calls
                       if c.tag == pause.tag and c.err and pause.start <= c.end <= pause.end)
    out += [f"  {n:5d} x {text[:200]}" for text, n in messages.most_common(5)]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.support.nemesis_explain")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--threshold", type=float, default=5.0)
    parser.add_argument("--tag", default=None, help="this tag's pauses only")
    parser.add_argument("--lines", type=int, default=60, help="at most this many per pause")
    args = parser.parse_args()
    report = check_run(args.run_dir, args.threshold)
    calls, events = read_calls(args.run_dir), read_events(args.run_dir)
    for tag in report.tags:
        if args.tag not in (None, tag.tag):
            continue
        for pause in tag.pauses:
            print("\n".join(explain(args.run_dir, report, pause, calls, events, args.lines)))


if __name__ == "__main__":
    main()
