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
from collections.abc import Callable
from typing import Literal

import redis
import redis.asyncio as aioredis

from leafpool import scripts
from leafpool.config import Settings, get_settings
from leafpool.errors import InvalidArgument, PoolEmpty, UnknownTag
from leafpool.keys import Keys
from leafpool.pool import Pool, Range, redis_errors
from leafpool.redis_conn import connect, connect_async
from leafpool.tags import validate_tag

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


def _check_policy(policy: str) -> Policy:
    if policy not in POLICIES:
        raise InvalidArgument("policy", policy, f"one of {', '.join(POLICIES)}")
    return policy  # type: ignore[return-value]


class _Base:
    """Key cache and settings shared by the two clients (no I/O here)."""

    def __init__(self, prefix: str, policy: str, wait_seconds: float) -> None:
        self.keys = Keys(prefix)
        self.policy = _check_policy(policy)
        if wait_seconds < 0:
            raise InvalidArgument("wait_seconds", wait_seconds, "a number >= 0")
        self.wait_seconds = wait_seconds
        self._ids_keys: dict[str, str] = {}

    def _ids_key(self, tag: str) -> str:
        key = self._ids_keys.get(tag)
        if key is None:
            validate_tag(tag)
            key = self._ids_keys[tag] = self.keys.tag(tag).ids
        return key


