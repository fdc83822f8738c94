"""A beat scheduler that holds a Redis lock: with two beats started by mistake, one sends
the schedules and the other stands by (and says so loudly) until the first goes away.

Even without it, two beats would break nothing (the sweep marks each queued refill, the
tag sync is idempotent); the lock keeps the queues free of doubled control tasks.

The beat that takes the lock sends a tag sync and a sweep at once, before the schedule's
first interval: tags already in the database fill within seconds of the start, not one
``LEAFPOOL_TAG_SYNC_SECONDS`` later.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from typing import Any

from celery.beat import PersistentScheduler
from redis.exceptions import LockError

from leafpool.keys import Keys
from leafpool.pool import Pool
from leafpool.redis_conn import connect
from workers.application import SWEEP_ENTRY, SYNC_ENTRY, settings

log = logging.getLogger(__name__)

LOCK_TTL_SECONDS = 15.0
STANDBY_POLL_SECONDS = 2.0
#: sent once when this beat takes the lock: the sync registers (and refills) the
#: database's tags, the sweep refills the tags Redis already knows
START_ENTRIES = (SYNC_ENTRY, SWEEP_ENTRY)


class LockedScheduler(PersistentScheduler):  # type: ignore[misc]
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._redis = connect(settings)
        self._lock = Pool(self._redis, settings.key_prefix).beat_lock(LOCK_TTL_SECONDS)
        self._active = False
        self._just_acquired = False
        self._identity = f"{socket.gethostname()}"

    def _hold(self) -> bool:
        try:
            if self._active:
                try:
                    self._lock.extend(LOCK_TTL_SECONDS, replace_ttl=True)
                    return True
                except LockError:
                    self._active = False
                    log.error("beat on %s: lost the beat lock; standing by", self._identity)
            if self._lock.acquire(blocking=False):
                self._active = True
                log.warning("beat on %s: holds the beat lock, sending schedules",
                            self._identity)
                self._just_acquired = True
                return True
        except Exception as exc:
            log.error("beat on %s: cannot reach Redis for the beat lock: %s",
                      self._identity, exc)
            return False
        log.error("beat on %s: ANOTHER BEAT IS RUNNING (lock %s held); this one stands by",
                  self._identity, Keys(settings.key_prefix).beat_lock)
        return False

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
            interval = float(super().tick(*args, **kwargs))
        except Exception as exc:  # e.g. no master while Sentinel fails over: keep beating
            log.error("beat on %s: schedules not sent (%s); trying again", self._identity, exc)
            return STANDBY_POLL_SECONDS
        return min(interval, LOCK_TTL_SECONDS / 3)

    def close(self) -> None:
        if self._active:
            with contextlib.suppress(LockError):
                self._lock.release()
        super().close()
