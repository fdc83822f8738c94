"""The worker-ID registry contract and what every mode shares (docs/design.md §8.1): the
caller claims once after the fork, records the high-water mark before pushing IDs that
reach it, checks before each push and releases on clean shutdown
(:class:`~leafpool.snowflake.registry.leased.LeasedGenerator` does it for you).

A mode supplies ``_acquire`` (take a worker ID, with the clock check of :meth:`_start`,
or start from the cache file with :meth:`_cached_start`) and ``_write_mark``; ``_renew``,
``_give_back``, ``_check_live`` and ``_close`` where it does more. The base does the
rest: the cache file, the background tick, the fencing, and the mark written ahead that
lets a leasing holder ride through an outage of its source for as long as its lease
runs (docs/design.md §8.1): a record covered by the mark the source already holds
writes the cache file alone, and the tick's source I/O never holds up a record.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from leafpool.core.config import Settings
from leafpool.core.errors import BackendUnavailable, InvalidArgument, WorkerIdUnavailable
from leafpool.core.setting_values import validate_name
from leafpool.core.snowflake_layout import dc_range, validate_worker_id, wall_clock_ms
from leafpool.snowflake.registry.cache import CacheFile, CacheRecord
from leafpool.snowflake.registry.identity import safe_identity, split_identity
from leafpool.snowflake.registry.ready import Readiness, ReadyFile, ready_dir
from leafpool.snowflake.registry.start import Lease, Start, cached_start, clock_check
from leafpool.snowflake.registry.timing import LeaseDeadline

log = logging.getLogger(__name__)

__all__ = ["HOT_WRITE_SECONDS", "BaseRegistry", "Lease", "Start"]

#: how long a record that needs the source waits for it (for the lock of a source write
#: already in flight, and a ZooKeeper write's answer; the database's driver timeouts
#: bound a database write): a refill is never held up by a stalled source for longer
HOT_WRITE_SECONDS = 2.0


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
        self.dc = dc_range(settings.dc_id, settings.dc_count)  # docs/design.md §12.1
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
        #: the current lease; the mark recorded for it (the cache file's: at or above
        #: every timestamp emitted); why it is fenced (for good)
        self.lease: Lease | None = None
        self.high_water_ms = 0
        #: the mark the source surely holds (its writes confirmed), ahead of the clock by
        #: up to :meth:`ahead_ms` in the leasing modes: a record at or below it writes
        #: the cache file alone
        self.source_mark = 0
        self.fenced: str | None = None
        #: started from the cache file: the source did not answer
        self.degraded = False
        #: the state and the cache file (held briefly); ``_source``: one source write at
        #: a time (the tick, a record, the claim, the release), taken before ``_io`` and
        #: never while holding it, so a stalled source holds up no record it covers
        self._io = threading.RLock()
        self._source = threading.Lock()
        self.window_ms = int(settings.snowflake_report_seconds * 1000)
        self._ticker: tuple[threading.Thread, threading.Event] | None = None
        self._renewed = True  # the last tick's source write went through

    # -- the contract -------------------------------------------------------------------

    def claim(self) -> Lease:
        """Get a worker ID for this identity (or raise); idempotent while held."""
        if self.lease is not None and self.fenced is None:
            return self.lease
        self._stop_ticker()
        with self._source, self._io:
            if self.lease is not None and self.fenced is None:
                return self.lease
            self.lease, self.fenced, self.degraded = None, None, False
            self.token = secrets.token_hex(8)
            try:
                start = self._acquire(self.read_cache())
                validate_worker_id(start.worker_id)
                self.source_mark = start.mark if start.durable is None else start.durable
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

    def ahead_ms(self) -> int:
        """How far ahead of the clock a write to the source records the mark. Leasing
        modes: the time the holder may use its lease after a renew before it fences
        itself, plus the generator's window, so every record made while the lease runs
        is covered and needs no source write (docs/design.md §8.1); 0 in the others."""
        if not self.leased:
            return 0
        return int(self.deadline.fence_after_s * 1000) + self.window_ms

    def record_high_water(self, ms: int) -> None:
        """Make ``ms`` durable as the worker ID's high-water mark (never lowered): in the
        cache file, and in the source unless the mark it holds covers ``ms`` already (a
        write then records ``max(ms, now + ahead_ms())``)."""
        if isinstance(ms, bool) or not isinstance(ms, int) or ms < 0:
            raise InvalidArgument("ms", ms, "a timestamp in ms since 1970 (integer >= 0)")
        with self._io:
            self.check()
            if ms <= self.high_water_ms:
                return
            if ms <= self.source_mark or self._cache_stands_in():
                self._raise_high_water(ms)
                return
        if not self._source.acquire(timeout=HOT_WRITE_SECONDS):
            self._source_busy(ms)
            return
        try:
            with self._io:
                self.check()
                lease = self.lease
                assert lease is not None
                covered = ms <= max(self.high_water_ms, self.source_mark)
            if not covered:
                target = max(ms, self.clock() + self.ahead_ms(), self.source_mark)
                self._write_mark(lease, target)
                with self._io:
                    self.source_mark = max(self.source_mark, target)
            with self._io:
                self.check()
                self._raise_high_water(ms)
        finally:
            self._source.release()

    def renew_now(self) -> None:
        """Renew the lease in the caller's thread, once its deadline has passed (the
        source may answer again before the next tick): :class:`BackendUnavailable` while
        the source does not answer, :class:`WorkerIdUnavailable` when the renew finds
        the worker ID taken over (fenced)."""
        if not self._round(raising=True):
            raise BackendUnavailable(f"{self.identity}: {self.mode}: the lease could not be "
                                     "renewed (the source is not connected)")

    def _raise_high_water(self, ms: int) -> None:
        """With ``_io`` held: ``ms`` is the mark, in the cache file (fsynced)."""
        lease = self.lease
        assert lease is not None
        if ms > self.high_water_ms:
            self.high_water_ms = ms
            self._write_cache(lease.worker_id, ms)

    def _cache_stands_in(self) -> bool:
        """The cache file alone may record a mark now (mode ``zk`` while ZooKeeper does
        not answer: synced by the tick once it does)."""
        return False

    def _source_busy(self, ms: int) -> None:
        """A record found another source write in flight for :data:`HOT_WRITE_SECONDS`
        (a stalled source): raise, unless the cache file may stand in."""
        raise BackendUnavailable(
            f"{self.identity}: {self.mode}: high-water {ms} not recorded: a write to the "
            f"source has not returned for {HOT_WRITE_SECONDS:.0f}s (the source is stalled)")

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
        with self._source, self._io:
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
                    self.high_water_ms = self.source_mark = final
                    self._write_cache(lease.worker_id, final, lease_until=0)
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
            self._renewed = self._round(raising=False)
        finally:
            self.publish_ready()

    def _round(self, raising: bool) -> bool:
        """Report the clock to the source (a renew in the leasing modes), recording the
        mark ``ahead_ms()`` ahead, then the clock to the cache file. The source write
        holds ``_source`` only: a record it does not concern goes on meanwhile. False:
        the mode skipped the round (not connected)."""
        with self._source:
            with self._io:
                lease = self.lease
                if lease is None or self.fenced is not None:
                    if raising:
                        self.check()
                    return True
                now = self.clock()
                target = max(now + self.ahead_ms(), self.high_water_ms, self.source_mark)
            try:
                if not self._renew(lease, target):
                    return False
            except BackendUnavailable as exc:
                if raising:
                    raise
                log.warning("%s: renew failed: %s", self.identity, exc)
                return False
            with self._io:
                if self.lease is not lease or self.fenced is not None:
                    return True
                self.source_mark = max(self.source_mark, target)
                self.high_water_ms = max(now, self.high_water_ms)
                self._write_cache(lease.worker_id, self.high_water_ms)  # and the lease's end
            return True

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
        """Durably record ``ms`` in the source (raise if that is not possible): a
        record's write, within :data:`HOT_WRITE_SECONDS` or the driver's timeouts."""
        raise NotImplementedError

    def _renew(self, lease: Lease, ms: int) -> bool:
        """The background round's write of ``ms`` (False: skip this round); it may
        wait longer than a record's."""
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
        """The claim's clock check (:func:`~leafpool.snowflake.registry.start.clock_check`)."""
        return clock_check(self, worker_id, recorded, where, cached, source)

    def _cached_start(self, reason: str, cause: BaseException, cached: CacheRecord | None) -> Start:
        """The source is unreachable: start from the cache file
        (:func:`~leafpool.snowflake.registry.start.cached_start`)."""
        return cached_start(self, reason, cause, cached)

    def _fence(self, reason: str) -> None:
        if self.fenced is None:
            self.fenced = reason
            self.ready.withdraw(self.identity, f"fenced: {reason}")
            wid = self.lease.worker_id if self.lease else -1
            log.error("%s: worker %d fenced, generation must stop: %s", self.identity, wid, reason)

    def _ticks(self, interval: float, stop: threading.Event) -> None:
        """The background thread: :meth:`tick` every ``interval`` seconds until stopped,
        every second at most while the source does not answer (renewed soon after it is
        back: the next outage finds the mark covering the lease again)."""
        while not stop.wait(interval if self._renewed else min(interval, 1.0)):
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
                source_mark=self.source_mark,
            )
        )
