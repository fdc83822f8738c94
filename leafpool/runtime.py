"""Wiring: the Redis client, pool, segment store and refiller built from one
:class:`Settings`. The CLI, the HTTP service and the Celery workers each hold one
(workers build theirs after the fork)."""

from __future__ import annotations

import os
from functools import cached_property
from typing import TYPE_CHECKING

from leafpool.core.config import Settings, get_settings

if TYPE_CHECKING:
    from leafpool.redis.connect import RedisClient
    from leafpool.redis.pool import Pool
    from leafpool.segment.refiller import SegmentRefiller
    from leafpool.segment.store import SegmentStore
    from leafpool.snowflake.refiller import SnowflakeRefiller
    from leafpool.snowflake.registry.leased import LeasedGenerator


class Runtime:
    def __init__(self, settings: Settings | None = None, identity: str | None = None) -> None:
        self.settings = settings or get_settings()
        self.pid = os.getpid()
        self.identity = identity
        self._generator: LeasedGenerator | None = None
        self._snowflake: SnowflakeRefiller | None = None

    # redis-py is imported on first use too: the commands that never reach Redis (`leafpool
    # --help`, `db`, `decode`, `probe`...) start without it (a quarter of a second of CPU)
    @cached_property
    def redis(self) -> RedisClient:
        from leafpool.redis.connect import connect

        return connect(self.settings)

    @cached_property
    def pool(self) -> Pool:
        from leafpool.redis.pool import Pool

        return Pool(self.redis, self.settings.key_prefix)

    # the database side is imported on first use: `leafpool status` and the HTTP
    # service's reads start without SQLAlchemy (a tenth of a second)
    @cached_property
    def store(self) -> SegmentStore:
        from leafpool.segment.counter import own_slot
        from leafpool.segment.store import SegmentStore

        s = self.settings
        return SegmentStore.from_url(s.database_url, s.database_tls_used,
                                     own_slot(s.dc_segments, s.dc_id))

    @cached_property
    def refiller(self) -> SegmentRefiller:
        from leafpool.segment.refiller import SegmentRefiller

        return SegmentRefiller(self.pool, self.store, self.settings)

    def snowflake_refiller(self) -> SnowflakeRefiller:
        """This process's snowflake refiller; its worker ID is claimed by its first refill
        (in a Celery worker: after the fork; a refused claim is recorded in the tag's
        ``lease_state`` and tried again by the next refill) and released by
        :meth:`close`."""
        if self._snowflake is None:
            from leafpool.snowflake.refiller import SnowflakeRefiller
            from leafpool.snowflake.registry import LeasedGenerator, default_identity, open_registry

            identity = self.identity or default_identity()
            registry = open_registry(self.settings, identity,
                                     start_wait_ms=self.settings.snowflake_start_wait_ms)
            generator = LeasedGenerator(registry, self.settings)
            self._generator = generator
            self._snowflake = SnowflakeRefiller(self.pool, generator, self.settings)
        return self._snowflake

    def close(self) -> None:
        if self._generator is not None:
            self._generator.close()
            self._generator = None
            self._snowflake = None
        if "redis" in self.__dict__:
            self.redis.close()
        if "store" in self.__dict__:
            self.store.engine.dispose()
