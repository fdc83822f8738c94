"""Snowflake IDs: the generator (docs/design.md §8, guarantee G4); the layout of an ID
is :mod:`leafpool.core.snowflake_layout`'s.

:class:`SnowflakeGenerator` is pure logic: the clock (ms since the Unix epoch) and the
sleep are injected, so tests drive it with a fake clock. It never emits

- a timestamp at or below the high-water mark it was given (the last timestamp the
  worker-ID registry recorded for this worker ID), nor one below a timestamp it already
  emitted: a small step back (<= ``max_backwards_ms``) is waited out (twice the offset,
  then one retry, as Leaf does); a larger one raises :class:`ClockMovedBackwards`;
- a negative or overflowed ID: construction is refused when the epoch is in the future
  or the 41 time bits are exhausted, and generation stops if they run out later.

Each new millisecond starts its sequence at a random value in ``[0, random_start)``
(Leaf: 0-99) so ``id % N`` sharding stays even at low traffic; the sequence then counts
up to 4095, the hard cap of 4096 IDs per millisecond per worker ID. :meth:`next_batch`
emits whole millisecond ranges with ``range()`` arithmetic, several million IDs per
second in CPython.

The generator is thread-safe (one lock per call), but one worker ID must be used by one
generator only: that is the registry's job (:mod:`leafpool.snowflake.registry`).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from leafpool.core.errors import ClockMovedBackwards, ConfigurationError, InvalidArgument
from leafpool.core.snowflake_layout import (
    EPOCH_ENV,
    IDS_PER_MS,
    LEAF_EPOCH_MS,
    MAX_BACKWARDS_MS,
    MAX_SEQUENCE,
    MAX_TIMESTAMP,
    MS_PER_DAY,
    MS_PER_YEAR,
    TIMESTAMP_BITS,
    TIMESTAMP_SHIFT,
    WORKER_SHIFT,
    iso_utc,
    validate_epoch,
    validate_worker_id,
    wall_clock_ms,
)

if TYPE_CHECKING:
    from leafpool.core.config import Settings

log = logging.getLogger(__name__)

_SPINS_BEFORE_SLEEP = 1_000
_SPIN_SLEEP_S = 0.0001


@dataclass(frozen=True)
class BackwardsEvent:
    """One clock step back (or a reading at/below the high-water mark)."""

    at_ms: int  # the clock reading
    last_ms: int  # the ms the generator could not go below
    offset_ms: int
    waited_ms: int  # how long it slept before retrying (0 when it raised at once)
    raised: bool


class SnowflakeGenerator:
    """Time-ordered 64-bit IDs for one worker ID.

    ``clock`` returns ms since the Unix epoch; ``sleep`` takes seconds. IDs are strictly
    increasing across all calls of one generator."""

    def __init__(
        self,
        worker_id: int,
        *,
        epoch_ms: int = LEAF_EPOCH_MS,
        clock: Callable[[], int] = wall_clock_ms,
        sleep: Callable[[float], None] = time.sleep,
        random_start: int = 100,
        max_backwards_ms: int = 5,
        high_water_ms: int = 0,
        rng: random.Random | None = None,
    ) -> None:
        self.worker_id = validate_worker_id(worker_id)
        now = clock()
        self.epoch_ms = validate_epoch(epoch_ms, now)
        if isinstance(random_start, bool) or not isinstance(random_start, int) or not (
            0 <= random_start <= IDS_PER_MS
        ):
            raise InvalidArgument("random_start", random_start,
                                  f"an integer from 0 (disabled) to {IDS_PER_MS}")
        if isinstance(max_backwards_ms, bool) or not isinstance(max_backwards_ms, int) or not (
            0 <= max_backwards_ms <= MAX_BACKWARDS_MS
        ):
            raise InvalidArgument("max_backwards_ms", max_backwards_ms,
                                  f"an integer from 0 to {MAX_BACKWARDS_MS}")
        if isinstance(high_water_ms, bool) or not isinstance(high_water_ms, int) or (
            high_water_ms < 0
        ):
            raise InvalidArgument("high_water_ms", high_water_ms, "an integer >= 0")
        self.random_start = random_start
        self.max_backwards_ms = max_backwards_ms
        self.high_water_ms = high_water_ms
        self._clock = clock
        self._sleep = sleep
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._worker_bits = self.worker_id << WORKER_SHIFT
        # The high-water mark is treated as a millisecond already used up: the next ID
        # is in a later ms, and a reading below it follows the clock-moved-back rule.
        self._last_ms = max(high_water_ms, self.epoch_ms - 1)
        self._seq = MAX_SEQUENCE
        self._base = 0
        self._emitted = 0
        self.backwards_events = 0  # times ClockMovedBackwards was raised
        self.backwards_waits = 0  # small steps back that were waited out
        self.last_backwards: BackwardsEvent | None = None

    @classmethod
    def from_settings(
        cls,
        worker_id: int,
        settings: Settings,
        *,
        high_water_ms: int = 0,
        clock: Callable[[], int] = wall_clock_ms,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> SnowflakeGenerator:
        return cls(
            worker_id,
            epoch_ms=settings.snowflake_epoch,
            clock=clock,
            sleep=sleep,
            random_start=settings.snowflake_random_sequence,
            max_backwards_ms=settings.snowflake_max_backwards_ms,
            high_water_ms=high_water_ms,
            rng=rng,
        )

    # -- state --------------------------------------------------------------------------

    @property
    def last_timestamp_ms(self) -> int | None:
        """The ms of the last ID emitted, or None before the first."""
        return self._last_ms if self._emitted else None

    @property
    def emitted(self) -> int:
        return self._emitted

    @property
    def exhausts_at_ms(self) -> int:
        """The first ms that no longer fits in the 41 time bits."""
        return self.epoch_ms + MAX_TIMESTAMP + 1

    def years_left(self) -> float:
        return (self.exhausts_at_ms - self._clock()) / MS_PER_YEAR

    def exhausts_within(self, days: float) -> bool:
        """True when the time bits run out within ``days`` (log it, export a metric)."""
        return self.exhausts_at_ms - self._clock() <= days * MS_PER_DAY

    # -- generation ---------------------------------------------------------------------

    def next_id(self) -> int:
        with self._lock:
            now = self._clock()
            while True:
                if now == self._last_ms:
                    seq = self._seq + 1
                    if seq <= MAX_SEQUENCE:
                        self._seq = seq
                        self._emitted += 1
                        return self._base | seq
                    now = self._wait_next_ms()
                elif now > self._last_ms:
                    seq = self._start_ms(now)
                    self._seq = seq
                    self._emitted += 1
                    return self._base | seq
                else:
                    now = self._moved_back(now)

    def next_batch(self, n: int) -> list[int]:
        """``n`` strictly increasing IDs, whole milliseconds at a time."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InvalidArgument("n", n, "an integer >= 0")
        out: list[int] = []
        remaining = n
        with self._lock:
            now = self._clock()
            while remaining:
                if now == self._last_ms:
                    start = self._seq + 1
                    if start > MAX_SEQUENCE:
                        now = self._wait_next_ms()
                        continue
                elif now > self._last_ms:
                    start = self._start_ms(now)
                else:
                    now = self._moved_back(now)
                    continue
                take = min(remaining, IDS_PER_MS - start)
                first = self._base + start
                out += range(first, first + take)
                self._seq = start + take - 1
                self._emitted += take
                remaining -= take
                if remaining:
                    now = self._clock()
        return out

    def next_ranges(self, n: int, max_ms: int) -> list[tuple[int, int]]:
        """Whole milliseconds, each as the half-open range of its IDs from the sequence
        it starts at to the last (4095): contiguous integers, strictly increasing from
        range to range, until they hold at least ``n`` IDs or ``max_ms`` milliseconds
        were taken (the rest of the current one first). A millisecond is one range, so a
        reserve of millions of IDs is a few thousand ``start:end`` strings; taking ``k``
        of them waits for ``k`` milliseconds of the clock."""
        for name, value in (("n", n), ("max_ms", max_ms)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise InvalidArgument(name, value, "an integer >= 0")
        out: list[tuple[int, int]] = []
        held = 0
        with self._lock:
            now = self._clock()
            while held < n and len(out) < max_ms:
                if now == self._last_ms:
                    start = self._seq + 1
                    if start > MAX_SEQUENCE:
                        now = self._wait_next_ms()
                        continue
                elif now > self._last_ms:
                    start = self._start_ms(now)
                else:
                    now = self._moved_back(now)
                    continue
                out.append((self._base + start, self._base + IDS_PER_MS))
                self._seq = MAX_SEQUENCE
                self._emitted += IDS_PER_MS - start
                held += IDS_PER_MS - start
                now = self._clock()
        return out

    # -- internals (called with the lock held) ------------------------------------------

    def _start_ms(self, now: int) -> int:
        """Make ``now`` (> the last ms) the current ms; return its first sequence."""
        offset = now - self.epoch_ms
        if offset > MAX_TIMESTAMP:
            raise ConfigurationError(
                EPOCH_ENV, self.epoch_ms,
                f"worker {self.worker_id}: the {TIMESTAMP_BITS} time bits ran out at "
                f"{iso_utc(self.exhausts_at_ms - 1)}; no ID can be generated",
            )
        self._last_ms = now
        self._base = (offset << TIMESTAMP_SHIFT) | self._worker_bits
        return self._rng.randrange(self.random_start) if self.random_start > 1 else 0

    def _wait_next_ms(self) -> int:
        """The current ms is used up: re-read the clock until it changes."""
        spins = 0
        while True:
            now = self._clock()
            if now != self._last_ms:
                return now
            spins += 1
            if spins >= _SPINS_BEFORE_SLEEP:
                self._sleep(_SPIN_SLEEP_S)
                spins = 0

    def _moved_back(self, now: int) -> int:
        """The clock reads below the last ms (or the high-water mark): wait out a small
        step (twice the offset, one retry), raise on a large one. Returns a new reading
        that is not below the last ms."""
        offset = self._last_ms - now
        if offset <= self.max_backwards_ms:
            waited = offset * 2
            log.warning("worker %d: clock moved backwards by %d ms (at %d, last %d); "
                        "waiting %d ms", self.worker_id, offset, now, self._last_ms, waited)
            self._sleep(waited / 1000)
            self.backwards_waits += 1
            retry = self._clock()
            if retry >= self._last_ms:
                self.last_backwards = BackwardsEvent(now, self._last_ms, offset, waited, False)
                return retry
            offset = self._last_ms - retry
            now = retry
        else:
            waited = 0
        self.backwards_events += 1
        self.last_backwards = BackwardsEvent(now, self._last_ms, offset, waited, True)
        log.error("worker %d: clock moved backwards by %d ms (at %d, last %d); refusing to "
                  "generate (event %d)", self.worker_id, offset, now, self._last_ms,
                  self.backwards_events)
        raise ClockMovedBackwards(self.worker_id, offset)
