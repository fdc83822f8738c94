"""The checker's report (tests/support/nemesis_checker.py) as rich tables: the run, per
tag, every long pause with what was in progress during it, the clients' errors; and one
row per seed for a series of runs (``python -m bench --only nemesis``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from tests.support.nemesis_checker import Pause, Report


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _policy_pct(x: float | None) -> str:
    return "-" if x is None else _pct(x)


def _counts(c: Counter[str], most: int = 4) -> str:
    return ", ".join(f"{k} {n}" for k, n in c.most_common(most)) or "-"


def cause(report: Report, p: Pause | None) -> str:
    """What was in progress during a pause: the faults (with their times since the start
    of the run), the failovers, the clients' errors, and how long it outlived the faults."""
    if p is None:
        return "-"
    parts = [f"{f.what} [{report.rel(f.start):.0f}-{report.rel(f.end):.0f} s]"
             for f in p.faults] or ["no fault in progress"]
    if p.failovers:
        parts.append("failover at " + ", ".join(f"{report.rel(t):.0f}" for t in p.failovers)
                     + " s")
    if p.errors:
        parts.append("errors: " + _counts(p.errors, 3))
    if p.outlived_s is not None and p.outlived_s > 0:
        parts.append(f"outlived the faults by {p.outlived_s:.1f} s")
    if p.open_end:
        parts.append("still paused at the end")
    if not p.asked:
        parts.append("NOT ASKED: no call of the tag in flight")
    return "; ".join(parts)


def _pause_text(report: Report, p: Pause | None) -> str:
    if p is None:
        return "-"
    return f"{p.length:.1f} s at {report.rel(p.start):.0f} s"


def print_report(console: Console, report: Report, pauses: bool = True) -> None:
    """The run's tables. "IDs unaccounted" is ``pushed_total - (handed out + gaps +
    uncounted gaps + ready)`` (tests/support/nemesis_checker.py): 0 when every ID pushed
    is accounted for."""
    title = (f"nemesis seed {report.seed}, POP_REPLICAS={report.pop_replicas}: "
             f"{report.end - report.start:.0f} s from the first fault to the end, "
             f"{sum(report.faults.values())} faults ({report.skipped} skipped), "
             f"{len(report.failovers)} failovers")
    tags = Table(title=title)
    for col in ("tag", "mode", "IDs", "calls (failed)", "duplicates", "inversions",
                "availability", "excl. master down", "pauses > 5 s", "longest pause",
                "first after heal", "IDs unaccounted"):
        tags.add_column(col, justify="left" if col in ("tag", "mode") else "right")
    for t in report.tags:
        tags.add_row(
            t.tag, t.mode, f"{t.handed_out:,}", f"{t.calls:,} ({t.failed:,})",
            str(t.duplicates), str(t.inversions),
            f"{_pct(t.availability)} of {t.windows}",
            f"{_pct(t.availability_kept)} of {t.kept_windows}", str(len(t.pauses)),
            _pause_text(report, t.longest),
            "never" if t.after_heal_s is None else f"{t.after_heal_s:.1f} s",
            "-" if t.balance is None else f"{t.balance:,}")
    console.print(tags)
    policies = sorted({p for t in report.tags for p in t.by_policy})
    if policies:
        console.print("availability excl. master down, by the clients' empty-pool policy: "
                      + "; ".join(f"{t.tag} " + " ".join(
                          f"{p} {_policy_pct(t.availability_of(p))}" for p in policies)
                          for t in report.tags))
    for t in report.tags:
        for ex in t.duplicate_examples:
            console.print(f"[red]{t.tag}: handed out twice: {ex}[/red]")
        for line in t.inversion_examples:
            console.print(f"[red]{t.tag}: inversion: {line}[/red]")
        if t.worker_ids:
            console.print(f"{t.tag}: IDs per worker ID: {t.worker_ids}")
    if report.heal_timeout:
        console.print(f"[red]the heal did not complete: {report.heal_timeout}[/red]")
    procs = Table(title="faults injected, restarts, master outages")
    procs.add_column("what")
    procs.add_column("count / detail")
    procs.add_row("faults", _counts(report.faults, 20))
    procs.add_row("restarts", _counts(report.restarts, 20))
    procs.add_row("exited by themselves", _counts(report.exits_by_itself, 20))
    procs.add_row("failovers at (s)",
                  ", ".join(f"{report.rel(t):.1f}" for t in report.failovers) or "-")
    procs.add_row("master down, no failover yet (s)",
                  ", ".join(f"{report.rel(o.start):.0f}-{report.rel(o.end):.0f}"
                            for o in report.master_outages) or "-")
    console.print(procs)
    if pauses:
        print_pauses(console, report)
    errors = Table(title="clients' errors by class")
    errors.add_column("client")
    errors.add_column("errors")
    for client, counts in sorted(report.errors.items()):
        errors.add_row(client, _counts(counts, 10))
    console.print(errors)


def print_pauses(console: Console, report: Report) -> None:
    table = Table(title="pauses longer than 5 s, with what was in progress")
    for col in ("tag", "at (s)", "length (s)", "cause"):
        table.add_column(col, justify="right" if col != "cause" else "left")
    for t in report.tags:
        for p in t.pauses:
            table.add_row(t.tag, f"{report.rel(p.start):.1f}", f"{p.length:.1f}",
                          cause(report, p))
    console.print(table)


def print_series(console: Console, reports: Sequence[Report]) -> None:
    """One row per seed: faults, IDs, duplicates, inversions, availability per tag, the
    longest pause and its cause."""
    table = Table(title="nemesis runs")
    for col in ("seed", "faults", "failovers", "IDs", "dup", "inv", "availability per tag",
                "excl. master down", "wait / reserve clients", "longest pause",
                "its cause"):
        table.add_column(col, justify="left" if col in ("its cause",) else "right")
    for r in reports:
        longest = max((t.longest for t in r.tags if t.longest), key=lambda p: p.length,
                      default=None)
        table.add_row(
            str(r.seed), str(sum(r.faults.values())), str(len(r.failovers)),
            f"{r.handed_out:,}", str(r.duplicates), str(r.inversions),
            " ".join(f"{t.tag} {_pct(t.availability)}" for t in r.tags),
            " ".join(f"{t.tag} {_pct(t.availability_kept)}" for t in r.tags),
            " ".join(f"{t.tag} {_policy_pct(t.availability_of('wait'))} / "
                     f"{_policy_pct(t.availability_of('reserve'))}" for t in r.tags),
            "-" if longest is None else f"{longest.tag} {_pause_text(r, longest)}",
            cause(r, longest))
    console.print(table)
