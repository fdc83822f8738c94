"""The worker-ID registry contract and what every mode shares (docs/design.md §8.1): the
caller claims once after the fork, records the high-water mark before pushing IDs that
reach it, checks before each push and releases on clean shutdown
(:class:`~leafpool.snowflake.registry.leased.LeasedGenerator` does it for you).

A mode supplies ``_acquire`` (take a worker ID, with the clock check of :meth:`_start`,
or start from the cache file with :meth:`_cached_start`) and ``_write_mark``; ``_renew``,
``_give_back``, ``_check_live`` and ``_close`` where it does more. The base does the
rest: the cache file, the background tick and the fencing.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, NamedTuple

from leafpool.core.config import Settings
from leafpool.core.errors import (
    BackendUnavailable,
    ClockMovedBackwards,
    InvalidArgument,
    WorkerIdUnavailable,
)
from leafpool.core.setting_values import validate_name
from leafpool.core.snowflake_layout import iso_utc, validate_worker_id, wall_clock_ms
from leafpool.snowflake.registry.cache import CacheFile, CacheRecord
from leafpool.snowflake.registry.identity import safe_identity, split_identity
from leafpool.snowflake.registry.ready import Readiness, ReadyFile, ready_dir
from leafpool.snowflake.registry.timing import LeaseDeadline

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Lease:
    """A claimed worker ID. ``last_timestamp_ms`` is the recorded high-water mark the
    generator must stay above; ``source`` says where the ID came from (``zookeeper``,
    ``mysql``, ``local-map``, ``local-host`` or ``cache``)."""

    worker_id: int
    last_timestamp_ms: int
    source: str
    identity: str
    mode: str


class Start(NamedTuple):
    """What ``_acquire`` found: the worker ID, the recorded mark, the mark written at
    the claim (``max(now, recorded)``) and where the ID came from."""

    worker_id: int
    recorded: int
    mark: int
    source: str


class BaseRegistry:
    """One identity's worker-ID registry (the mode is the subclass).

    ``background=False`` starts no thread; tests call :meth:`tick` themselves.
    ``start_wait_ms``: a start whose clock is behind the recorded timestamp by at most
    this much waits for the clock to pass it instead of failing (default 0: refuse)."""

    mode: ClassVar[str] = ""
    #: leasing modes (zk_recycle, mysql): the worker ID is held while renewed in time;
    #: a start from the cache file is allowed only while the cached lease runs.
    leased: ClassVar[bool] = False

    def __init__(
        self,
        settings: Settings,
        identity: str,
        *,
        clock: Callable[[], int] = wall_clock_ms,
        sleep: Callable[[float], None] = time.sleep,
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
        self.deadline = LeaseDeadline(settings, self.leased, monotonic, clock)
        self.cache_dir = Path(settings.snowflake_cache_dir) / self.name
        self.cache = CacheFile(self.cache_dir / f"{self.safe_identity}.json")
        self.ready = ReadyFile(ready_dir(settings), self.safe_identity)
        self.token = ""
        #: the current lease; the mark recorded for it; why it is fenced (for good)
        self.lease: Lease | None = None
        self.high_water_ms = 0
        self.fenced: str | None = None
        #: started from the cache file: the source did not answer
        self.degraded = False
        self._io = threading.RLock()
        self._ticker: tuple[threading.Thread, threading.Event] | None = None

    # -- the contract -------------------------------------------------------------------

    def claim(self) -> Lease:
        """Get a worker ID for this identity (or raise); idempotent while held."""
        with self._io:
            if self.lease is not None and self.fenced is None:
                return self.lease
            self._stop_ticker()
            self.lease, self.fenced, self.degraded = None, None, False
            self.token = secrets.token_hex(8)
            try:
                start = self._acquire(self.read_cache())
                validate_worker_id(start.worker_id)
                self._write_cache(start.worker_id, start.mark)
            except BaseException:
                self._close()
                raise
            lease = Lease(start.worker_id, start.recorded, start.source, self.identity, self.mode)
            self.lease, self.high_water_ms = lease, start.mark
            log.info(
                "%s: claimed worker %d (mode %s, source %s, last timestamp %d)",
                self.identity,
                lease.worker_id,
                self.mode,
                lease.source,
                start.recorded,
            )
            self.publish_ready()
        if self.background:
            interval = self.settings.snowflake_report_seconds
            if self.leased:
                interval = self.settings.snowflake_renew_seconds
            stop = threading.Event()
            name = f"leafpool-{self.mode}-{lease.worker_id}"
            thread = threading.Thread(target=self._ticks, args=(interval, stop), name=name)
            self._ticker = thread, stop
            thread.daemon = True
            thread.start()
        return lease

    def record_high_water(self, ms: int) -> None:
        """Make ``ms`` durable as the worker ID's high-water mark (never lowered)."""
        if isinstance(ms, bool) or not isinstance(ms, int) or ms < 0:
            raise InvalidArgument("ms", ms, "a timestamp in ms since 1970 (integer >= 0)")
        with self._io:
            self.check()
            lease = self.lease
            assert lease is not None
            if ms <= self.high_water_ms:
                return
            self._write_mark(lease, ms)
            self.high_water_ms = ms
            self._write_cache(lease.worker_id, ms)

    def check(self) -> None:
        """Raise :class:`WorkerIdUnavailable` unless the lease is held right now."""
        if self.lease is None:
            raise WorkerIdUnavailable(f"{self.identity}: no worker ID claimed")
        who = f"{self.identity}: worker {self.lease.worker_id}"
        if self.fenced is not None:
            raise WorkerIdUnavailable(f"{who} fenced: {self.fenced}")
        self._check_live(who)

    def release(self, last_emitted_ms: int | None = None) -> None:
        """Give the worker ID back (clean shutdown). With ``last_emitted_ms`` (the last
        timestamp the generator emitted) the recorded mark drops to
        ``max(last_emitted_ms, now)``: the window recorded ahead is not needed any more,
        so a quick restart is not refused by its own window."""
        self._stop_ticker()
        with self._io:
            lease = self.lease
            if lease is None:
                return
            self.ready.withdraw(self.identity, f"releasing worker {lease.worker_id}")
            final = self.high_water_ms
            if last_emitted_ms is not None:
                final = max(last_emitted_ms, self.clock(), lease.last_timestamp_ms)
            try:
                if self.fenced is None:
                    self._give_back(lease, final)
                    self._write_cache(lease.worker_id, final, lease_until=0)
                    self.high_water_ms = final
            finally:
                self.lease = None
                self._close()
            log.info(
                "%s: released worker %d (last timestamp %d)", self.identity, lease.worker_id, final
            )

    def tick(self) -> None:
        """One background round: report the clock to the source (renewing the lease in
        the leasing modes) and to the cache file; then the readiness file."""
        try:
            self._tick()
        finally:
            self.publish_ready()

    def _tick(self) -> None:
        with self._io:
            lease = self.lease
            if lease is None or self.fenced is not None:
                return
            ts = max(self.clock(), self.high_water_ms)
            try:
                if not self._renew(lease, ts):
                    return
            except BackendUnavailable as exc:
                log.warning("%s: renew failed: %s", self.identity, exc)
                return
            self.high_water_ms = ts
            self._write_cache(lease.worker_id, ts)

    def publish_ready(self) -> None:
        """Refresh the readiness file while the lease is held; remove it when not."""
        with self._io:
            lease = self.lease
            if lease is None:
                return
            try:
                self.check()
            except WorkerIdUnavailable as exc:
                self.ready.withdraw(self.identity, str(exc))
                return
            now = self.clock()
            until = self.deadline.until_wall if self.leased else (
                now + int(3_000 * self.settings.snowflake_report_seconds))
            self.ready.publish(Readiness(self.identity, lease.worker_id, self.mode,
                                         os.getpid(), until, now))

    # -- what a mode supplies -----------------------------------------------------------

    def _acquire(self, cached: CacheRecord | None) -> Start:
        """Take a worker ID in the source, check the clock against its mark
        (:meth:`_start`) and write the start mark there. ``cached``: this identity's
        cache file. On failure the base calls :meth:`_close`."""
        raise NotImplementedError

    def _write_mark(self, lease: Lease, ms: int) -> None:
        """Durably record ``ms`` in the source (raise if that is not possible)."""
        raise NotImplementedError

    def _renew(self, lease: Lease, ms: int) -> bool:
        """The background round's write of ``ms`` (False: skip this round)."""
        self._write_mark(lease, ms)
        return True

    def _give_back(self, lease: Lease, final_ms: int) -> None:
        """Write the final mark and give the ID back in the source (best effort)."""

    def _check_live(self, who: str) -> None:
        """Raise WorkerIdUnavailable while generating is not safe (self-fencing)."""
        self.deadline.check(who)

    def _close(self) -> None:
        """Drop connections and locks."""

    # -- shared steps -------------------------------------------------------------------

    def _start(
        self, worker_id: int, recorded: int, where: str, cached: CacheRecord | None, source: str
    ) -> Start:
        """The claim's clock check: the recorded mark is the larger of the source's
        (``recorded``, kept in ``where``) and the cache file's. A clock behind it is
        refused, unless it passes it within ``start_wait_ms``, which is waited out."""
        if cached is not None and cached.last_timestamp > recorded:
            recorded, where = cached.last_timestamp, f"the cache file {self.cache.path}"
        now = self.clock()
        if 0 < recorded - now <= self.start_wait_ms:
            log.warning(
                "%s: worker %d: clock is %d ms behind the timestamp recorded in %s; "
                "waiting for it to pass",
                self.identity,
                worker_id,
                recorded - now,
                where,
            )
            deadline = self.monotonic() + 2 * self.start_wait_ms / 1000 + 1
            while now < recorded and self.monotonic() <= deadline:
                self.sleep((recorded - now) / 1000)
                now = self.clock()
        if now < recorded:
            exc = ClockMovedBackwards(worker_id, recorded - now)
            exc.args = (
                f"worker {worker_id}: clock moved backwards by {recorded - now} ms: the local "
                f"clock {now} ({iso_utc(now)}) is behind the timestamp {recorded} "
                f"({iso_utc(recorded)}) recorded in {where}; refusing to start (fix the "
                "clock, or wait until it passes)",
            )
            log.error("%s: %s", self.identity, exc)
            raise exc
        return Start(worker_id, recorded, max(now, recorded), source)

    def _cached_start(self, reason: str, cause: BaseException, cached: CacheRecord | None) -> Start:
        """The source is unreachable: start from the cache file, with the clock check
        (leasing modes: only while the cached lease surely runs, which it then does)."""
        if cached is None:
            raise WorkerIdUnavailable(
                f"{self.identity}: {reason}, and there is no cache file {self.cache.path} "
                "to start from"
            ) from cause
        validate_worker_id(cached.worker_id)
        if self.leased:
            now = self.clock()
            if now >= cached.lease_until:
                raise WorkerIdUnavailable(
                    f"{self.identity}: {reason}; the cached lease of worker "
                    f"{cached.worker_id} is not held any more (lease_until "
                    f"{cached.lease_until}, now {now}): in mode {self.mode} another "
                    "process may own it now, so the cache cannot be used"
                ) from cause
            self.deadline.resume(cached.lease_until, now)
        where = f"the cache file {self.cache.path}"
        start = self._start(cached.worker_id, cached.last_timestamp, where, None, "cache")
        self.token = cached.token or self.token
        self.degraded = True
        log.warning("%s: %s; starting from the cache file", self.identity, reason)
        return start  # the claim logs the worker ID and the last timestamp

    def _fence(self, reason: str) -> None:
        if self.fenced is None:
            self.fenced = reason
            self.ready.withdraw(self.identity, f"fenced: {reason}")
            wid = self.lease.worker_id if self.lease else -1
            log.error("%s: worker %d fenced, generation must stop: %s", self.identity, wid, reason)

    def _ticks(self, interval: float, stop: threading.Event) -> None:
        """The background thread: :meth:`tick` every ``interval`` seconds until stopped."""
        while not stop.wait(interval):
            try:
                self.tick()
            except Exception:
                log.exception("%s: background tick failed", self.identity)

    def _stop_ticker(self) -> None:
        if self._ticker is not None:
            thread, stop = self._ticker
            stop.set()
            if thread is not threading.current_thread():
                thread.join(5.0)
            self._ticker = None

    def read_cache(self) -> CacheRecord | None:
        """This identity's cache record (a file another identity wrote is ignored)."""
        record = self.cache.read()
        if record is not None and record.identity and record.identity != self.identity:
            path, owner = self.cache.path, record.identity
            log.warning("%s: cache file %s belongs to %r; ignored", self.identity, path, owner)
            return None
        return record

    def _write_cache(
        self, worker_id: int, last_timestamp: int, lease_until: int | None = None
    ) -> None:
        self.cache.write(
            CacheRecord(
                worker_id=worker_id,
                last_timestamp=last_timestamp,
                identity=self.identity,
                mode=self.mode,
                token=self.token,
                lease_until=self.deadline.until_wall if lease_until is None else lease_until,
                updated_at=self.clock(),
                pid=os.getpid(),
            )
        )