class Client(_Base):
    """Synchronous client. Thread-safe (redis-py's connection pool)."""

    def __init__(
        self,
        redis_client: redis.Redis | None = None,
        *,
        settings: Settings | None = None,
        policy: str | None = None,
        wait_seconds: float | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        s = settings or get_settings()
        wait = s.empty_wait_seconds if wait_seconds is None else wait_seconds
        super().__init__(s.key_prefix, policy or s.empty_policy, wait)
        self.redis = redis_client or connect(s.redis_url, timeout=max(5.0, wait + 5.0))
        self._pool = Pool(self.redis, s.key_prefix)
        self._monotonic = monotonic

    def next_id(self, tag: str) -> int:
        key = self._ids_key(tag)
        try:  # (not redis_errors(): the hot path saves its ~1 us)
            raw = self.redis.lpop(key)
        except redis.RedisError:
            with redis_errors(f"{tag}: LPOP"):
                raise
        if raw is not None:
            return int(raw)  # type: ignore[arg-type]
        return self._on_empty(tag, 1, [])[0]

    def next_ids(self, tag: str, n: int) -> list[int]:
        """``n`` IDs in one round trip, strictly increasing."""
        key = self._ids_key(tag)
        _check_count(n)
        try:
            raw = self.redis.lpop(key, n)
        except redis.RedisError:
            with redis_errors(f"{tag}: LPOP"):
                raise
        got = list(map(int, raw)) if raw else []  # type: ignore[call-overload]
        if len(got) == n:
            return got
        return self._on_empty(tag, n, got)

    def close(self) -> None:
        self.redis.close()

    # -- empty pool ---------------------------------------------------------------------

    def _on_empty(self, tag: str, n: int, got: list[int]) -> list[int]:
        if not self._pool.is_known(tag):
            raise UnknownTag(tag)
        self._pool.want(tag)
        if self.policy == "raise":
            raise PoolEmpty(tag, partial=got)
        if self.policy == "reserve":
            got += self._from_reserve(tag, n - len(got))
            if len(got) == n:
                return got
        return self._wait(tag, n, got)

    def _from_reserve(self, tag: str, n: int) -> list[int]:
        """Take up to ``n`` IDs from the reserve head while the list is empty."""
        key = self._ids_keys[tag]
        out: list[int] = []
        for _ in range(MAX_TAKE_TRIES):  # each retry: another client or the refill moved on
            if len(out) == n:
                break
            head = self._pool.reserve_head(tag)
            if head is None:
                break
            take = min(n - len(out), head.size)
            code = self._pool.take_reserve(tag, head, take)
            if code == 1:
                out += range(head.start, head.start + take)
            elif code == scripts.LIST_NOT_EMPTY:
                with redis_errors(f"{tag}: LPOP"):
                    raw = self.redis.lpop(key, n - len(out))
                out += map(int, raw or [])  # type: ignore[call-overload]
            elif not _retryable(tag, code):
                break
        return out

    def _wait(self, tag: str, n: int, got: list[int]) -> list[int]:
        key = self._ids_keys[tag]
        deadline = self._monotonic() + self.wait_seconds
        while len(got) < n:
            remaining = deadline - self._monotonic()
            if remaining <= 0:
                raise PoolEmpty(tag, self.wait_seconds, partial=got)
            with redis_errors(f"{tag}: BLPOP"):
                popped = self.redis.blpop([key], timeout=max(remaining, 0.01))
            if popped is None:
                continue
            got.append(int(popped[1]))  # type: ignore[arg-type]
            if len(got) < n:
                with redis_errors(f"{tag}: LPOP"):
                    raw = self.redis.lpop(key, n - len(got))
                got += map(int, raw or [])  # type: ignore[call-overload]
        return got


class AsyncClient(_Base):
    """asyncio client with the same behaviour as :class:`Client`."""

    def __init__(
        self,
        redis_client: aioredis.Redis | None = None,
        *,
        settings: Settings | None = None,
        policy: str | None = None,
        wait_seconds: float | None = None,
    ) -> None:
        s = settings or get_settings()
        wait = s.empty_wait_seconds if wait_seconds is None else wait_seconds
        super().__init__(s.key_prefix, policy or s.empty_policy, wait)
        self.redis = redis_client or connect_async(s.redis_url, timeout=max(5.0, wait + 5.0))
        self._take = self.redis.register_script(scripts.source("take_reserve"))

    async def next_id(self, tag: str) -> int:
        key = self._ids_key(tag)
        with redis_errors(f"{tag}: LPOP"):
            raw = await self.redis.lpop(key)
        if raw is not None:
            return int(raw)  # type: ignore[arg-type]
        return (await self._on_empty(tag, 1, []))[0]

    async def next_ids(self, tag: str, n: int) -> list[int]:
        key = self._ids_key(tag)
        _check_count(n)
        with redis_errors(f"{tag}: LPOP"):
            raw = await self.redis.lpop(key, n)
        got = list(map(int, raw)) if raw else []
        if len(got) == n:
            return got
        return await self._on_empty(tag, n, got)

    async def aclose(self) -> None:
        await self.redis.aclose()

    async def _on_empty(self, tag: str, n: int, got: list[int]) -> list[int]:
        k = self.keys.tag(tag)
        with redis_errors(f"{tag}: membership"):
            known = await self.redis.sismember(self.keys.tags, tag)
        if not known:
            raise UnknownTag(tag)
        with redis_errors(f"{tag}: want"):
            pipe = self.redis.pipeline(transaction=False)
            pipe.sadd(self.keys.wanted, tag)
            pipe.hincrby(k.state, "empty_hits", 1)
            await pipe.execute()
        if self.policy == "raise":
            raise PoolEmpty(tag, partial=got)
        if self.policy == "reserve":
            got += await self._from_reserve(tag, n - len(got))
            if len(got) == n:
                return got
        return await self._wait(tag, n, got)

    async def _from_reserve(self, tag: str, n: int) -> list[int]:
        k = self.keys.tag(tag)
        out: list[int] = []
        for _ in range(MAX_TAKE_TRIES):
            if len(out) == n:
                break
            with redis_errors(f"{tag}: reserve head"):
                raw_head = await self.redis.lindex(k.reserve, 0)
            if raw_head is None:
                break
            head = Range.decode(raw_head)
            take = min(n - len(out), head.size)
            with redis_errors(f"{tag}: take reserve"):
                code = int(await self._take(keys=[k.ids, k.reserve, k.state],
                                            args=head.take_args(take)))
            if code == 1:
                out += range(head.start, head.start + take)
            elif code == scripts.LIST_NOT_EMPTY:
                with redis_errors(f"{tag}: LPOP"):
                    raw = await self.redis.lpop(k.ids, n - len(out))
                out += map(int, raw or [])
            elif not _retryable(tag, code):
                break
        return out

    async def _wait(self, tag: str, n: int, got: list[int]) -> list[int]:
        key = self._ids_keys[tag]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_seconds
        while len(got) < n:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise PoolEmpty(tag, self.wait_seconds, partial=got)
            with redis_errors(f"{tag}: BLPOP"):
                popped = await self.redis.blpop([key], timeout=max(remaining, 0.01))
            if popped is None:
                continue
            got.append(int(popped[1]))
            if len(got) < n:
                with redis_errors(f"{tag}: LPOP"):
                    raw = await self.redis.lpop(key, n - len(got))
                got += map(int, raw or [])
        return got
