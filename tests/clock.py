"""A fake clock for logic that reads time: tests move it explicitly."""

from __future__ import annotations


class FakeClock:
    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def ms(self) -> int:
        return int(self.now * 1000)
