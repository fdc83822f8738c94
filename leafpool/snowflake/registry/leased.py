"""A snowflake generator bound to a worker-ID lease: the caller's side of the registry
contract (:mod:`leafpool.snowflake.registry.base`) in one object. The IDs
:meth:`LeasedGenerator.next_batch` (and the ranges :meth:`LeasedGenerator.next_ranges`)
returns may be pushed: the recorded mark covers them (written ``window_ms`` ahead, about
once a window), so a restarted or reclaimed worker ID starts above them. A lease whose
deadline passed while its source was down is renewed here, in the caller's thread, so
generation resumes at the first call after the source answers again, not at the next
background tick.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from leafpool.core.config import Settings
from leafpool.core.errors import LeafpoolError, WorkerIdUnavailable
from leafpool.core.snowflake_layout import wall_clock_ms
from leafpool.snowflake.generator import SnowflakeGenerator
from leafpool.snowflake.registry.base import BaseRegistry, Lease

log = logging.getLogger(__name__)


class LeasedGenerator:
    def __init__(
        self,
        registry: BaseRegistry,
        settings: Settings,
        *,
        window_ms: int | None = None,
        clock: Callable[[], int] = wall_clock_ms,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.registry = registry
        self.settings = settings
        self.window_ms = (
            int(settings.snowflake_report_seconds * 1000) if window_ms is None else window_ms
        )
        self._generator_kwargs: dict[str, Any] = {"clock": clock, "sleep": sleep, "rng": rng}
        self.generator: SnowflakeGenerator | None = None
        self.lease: Lease | None = None
        self._recorded = 0
        # one generator per lease: a claim at start (a thread) and a first refill may race
        self._lock = threading.RLock()

    def start(self) -> Lease:
        """Claim a worker ID and build the generator above its recorded timestamp
        (again only after the lease was lost: while held, the lease in use)."""
        with self._lock:
            if self.generator is not None and self.lease is not None and (
                    self.registry.lease is self.lease and self.registry.fenced is None):
                return self.lease
            return self._start()

    def _start(self) -> Lease:
        lease = self.registry.claim()
        self.generator = SnowflakeGenerator.from_settings(
            lease.worker_id,
            self.settings,
            high_water_ms=lease.last_timestamp_ms,
            **self._generator_kwargs,
        )
        self.lease = lease
        self._recorded = lease.last_timestamp_ms
        days = self.settings.snowflake_exhaustion_warn_days
        if self.generator.exhausts_within(days):
            log.warning(
                "worker %d: the snowflake time bits run out in %.2f years "
                "(LEAFPOOL_SNOWFLAKE_EPOCH=%d)",
                lease.worker_id,
                self.generator.years_left(),
                self.settings.snowflake_epoch,
            )
        return lease

    def keep_claimed(self, stop: threading.Event, retry_s: float) -> None:
        """Hold a worker ID until ``stop``: claim (tried again every ``retry_s`` while
        refused), and once the lease is lost (fenced: the process stopped generating and
        turned not ready) claim again, above the recorded mark, as soon as the source
        allows. For a thread of a worker process (LEAFPOOL_SNOWFLAKE_CLAIM_AT_START)."""
        who = self.registry.identity
        while not stop.is_set():
            if self.registry.lease is not None and self.registry.fenced is None:
                stop.wait(retry_s)
                continue
            try:
                lease = self.start()
            except LeafpoolError as exc:
                log.warning("%s: worker ID not claimed (%s); trying again in %ss",
                            who, exc, retry_s)
                stop.wait(retry_s)
                continue
            log.info("%s: holds worker %d", who, lease.worker_id)

    def lease_state(self, error: LeafpoolError | None = None) -> str:
        """What status shows for this generator's worker ID: ``held (mode, from
        source)``, ``fenced: <why>`` once the registry fenced it (for good), or
        ``unavailable: <error>`` when no worker ID could be claimed."""
        fenced = self.registry.fenced
        if fenced is not None:
            return f"fenced: {fenced}"
        lease = self.lease
        if error is None and lease is not None:
            return f"held ({lease.mode}, from {lease.source})"
        return f"unavailable: {error}" if error is not None else "none"

    def next_batch(self, n: int) -> list[int]:
        """``n`` IDs, the recorded mark covering their timestamps (a window ahead)."""
        with self._lock:
            generator = self._live()
            ids = generator.next_batch(n)
            self._record(generator)
            return ids

    def next_ranges(self, n: int, max_ms: int) -> list[tuple[int, int]]:
        """Whole milliseconds as half-open ranges of IDs (at least ``n`` IDs, at most
        ``max_ms`` ranges: :meth:`SnowflakeGenerator.next_ranges`), the recorded mark
        covering them."""
        with self._lock:
            generator = self._live()
            ranges = generator.next_ranges(n, max_ms)
            self._record(generator)
            return ranges

    def live(self) -> bool:
        """Claimed, and the lease surely held right now (no source asked)."""
        if self.generator is None:
            return False
        try:
            self.registry.check()
        except WorkerIdUnavailable:
            return False
        return True

    def _live(self) -> SnowflakeGenerator:
        """The generator, once the lease is surely held: claimed if it was not, renewed
        now if its deadline passed (the source down meanwhile: BackendUnavailable)."""
        if self.generator is None:
            self.start()
        assert self.generator is not None
        registry = self.registry
        try:
            registry.check()
        except WorkerIdUnavailable:
            if registry.lease is None or registry.fenced is not None or not registry.leased:
                raise
            registry.renew_now()
            registry.check()
        return self.generator

    def _record(self, generator: SnowflakeGenerator) -> None:
        last = generator.last_timestamp_ms
        if last is not None and last > self._recorded:
            self.registry.record_high_water(last + self.window_ms)
            self._recorded = last + self.window_ms
        self.registry.check()

    def next_id(self) -> int:
        return self.next_batch(1)[0]

    def close(self) -> None:
        """Release the worker ID (clean shutdown)."""
        with self._lock:
            self._close()

    def _close(self) -> None:
        gen = self.generator
        last = gen.last_timestamp_ms if gen is not None else None
        try:
            self.registry.release(last_emitted_ms=last)
        except LeafpoolError as exc:
            wid = self.lease.worker_id if self.lease else -1
            log.warning("worker %d: releasing the worker ID failed: %s", wid, exc)
        self.generator = None
        self.lease = None

    def __enter__(self) -> LeasedGenerator:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
