"""The Redis side of the pools: tag registration, snapshots, and the fenced writes that
add IDs (each one a Lua script that checks the lock token and the high-water mark).

This module owns no policy: how much to push and when is the refillers' (:mod:`leafpool.refill`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import redis

from leafpool.core.errors import BackendUnavailable, ReplicasBehind, StaleWrite
from leafpool.core.keys import Keys
from leafpool.redis import replicas, scripts
from leafpool.redis.connect import redis_errors, wrap
from leafpool.redis.lock import BeatLock, RefillLock
from leafpool.redis.pool_common import SNAPSHOT_REPLIES as SNAPSHOT_REPLIES
from leafpool.redis.pool_common import Level as Level
from leafpool.redis.pool_common import Range as Range
from leafpool.redis.pool_common import Snapshot as Snapshot
from leafpool.redis.pool_common import (
    ids_from,
    queue_snapshot,
    queue_want,
    register_scripts,
    snapshot_from,
    take_result,
    text,
)
from leafpool.redis.pool_many import TAGS_PER_PIPELINE as TAGS_PER_PIPELINE
from leafpool.redis.pool_many import ManyTags
from leafpool.redis.pool_many import pack as pack

log = logging.getLogger(__name__)

class Pool(ManyTags):
    """Redis operations on the pools under one key prefix (the reads and writes of many
    tags at once are :class:`~leafpool.redis.pool_many.ManyTags`'s)."""

    acks = 0  # replicas that must acknowledge a pop (LEAFPOOL_POP_REPLICAS; 0: none)
    ack_wait_ms = 100

    def __init__(self, client: redis.Redis, prefix: str = "leafpool") -> None:
        self.redis = client
        self.keys = Keys(prefix)
        registered = register_scripts(client)
        self._push = registered["push_ids"]
        self._append = registered["append_reserve"]
        self._take = registered["take_reserve"]
        self._fresh = registered["push_fresh"]
        self._record = registered["record"]
        self._drop = registered["drop"]
        self._ids_keys: dict[str, str] = {}

    # -- locks ----------------------------------------------------------------------------

    def refill_lock(self, tag: str, ttl_ms: int,
                    monotonic: Callable[[], float] = time.monotonic) -> RefillLock:
        """The tag's refill lock (its token fences every write)."""
        return RefillLock(self.redis, self.tag(tag).lock, ttl_ms, monotonic)

    def beat_lock(self, ttl_seconds: float) -> BeatLock:
        """The lock held by the one active Celery beat."""
        return BeatLock(self.redis, self.keys.beat_lock, ttl_seconds)

    def lengths(self, tags: Sequence[str]) -> list[int]:
        """``LLEN`` of each tag's ready list, in one round trip."""
        with redis_errors("lengths"):
            pipe = self.redis.pipeline(transaction=False)
            for tag in tags:
                pipe.llen(self.tag(tag).ids)
            return [int(n) for n in pipe.execute()]

    # -- the client's commands (the public LPOP, and waiting for a refill) ----------------

    def pop(self, tag: str) -> int | None:
        """``LPOP`` one ID (None when the list is empty): the hot path."""
        if self.acks:
            got = self.pop_many(tag, 1)
            return got[0] if got else None
        key = self._ids_keys.get(tag) or self._ids_key(tag)
        try:
            raw = self.redis.lpop(key)
        except redis.RedisError as exc:
            raise wrap(exc, f"{tag}: LPOP") from exc
        return None if raw is None else int(raw)  # type: ignore[arg-type]

    def pop_many(self, tag: str, count: int) -> list[int]:
        """``LPOP key count``: up to ``count`` IDs, in order."""
        key = self._ids_keys.get(tag) or self._ids_key(tag)
        if self.acks:
            raw, acked = self._then_wait(tag, key, lambda pipe: pipe.lpop(key, count))
            return self._acknowledged(tag, ids_from(raw), acked)
        try:
            raw = self.redis.lpop(key, count)
        except redis.RedisError as exc:
            raise wrap(exc, f"{tag}: LPOP") from exc
        return ids_from(raw)  # type: ignore[arg-type]

    def wait_pop(self, tag: str, timeout: float) -> int | None:
        """``BLPOP`` one ID, waiting up to ``timeout`` seconds for a refill."""
        key = self._ids_key(tag)
        if self.acks:
            popped, acked = self._then_wait(tag, key,
                                            lambda pipe: pipe.blpop([key], timeout=timeout))
            got = self._acknowledged(tag, [] if popped is None else [int(popped[1])], acked)
            return got[0] if got else None
        with redis_errors(f"{tag}: BLPOP"):
            popped = self.redis.blpop([key], timeout=timeout)
        return None if popped is None else int(popped[1])  # type: ignore[index]

    def _ids_key(self, tag: str) -> str:
        key = self._ids_keys[tag] = self.keys.tag(tag).ids
        return key

    # -- registration -------------------------------------------------------------------

    def register(self, tag: str, mode: str, now_ms: int, **fields: object) -> bool:
        """Make ``tag`` known; True when it was new. Existing state is kept."""
        k = self.tag(tag)
        with redis_errors(f"{tag}: register"):
            pipe = self.redis.pipeline(transaction=False)
            pipe.sadd(self.keys.tags, tag)
            pipe.hsetnx(k.state, "mode", mode)
            pipe.hsetnx(k.state, "created_ms", now_ms)
            for name, value in fields.items():
                pipe.hset(k.state, name, str(value))
            added = pipe.execute()[0]
        return bool(added)

    def drop(self, tag: str, if_created_ms: str | None = None) -> bool:
        """Forget ``tag``: its keys go away (the ready IDs in it are a gap, never reused:
        a running refiller loses its lock and every write it tries is refused).

        With ``if_created_ms``, only while the tag's state still has that ``created_ms``
        (a tag dropped and registered again meanwhile is kept). True when dropped."""
        k = self.tag(tag)
        keys = [k.state, *(key for key in k.all() if key != k.state)]
        with redis_errors(f"{tag}: drop"):
            if not self._drop(keys=keys, args=["*" if if_created_ms is None else if_created_ms]):
                return False
            # the global sets live in other slots of a Redis Cluster: a second round trip
            pipe = self.redis.pipeline(transaction=False)
            pipe.srem(self.keys.tags, tag)
            pipe.srem(self.keys.wanted, tag)
            pipe.execute()
        return True

    def tags(self) -> list[str]:
        with redis_errors("list tags"):
            return sorted(text(t) for t in self.redis.smembers(self.keys.tags))

    def is_known(self, tag: str) -> bool:
        with redis_errors(f"{tag}: membership"):
            return bool(self.redis.sismember(self.keys.tags, tag))

    def mode(self, tag: str) -> str | None:
        with redis_errors(f"{tag}: mode"):
            raw = self.redis.hget(self.tag(tag).state, "mode")
        return text(raw) if raw else None

    # -- reads --------------------------------------------------------------------------

    def snapshot(self, tag: str) -> Snapshot:
        with redis_errors(f"{tag}: snapshot"):
            pipe = self.redis.pipeline(transaction=True)
            queue_snapshot(pipe, self.tag(tag))
            return snapshot_from(tag, pipe.execute())

    # -- state --------------------------------------------------------------------------

    def record(self, tag: str, counts: Mapping[str, int] | None = None,
               **fields: object) -> bool:
        """Set ``fields`` and add ``counts`` in the tag's state, only while the tag is
        registered (False, nothing written, once it was dropped)."""
        if not fields and not counts:
            return True
        args: list[str | int] = [len(fields)]
        for name, value in fields.items():
            args += [name, str(value)]
        for name, by in (counts or {}).items():
            args += [name, by]
        with redis_errors(f"{tag}: record"):
            return bool(self._record(keys=[self.tag(tag).state], args=args))

    def count(self, tag: str, name: str, by: int = 1) -> bool:
        return self.record(tag, counts={name: by})

    def want(self, tag: str) -> None:
        """Record an empty-pool hit and ask the sweep for a refill of ``tag``."""
        with redis_errors(f"{tag}: want"):
            pipe = self.redis.pipeline(transaction=False)
            queue_want(pipe, self.keys, tag)
            pipe.execute()

    def take_wanted(self) -> list[str]:
        with redis_errors("wanted"):
            raw = self.redis.spop(self.keys.wanted, 10_000)
        return sorted(text(t) for t in raw or [])

    def mark_queued(self, tag: str, seconds: int) -> bool:
        """True when no refill of ``tag`` was marked queued in the last ``seconds``."""
        with redis_errors(f"{tag}: mark queued"):
            return bool(self.redis.set(self.tag(tag).queued, 1, nx=True, ex=seconds))

    def clear_queued(self, tag: str) -> None:
        with redis_errors(f"{tag}: clear queued"):
            self.redis.delete(self.tag(tag).queued)

    # -- fenced writes ------------------------------------------------------------------

    def push(self, tag: str, token: bytes, head: Range, count: int, now_ms: int) -> int:
        """Push the first ``count`` IDs of the reserve ``head`` into the ready list.

        Returns the new list length; raises :class:`StaleWrite` (nothing written) when the
        lock, the head or the high-water mark says this chunk must not be pushed.
        """
        k = self.tag(tag)
        new_head = head.after_taking(count)
        ids = [str(i) for i in range(head.start, head.start + count)]
        with redis_errors(f"{tag}: push"):
            result = int(self._push(
                keys=[k.ids, k.reserve, k.state, k.lock],
                args=[token, head.encode(), new_head, now_ms, *ids],
            ))
        if result < 0:
            raise StaleWrite(f"{tag}: push of {count} IDs from {head.encode()} refused: "
                             f"{scripts.REFUSALS[result]}", code=result)
        return result

    def push_fresh(self, tag: str, token: bytes, ids: Sequence[int], now_ms: int) -> int:
        """Push freshly generated, strictly increasing IDs (snowflake mode)."""
        k = self.tag(tag)
        with redis_errors(f"{tag}: push"):
            result = int(self._fresh(keys=[k.ids, k.state, k.lock],
                                     args=[token, now_ms, *map(str, ids)]))
        if result < 0:
            raise StaleWrite(f"{tag}: push of {len(ids)} IDs from {ids[0]} refused: "
                             f"{scripts.REFUSALS[result]}", code=result)
        return result

    def append_reserve(
        self, tag: str, token: bytes, segment: Range, **fields: object
    ) -> int:
        """Append ``segment`` to the reserve (and record ``fields`` with it)."""
        k = self.tag(tag)
        pairs: list[str] = []
        for name, value in fields.items():
            pairs += [name, str(value)]
        with redis_errors(f"{tag}: append reserve"):
            result = int(self._append(
                keys=[k.reserve, k.state, k.lock],
                args=[token, str(segment.start), str(segment.end), *pairs],
            ))
        if result < 0:
            raise StaleWrite(f"{tag}: reserve range {segment.encode()} refused: "
                             f"{scripts.REFUSALS[result]}", code=result)
        return result

    def take_reserve(self, tag: str, head: Range, count: int) -> list[int] | int:
        """Client path: take ``count`` IDs from the reserve head while the list is empty.
        Returns the IDs taken, or the script's refusal code (nothing written)."""
        k = self.tag(tag)
        count = min(count, head.size)
        keys, args = [k.ids, k.reserve, k.state], head.take_args(count)
        if self.acks:
            code, acked = self._then_wait(
                tag, k.ids, lambda pipe: self._take(keys=keys, args=args, client=pipe))
            taken = take_result(head, count, int(code))
            return self._acknowledged(tag, taken, acked) if isinstance(taken, list) else taken
        with redis_errors(f"{tag}: take reserve"):
            code = int(self._take(keys=keys, args=args))
        return take_result(head, count, code)

    # -- replica-acknowledged pops (docs/design.md §7) -------------------------------------

    def require_replicas(self, required: int | str, wait_ms: int) -> int:
        """From now on hand out a pop's IDs only once ``required`` replicas (a number, or
        ``all`` connected now) acknowledged it within ``wait_ms``; a requirement the
        master cannot meet now is refused here, not discovered pop by pop."""
        self.acks, self.ack_wait_ms = replicas.required(self.redis, required), wait_ms
        return self.acks

    def note_master(self, snap: Snapshot, now_ms: int) -> bool:
        """Record which master serves the tag and its replication ID; a new ID means a
        failover promoted a replica (or the master restarted without its data): counted
        in ``failovers``, logged, and the refill goes on from the promoted node's state
        (its high-water mark and reserve fence every write). True on a failover."""
        replid, where = replicas.replication_id(self.redis, self.tag(snap.tag).ids)
        before = snap.state.get("redis_replid", "")
        changed = bool(before) and before != replid
        if changed:
            log.warning("%s: Redis master changed (replication ID %s -> %s, now %s): "
                        "going on from its state", snap.tag, before, replid, where)
        if changed or before != replid or snap.state.get("redis_node") != where:
            self.record(snap.tag, counts={"failovers": 1} if changed else None,
                        redis_replid=replid, redis_node=where,
                        **({"last_failover_ms": now_ms} if changed else {}))
        return changed

    def _then_wait(self, tag: str, key: str, queue: Callable[[Any], object]) -> tuple[Any, int]:
        """The command ``queue`` puts on a pipeline, then ``WAIT acks ms``, in one round
        trip on the node holding ``key``: (its reply, replicas that acknowledged it)."""
        try:
            pipe = replicas.node_of(self.redis, key).pipeline(transaction=False)
            queue(pipe)
            pipe.execute_command("WAIT", self.acks,  # type: ignore[no-untyped-call]
                                 self.ack_wait_ms)
            reply, acked = pipe.execute()
        except redis.RedisError as exc:
            replicas.refresh(self.redis)
            raise wrap(exc, f"{tag}: pop") from exc
        return reply, int(acked)

    def _acknowledged(self, tag: str, ids: list[int], acked: int) -> list[int]:
        if ids and acked < self.acks:
            replicas.log_discarded(tag, len(ids), acked, self.acks)
            with contextlib.suppress(BackendUnavailable):
                self.record(tag, counts={"unacked_ids": len(ids)})
            raise ReplicasBehind(tag, len(ids), acked, self.acks)
        return ids

    def reserve_head(self, tag: str) -> Range | None:
        with redis_errors(f"{tag}: reserve head"):
            raw = self.redis.lindex(self.tag(tag).reserve, 0)
        return Range.decode(raw) if raw else None
