"""The asyncio twin of :class:`leafpool.redis.pool.Pool`, for the asyncio client and the HTTP
service: the same keys, scripts and arguments (built by :mod:`leafpool.redis.pool`), awaited.

It holds only what those callers do to Redis: pop, wait, the empty-pool path (known?,
want, reserve take), the mode and snapshots for the status views. Refills stay
synchronous (Celery tasks). Pops are sent once, as :mod:`leafpool.redis.pops` says, and
a pop cancelled once it was sent (a request given up) counts what it may have taken as a
gap; reads are repeated after a lost reply (:mod:`leafpool.redis.retries`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

from leafpool.core.errors import BackendUnavailable, LeafpoolError, ReplicasBehind
from leafpool.core.keys import Keys, TagKeys
from leafpool.redis import replicas
from leafpool.redis.connect import redis_errors, wrap
from leafpool.redis.pool_common import (
    SNAPSHOT_REPLIES,
    Range,
    Snapshot,
    ids_from,
    queue_snapshot,
    register_scripts,
    snapshot_from,
    take_result,
    text,
)
from leafpool.redis.pop_lean import LeanPop
from leafpool.redis.pops import (
    GAPS,
    MOVED,
    NOSCRIPT,
    RESERVE_PROBE_TAG,
    SEND_ATTEMPTS,
    UNACKED,
    gap_counts,
    no_rights,
    script_command,
    settle,
)
from leafpool.redis.retries import safely_async, send_once_async

log = logging.getLogger(__name__)


class AsyncPool:
    """asyncio Redis operations on the pools under one key prefix."""

    acks = 0  # replicas that must acknowledge a pop (LEAFPOOL_POP_REPLICAS; 0: none)
    ack_wait_ms = 100
    _behind = False  # the last acknowledged pop was refused: probe before popping again

    def __init__(self, client: aioredis.Redis, prefix: str = "leafpool") -> None:
        self.redis = client
        self.keys = Keys(prefix)
        registered = register_scripts(client)
        self._take = registered["take_reserve"]
        self._ids_keys: dict[str, str] = {}
        self._nodes: dict[str, aioredis.Redis] = {}
        self._counting: set[asyncio.Task[None]] = set()  # gap counts under way
        # the single-key pop of a plain client (not a cluster's): sent lean
        self._lean = LeanPop(client, self._count_gap_later) if type(
            client) is aioredis.Redis else None

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
        key = self._ids_key(tag)
        raw = (await self._once(tag, key, [("LPOP", key)], "LPOP", 1))[0]
        return None if raw is None else int(raw)

    async def pop_many(self, tag: str, count: int) -> list[int]:
        key = self._ids_key(tag)
        if self.acks:
            await self._probe(tag, key)
            raw, acked = await self._once(tag, key, [("LPOP", key, count), self._wait()],
                                          "LPOP", count)
            return await self._acknowledged(tag, ids_from(raw), int(acked))
        if self._lean is not None:
            return ids_from(await self._lean.pop(tag, key, count))
        return ids_from((await self._once(tag, key, [("LPOP", key, count)], "LPOP", count))[0])

    async def wait_pop(self, tag: str, timeout: float) -> int | None:
        key = self._ids_key(tag)
        command = ("BLPOP", key, f"{timeout:.3f}")
        if self.acks:
            await self._probe(tag, key)
            popped, acked = await self._once(tag, key, [command, self._wait()], "BLPOP", 1)
            got = await self._acknowledged(tag, [] if popped is None else [int(popped[1])],
                                           int(acked))
            return got[0] if got else None
        popped = (await self._once(tag, key, [command], "BLPOP", 1))[0]
        return None if popped is None else int(popped[1])

    async def is_known(self, tag: str) -> bool:
        with redis_errors(f"{tag}: membership"):
            return bool(await safely_async(lambda: self.redis.sismember(self.keys.tags, tag)))

    async def db_unreachable_ms(self, tag: str) -> int:
        """As :meth:`leafpool.redis.pool.Pool.db_unreachable_ms`."""
        with redis_errors(f"{tag}: db_unreachable_ms"):
            raw = await safely_async(
                lambda: self.redis.hget(self.tag(tag).state, "db_unreachable_ms"))
        return int(raw) if raw and text(raw).isdigit() else 0

    async def want(self, tag: str) -> None:
        with redis_errors(f"{tag}: want"):
            await safely_async(lambda: self.redis.sadd(self.keys.wanted, tag))
        try:  # a counter: never repeated; best effort (another app may have overflowed it)
            await self._record_once(tag, {"empty_hits": 1})
        except LeafpoolError as exc:
            log.warning("%s: empty hit not counted: %s", tag, exc)

    async def reserve_head(self, tag: str) -> Range | None:
        with redis_errors(f"{tag}: reserve head"):
            raw = await safely_async(lambda: self.redis.lindex(self.tag(tag).reserve, 0))
        return Range.decode(raw) if raw else None

    async def take_reserve(self, tag: str, head: Range, count: int) -> list[int] | int:
        k = self.tag(tag)
        count = min(count, head.size)
        take = script_command(self._take, [k.ids, k.reserve, k.state], head.take_args(count))
        if self.acks:
            await self._probe(tag, k.ids)
            code, acked = await self._once(tag, k.ids, [take, self._wait()], "take reserve",
                                           count, self._take)
            taken = take_result(head, count, int(code))
            if isinstance(taken, list):
                return await self._acknowledged(tag, taken, int(acked))
            return taken
        code = (await self._once(tag, k.ids, [take], "take reserve", count, self._take))[0]
        return take_result(head, count, int(code))

    # -- sending once (docs/design.md §7.2; see leafpool.redis.pops) --------------------------

    async def _once(self, tag: str, key: str, commands: list[tuple[Any, ...]], what: str,
                    at_stake: int, script: Any = None,
                    refused: Callable[[Any], None] | None = None) -> list[Any]:
        for attempt in range(SEND_ATTEMPTS):
            node = self._node_of(key)
            lost = (lambda: self._count_gap_later(tag, at_stake)) if at_stake else None
            try:
                replies = await send_once_async(node, commands, f"{tag}: {what}", lost)
            except BackendUnavailable:
                await self._refresh()
                raise
            resend = settle(replies, attempt, script, f"{tag}: {what}", refused)
            if resend == MOVED:
                await self._refresh()
            elif resend == NOSCRIPT:
                with redis_errors(f"{tag}: SCRIPT LOAD"):
                    await safely_async(lambda n=node: n.script_load(script.script))  # type: ignore[misc]
            else:
                return replies
        raise AssertionError("unreachable")  # pragma: no cover

    async def check_reserve_rights(self) -> None:
        """As :meth:`leafpool.redis.pops.Pops.check_reserve_rights`."""
        k = self.tag(RESERVE_PROBE_TAG)
        take = script_command(self._take, [k.ids, k.reserve, k.state],
                              Range(1, 2).take_args(1))
        await self._once(RESERVE_PROBE_TAG, k.ids, [take], "reserve rights", 0, self._take,
                         refused=no_rights)

    def _count_gap_later(self, tag: str, ids: int) -> None:
        """A pop's reply was lost or its caller cancelled once it was sent: count what it
        may have taken, in a task of its own (the cancelled caller cannot wait for it)."""
        log.warning("%s: a pop's reply was lost or its request cancelled: up to %d ID(s) "
                    "counted as a gap, never handed out", tag, ids)
        self.count_gap(tag, ids, lost_reply=True)

    def count_gap(self, tag: str, ids: int, lost_reply: bool = False) -> None:
        """Count ``ids`` IDs taken and not handed out (a coalesced request cancelled after
        its pop: exact), in a task of its own; best effort."""
        task = asyncio.get_running_loop().create_task(
            self._record_once(tag, gap_counts(ids, lost_reply)))
        self._counting.add(task)
        task.add_done_callback(self._counted)

    def _counted(self, task: asyncio.Task[None]) -> None:
        self._counting.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.warning("gap not counted: %s", task.exception())

    async def _record_once(self, tag: str, counts: dict[str, int]) -> None:
        hits = self.tag(tag).hits
        await self._once(tag, hits, [("HINCRBY", hits, n, by) for n, by in counts.items()],
                         "count", 0)

    async def _refresh(self) -> None:
        if isinstance(self.redis, AsyncRedisCluster):  # read the slot map again
            with contextlib.suppress(redis.RedisError):
                await self.redis.nodes_manager.initialize()

    # -- replica-acknowledged pops (docs/design.md §7; see leafpool.redis.pool.Pool) ------------

    async def require_replicas(self, required: int | str, wait_ms: int) -> int:
        """As :meth:`leafpool.redis.pops.Pops.require_replicas`: the group's replicas read
        from the sentinels, the cluster or the master (:func:`replicas.need`)."""
        if required == 0:
            return 0
        self.acks, self.ack_wait_ms = replicas.need(required, await self._group()), wait_ms
        return self.acks

    async def _group(self) -> replicas.Group:
        try:
            infos = [await safely_async(lambda m=m: m.info("replication"))  # type: ignore[misc]
                     for m in self._masters()]
            connected = min(int(i.get("connected_slaves", 0)) for i in infos)
            found = replicas.sentinel_of(self.redis)
            if found is not None:
                manager, name = found
                replies: list[Any] = []
                for s in manager.sentinels:
                    try:
                        replies.append(await s.sentinel_slaves(name))
                    except redis.RedisError as exc:
                        replies.append(exc)
                return replicas.Group(replicas.known_by_sentinels(replies), connected,
                                      "the sentinels know")
            if isinstance(self.redis, AsyncRedisCluster):
                nodes = await self.redis.cluster_nodes()
                return replicas.Group(replicas.known_in_cluster(nodes), connected,
                                      "CLUSTER NODES lists for a master")
        except redis.RedisError as exc:
            raise wrap(exc, "the replicas") from exc
        return replicas.Group(connected, connected, "the master reports connected")

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

    def _wait(self) -> tuple[Any, ...]:
        return ("WAIT", self.acks, self.ack_wait_ms)

    async def _probe(self, tag: str, key: str) -> None:
        """As :meth:`leafpool.redis.pops.Pops._probe`: after a refused pop, ``WAIT`` alone
        before the next, so nothing is popped (and dropped) while the replicas are away."""
        if not self._behind:
            return
        loop = asyncio.get_running_loop()
        started = loop.time()
        acked = int((await self._once(tag, key, [self._wait()], "WAIT", 0))[0])
        if acked >= self.acks:
            self._behind = False
            return
        await replicas.recheck_master_async(self.redis)
        await asyncio.sleep(max(0.0, self.ack_wait_ms / 1000 - (loop.time() - started)))
        raise ReplicasBehind(tag, 0, acked, self.acks)

    async def _acknowledged(self, tag: str, ids: list[int], acked: int) -> list[int]:
        """``ids``, or ReplicasBehind once they are dropped and counted (as Pool does)."""
        if ids and acked < self.acks:
            replicas.log_discarded(tag, len(ids), acked, self.acks)
            with contextlib.suppress(LeafpoolError):
                await self._record_once(tag, {UNACKED: len(ids), GAPS: len(ids)})
            self._behind = True
            await replicas.recheck_master_async(self.redis)
            raise ReplicasBehind(tag, len(ids), acked, self.acks)
        return ids

    # -- reads for the HTTP service ---------------------------------------------------------

    async def mode(self, tag: str) -> str | None:
        with redis_errors(f"{tag}: mode"):
            raw = await safely_async(lambda: self.redis.hget(self.tag(tag).state, "mode"))
        return text(raw) if raw is not None else None

    async def tags(self) -> list[str]:
        with redis_errors("list tags"):
            return sorted(text(t) for t in await safely_async(
                lambda: self.redis.smembers(self.keys.tags)))

    async def modes(self, tags: Sequence[str]) -> dict[str, str | None]:
        async def read() -> Any:
            pipe = self.redis.pipeline(transaction=False)
            for tag in tags:
                pipe.hget(self.tag(tag).state, "mode")
            return await pipe.execute()

        with redis_errors("modes"):
            raw = await safely_async(read)
        return {tag: (text(m) if m is not None else None) for tag, m in zip(tags, raw,
                                                                              strict=True)}

    async def snapshots(self, tags: Sequence[str]) -> list[Snapshot]:
        async def read() -> Any:
            pipe = self.redis.pipeline(transaction=False)
            for tag in tags:
                queue_snapshot(pipe, self.tag(tag))
            return await pipe.execute()

        with redis_errors("snapshots"):
            raw = await safely_async(read)
        n = SNAPSHOT_REPLIES
        return [snapshot_from(tag, raw[n * i : n * i + n]) for i, tag in enumerate(tags)]

    async def ping(self) -> None:
        with redis_errors("PING"):
            await safely_async(self.redis.ping)
