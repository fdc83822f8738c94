"""A fake millisecond clock for snowflake generators and worker-ID registries: tests move
it explicitly, script its next readings, and see every sleep (which advances it)."""

from __future__ import annotations

LEAF_EPOCH_MS = 1288834974657
T0 = 1_700_000_000_000  # 2023-11-14T22:13:20Z


class MsClock:
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
