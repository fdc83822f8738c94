"""The pipeline benchmark's pure arithmetic (bench/pipeline_bench.py): the clients' rate
when a pre-filled list runs dry early, and the CPU split's "other" (the machine's busy
time no watched process accounts for)."""

from __future__ import annotations

import pytest

from bench.pipeline_bench import CpuSample, Phase, cpu_split, rate


def test_the_rate_adds_each_clients_ids_over_its_own_window() -> None:
    # one client ran dry after 0.5 s: its IDs count over its 0.5 s, not the 2 s window
    phases = [Phase(ids=2_000_000, wall_s=2.0), Phase(ids=500_000, wall_s=0.5, dry=True),
              Phase(ids=0, wall_s=0.0)]  # a client that never got a turn adds nothing
    assert rate(phases) == pytest.approx(1_000_000 + 1_000_000)


def test_other_is_the_busy_time_no_watched_group_accounts_for() -> None:
    a = CpuSample(0.0, {"clients": 1.0, "redis": 2.0, "broker": 0.0, "workers": 3.0},
                  busy=100.0, total=200.0)
    b = CpuSample(2.0, {"clients": 1.5, "redis": 3.0, "broker": 0.1, "workers": 3.4},
                  busy=103.0, total=204.0)
    split = cpu_split(a, b)
    assert split == pytest.approx({"clients": 0.5, "redis": 1.0, "broker": 0.1,
                                   "workers": 0.4, "other": 1.0})
    # /proc/stat and /proc/PID/stat tick apart: the groups may add up to more than the
    # machine's busy time; "other" is then 0, never negative
    b_ahead = CpuSample(2.0, {"clients": 1.5, "redis": 3.0, "broker": 0.1, "workers": 3.4},
                        busy=101.5, total=204.0)
    assert cpu_split(a, b_ahead)["other"] == 0.0
