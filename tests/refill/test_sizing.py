"""The pool sizing rule (docs/design.md §3.2): rate to target, smoothing, bursts."""

import pytest

from leafpool.refill.sizing import pool_target, smooth_rate


def test_pool_target_is_rate_times_seconds_within_bounds() -> None:
    assert pool_target(0, 30, 2000, 100_000) == 2000
    assert pool_target(1000, 30, 2000, 100_000) == 30_000
    assert pool_target(10_000, 30, 2000, 100_000) == 100_000


def test_rate_is_smoothed() -> None:
    assert smooth_rate(0, 100, 1.0, 0.5) == 100
    assert smooth_rate(100, 300, 1.0, 0.5) == 200
    assert smooth_rate(100, 300, 0.0, 0.5) == 100


# -- burst sizing (docs/design.md §3.2) ------------------------------------------------------


def test_sizing_takes_the_largest_of_smoothed_instant_and_watched_rates() -> None:
    from leafpool.refill.sizing import instant_rate, sizing_rate

    assert sizing_rate(1000.0, 0.0) == 1000.0  # consumption stopped: the smoothed rate
    assert sizing_rate(1000.0, 50_000.0) == 50_000.0  # a jump counts in full at once
    assert sizing_rate(1000.0, 2000.0, 40_000.0) == 40_000.0  # the watcher saw more
    assert instant_rate(50_000, 1.0) == 50_000.0
    assert instant_rate(-5, 1.0) == 0.0 and instant_rate(10, 0.0) == 0.0


def test_a_jump_to_50x_sizes_the_pool_for_the_new_rate_at_the_first_refill() -> None:
    """1,000 IDs/s smoothed for long; then 50,000 IDs are taken in one second. The
    smoothed rate alone (alpha 0.3) would size for 15,700 IDs/s; the instant rate for
    50,000."""
    from leafpool.refill.sizing import instant_rate, sizing_rate

    smoothed = smooth_rate(1000.0, 50_000, 1.0, 0.3)
    assert round(smoothed) == 15_700
    rate = sizing_rate(smoothed, instant_rate(50_000, 1.0))
    assert pool_target(rate, 30, 200, 10_000_000) == 1_500_000


def test_recent_rate_over_a_window_with_a_fake_clock() -> None:
    from leafpool.refill.sizing import RecentRate

    clock = 100.0
    recent = RecentRate()
    assert recent.add(clock, 0) == 0.0  # one sample: no rate
    clock += 0.01
    # 100 IDs 10 ms after a read: counted over the minimum span (1 s), not as 10,000/s
    assert recent.add(clock, 100) == 100.0
    for _ in range(300):  # 50,000 IDs/s, read every 10 ms, for 3 s
        clock += 0.01
        consumed = 100 + round((clock - 100.01) * 50_000)
        rate = recent.add(clock, consumed)
    assert 49_000 < rate < 51_000  # the window forgot the quiet start
    assert recent.add(clock + 0.01, 10) == 0.0  # counters went back: start again


def test_an_idle_tag_read_long_ago_is_not_sized_as_a_flood() -> None:
    from leafpool.refill.sizing import RecentRate

    recent = RecentRate()
    recent.add(0.0, 0)
    assert recent.add(600.0, 200) == pytest.approx(200 / 600)


def test_a_pool_is_outgrown_when_the_rate_asks_for_twice_its_size_below_the_ceiling() -> None:
    from leafpool.refill.sizing import outgrown

    assert outgrown(1000.0, 30, 200, 1_000_000)  # 30,000 wanted, 200 held
    assert not outgrown(1000.0, 30, 20_000, 1_000_000)  # within 2x: the low-water mark
    assert not outgrown(1e6, 30, 1_000_000, 1_000_000)  # at the ceiling already
    assert not outgrown(1000.0, 30, 0, 1_000_000)  # never refilled: due anyway


# -- the outage budget (docs/design.md §3.2) --------------------------------------------------


def test_the_recent_peak_is_a_maximum_that_halves_every_half_life() -> None:
    from leafpool.refill.sizing import PEAK_HALF_LIFE_SECONDS, decayed_peak

    assert decayed_peak(0.0, 0.0, 3000.0) == 3000.0  # the first measurement
    assert decayed_peak(3000.0, 10.0, 30_000.0) == 30_000.0  # a higher rate: at once
    half = decayed_peak(3000.0, PEAK_HALF_LIFE_SECONDS, 100.0)
    assert half == pytest.approx(1500.0)
    assert decayed_peak(3000.0, 24 * PEAK_HALF_LIFE_SECONDS, 100.0) == 100.0  # a day on
    assert decayed_peak(3000.0, 0.0, 100.0) == 3000.0  # no time passed: kept


