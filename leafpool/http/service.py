"""What the handlers share: the settings, the token policy, the asyncio client (and its
:class:`~leafpool.redis.pool_async.AsyncPool`, through which every Redis command of the
service goes), a synchronous runtime whose segment store and pool serve the database
views and the metrics from worker threads, and the metrics registry."""

from __future__ import annotations

import math

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request

from leafpool import metrics
from leafpool.client import MAX_BATCH, AsyncClient
from leafpool.core.config import Settings
from leafpool.http.auth import Auth
from leafpool.redis.pool_async import AsyncPool
from leafpool.runtime import Runtime
from leafpool.status import TagStatus, tag_status

SEGMENT = "segment"
SNOWFLAKE = "snowflake"
MODES = (SEGMENT, SNOWFLAKE)


class Service:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.auth = Auth(settings.token_policy)  # parsed with the settings
        self.max_count = min(settings.http_max_count, MAX_BATCH)
        self.retry_after = max(1, math.ceil(settings.sweep_seconds))
        self.runtime = Runtime(settings)
        self.registry = metrics.make_registry(self.runtime.pool)
        self.http = metrics.http_metrics(self.registry)
        self._client: AsyncClient | None = None

    @property
    def client(self) -> AsyncClient:
        if self._client is None:
            self._client = AsyncClient(settings=self.settings, policy="wait",
                                       wait_seconds=self.settings.empty_wait_seconds)
            if self.settings.http_coalesce_max:  # docs/design.md §1.1
                self._client.coalesce(self.settings.http_coalesce_max,
                                      self.settings.http_coalesce_in_flight)
        return self._client

    @property
    def pool(self) -> AsyncPool:
        return self.client.pool

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        await run_in_threadpool(self.runtime.close)

    async def statuses(self, allowed: frozenset[str] | None = None) -> list[TagStatus]:
        """Every tag's status (only ``allowed`` ones, unless None), by tag."""
        names = await self.pool.tags()
        if allowed is not None:
            names = [n for n in names if n in allowed]
        return [tag_status(s) for s in await self.pool.snapshots(names)]


def service(request: Request) -> Service:
    svc: Service = request.app.state.service
    return svc
