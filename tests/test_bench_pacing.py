"""The benchmarks' client pacing (bench/step_bench.py ``paced``): the calls each phase
schedules, counted from the schedule itself (a start in the past: nothing sleeps)."""

from __future__ import annotations

import time

from bench.step_bench import BATCH, paced


def test_each_phase_schedules_its_own_calls_and_a_late_client_does_not_carry_over() -> None:
    start = time.time() - 100  # every turn is already due: no sleep, the count is exact
    # 1 s at 0 IDs/s (a pause), 1 s at 500 IDs/s, 1 s at 100 IDs/s; 1 client: a call of
    # BATCH (50) IDs every 0.1 s, then every 0.5 s
    calls = sum(1 for _ in paced([(1.0, 0), (1.0, 500), (1.0, 100)], start, clients=1))
    assert BATCH == 50 and calls == 10 + 2


def test_clients_interleave_their_turns() -> None:
    start = time.time() - 100
    phases = [(1.0, 1000)]  # 4 clients together: a call every 0.05 s, each one every 0.2 s
    per_client = [sum(1 for _ in paced(phases, start, index=i, clients=4)) for i in range(4)]
    assert per_client == [5, 5, 5, 5]
