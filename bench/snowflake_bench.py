"""Snowflake generation speed, side by side in one run: leafpool's batch path and
``next_id`` against the ``snowflake-id`` package from PyPI
(``from snowflake import SnowflakeGenerator``), on the real clock.

``python bench/snowflake_bench.py`` prints the table; :func:`run` returns its rows. The
cases run in interleaved rounds (the median of each is reported) so that the ratios
compare figures measured on the same machine at the same time. The hard cap of any
snowflake generator is 4096 IDs per ms per worker ID (4,096,000/s).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from leafpool.core.snowflake_layout import IDS_PER_MS
from leafpool.snowflake.generator import SnowflakeGenerator

CAP_PER_S = IDS_PER_MS * 1000
ROUNDS = 5
ROUND_SECONDS = 0.25
BASELINE = "snowflake-id: next(gen)"


def _rate(step: Callable[[], int], seconds: float) -> float:
    """IDs/s of ``step`` (which returns how many IDs it produced) over ``seconds``."""
    produced = 0
    started = time.perf_counter()
    deadline = started + seconds
    while True:
        produced += step()
        now = time.perf_counter()
        if now >= deadline:
            return produced / (now - started)


def _ours_batch(size: int) -> Callable[[], int]:
    gen = SnowflakeGenerator(1)

    def step() -> int:
        return len(gen.next_batch(size))

    return step


def _ours_next_id() -> Callable[[], int]:
    next_id = SnowflakeGenerator(2).next_id

    def step() -> int:
        for _ in range(1000):
            next_id()
        return 1000

    return step


def _snowflake_id() -> Callable[[], int]:
    from snowflake import SnowflakeGenerator as TheirGenerator

    gen = TheirGenerator(3)

    def step() -> int:
        made = 0
        for _ in range(1000):
            if next(gen) is not None:  # it yields None once a millisecond is used up
                made += 1
        return made

    return step


def run(rounds: int = ROUNDS, round_seconds: float = ROUND_SECONDS) -> list[dict[str, Any]]:
    """One row per case: ``case``, ``ids_per_s`` (median of the rounds),
    ``vs_snowflake_id`` (ratio to the baseline) and ``share_of_cap``."""
    cases: dict[str, Callable[[], int]] = {
        "leafpool: next_batch(10000)": _ours_batch(10_000),
        "leafpool: next_batch(1000)": _ours_batch(1_000),
        "leafpool: next_id()": _ours_next_id(),
        BASELINE: _snowflake_id(),
    }
    rates: dict[str, list[float]] = {name: [] for name in cases}
    for step in cases.values():  # warm up
        _rate(step, 0.02)
    for _ in range(rounds):
        for name, step in cases.items():
            rates[name].append(_rate(step, round_seconds))
    medians = {name: statistics.median(values) for name, values in rates.items()}
    base = medians[BASELINE]
    return [
        {"case": name, "ids_per_s": rate, "vs_snowflake_id": rate / base,
         "share_of_cap": rate / CAP_PER_S}
        for name, rate in medians.items()
    ]


def format_table(rows: list[dict[str, Any]]) -> str:
    header = f"{'case':<30} {'IDs/s':>12} {'x snowflake-id':>15} {'% of 4,096,000/s cap':>21}"
    lines = [header, "-" * len(header)]
    for row in rows:
        lines.append(f"{row['case']:<30} {row['ids_per_s']:>12,.0f} "
                     f"{row['vs_snowflake_id']:>15.2f} {row['share_of_cap']:>20.1%}")
    return "\n".join(lines)


def main(rounds: int = ROUNDS, round_seconds: float = ROUND_SECONDS) -> None:
    print(f"Snowflake generation, one process, one worker ID each; median of {rounds} "
          f"interleaved rounds of {round_seconds}s")
    print(format_table(run(rounds, round_seconds)))


if __name__ == "__main__":
    main()
