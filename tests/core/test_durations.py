"""The one duration formatter (pure logic: a fixed clock)."""

from __future__ import annotations

import pytest

from leafpool.core.durations import fmt_ago, fmt_duration

NOW = 1_700_000_000.0


@pytest.mark.parametrize(("seconds", "shown"), [
    (None, "-"),
    (0, "0s"),
    (59.4, "59s"),
    (119, "119s"),
    (120, "2m"),
    (187, "3m"),
    (7199, "120m"),
    (7200, "2.0h"),
    (3 * 3600, "3.0h"),
    (47.9 * 3600, "47.9h"),
    (48 * 3600, "2.0d"),
    (10 * 86400 + 43200, "10.5d"),
])
def test_duration_picks_the_unit_by_size(seconds: float | None, shown: str) -> None:
    assert fmt_duration(seconds) == shown


@pytest.mark.parametrize(("ms", "shown"), [
    (None, "never"),
    (int(NOW * 1000), "0s ago"),
    (int((NOW - 90) * 1000), "90s ago"),
    (int((NOW - 3 * 3600) * 1000), "3.0h ago"),
    (int((NOW - 3 * 86400) * 1000), "3.0d ago"),
    (int((NOW + 30) * 1000), "0s ago"),  # ahead of this clock: another host's
])
def test_ago_is_the_duration_since_a_wall_clock_ms(ms: int | None, shown: str) -> None:
    assert fmt_ago(ms, clock=lambda: NOW) == shown
