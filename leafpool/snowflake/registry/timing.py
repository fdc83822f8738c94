"""The lease deadline of the leasing modes (``zk_recycle``, ``mysql``; docs/design.md
§8.1)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from leafpool.core.config import Settings
from leafpool.core.errors import ConfigurationError, WorkerIdUnavailable

#: without a successful renew for this fraction of the lease, the holder stops
FENCE_FRACTION = 2 / 3


class LeaseDeadline:
    """When a leasing holder must stop: with no renew succeeding for 2/3 of the lease
    (``lease_s``, the lease the source granted) :meth:`check` raises until one succeeds.
    A mode without a lease (``leased=False``) never has to stop."""

    def __init__(
        self,
        settings: Settings,
        leased: bool,
        monotonic: Callable[[], float],
        clock: Callable[[], int],
    ) -> None:
        self.leased = leased
        self.lease_s = settings.snowflake_lease_seconds
        if leased and settings.snowflake_renew_seconds >= self.lease_s * FENCE_FRACTION:
            raise ConfigurationError(
                "LEAFPOOL_SNOWFLAKE_RENEW_SECONDS",
                settings.snowflake_renew_seconds,
                f"must be below 2/3 of LEAFPOOL_SNOWFLAKE_LEASE_SECONDS={self.lease_s} "
                "(the holder fences itself when no renew succeeded for that long)",
            )
        self.monotonic = monotonic
        self.clock = clock
        self.last_ok = 0.0  # monotonic: when the last successful renew was sent
        self.last_ok_wall = 0  # the same moment by the wall clock, ms

    @property
    def fence_after_s(self) -> float:
        return self.lease_s * FENCE_FRACTION

    @property
    def until_wall(self) -> int:
        """Wall-clock ms until which the lease is surely ours (the cache file keeps it;
        0: no lease)."""
        return self.last_ok_wall + int(self.fence_after_s * 1000) if self.leased else 0

    @contextlib.contextmanager
    def renewing(self) -> Iterator[None]:
        """Around a renew: once it succeeds (no exception), the lease runs from when it
        was sent."""
        sent, sent_wall = self.monotonic(), self.clock()
        yield
        self.last_ok, self.last_ok_wall = sent, sent_wall

    def resume(self, lease_until: int, now_wall: int) -> None:
        """A start from the cache file: the cached lease runs until ``lease_until``."""
        self.last_ok_wall = lease_until - int(self.fence_after_s * 1000)
        self.last_ok = self.monotonic() - (now_wall - self.last_ok_wall) / 1000

    def check(self, who: str) -> None:
        age = self.monotonic() - self.last_ok
        if self.leased and age > self.fence_after_s:
            raise WorkerIdUnavailable(
                f"{who}: lease not renewed for {age:.1f}s (limit {self.fence_after_s:.1f}s); "
                "self-fenced until a renew succeeds"
            )
