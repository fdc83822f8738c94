"""The snowflake generator (leafpool.snowflake.generator) and the ID layout
(leafpool.core.snowflake_layout), driven by a fake clock."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from typing import Any

import pytest

from leafpool.core.config import load_settings
from leafpool.core.errors import ClockMovedBackwards, ConfigurationError, InvalidArgument
from leafpool.core.snowflake_layout import (
    MAX_BACKWARDS_MS,
    MAX_ID,
    MAX_SEQUENCE,
    MAX_TIMESTAMP,
    compose,
    decode,
)
from leafpool.snowflake.generator import SnowflakeGenerator
from tests.support.clocks import LEAF_EPOCH_MS, T0, FakeMsClock


def make(clock: FakeMsClock, worker_id: int = 7, **kwargs: Any) -> SnowflakeGenerator:
    return SnowflakeGenerator(worker_id, clock=clock, sleep=clock.sleep,
                              rng=random.Random(1), **kwargs)


def increasing(ids: list[int]) -> bool:
    return all(a < b for a, b in itertools.pairwise(ids))


# -- layout and decode -------------------------------------------------------------------

def test_layout_is_sign_41_time_10_worker_12_sequence() -> None:
    value = compose(LEAF_EPOCH_MS + 5, 1023, 4095)
    assert value == (5 << 22) | (1023 << 12) | 4095
    top = compose(LEAF_EPOCH_MS + MAX_TIMESTAMP, 1023, 4095)
    assert top == MAX_ID  # all 63 bits used, the sign bit never
    assert compose(LEAF_EPOCH_MS, 0, 0) == 0


def test_decode_agrees_with_leafs_example() -> None:
    # Leaf's /decodeSnowflakeId example: timestamp 1567733700834, worker 39, sequence 3448
    value = 1169786042799259000
    assert value == ((1567733700834 - 1288834974657) << 22) | (39 << 12) | 3448
    parts = decode(value)
    assert parts.timestamp_ms == 1567733700834
    assert parts.worker_id == 39
    assert parts.sequence == 3448
    assert parts.iso == "2019-09-06T01:35:00.834Z"
    assert compose(1567733700834, 39, 3448) == value
    assert decode(str(value)) == parts


def test_decode_with_another_epoch() -> None:
    epoch = 1_600_000_000_000
    value = compose(epoch + 1234, 5, 6, epoch_ms=epoch)
    parts = decode(value, epoch_ms=epoch)
    assert (parts.timestamp_ms, parts.worker_id, parts.sequence) == (epoch + 1234, 5, 6)


@pytest.mark.parametrize("bad", [-1, 2**63, True, 1.5, "abc", "-5", "", None])
def test_decode_refuses_what_is_not_a_63_bit_id(bad: object) -> None:
    with pytest.raises(InvalidArgument) as err:
        decode(bad)  # type: ignore[arg-type]
    assert err.value.field == "id"


def test_decode_accepts_the_extremes() -> None:
    assert decode(0).timestamp_ms == LEAF_EPOCH_MS
    assert decode(MAX_ID).sequence == MAX_SEQUENCE


# -- refusals at construction ------------------------------------------------------------

@pytest.mark.parametrize("worker_id", [-1, 1024, True, "1", 2.0])
def test_worker_id_outside_0_1023_is_refused(worker_id: object) -> None:
    with pytest.raises(InvalidArgument) as err:
        make(FakeMsClock(), worker_id=worker_id)  # type: ignore[arg-type]
    assert err.value.field == "worker_id"
    assert repr(worker_id) in str(err.value)


def test_worker_ids_0_and_1023_are_accepted() -> None:
    clock = FakeMsClock()
    assert decode(make(clock, worker_id=0).next_id()).worker_id == 0
    assert decode(make(clock, worker_id=1023).next_id()).worker_id == 1023


def test_epoch_in_the_future_is_refused() -> None:
    with pytest.raises(ConfigurationError) as err:
        make(FakeMsClock(T0), epoch_ms=T0 + 1)
    assert err.value.field == "LEAFPOOL_SNOWFLAKE_EPOCH"
    assert err.value.value == T0 + 1
    assert "future" in str(err.value)


def test_exhausted_time_bits_are_refused() -> None:
    with pytest.raises(ConfigurationError) as err:
        make(FakeMsClock(LEAF_EPOCH_MS + MAX_TIMESTAMP + 1))
    assert err.value.field == "LEAFPOOL_SNOWFLAKE_EPOCH"
    assert "41 time bits" in str(err.value)


def test_generation_stops_when_the_bits_run_out_never_a_negative_id() -> None:
    clock = FakeMsClock(LEAF_EPOCH_MS + MAX_TIMESTAMP)
    gen = make(clock, worker_id=1023, random_start=0)
    ids = gen.next_batch(IDS := 4096)
    assert len(ids) == IDS and max(ids) == MAX_ID and min(ids) > 0
    clock.advance(1)
    with pytest.raises(ConfigurationError):
        gen.next_id()
    with pytest.raises(ConfigurationError):
        gen.next_batch(1)


def test_exhaustion_horizon() -> None:
    clock = FakeMsClock(LEAF_EPOCH_MS + MAX_TIMESTAMP - 10 * 86_400_000)
    gen = make(clock)
    assert gen.exhausts_at_ms == LEAF_EPOCH_MS + 2**41
    assert gen.exhausts_within(30)
    assert not gen.exhausts_within(5)
    assert gen.years_left() == pytest.approx(10 / 365.25, rel=1e-3)
    young = make(FakeMsClock(T0))
    assert young.years_left() > 50 and not young.exhausts_within(365)


@pytest.mark.parametrize("field,value", [("random_start", -1), ("random_start", 4097),
                                         ("max_backwards_ms", -1),
                                         ("max_backwards_ms", MAX_BACKWARDS_MS + 1),
                                         ("high_water_ms", -5)])
def test_bad_tuning_is_refused(field: str, value: int) -> None:
    with pytest.raises(InvalidArgument) as err:
        make(FakeMsClock(), **{field: value})
    assert err.value.field == field


def test_from_settings_uses_the_snowflake_settings() -> None:
    settings = load_settings(snowflake_epoch=1_600_000_000_000, snowflake_random_sequence=0,
                             snowflake_max_backwards_ms=9)
    clock = FakeMsClock()
    gen = SnowflakeGenerator.from_settings(3, settings, clock=clock, sleep=clock.sleep)
    assert (gen.epoch_ms, gen.random_start, gen.max_backwards_ms) == (1_600_000_000_000, 0, 9)
    assert decode(gen.next_id(), epoch_ms=1_600_000_000_000).timestamp_ms == T0


# -- sequence start --------------------------------------------------------------------

def test_random_sequence_start_keeps_modulo_sharding_even() -> None:
    clock = FakeMsClock()
    gen = make(clock, random_start=100)
    ids = []
    for _ in range(20_000):  # low traffic: one ID per millisecond
        ids.append(gen.next_id())
        clock.advance(1)
    seqs = [decode(i).sequence for i in ids]
    assert max(seqs) < 100 and len(set(seqs)) == 100
    for n in (2, 4, 10):
        counts = Counter(i % n for i in ids)
        expected = len(ids) / n
        assert len(counts) == n
        assert all(abs(c - expected) < 0.1 * expected for c in counts.values()), (n, counts)
    # without the random start every ID of this traffic is at sequence 0: id % 2 is fixed
    flat_clock = FakeMsClock()
    flat = make(flat_clock, random_start=0)
    plain = []
    for _ in range(1000):
        plain.append(flat.next_id())
        flat_clock.advance(1)
    assert {i % 2 for i in plain} == {0}


def test_same_millisecond_counts_up_from_the_random_start() -> None:
    clock = FakeMsClock()
    gen = make(clock, random_start=100)
    ids = [gen.next_id() for _ in range(50)]
    seqs = [decode(i).sequence for i in ids]
    assert seqs == list(range(seqs[0], seqs[0] + 50)) and seqs[0] < 100
    assert {decode(i).timestamp_ms for i in ids} == {T0}


# -- strictly increasing, batches and the 4096 cap -------------------------------------

def test_ids_strictly_increase_across_next_id_and_next_batch() -> None:
    clock = FakeMsClock()
    gen = make(clock)
    out: list[int] = []
    for step in range(200):
        out.append(gen.next_id())
        out.extend(gen.next_batch(step * 37 % 5000))
        if step % 3 == 0:
            clock.advance(1)
    assert increasing(out)
    assert len(set(out)) == len(out) == gen.emitted


def test_batch_crosses_millisecond_boundaries_exactly() -> None:
    class Ticking(FakeMsClock):
        def __call__(self) -> int:  # one ms per reading
            value = super().__call__()
            self.now += 1
            return value

    clock = Ticking()
    gen = make(clock, random_start=100)
    ids = gen.next_batch(50_000)
    assert len(ids) == 50_000 and increasing(ids)
    by_ms: dict[int, list[int]] = {}
    for i in ids:
        parts = decode(i)
        assert parts.worker_id == 7
        by_ms.setdefault(parts.timestamp_ms, []).append(parts.sequence)
    stamps = sorted(by_ms)
    assert stamps == list(range(stamps[0], stamps[0] + len(stamps)))  # no ms skipped
    for stamp in stamps[:-1]:  # each full ms: random start .. 4095, contiguous
        seqs = by_ms[stamp]
        assert seqs[0] < 100 and seqs == list(range(seqs[0], MAX_SEQUENCE + 1))
    assert by_ms[stamps[-1]][0] < 100


def test_4096_per_millisecond_cap_waits_for_the_next_ms() -> None:
    clock = FakeMsClock()
    gen = make(clock, random_start=0)
    first = gen.next_batch(4096)
    assert [decode(i).sequence for i in first] == list(range(4096))
    assert {decode(i).timestamp_ms for i in first} == {T0}
    reads = clock.reads
    more = gen.next_batch(10)  # the clock stands still: the generator re-reads it, and
    assert clock.reads - reads > 1000  # only after many readings sleeps briefly
    assert clock.sleeps and max(clock.sleeps) <= 0.001
    assert {decode(i).timestamp_ms for i in more} == {T0 + 1}
    assert [decode(i).sequence for i in more] == list(range(10))
    assert increasing(first + more)


def test_next_id_obeys_the_4096_cap_too() -> None:
    clock = FakeMsClock()
    gen = make(clock, random_start=0)
    ids = [gen.next_id() for _ in range(4097)]
    assert [decode(i).timestamp_ms for i in ids[-2:]] == [T0, T0 + 1]
    assert decode(ids[-1]).sequence == 0 and increasing(ids)


def test_batch_of_zero_and_bad_sizes() -> None:
    gen = make(FakeMsClock())
    assert gen.next_batch(0) == []
    for bad in (-1, True, 1.5):
        with pytest.raises(InvalidArgument):
            gen.next_batch(bad)  # type: ignore[arg-type]


# -- clock moved backwards ---------------------------------------------------------------

def test_small_step_back_waits_twice_the_offset_and_retries() -> None:
    clock = FakeMsClock()
    gen = make(clock, max_backwards_ms=5)
    before = gen.next_id()
    clock.set(T0 - 3)
    after = gen.next_id()  # sleeps 6 ms: the fake clock is then at T0 + 3
    assert clock.sleeps == [pytest.approx(0.006)]
    assert decode(after).timestamp_ms == T0 + 3 and after > before
    assert gen.backwards_waits == 1 and gen.backwards_events == 0
    assert gen.last_backwards is not None and gen.last_backwards.offset_ms == 3
    assert not gen.last_backwards.raised


def test_small_step_back_still_behind_after_the_wait_raises() -> None:
    clock = FakeMsClock()
    gen = make(clock, max_backwards_ms=5)
    gen.next_id()
    clock.script = [T0 - 4, T0 - 1]  # still behind after waiting 8 ms
    with pytest.raises(ClockMovedBackwards) as err:
        gen.next_id()
    assert clock.sleeps == [pytest.approx(0.008)]
    assert err.value.offset_ms == 1 and err.value.worker_id == 7
    assert gen.backwards_events == 1
    assert gen.last_backwards is not None and gen.last_backwards.raised


def test_large_step_back_raises_counts_and_recovers_when_the_clock_catches_up() -> None:
    clock = FakeMsClock()
    gen = make(clock, max_backwards_ms=5)
    ids = gen.next_batch(100)
    clock.set(T0 - 6)
    with pytest.raises(ClockMovedBackwards) as err:
        gen.next_batch(10)
    assert err.value.offset_ms == 6 and clock.sleeps == []
    with pytest.raises(ClockMovedBackwards):
        gen.next_id()
    assert gen.backwards_events == 2
    assert gen.last_backwards is not None and gen.last_backwards.offset_ms == 6
    clock.set(T0 + 1)
    more = gen.next_batch(10)
    assert increasing(ids + more)


def test_zero_tolerance_raises_on_any_step_back() -> None:
    clock = FakeMsClock()
    gen = make(clock, max_backwards_ms=0)
    gen.next_id()
    clock.set(T0 - 1)
    with pytest.raises(ClockMovedBackwards):
        gen.next_id()


# -- high-water mark ---------------------------------------------------------------------

def test_high_water_is_never_emitted_small_gap_waits() -> None:
    clock = FakeMsClock()
    gen = make(clock, high_water_ms=T0 + 3)
    value = gen.next_id()
    assert clock.sleeps == [pytest.approx(0.006)]
    assert decode(value).timestamp_ms == T0 + 6 > T0 + 3


def test_high_water_equal_to_now_moves_to_the_next_ms() -> None:
    clock = FakeMsClock()
    gen = make(clock, high_water_ms=T0)
    ids = gen.next_batch(5)
    assert {decode(i).timestamp_ms for i in ids} == {T0 + 1}


def test_high_water_far_ahead_raises() -> None:
    clock = FakeMsClock()
    gen = make(clock, high_water_ms=T0 + 100)
    with pytest.raises(ClockMovedBackwards) as err:
        gen.next_batch(10)
    assert err.value.offset_ms == 100 and gen.backwards_events == 1
    clock.set(T0 + 101)
    assert decode(gen.next_id()).timestamp_ms == T0 + 101


# -- large batches -----------------------------------------------------------------------

def test_a_million_id_batch_is_unique_and_increasing() -> None:
    """(Its speed is measured by ``python -m bench``, not asserted here.)"""
    ids = SnowflakeGenerator(1).next_batch(1_000_000)
    assert increasing(ids) and len(set(ids)) == 1_000_000
