"""The application client: ``next_id(tag)`` and ``next_ids(tag, n)`` are one ``LPOP``
each on the hot path; :class:`AsyncClient` is the asyncio twin.

On an empty pool the client applies a policy (``LEAFPOOL_EMPTY_POLICY``):

- ``raise``: raise :class:`PoolEmpty` at once;
- ``wait``: block (``BLPOP``) up to ``LEAFPOOL_EMPTY_WAIT_SECONDS`` for the refill;
- ``reserve``: take IDs straight from the reserve head (in order, fenced by a Lua
  script), then wait as ``wait`` does if the reserve is empty too.

Every empty-pool hit is counted in the tag's state and asks the sweep for a refill. An
unknown tag raises :class:`UnknownTag`; no path ever returns a sentinel ID (G5).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Literal, TypeVar

from leafpool.core.config import Settings, get_settings
from leafpool.core.errors import (
    BackendUnavailable,
    InvalidArgument,
    PoolEmpty,
    PoolEmptyDatabaseUnreachable,
    ReplicasBehind,
    UnknownTag,
)
from leafpool.core.tags import validate_tag
from leafpool.redis import scripts
from leafpool.redis.coalesce import IN_FLIGHT, Coalescer
from leafpool.redis.connect import AsyncRedisClient, RedisClient, connect, connect_async
from leafpool.redis.pool import Pool
from leafpool.redis.pool_async import AsyncPool

_T = TypeVar("_T")
Policy = Literal["raise", "wait", "reserve"]
POLICIES = ("raise", "wait", "reserve")
MAX_BATCH = 100_000
MAX_TAKE_TRIES = 100

log = logging.getLogger(__name__)


def _retryable(tag: str, code: int) -> bool:
    """A reserve take refused because the state moved on (head moved) is tried again; a
    refusal that another try cannot change (not above the high-water mark, not a
    canonical decimal, outside the head) ends the take: the client waits for the refill."""
    if code in scripts.RETRYABLE_TAKE:
        return True
    log.warning("%s: reserve take refused (%s); waiting for the refill instead", tag,
                scripts.REFUSALS.get(code, code))
    return False


def _check_count(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1 or n > MAX_BATCH:
        raise InvalidArgument("n", n, f"an integer from 1 to {MAX_BATCH:,}")
    return n


def _check_least(n: int, at_least: int | None) -> int:
    if at_least is None:
        return n
    if isinstance(at_least, bool) or not isinstance(at_least, int) or not 1 <= at_least <= n:
        raise InvalidArgument("at_least", at_least, f"an integer from 1 to n ({n:,})")
    return at_least


def _empty(tag: str, since: int, waited: float, got: list[int]) -> PoolEmpty:
    """The error for a pool found empty: it says since when the database has been
    unreachable when the tag's refills recorded so (``since``: ``db_unreachable_ms``,
    docs/design.md §3.8): the pool rode through on its list and reserve and has run dry."""
    if since > 0:
        return PoolEmptyDatabaseUnreachable(tag, since, int(time.time() * 1000), waited, got)
    return PoolEmpty(tag, waited, partial=got)


def _check_policy(policy: str) -> Policy:
    if policy not in POLICIES:
        raise InvalidArgument("policy", policy, f"one of {', '.join(POLICIES)}")
    return policy  # type: ignore[return-value]


class _Base:
    """Settings shared by the two clients (no I/O here)."""

    def __init__(self, policy: str, wait_seconds: float) -> None:
        self.policy = _check_policy(policy)
        if wait_seconds < 0:
            raise InvalidArgument("wait_seconds", wait_seconds, "a number >= 0")
        self.wait_seconds = wait_seconds
        self._valid: set[str] = set()

    def _check(self, tag: str) -> str:
        if tag not in self._valid:
            validate_tag(tag)
            self._valid.add(tag)
        return tag


class Client(_Base):
    """Synchronous client. Thread-safe (redis-py's connection pool). Every Redis command
    goes through :class:`~leafpool.redis.pool.Pool`."""

    def __init__(
        self,
        redis_client: RedisClient | None = None,
        *,
        settings: Settings | None = None,
        policy: str | None = None,
        wait_seconds: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        s = settings or get_settings()
        wait = s.empty_wait_seconds if wait_seconds is None else wait_seconds
        super().__init__(policy or s.empty_policy, wait)
        self.redis = redis_client or connect(s, timeout=max(5.0, wait + 5.0))
        self.pool = Pool(self.redis, s.key_prefix)
        self._monotonic = monotonic
        if s.pop_replicas_required != 0:
            self.pool.require_replicas(s.pop_replicas_required, s.pop_wait_ms)
        if self.policy == "reserve":  # refused now for a user of the app role, not later
            self.pool.check_reserve_rights()

    def next_id(self, tag: str) -> int:
        if self.pool.acks:
            return self._acknowledged(lambda: self._next_ids(tag, 1, 1))[0]
        value = self.pool.pop(tag if tag in self._valid else self._check(tag))
        if value is not None:
            return value
        return self._on_empty(tag, 1, [])[0]

    def next_ids(self, tag: str, n: int, *, at_least: int | None = None) -> list[int]:
        """``n`` IDs in one round trip, strictly increasing. With ``at_least``, up to
        ``n``: what one pop got, the empty-pool policy applied only below ``at_least``
        (a batch that takes ahead, :mod:`leafpool.orm.batch`)."""
        least = _check_least(_check_count(n), at_least)
        if self.pool.acks:
            return self._acknowledged(lambda: self._next_ids(tag, n, least))
        return self._next_ids(tag, n, least)

    def _next_ids(self, tag: str, n: int, least: int) -> list[int]:
        """One pop of up to ``n`` (checked by the caller); the policy below ``least``."""
        got = self.pool.pop_many(tag if tag in self._valid else self._check(tag), n)
        if len(got) >= least:
            return got
        return self._on_empty(tag, least, got)

    def _acknowledged(self, call: Callable[[], list[int]]) -> list[int]:
        """``call`` again while too few replicas acknowledge its pop (its IDs were
        dropped), up to the empty-pool wait; then the last ReplicasBehind is raised."""
        deadline = self._monotonic() + self.wait_seconds
        while True:
            try:
                return call()
            except ReplicasBehind:
                if self._monotonic() >= deadline:
                    raise

    def close(self) -> None:
        self.redis.close()

    # -- empty pool ---------------------------------------------------------------------

    def _on_empty(self, tag: str, n: int, got: list[int]) -> list[int]:
        if not self.pool.is_known(tag):
            raise UnknownTag(tag)
        self.pool.want(tag)
        if self.policy == "raise":
            raise self._empty(tag, 0.0, got)
        if self.policy == "reserve":
            got += self._from_reserve(tag, n - len(got))
            if len(got) == n:
                return got
        return self._wait(tag, n, got)

    def _empty(self, tag: str, waited: float, got: list[int]) -> PoolEmpty:
        """:class:`PoolEmpty`, saying why when the database is the reason (one ``HGET``
        of the tag's state, on this path only; a Redis error leaves the plain one)."""
        try:
            since = self.pool.db_unreachable_ms(tag)
        except BackendUnavailable:
            since = 0
        return _empty(tag, since, waited, got)

    def _from_reserve(self, tag: str, n: int) -> list[int]:
        """Take up to ``n`` IDs from the reserve head while the list is empty."""
        out: list[int] = []
        for _ in range(MAX_TAKE_TRIES):  # each retry: another client or the refill moved on
            if len(out) == n:
                break
            head = self.pool.reserve_head(tag)
            if head is None:
                break
            taken = self.pool.take_reserve(tag, head, n - len(out))
            if isinstance(taken, list):
                out += taken
            elif taken == scripts.LIST_NOT_EMPTY:
                out += self.pool.pop_many(tag, n - len(out))
            elif not _retryable(tag, taken):
                break
        return out

    def _wait(self, tag: str, n: int, got: list[int]) -> list[int]:
        deadline = self._monotonic() + self.wait_seconds
        while len(got) < n:
            remaining = deadline - self._monotonic()
            if remaining <= 0:
                raise self._empty(tag, self.wait_seconds, got)
            value = self.pool.wait_pop(tag, max(remaining, 0.01))
            if value is None:
                continue
            got.append(value)
            if len(got) < n:
                got += self.pool.pop_many(tag, n - len(got))
        return got


class AsyncClient(_Base):
    """asyncio client with the same behaviour as :class:`Client`, through
    :class:`~leafpool.redis.pool_async.AsyncPool`."""

    def __init__(
        self,
        redis_client: AsyncRedisClient | None = None,
        *,
        settings: Settings | None = None,
        policy: str | None = None,
        wait_seconds: float | None = None,
    ) -> None:
        s = settings or get_settings()
        wait = s.empty_wait_seconds if wait_seconds is None else wait_seconds
        super().__init__(policy or s.empty_policy, wait)
        self.redis = redis_client or connect_async(s, timeout=max(5.0, wait + 5.0))
        self.pool = AsyncPool(self.redis, s.key_prefix)
        self._replicas = s.pop_replicas_required
        self._wait_ms = s.pop_wait_ms
        self._started = self._replicas == 0 and self.policy != "reserve"

    async def start(self) -> None:
        """Check the replicas a pop must wait for (``LEAFPOOL_POP_REPLICAS``) now, not at
        the first pop; the first pop does it otherwise (once)."""
        if not self._started:
            if self._replicas != 0:
                await self.pool.require_replicas(self._replicas, self._wait_ms)
            if self.policy == "reserve":  # refused for a user of the app role
                await self.pool.check_reserve_rights()
            self._started = True

    async def next_id(self, tag: str) -> int:
        if self._replicas != 0:
            return (await self._acknowledged(lambda: self._next_ids(tag, 1, 1)))[0]
        value = await self.pool.pop(tag if tag in self._valid else self._check(tag))
        if value is not None:
            return value
        return (await self._on_empty(tag, 1, []))[0]

    async def next_ids(self, tag: str, n: int, *, at_least: int | None = None) -> list[int]:
        """As :meth:`Client.next_ids`."""
        least = _check_least(_check_count(n), at_least)
        if self._replicas != 0:
            return await self._acknowledged(lambda: self._next_ids(tag, n, least))
        return await self._next_ids(tag, n, least)

    async def _next_ids(self, tag: str, n: int, least: int) -> list[int]:
        got = await self.pool.pop_many(tag if tag in self._valid else self._check(tag), n)
        if len(got) >= least:
            return got
        return await self._on_empty(tag, least, got)

    async def _acknowledged(self, call: Callable[[], Awaitable[_T]]) -> _T:
        """``call`` again while too few replicas acknowledge its pop (its IDs were
        dropped), up to the empty-pool wait; then the last ReplicasBehind is raised."""
        await self.start()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_seconds
        while True:
            try:
                return await call()
            except ReplicasBehind:
                if loop.time() >= deadline:
                    raise

    async def aclose(self) -> None:
        await self.redis.aclose()

    # -- coalesced single-ID pops (leafpool/redis/coalesce.py, docs/design.md §1.1) -------------

    _coalescer: Coalescer | None = None

    def coalesce(self, max_batch: int, in_flight: int = IN_FLIGHT) -> None:
        """Let :meth:`next_id_coalesced` share one ``LPOP tag n`` among up to
        ``max_batch`` concurrent callers of one tag, ``in_flight`` such pops of a tag at
        a time."""
        self._coalescer = Coalescer(self.pool.pop_many, max_batch, in_flight,
                                    count_gap=self.pool.count_gap)

    async def next_id_coalesced(self, tag: str) -> int:
        """:meth:`next_id`, its pop shared with the concurrent callers of ``tag``: the ID
        comes from a pop issued after this call, so the order across clients is the
        same as with one pop per call. A short pop, an unknown tag, replica
        acknowledgement: as :meth:`next_id` (each caller applies the policy itself).
        Without :meth:`coalesce` this is :meth:`next_id`."""
        coalescer = self._coalescer
        if coalescer is None:
            return await self.next_id(tag)
        tag = tag if tag in self._valid else self._check(tag)
        if self._replicas == 0:
            return await self._coalesced(coalescer, tag)
        return await self._acknowledged(lambda: self._coalesced(coalescer, tag))

    async def _coalesced(self, coalescer: Coalescer, tag: str) -> int:
        value = await coalescer.take(tag)
        if value is not None:
            return value
        return (await self._on_empty(tag, 1, []))[0]

    async def _on_empty(self, tag: str, n: int, got: list[int]) -> list[int]:
        if not await self.pool.is_known(tag):
            raise UnknownTag(tag)
        await self.pool.want(tag)
        if self.policy == "raise":
            raise await self._empty(tag, 0.0, got)
        if self.policy == "reserve":
            await self.start()
            got += await self._from_reserve(tag, n - len(got))
            if len(got) == n:
                return got
        return await self._wait(tag, n, got)

    async def _empty(self, tag: str, waited: float, got: list[int]) -> PoolEmpty:
        try:
            since = await self.pool.db_unreachable_ms(tag)
        except BackendUnavailable:
            since = 0
        return _empty(tag, since, waited, got)

    async def _from_reserve(self, tag: str, n: int) -> list[int]:
        out: list[int] = []
        for _ in range(MAX_TAKE_TRIES):
            if len(out) == n:
                break
            head = await self.pool.reserve_head(tag)
            if head is None:
                break
            taken = await self.pool.take_reserve(tag, head, n - len(out))
            if isinstance(taken, list):
                out += taken
            elif taken == scripts.LIST_NOT_EMPTY:
                out += await self.pool.pop_many(tag, n - len(out))
            elif not _retryable(tag, taken):
                break
        return out

    async def _wait(self, tag: str, n: int, got: list[int]) -> list[int]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_seconds
        while len(got) < n:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise await self._empty(tag, self.wait_seconds, got)
            value = await self.pool.wait_pop(tag, max(remaining, 0.01))
            if value is None:
                continue
            got.append(value)
            if len(got) < n:
                got += await self.pool.pop_many(tag, n - len(got))
        return got