def test_the_reserve_holds_the_outage_at_the_peak_rate_or_its_own_seconds() -> None:
    from leafpool.refill.sizing import reserve_target

    # 3,000 IDs/s at peak, 100 now: 600 s of the peak, not 60 s of the current rate
    assert reserve_target(100.0, 3000.0, 60.0, 600.0, 200, 10**8) == 1_800_000
    # the outage budget off: the reserve seconds of the current rate, as before
    assert reserve_target(100.0, 3000.0, 60.0, 0.0, 200, 10**8) == 6_000
    # within the floor and ceiling
    assert reserve_target(0.0, 0.0, 60.0, 600.0, 200, 10**8) == 200
    assert reserve_target(30_000.0, 300_000.0, 60.0, 600.0, 200, 10**8) == 10**8


def test_the_rate_now_forgets_a_measurement_nobody_pops_after() -> None:
    """Status's rate (issue 27): the measured rate just after the refill, the mean since
    it as the measurement ages, 0 once nothing was consumed for IDLE_SECONDS."""
    from leafpool.refill.sizing import IDLE_SECONDS, RATE_HALF_LIFE_SECONDS, rate_now

    assert rate_now(9.3, 0, 0.0) == 9.3
    assert rate_now(9.3, 0, -5.0) == 9.3  # the refiller's clock ahead of this host's
    assert rate_now(9.3, 0, RATE_HALF_LIFE_SECONDS) == pytest.approx(9.3 / 2)
    assert rate_now(9.3, 0, IDLE_SECONDS) == 0.0
    assert rate_now(9.3, 0, 3600.0) == 0.0  # a previous run's rate
    assert rate_now(100.0, 3000, 30.0) == pytest.approx(100.0)  # still popped at 100/s
    assert rate_now(9.3, 8, 600.0) == 0.0  # ./dev up's own pops, 10 min after: idle still
    assert rate_now(9.3, 60, 600.0) == pytest.approx(60 / 600, rel=0.01)  # one ID each 10 s
    assert rate_now(9.3, -40, 3600.0) == 0.0  # the counters went back (a re-created tag)


# -- the allocation's latency (docs/design.md §3.2, §12.2) ---------------------------------


def test_the_allocation_latency_rises_fast_and_falls_slowly() -> None:
    from leafpool.refill.sizing import smooth_latency

    assert smooth_latency(0.0, 600.0) == 600.0  # the first sample as it is
    assert smooth_latency(100.0, 600.0) == 350.0  # half way to a slower one
    assert smooth_latency(600.0, 100.0) == 550.0  # a tenth of the way to a faster one
    assert smooth_latency(600.0, -1.0) == 600.0  # no sample


def test_the_low_water_mark_covers_four_allocation_latencies_at_the_rate() -> None:
    """The list's seconds grow only when the latency asks it: a local database's few ms
    leave the default 30 s alone; 2 s allocations at ratio 0.5 ask 16 s of list."""
    from leafpool.refill.sizing import ALLOC_LATENCY_FACTOR, latency_cover, list_seconds

    assert ALLOC_LATENCY_FACTOR == 4.0
    assert list_seconds(30.0, 0.005, 0.5) == 30.0
    assert list_seconds(10.0, 2.0, 0.5) == 16.0
    assert list_seconds(1.0, 0.6, 0.25) == pytest.approx(9.6)
    assert latency_cover(1000.0, 0.6) == pytest.approx(2400.0)
    assert latency_cover(-1.0, 0.6) == 0.0 and latency_cover(1000.0, -1.0) == 0.0
    # the low-water mark is ratio x target: with the grown seconds it holds the cover
    rate, latency, ratio = 5000.0, 0.6, 0.5
    target = pool_target(rate, list_seconds(1.0, latency, ratio), 200, 10**8)
    assert target * ratio >= latency_cover(rate, latency)


def test_the_reserves_top_up_margin_covers_four_latencies_at_the_rate() -> None:
    """Due at half its target, so the target is at least twice the cover; unchanged
    when the latency is small."""
    from leafpool.refill.sizing import latency_cover, reserve_target

    assert reserve_target(1000.0, 0.0, 60.0, 0.0, 200, 10**9, latency=0.002) == 60_000
    want = reserve_target(1000.0, 0.0, 1.0, 0.0, 200, 10**9, latency=0.6)
    assert want == 4800 and want // 2 >= latency_cover(1000.0, 0.6)
