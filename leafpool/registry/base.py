"""The worker-ID registry interface and what every mode shares.

A registry gives one generator process (an *identity*) a worker ID and keeps, per
worker ID, the high-water timestamp: the largest ms a generator may have pushed IDs for.
The contract the caller follows (:class:`~leafpool.registry.leased.LeasedGenerator` does
it for you):

1. :meth:`WorkerIdRegistry.claim` once (after the fork); it returns a :class:`Lease`.
   The generator is built with ``high_water_ms=lease.last_timestamp_ms`` and so never
   emits a timestamp at or below it.
2. Before pushing IDs whose timestamps reach ``ms``: :meth:`record_high_water` with
   ``ms`` or more (a window ahead, so it is not called per batch). It returns only when
   the mark is durable in the source and in the local cache file, and raises when the
   lease is lost.
3. :meth:`check` before each push: it raises :class:`WorkerIdUnavailable` once the
   registry has fenced the holder (lease lost or not renewed in time).
4. :meth:`release` on clean shutdown.

A start is refused when the local clock is behind the recorded timestamp, whichever
source supplied it (the source or the cache file); unlike Leaf's holder, a start from
the cache file is held to the same check.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from leafpool.config import Settings
from leafpool.errors import ClockMovedBackwards, InvalidArgument, WorkerIdUnavailable
from leafpool.registry.cache import CacheFile, CacheRecord
from leafpool.registry.identity import safe_identity, split_identity, validate_name
from leafpool.snowflake import iso_utc, validate_worker_id, wall_clock_ms

log = logging.getLogger(__name__)

Clock = Callable[[], int]
Sleep = Callable[[float], None]


@dataclass(frozen=True)
class Lease:
    """A claimed worker ID. ``last_timestamp_ms`` is the recorded high-water mark the
    generator must stay above; ``source`` says where the ID came from (``zookeeper``,
    ``mysql``, ``local-map`` or ``cache``)."""

    worker_id: int
    last_timestamp_ms: int
    source: str
    identity: str
    mode: str


def clock_behind(worker_id: int, now: int, recorded: int, where: str) -> ClockMovedBackwards:
    """ClockMovedBackwards with a message naming the recorded timestamp and its source."""
    exc = ClockMovedBackwards(worker_id, recorded - now)
    exc.args = (
        f"worker {worker_id}: clock moved backwards by {recorded - now} ms: the local clock "
        f"{now} ({iso_utc(now)}) is behind the timestamp {recorded} ({iso_utc(recorded)}) "
        f"recorded in {where}; refusing to start (fix the clock, or wait until it passes)",
    )
    return exc


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


class WorkerIdRegistry(ABC):
    """The interface every worker-ID mode implements."""

    mode: ClassVar[str]

    @abstractmethod
    def claim(self) -> Lease:
        """Get a worker ID for this identity (or raise); idempotent while held."""

    @abstractmethod
    def record_high_water(self, ms: int) -> None:
        """Make ``ms`` durable as the worker ID's high-water mark (never lowered)."""

    @abstractmethod
    def check(self) -> None:
        """Raise :class:`WorkerIdUnavailable` unless the lease is held right now."""

    @abstractmethod
    def release(self, last_emitted_ms: int | None = None) -> None:
        """Give the worker ID back (clean shutdown). With ``last_emitted_ms`` (the last
        timestamp the generator emitted) the recorded mark drops to
        ``max(last_emitted_ms, now)``: the window recorded ahead is not needed any more,
        so a quick restart is not refused by its own window."""

    @property
    @abstractmethod
    def lease(self) -> Lease | None:
        """The current lease, if any."""

    def __enter__(self) -> WorkerIdRegistry:
        self.claim()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class BaseRegistry(WorkerIdRegistry):
    """Shared state: identity, cache file, clock check, fencing, background ticker.

    ``background=False`` starts no thread; tests call :meth:`tick` themselves.
    ``start_wait_ms``: a start whose clock is behind the recorded timestamp by at most
    this much waits for the clock to pass it instead of failing (default 0: refuse)."""

    mode: ClassVar[str] = ""
    #: leased modes (zk_recycle, mysql): a start from the cache file is allowed only
    #: while the cached lease is surely still ours.
    leased: ClassVar[bool] = False

    def __init__(
        self,
        settings: Settings,
        identity: str,
        *,
        clock: Clock = wall_clock_ms,
        sleep: Sleep = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
        background: bool = True,
        start_wait_ms: int = 0,
    ) -> None:
        self.settings = settings
        self.identity = identity
        self.safe_identity = safe_identity(identity)
        self.host, self.rest = split_identity(identity)
        self.name = validate_name(settings.snowflake_name)
        self.clock = clock
        self.sleep = sleep
        self.monotonic = monotonic
        self.background = background
        self.start_wait_ms = start_wait_ms
        self.cache_dir = Path(settings.snowflake_cache_dir) / self.name
        self.cache = CacheFile(self.cache_dir / f"{self.safe_identity}.json")
        self.token = ""
        self._lease: Lease | None = None
        self._high_water = 0
        self._fenced: str | None = None  # permanent: the lease is lost
        self._io = threading.RLock()
        self._ticker: Ticker | None = None

    # -- interface ----------------------------------------------------------------------

    @property
    def lease(self) -> Lease | None:
        return self._lease

    @property
    def high_water_ms(self) -> int:
        return self._high_water

    @property
    def fenced(self) -> str | None:
        """Why the holder is fenced (permanently), or None."""
        return self._fenced

    def check(self) -> None:
        if self._lease is None:
            raise WorkerIdUnavailable(f"{self.identity}: no worker ID claimed")
        if self._fenced is not None:
            raise WorkerIdUnavailable(
                f"{self.identity}: worker {self._lease.worker_id} fenced: {self._fenced}"
            )
        self._check_live()

    def claim(self) -> Lease:
        with self._io:
            if self._lease is not None and self._fenced is None:
                return self._lease
            self._stop_ticker()
            self._lease = None
            self._fenced = None
            self.token = secrets.token_hex(8)
            lease = self._claim()
            validate_worker_id(lease.worker_id)
            self._lease = lease
            self._high_water = max(self._high_water, lease.last_timestamp_ms)
            log.info("%s: claimed worker %d (mode %s, source %s, last timestamp %d)",
                     self.identity, lease.worker_id, self.mode, lease.source,
                     lease.last_timestamp_ms)
        if self.background:
            self._ticker = Ticker(self._tick_interval(), self.tick,
                                  f"leafpool-{self.mode}-{lease.worker_id}", self.identity)
            self._ticker.start()
        return lease

    def record_high_water(self, ms: int) -> None:
        if isinstance(ms, bool) or not isinstance(ms, int) or ms < 0:
            raise InvalidArgument("ms", ms, "a timestamp in ms since 1970 (integer >= 0)")
        with self._io:
            lease = self._require_lease()
            if ms <= self._high_water:
                self.check()
                return
            self._record(lease, ms)
            self._high_water = ms
            self._write_cache(lease.worker_id, ms)

    def release(self, last_emitted_ms: int | None = None) -> None:
        self._stop_ticker()
        with self._io:
            lease = self._lease
            if lease is None:
                return
            final = self._high_water
            if last_emitted_ms is not None:
                final = max(last_emitted_ms, self.clock(), lease.last_timestamp_ms)
            try:
                if self._fenced is None:
                    self._release(lease, final)
                    self._write_cache(lease.worker_id, final, lease_until=0)
                    self._high_water = final
            finally:
                self._lease = None
                self._close()
            log.info("%s: released worker %d (last timestamp %d)", self.identity,
                     lease.worker_id, final)

    def tick(self) -> None:
        """One background round: report/renew (mode specific)."""
        with self._io:
            if self._lease is None or self._fenced is not None:
                return
            self._tick(self._lease)

    # -- mode hooks ---------------------------------------------------------------------

    @abstractmethod
    def _claim(self) -> Lease: ...

    @abstractmethod
    def _record(self, lease: Lease, ms: int) -> None:
        """Durably record ``ms`` in the source (raise if that is not possible)."""

    def _release(self, lease: Lease, final_ms: int) -> None:
        """Write the final mark and give the ID back in the source (best effort)."""

    def _tick(self, lease: Lease) -> None:
        """Background report/renew."""

    def _tick_interval(self) -> float:
        return self.settings.snowflake_report_seconds

    def _check_live(self) -> None:
        """Mode-specific liveness (self-fencing); raise WorkerIdUnavailable."""

    def _close(self) -> None:
        """Drop connections."""

    # -- shared helpers -----------------------------------------------------------------

    def _require_lease(self) -> Lease:
        self.check()
        assert self._lease is not None
        return self._lease

    def _fence(self, reason: str) -> None:
        if self._fenced is None:
            self._fenced = reason
            wid = self._lease.worker_id if self._lease else -1
            log.error("%s: worker %d fenced, generation must stop: %s", self.identity, wid,
                      reason)

    def _stop_ticker(self) -> None:
        if self._ticker is not None:
            self._ticker.stop()
            self._ticker = None

    def read_cache(self) -> CacheRecord | None:
        record = self.cache.read()
        if record is not None and record.identity and record.identity != self.identity:
            log.warning("%s: cache file %s belongs to %r; ignored", self.identity,
                        self.cache.path, record.identity)
            return None
        return record

    def _write_cache(self, worker_id: int, last_timestamp: int, lease_until: int | None = None
                     ) -> None:
        if lease_until is None:
            lease_until = self._lease_until()
        self.cache.write(CacheRecord(
            worker_id=worker_id, last_timestamp=last_timestamp, identity=self.identity,
            mode=self.mode, token=self.token, lease_until=lease_until,
            updated_at=self.clock(), pid=os.getpid(),
        ))

    def _lease_until(self) -> int:
        """Leased modes: the wall-clock ms until which the lease is surely ours."""
        return 0

    def _verify_clock(self, worker_id: int, recorded: int, where: str) -> int:
        """Refuse a start whose clock is behind ``recorded`` (beyond ``start_wait_ms``,
        which is waited out). Returns the clock reading."""
        now = self.clock()
        if now >= recorded:
            return now
        behind = recorded - now
        if behind > self.start_wait_ms:
            log.error("%s: worker %d: clock %d is behind the timestamp %d recorded in %s",
                      self.identity, worker_id, now, recorded, where)
            raise clock_behind(worker_id, now, recorded, where)
        log.warning("%s: worker %d: clock is %d ms behind the timestamp recorded in %s; "
                    "waiting for it to pass", self.identity, worker_id, behind, where)
        deadline = self.monotonic() + 2 * self.start_wait_ms / 1000 + 1
        while now < recorded:
            if self.monotonic() > deadline:
                raise clock_behind(worker_id, now, recorded, where)
            self.sleep((recorded - now) / 1000)
            now = self.clock()
        return now

    def _cached_start(self, reason: str, cause: BaseException | None = None) -> Lease:
        """The source is unreachable: start from the cache file, with the clock check."""
        record = self.read_cache()
        if record is None:
            raise WorkerIdUnavailable(
                f"{self.identity}: {reason}, and there is no cache file {self.cache.path} "
                "to start from"
            ) from cause
        validate_worker_id(record.worker_id)
        if self.leased:
            now = self.clock()
            if now >= record.lease_until:
                raise WorkerIdUnavailable(
                    f"{self.identity}: {reason}; the cached lease of worker "
                    f"{record.worker_id} is not held any more (lease_until "
                    f"{record.lease_until}, now {now}): in mode {self.mode} another "
                    "process may own it now, so the cache cannot be used"
                ) from cause
        self._verify_clock(record.worker_id, record.last_timestamp,
                           f"the cache file {self.cache.path}")
        self.token = record.token or self.token
        log.warning("%s: %s; starting from the cache file with worker %d (last timestamp "
                    "%d)", self.identity, reason, record.worker_id, record.last_timestamp)
        return Lease(record.worker_id, record.last_timestamp, "cache", self.identity,
                     self.mode)

    def describe(self) -> dict[str, Any]:
        lease = self._lease
        return {
            "mode": self.mode,
            "identity": self.identity,
            "worker_id": lease.worker_id if lease else None,
            "source": lease.source if lease else None,
            "high_water_ms": self._high_water,
            "fenced": self._fenced,
        }
