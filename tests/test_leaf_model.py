"""bench/leaf_model.py against cases worked by hand from Leaf's rules (SegmentIDGenImpl):
the next segment loaded once 10 % of the current one is consumed, the step doubled
under 15 minutes, halved at 30 or more (not below the table's step), kept between, and a
request that finds both segments empty waiting for the load in flight."""

from __future__ import annotations

import pytest

from bench.leaf_model import MAX_STEP, LeafBuffer, Phase, calls, simulate


def test_steady_demand_loads_at_ten_percent_and_doubles_the_third_load() -> None:
    # 100 IDs/s in calls of 50 (one every 0.5 s), table step 1,000, loads of 0.2 s.
    # Init: [0, 1000). Idle before each call: 1000, 950, 900, 850: the call at 1.5 s finds
    # it under 900 and starts load 1 (no update timestamp yet: the table's step), ready at
    # 1.7 s. At 10.0 s the first segment is used up and the call switches to [1000, 2000);
    # the call at 11.5 s finds idle 850 and starts load 2, 9.8 s after load 1 ended
    # (under 15 minutes): step 2,000, ready at 11.7 s.
    f = simulate([Phase(12.0, 100)], batch=50, table_step=1000, latencies_s=[0.2],
                 step_at=0.0, headroom_s=10.0)
    assert f.empty_pops == 0 and f.empty_s == 0.0 and f.waited_s == 0.0
    assert f.steps == [1000, 2000]
    assert f.loads == 2
    # ready (10 s of 100 IDs/s held) at the first call after load 1 ended: 2.0 s,
    # holding 750 of the first segment and the 1,000 loaded
    assert f.ready_s == pytest.approx(2.0)
    # at the end (12 s): 24 calls took 1,200; left: 800 of [1000, 2000) + [2000, 4000)
    assert f.held_at_end == f.lost_on_restart == 800 + 2000
    assert f.step_at_end == 2000


def test_a_jump_waits_for_the_load_in_flight() -> None:
    # 10,000 IDs/s in calls of 50 (every 5 ms) for 0.2 s, loads of 1 s. The call at
    # 15 ms finds idle 850 and starts load 1 (step 1,000, ready at 1.015 s). The 20 calls
    # from 0 to 95 ms use [0, 1000); the 20 from 100 to 195 ms find nothing and are all
    # served at 1.015 s from [1000, 2000), the fourth of them starting load 2 at 1.015 s
    # (0 s after load 1 ended: step 2,000).
    f = simulate([Phase(0.2, 10_000)], batch=50, table_step=1000, latencies_s=[1.0],
                 step_at=0.0, headroom_s=0.05)
    assert f.empty_pops == 20
    assert f.empty_s == pytest.approx(1.015 - 0.100)
    assert f.longest_wait_s == pytest.approx(1.015 - 0.100)
    waits = sum(1.015 - (0.100 + 0.005 * i) for i in range(20))
    assert f.waited_s == pytest.approx(waits)
    assert f.steps == [1000, 2000]
    assert f.ready_s == 0.0  # 950 held after the first call: 0.05 s of 10,000 IDs/s is 500
    assert f.held_at_end == 0  # [1000, 2000) used up, load 2 still in flight at 0.2 s


def test_figures_count_from_the_step_on() -> None:
    # the same jump after 1 s of nothing: the waiting calls are all after the step
    f = simulate([Phase(1.0, 0), Phase(0.2, 10_000)], batch=50, table_step=1000,
                 latencies_s=[1.0], step_at=1.0, headroom_s=0.05)
    assert f.empty_pops == 20
    assert f.empty_s == pytest.approx(0.915)
    # a step down right after that jump: the calls at 0.2, 0.7, 1.2 and 1.7 s (100 IDs/s)
    # queue behind the jump's last calls, which used up [1000, 2000) at 1.015 s, and are
    # served when load 2 (started at 1.015 s, before the step: not counted) ends at
    # 2.015 s with [2000, 4000); the buffer then holds 2,000 - 200
    down = simulate([Phase(0.2, 10_000), Phase(2.0, 100)], batch=50, table_step=1000,
                    latencies_s=[1.0], step_at=0.2, headroom_s=15.0)
    assert down.loads == 0 and down.empty_pops == 4
    assert down.empty_s == pytest.approx(2.015 - 0.2)
    assert down.ready_s == pytest.approx(2.015 - 0.2)  # 1,800 >= 15 s of 100 IDs/s
    assert down.held_at_end == down.lost_on_restart == 1800


def test_the_step_rule() -> None:
    buf = LeafBuffer(1000, [0.0])
    assert buf._next_step(5.0) == 1000  # no update timestamp yet: the table's step
    buf.update_ts, buf.step = 0.0, 4000
    assert buf._next_step(10.0) == 8000  # lasted under 15 min: doubled
    assert buf._next_step(900.0) == 4000  # 15 min up to 30: kept
    assert buf._next_step(1799.0) == 4000
    assert buf._next_step(1800.0) == 2000  # 30 min or more: halved
    buf.step = 1000
    assert buf._next_step(5000.0) == 1000  # never below the table's step
    buf.step = 1500
    assert buf._next_step(5000.0) == 1500  # 750 would be below it: kept
    buf.step = 600_000
    assert buf._next_step(1.0) == 600_000  # 1,200,000 is over MAX_STEP: kept
    buf.step = MAX_STEP // 2
    assert buf._next_step(1.0) == MAX_STEP


def test_settled_buffer_starts_at_the_step_long_service_reaches() -> None:
    # 100 IDs/s: 1000 -> ... -> 64,000 (640 s, under 15 min) -> 128,000 (1,280 s): kept
    buf = LeafBuffer(1000, [0.0])
    buf.settle(100.0, 0.0)
    assert buf.step == 128_000 and buf.held() == 128_000
    # the next load starts 10 % into the segment (128 s), one segment's life (1,280 s)
    # after the previous one ended: kept
    assert buf._next_step(128.0) == 128_000


def test_calls_are_evenly_spaced_per_phase() -> None:
    assert calls([Phase(1.0, 100), Phase(1.0, 0), Phase(0.5, 200)], 50) == [
        0.0, 0.5, 2.0, 2.25]


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"table_step": 0}, "table_step"),
    ({"latencies_s": []}, "latencies_s"),
    ({"latencies_s": [-1.0]}, "latencies_s"),
    ({"batch": 0}, "batch"),
])
def test_bad_input_names_the_field(kwargs: dict[str, object], field: str) -> None:
    args: dict[str, object] = {"batch": 50, "table_step": 1000, "latencies_s": [0.1],
                               "step_at": 0.0, "headroom_s": 1.0}
    args.update(kwargs)
    with pytest.raises(ValueError, match=field):
        simulate([Phase(1.0, 100)], **args)  # type: ignore[arg-type]
