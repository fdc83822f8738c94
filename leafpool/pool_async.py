"""The asyncio twin of :class:`leafpool.pool.Pool`, for the asyncio client and the HTTP
service: the same keys, scripts and arguments (built by :mod:`leafpool.pool`), awaited.

It holds only what those callers do to Redis: pop, wait, the empty-pool path (known?,
want, reserve take), the mode and snapshots for the status views. Refills stay
synchronous (Celery tasks)."""

from __future__ import annotations

from collections.abc import Sequence

import redis
import redis.asyncio as aioredis

from leafpool.keys import Keys, TagKeys
from leafpool.pool_common import (
    SNAPSHOT_REPLIES,
    Range,
    Snapshot,
    queue_snapshot,
    queue_want,
    register_scripts,
    snapshot_from,
    take_result,
    text,
)
from leafpool.redis_conn import redis_errors, wrap


class AsyncPool:
    """asyncio Redis operations on the pools under one key prefix."""

    def __init__(self, client: aioredis.Redis, prefix: str = "leafpool") -> None:
        self.redis = client
        self.keys = Keys(prefix)
        self._take = register_scripts(client)["take_reserve"]
        self._ids_keys: dict[str, str] = {}

    def tag(self, tag: str) -> TagKeys:
        return self.keys.tag(tag)

    def _ids_key(self, tag: str) -> str:
        key = self._ids_keys.get(tag)
        if key is None:
            key = self._ids_keys[tag] = self.keys.tag(tag).ids
        return key

    # -- the client's commands ------------------------------------------------------------

    async def pop(self, tag: str) -> int | None:
        try:
            raw = await self.redis.lpop(self._ids_key(tag))
        except redis.RedisError as exc:
            raise wrap(exc, f"{tag}: LPOP") from exc
        return None if raw is None else int(raw)  # type: ignore[arg-type]

    async def pop_many(self, tag: str, count: int) -> list[int]:
        try:
            raw = await self.redis.lpop(self._ids_key(tag), count)
        except redis.RedisError as exc:
            raise wrap(exc, f"{tag}: LPOP") from exc
        return list(map(int, raw)) if raw else []  # type: ignore[arg-type]

    async def wait_pop(self, tag: str, timeout: float) -> int | None:
        with redis_errors(f"{tag}: BLPOP"):
            popped = await self.redis.blpop([self._ids_key(tag)], timeout=timeout)
        return None if popped is None else int(popped[1])

    async def is_known(self, tag: str) -> bool:
        with redis_errors(f"{tag}: membership"):
            return bool(await self.redis.sismember(self.keys.tags, tag))

    async def want(self, tag: str) -> None:
        with redis_errors(f"{tag}: want"):
            pipe = self.redis.pipeline(transaction=False)
            queue_want(pipe, self.keys, tag)
            await pipe.execute()

    async def reserve_head(self, tag: str) -> Range | None:
        with redis_errors(f"{tag}: reserve head"):
            raw = await self.redis.lindex(self.tag(tag).reserve, 0)
        return Range.decode(raw) if raw else None

    async def take_reserve(self, tag: str, head: Range, count: int) -> list[int] | int:
        k = self.tag(tag)
        count = min(count, head.size)
        with redis_errors(f"{tag}: take reserve"):
            code = int(await self._take(keys=[k.ids, k.reserve, k.state],
                                        args=head.take_args(count)))
        return take_result(tag, head, count, code)

    # -- reads for the HTTP service ---------------------------------------------------------

    async def mode(self, tag: str) -> str | None:
        with redis_errors(f"{tag}: mode"):
            raw = await self.redis.hget(self.tag(tag).state, "mode")
        return text(raw) if raw is not None else None

    async def tags(self) -> list[str]:
        with redis_errors("list tags"):
            return sorted(text(t) for t in await self.redis.smembers(self.keys.tags))

    async def modes(self, tags: Sequence[str]) -> dict[str, str | None]:
        with redis_errors("modes"):
            pipe = self.redis.pipeline(transaction=False)
            for tag in tags:
                pipe.hget(self.tag(tag).state, "mode")
            raw = await pipe.execute()
        return {tag: (text(m) if m is not None else None) for tag, m in zip(tags, raw,
                                                                              strict=True)}

    async def snapshots(self, tags: Sequence[str]) -> list[Snapshot]:
        with redis_errors("snapshots"):
            pipe = self.redis.pipeline(transaction=False)
            for tag in tags:
                queue_snapshot(pipe, self.tag(tag))
            raw = await pipe.execute()
        n = SNAPSHOT_REPLIES
        return [snapshot_from(tag, raw[n * i : n * i + n]) for i, tag in enumerate(tags)]

    async def ping(self) -> None:
        with redis_errors("PING"):
            await self.redis.ping()
