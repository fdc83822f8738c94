"""The asyncio twin of :class:`leafpool.redis.pool.Pool`, for the asyncio client and the HTTP
service: the same keys, scripts and arguments (built by :mod:`leafpool.redis.pool`), awaited.

It holds only what those callers do to Redis: pop, wait, the empty-pool path (known?,
want, reserve take), the mode and snapshots for the status views. Refills stay
synchronous (Celery tasks)."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from leafpool.core.errors import BackendUnavailable, ReplicasBehind
from leafpool.core.keys import Keys, TagKeys
from leafpool.redis import replicas
from leafpool.redis.connect import redis_errors, wrap
from leafpool.redis.pool_common import (
    SNAPSHOT_REPLIES,
    Range,
    Snapshot,
    ids_from,
    queue_snapshot,
    queue_want,
    register_scripts,
    snapshot_from,
    take_result,
    text,
)


class AsyncPool:
    """asyncio Redis operations on the pools under one key prefix."""

    acks = 0  # replicas that must acknowledge a pop (LEAFPOOL_POP_REPLICAS; 0: none)
    ack_wait_ms = 100

    def __init__(self, client: aioredis.Redis, prefix: str = "leafpool") -> None:
        self.redis = client
        self.keys = Keys(prefix)
        registered = register_scripts(client)
        self._take, self._record = registered["take_reserve"], registered["record"]
        self._ids_keys: dict[str, str] = {}
        self._nodes: dict[str, aioredis.Redis] = {}

    def tag(self, tag: str) -> TagKeys:
        return self.keys.tag(tag)

    def _ids_key(self, tag: str) -> str:
        key = self._ids_keys.get(tag)
        if key is None:
            key = self._ids_keys[tag] = self.keys.tag(tag).ids
        return key

    # -- the client's commands ------------------------------------------------------------

    async def pop(self, tag: str) -> int | None:
        if self.acks:
            got = await self.pop_many(tag, 1)
            return got[0] if got else None
        try:
            raw = await self.redis.lpop(self._ids_key(tag))
        except redis.RedisError as exc:
            raise wrap(exc, f"{tag}: LPOP") from exc
        return None if raw is None else int(raw)  # type: ignore[arg-type]

    async def pop_many(self, tag: str, count: int) -> list[int]:
        if self.acks:
            key = self._ids_key(tag)
            raw, acked = await self._then_wait(tag, key, lambda pipe: pipe.lpop(key, count))
            return await self._acknowledged(tag, ids_from(raw), acked)
        try:
            raw = await self.redis.lpop(self._ids_key(tag), count)
        except redis.RedisError as exc:
            raise wrap(exc, f"{tag}: LPOP") from exc
        return ids_from(raw)  # type: ignore[arg-type]

    async def wait_pop(self, tag: str, timeout: float) -> int | None:
        if self.acks:
            key = self._ids_key(tag)
            popped, acked = await self._then_wait(
                tag, key, lambda pipe: pipe.blpop([key], timeout=timeout))
            got = await self._acknowledged(tag, [] if popped is None else [int(popped[1])],
                                           acked)
            return got[0] if got else None
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
        keys, args = [k.ids, k.reserve, k.state], head.take_args(count)
        if self.acks:
            code, acked = await self._then_wait(
                tag, k.ids, lambda pipe: self._take(keys=keys, args=args, client=pipe))
            taken = take_result(head, count, int(code))
            if isinstance(taken, list):
                return await self._acknowledged(tag, taken, acked)
            return taken
        with redis_errors(f"{tag}: take reserve"):
            code = int(await self._take(keys=keys, args=args))
        return take_result(head, count, code)

    # -- replica-acknowledged pops (docs/design.md §7; see leafpool.redis.pool.Pool) ------------

    async def require_replicas(self, required: int | str, wait_ms: int) -> int:
        if required == 0:
            return 0
        try:
            infos = [await m.info("replication") for m in self._masters()]
        except redis.RedisError as exc:
            raise wrap(exc, "INFO replication") from exc
        connected = min(int(i.get("connected_slaves", 0)) for i in infos)
        self.acks, self.ack_wait_ms = replicas.need(required, connected), wait_ms
        return self.acks

    def _masters(self) -> list[aioredis.Redis]:
        if isinstance(self.redis, AsyncRedisCluster):
            return [self._node(n.host, n.port) for n in self.redis.get_primaries()]
        return [self.redis]

    def _node(self, host: str, port: int) -> aioredis.Redis:
        """A plain client of one cluster node (a WAIT must follow the pop on its node)."""
        name = f"{host}:{port}"
        client = self._nodes.get(name)
        if client is None:
            kwargs = self.redis.get_connection_kwargs()  # type: ignore[no-untyped-call]
            client = self._nodes[name] = aioredis.Redis(
                host=host, port=port, socket_timeout=kwargs.get("socket_timeout"),
                socket_connect_timeout=kwargs.get("socket_connect_timeout"),
                password=kwargs.get("password"), username=kwargs.get("username"))
        return client

    def _node_of(self, key: str) -> aioredis.Redis:
        if isinstance(self.redis, AsyncRedisCluster):
            node = self.redis.get_node_from_key(key)
            return self._node(node.host, node.port)
        return self.redis

    async def _then_wait(self, tag: str, key: str,
                         queue: Callable[[Any], object]) -> tuple[Any, int]:
        try:
            pipe = self._node_of(key).pipeline(transaction=False)
            queued = queue(pipe)
            if inspect.isawaitable(queued):  # a script queues itself asynchronously
                await queued
            pipe.execute_command("WAIT", self.acks, self.ack_wait_ms)
            reply, acked = await pipe.execute()
        except redis.RedisError as exc:
            if isinstance(self.redis, AsyncRedisCluster):  # read the slot map again
                with contextlib.suppress(redis.RedisError):
                    await self.redis.nodes_manager.initialize()
            raise wrap(exc, f"{tag}: pop") from exc
        return reply, int(acked)

    async def _acknowledged(self, tag: str, ids: list[int], acked: int) -> list[int]:
        """``ids``, or ReplicasBehind once they are dropped and counted (as Pool does)."""
        if ids and acked < self.acks:
            replicas.log_discarded(tag, len(ids), acked, self.acks)
            with contextlib.suppress(BackendUnavailable), redis_errors(f"{tag}: record"):
                await self._record(keys=[self.tag(tag).state],
                                   args=[0, "unacked_ids", len(ids)])
            raise ReplicasBehind(tag, len(ids), acked, self.acks)
        return ids

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
