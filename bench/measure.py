"""Timing helpers: throughput and latency percentiles of a callable, rounds interleaved
so that the figures compared with each other see the same machine."""

from __future__ import annotations

import contextlib
import logging
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

#: ``python -m bench --smoke``: its figures mean nothing by design (tiny sizes), so no
#: target is judged on them (set once by bench/__main__.py)
SMOKE_RUN = False


def met(ok: bool) -> str:
    """A targets table's "met" cell: yes or NO, or, in a smoke run, not judged."""
    if SMOKE_RUN:
        return "not judged (smoke)"
    return "yes" if ok else "NO"


@contextlib.contextmanager
def meant_failures(*loggers: str) -> Iterator[None]:
    """The warnings of what a section does on purpose (a database killed: refills fail, the
    store moves to another node, the database is reachable again) unprinted while it
    runs: the section's table counts and times them, and bare on stderr ("refill failed:
    ... Can't connect to MySQL server") they read like a broken install. An ERROR still
    prints."""
    chosen = [logging.getLogger(name) for name in loggers]
    levels = [logger.level for logger in chosen]
    for logger in chosen:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(chosen, levels, strict=True):
            logger.setLevel(level)


@dataclass
class Result:
    name: str
    ids_per_op: int
    samples_ns: list[int] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)  # IDs/s of each round

    @property
    def ids_per_s(self) -> float:
        return statistics.median(self.rates) if self.rates else 0.0

    def pct_us(self, q: float) -> float:
        if not self.samples_ns:
            return float("nan")
        ordered = sorted(self.samples_ns)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1000


def run_round(result: Result, op: Callable[[], object], ops: int) -> None:
    samples = result.samples_ns
    clock = time.perf_counter_ns
    started = clock()
    for _ in range(ops):
        t0 = clock()
        op()
        samples.append(clock() - t0)
    elapsed = (clock() - started) / 1e9
    result.rates.append(ops * result.ids_per_op / elapsed)


def interleaved(cases: list[tuple[Result, Callable[[], object], int]], rounds: int,
                before_round: Callable[[], None] | None = None) -> list[Result]:
    for _ in range(rounds):
        if before_round:
            before_round()
        for result, op, ops in cases:
            run_round(result, op, ops)
    return [c[0] for c in cases]
