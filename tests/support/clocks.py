"""Fake clocks for logic that reads time, named by what they return; tests move them
explicitly.

- :class:`FakeWallClock`: seconds since the epoch (a float), the ``wall`` clock of the
  refillers and the tag sync (and any clock in seconds, such as the lock's monotonic).
- :class:`FakeMsClock`: ms since the epoch (an int), the clock of snowflake generators
  and worker-ID registries; it also keeps a monotonic clock in seconds, sees every sleep
  (which advances both) and can be scripted with its next readings.
"""

from __future__ import annotations

LEAF_EPOCH_MS = 1288834974657
T0 = 1_700_000_000_000  # 2023-11-14T22:13:20Z, in ms


class FakeWallClock:
    """Seconds since the epoch."""

    def __init__(self, start: float = T0 / 1000) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeMsClock:
    """Milliseconds since the epoch, with :meth:`monotonic` (seconds) and :meth:`sleep`."""

    def __init__(self, start: int = T0) -> None:
        self.now = float(start)
        self.sleeps: list[float] = []
        self.reads = 0
        self.script: list[int] = []  # next readings, consumed before ``now``
        self.mono = 1_000.0  # a monotonic clock in seconds, moved by sleep/advance

    def __call__(self) -> int:
        self.reads += 1
        if self.script:
            self.now = float(self.script.pop(0))
        return int(self.now)

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds * 1000
        self.mono += seconds

    def advance(self, ms: float) -> None:
        self.now += ms
        self.mono += ms / 1000

    def monotonic(self) -> float:
        return self.mono

    def set(self, ms: int) -> None:
        self.now = float(ms)
