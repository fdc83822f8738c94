"""Wiring: the Redis client, pool, segment store and refiller built from one
:class:`Settings`. The CLI, the HTTP service and the Celery workers each hold one
(workers build theirs after the fork)."""

from __future__ import annotations

import os
from functools import cached_property

import redis

from leafpool.config import Settings, get_settings
from leafpool.pool import Pool
from leafpool.redis_conn import connect
from leafpool.refill import SegmentRefiller
from leafpool.store import SegmentStore


class Runtime:
    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or get_settings()
        self.pid = os.getpid()

    @cached_property
    def redis(self) -> redis.Redis:
        return connect(self.settings.redis_url)

    @cached_property
    def pool(self) -> Pool:
        return Pool(self.redis, self.settings.key_prefix)

    @cached_property
    def store(self) -> SegmentStore:
        return SegmentStore.from_url(self.settings.database_url)

    @cached_property
    def refiller(self) -> SegmentRefiller:
        return SegmentRefiller(self.pool, self.store, self.settings)

    def close(self) -> None:
        if "redis" in self.__dict__:
            self.redis.close()
        if "store" in self.__dict__:
            self.store.engine.dispose()
