"""The registry's time keeping: the background ticker, and the lease deadline of the
leasing modes (``zk_recycle``, ``mysql``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from leafpool.config import Settings
from leafpool.errors import ConfigurationError, WorkerIdUnavailable

log = logging.getLogger(__name__)

#: without a successful renew for this fraction of the lease, the holder stops
FENCE_FRACTION = 2 / 3


class Ticker:
    """A daemon thread calling ``fn`` every ``interval`` seconds until stopped."""

    def __init__(self, interval: float, fn: Callable[[], None], name: str,
                 label: str = "") -> None:
        self.interval = interval
        self.label = label or name
        self._fn = fn
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self._fn()
            except Exception:
                log.exception("%s: background tick failed", self.label)


class LeaseDeadline:
    """When a leasing holder must stop. It renews every ``snowflake_renew_seconds``,
    which must stay under 2/3 of the lease; with no renew succeeding for 2/3 of the lease
    it fences itself (:meth:`check` raises until a renew succeeds). Another process can
    take the worker ID over only after the whole lease (the ZooKeeper session timeout,
    or the lease by the database's clock), so the holder has stopped by then.

    ``lease_s`` is the lease the source granted (zk_recycle: the negotiated session
    timeout, set once connected)."""

    def __init__(self, settings: Settings, monotonic: Callable[[], float]) -> None:
        self.lease_s = settings.snowflake_lease_seconds
        if settings.snowflake_renew_seconds >= self.lease_s * FENCE_FRACTION:
            raise ConfigurationError(
                "LEAFPOOL_SNOWFLAKE_RENEW_SECONDS", settings.snowflake_renew_seconds,
                f"must be below 2/3 of LEAFPOOL_SNOWFLAKE_LEASE_SECONDS={self.lease_s} "
                "(the holder fences itself when no renew succeeded for that long)",
            )
        self.monotonic = monotonic
        self.last_ok = 0.0  # monotonic: when the last successful renew was sent
        self.last_ok_wall = 0  # the same moment by the wall clock, ms

    @property
    def fence_after_s(self) -> float:
        return self.lease_s * FENCE_FRACTION

    @property
    def until_wall(self) -> int:
        """Wall-clock ms until which the lease is surely ours (the cache file keeps it)."""
        return self.last_ok_wall + int(self.fence_after_s * 1000)

    def renewed(self, sent: float, sent_wall: int) -> None:
        """A renew sent at ``sent`` (monotonic) / ``sent_wall`` (ms) succeeded."""
        self.last_ok, self.last_ok_wall = sent, sent_wall

    def resume(self, lease_until: int, now_wall: int) -> None:
        """A start from the cache file: the cached lease runs until ``lease_until``."""
        self.last_ok_wall = lease_until - int(self.fence_after_s * 1000)
        self.last_ok = self.monotonic() - (now_wall - self.last_ok_wall) / 1000

    def check(self, who: str) -> None:
        age = self.monotonic() - self.last_ok
        if age > self.fence_after_s:
            raise WorkerIdUnavailable(
                f"{who}: lease not renewed for {age:.1f}s (limit {self.fence_after_s:.1f}s); "
                "self-fenced until a renew succeeds"
            )
