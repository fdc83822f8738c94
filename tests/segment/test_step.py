"""Leaf's dynamic step rule (15/30 minutes; here the durations are arguments)."""

import pytest

from leafpool.segment.step import next_step

RULE = {"grow_below": 900.0, "shrink_above": 1800.0, "cap": 1_000_000}


def test_first_allocation_uses_the_table_step() -> None:
    assert next_step(0, 1000, None, **RULE) == 1000


@pytest.mark.parametrize(
    "lasted,expected", [(1.0, 2000), (899.9, 2000), (900.0, 1000), (1799.0, 1000), (1800.0, 500)]
)
def test_step_doubles_keeps_or_halves_by_how_long_the_segment_lasted(
    lasted: float, expected: int
) -> None:
    assert next_step(1000, 500, lasted, **RULE) == expected


def test_step_never_passes_the_cap() -> None:
    assert next_step(600_000, 1000, 1.0, **RULE) == 600_000
    assert next_step(500_000, 1000, 1.0, **RULE) == 1_000_000


def test_step_never_halves_below_the_table_step() -> None:
    assert next_step(1500, 1000, 4000.0, **RULE) == 1000
    assert next_step(1000, 1000, 4000.0, **RULE) == 1000


def test_a_raised_table_step_lifts_the_current_step() -> None:
    assert next_step(1000, 5000, 1000.0, **RULE) == 5000
