"""A beat scheduler that holds a Redis lock: with two beats started by mistake, one sends
the schedules and the other stands by (and says so loudly) until the first goes away.

The beat announces itself in the lock (its host or pod name) and keeps a subscription to
its own presence channel while it holds it (docs/design.md §3.1): when its process dies
the subscription goes with its connections, and the next beat to try takes the lock over
at once: the same beat restarted by its supervisor, or a standby beat elsewhere (it tries
every second). A beat that is alive is never taken over; one of an earlier release, which
announces nothing, is waited out as before (the lock's TTL).

Even without it, two beats would break nothing (the sweep marks each queued refill, the
tag sync is idempotent); the lock keeps the queues free of doubled control tasks.

The beat that takes the lock sends a tag sync and a sweep at once, before the schedule's
first interval: tags already in the database fill within seconds of the start, not one
``LEAFPOOL_TAG_SYNC_SECONDS`` later.

While it holds the lock it also runs the drop watcher (:mod:`leafpool.housekeeping.watch`, unless
``LEAFPOOL_WATCH=false`` or on a Redis Cluster) in a thread: a pop that takes a tag below
its low-water mark queues the refill task at once, and the sweep only backs it up.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from typing import Any

from celery.beat import PersistentScheduler

from leafpool.core.errors import LeafpoolError
from leafpool.core.version import __version__
from leafpool.housekeeping.sweep import QUEUED_SECONDS, Due
from leafpool.housekeeping.watch import DropWatcher, supported
from leafpool.redis.connect import connect
from leafpool.redis.lock import describe
from leafpool.redis.pool import Level, Pool
from leafpool.refill.sizing import outgrown as outgrown_by
from leafpool.snowflake.refiller import list_seconds
from workers.application import SWEEP_ENTRY, SYNC_ENTRY, settings, watching
from workers.tasks import REFILL_TASKS

log = logging.getLogger(__name__)

LOCK_TTL_SECONDS = 15.0
#: a standby beat tries the lock this often: it takes over within it of the holder's death
STANDBY_POLL_SECONDS = 1.0
#: the holder renews the lock (and checks its presence) at least this often
ACTIVE_TICK_SECONDS = 1.0
#: sent once when this beat takes the lock: the sync registers (and refills) the
#: database's tags, the sweep refills the tags Redis already knows
START_ENTRIES = (SYNC_ENTRY, SWEEP_ENTRY)


class LockedScheduler(PersistentScheduler):  # type: ignore[misc]
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._redis = connect(settings)
        self._pool = Pool(self._redis, settings.key_prefix)
        self._identity = f"{socket.gethostname()}"
        self._lock = self._pool.beat_lock(LOCK_TTL_SECONDS, identity=self._identity)
        self._watcher: DropWatcher | None = None
        self._active = False
        self._just_acquired = False
        self._standing_by: str | None = None  # the holder this beat last stood by for
        log.warning("leafpool %s: beat on %s started", __version__, self._identity)

    def _hold(self) -> bool:
        try:
            if self._active:
                if self._lock.extend():
                    return True
                self._active = False
                self._stop_watching()
                log.error("beat on %s: lost the beat lock; standing by", self._identity)
            if self._lock.acquire():
                self._active = True
                self._standing_by = None
                gone = self._lock.took_over_from
                log.warning("beat on %s: holds the beat lock, sending schedules%s",
                            self._identity, f" (taken over from {describe(gone)}, gone)"
                            if gone is not None else "")
                self._lock.took_over_from = None
                self._just_acquired = True
                return True
        except Exception as exc:
            log.error("beat on %s: cannot reach Redis for the beat lock: %s", self._identity, exc)
            return False
        holder = describe(self._lock.holder)
        # said when the holder changes, not at every try (a hot standby tries every second)
        log.log(logging.ERROR if holder != self._standing_by else logging.DEBUG,
                "beat on %s: ANOTHER BEAT IS RUNNING (lock %s held by %s); this one stands by",
                self._identity, self._lock.name, holder)
        self._standing_by = holder
        return False

    # -- the drop watcher (docs/design.md §3.7): runs while this beat holds the lock -------

    def _start_watching(self) -> None:
        if not watching or (self._watcher is not None and self._watcher.running):
            return
        if not supported(self._pool):
            log.warning(
                "beat on %s: Redis Cluster: no drop watcher, the sweep runs every %s s",
                self._identity,
                settings.sweep_seconds,
            )
            return
        seconds = {"segment": settings.pool_seconds, "snowflake": list_seconds(settings)}

        def outgrown(level: Level, rate: float) -> bool:
            return outgrown_by(
                rate, seconds.get(level.mode or "segment", 0.0), level.target, settings.pool_ceiling
            )

        self._watcher = DropWatcher(
            self._pool,
            self._queue_refill,
            interval_s=settings.watch_interval_ms / 1000,
            queued_seconds=QUEUED_SECONDS,  # short: a task that cannot run is queued again
            outgrown=outgrown if settings.burst_sizing else None,
            chunk=settings.chunk_size,  # the refill's chunk: a move is fenced per chunk alike
        ).start()
        log.info("beat on %s: drop watcher started", self._identity)

    def _stop_watching(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None

    def _queue_refill(self, due: Due) -> None:
        """The watcher's callback: the refill is a Celery task like the sweep's."""
        task = REFILL_TASKS.get(due.mode)
        if task is not None:
            self.app.send_task(task.name, args=[due.tag, due.force])

    def _send_start_entries(self) -> None:
        self._just_acquired = False
        for name in START_ENTRIES:
            entry = self.schedule.get(name)
            if entry is not None:
                log.info("beat on %s: %s once at the start", self._identity, entry.task)
                self.apply_entry(entry, producer=self.producer)  # the schedule is unchanged

    def tick(self, *args: Any, **kwargs: Any) -> float:
        if not self._hold():
            return STANDBY_POLL_SECONDS
        try:
            if self._just_acquired:
                self._send_start_entries()
            self._start_watching()  # again if its thread ended
            interval = float(super().tick(*args, **kwargs))
        except Exception as exc:  # e.g. no master while Sentinel fails over: keep beating
            log.error("beat on %s: schedules not sent (%s); trying again", self._identity, exc)
            return STANDBY_POLL_SECONDS
        return min(interval, ACTIVE_TICK_SECONDS)

    def close(self) -> None:
        self._stop_watching()
        if self._active:
            with contextlib.suppress(LeafpoolError):
                self._lock.release()
        super().close()
