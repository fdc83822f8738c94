"""The Redis side of the pools: tag registration, snapshots, and the fenced writes that
add IDs (each one a Lua script that checks the lock token and the high-water mark).

This module owns no policy: how much to push and when is the refillers' (:mod:`leafpool.refill`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import redis

from leafpool.core.errors import LeafpoolError, StaleWrite
from leafpool.core.keys import Keys
from leafpool.redis import replicas, scripts
from leafpool.redis.connect import redis_errors
from leafpool.redis.lock import BeatLock, RefillLock
from leafpool.redis.pool_common import SNAPSHOT_REPLIES as SNAPSHOT_REPLIES
from leafpool.redis.pool_common import Level as Level
from leafpool.redis.pool_common import Range as Range
from leafpool.redis.pool_common import Snapshot as Snapshot
from leafpool.redis.pool_common import (
    queue_snapshot,
    record_args,
    register_scripts,
    snapshot_from,
    text,
)
from leafpool.redis.pool_many import TAGS_PER_PIPELINE as TAGS_PER_PIPELINE
from leafpool.redis.pool_many import ManyTags
from leafpool.redis.pool_many import pack as pack
from leafpool.redis.pops import Pops
from leafpool.redis.push_run import RANGE_LIMIT as RANGE_LIMIT
from leafpool.redis.push_run import PushRun as PushRun
from leafpool.redis.push_run import RunPushes
from leafpool.redis.retries import safely

log = logging.getLogger(__name__)

class Pool(Pops, ManyTags, RunPushes):
    """Redis operations on the pools under one key prefix (the client's pops are
    :class:`~leafpool.redis.pops.Pops`'s, the reads and writes of many tags at once
    :class:`~leafpool.redis.pool_many.ManyTags`'s).

    Every command is either repeated after a lost reply or never, by the rule of
    :mod:`leafpool.redis.retries`: reads and idempotent or fenced writes go through
    :func:`~leafpool.redis.retries.safely`; pops and counters are sent once."""

    def __init__(self, client: redis.Redis, prefix: str = "leafpool") -> None:
        self.redis = client
        self.keys = Keys(prefix)
        registered = register_scripts(client)
        self._push = registered["push_ids"]
        self._push_range = registered["push_range"]
        self._append = registered["append_reserve"]
        self._take = registered["take_reserve"]
        self._fresh = registered["push_fresh"]
        self._record = registered["record"]
        self._drop = registered["drop"]
        self._dry = registered["dry"]
        self._trim = registered["trim_reserve"]
        self._ids_keys: dict[str, str] = {}

    # -- locks ----------------------------------------------------------------------------

    def refill_lock(self, tag: str, ttl_ms: int,
                    monotonic: Callable[[], float] = time.monotonic) -> RefillLock:
        """The tag's refill lock (its token fences every write)."""
        return RefillLock(self.redis, self.tag(tag).lock, ttl_ms, monotonic)

    def beat_lock(self, ttl_seconds: float, identity: str | None = None) -> BeatLock:
        """The lock held by the one active Celery beat; with ``identity`` (its host or pod
        name) the holder announces its presence (docs/design.md §3.1)."""
        return BeatLock(self.redis, self.keys.beat_lock, ttl_seconds, identity)

    def lengths(self, tags: Sequence[str]) -> list[int]:
        """``LLEN`` of each tag's ready list, in one round trip."""
        raw = self._pipelined("lengths", tags, lambda tag: [("LLEN", self.tag(tag).ids)])
        return [int(n) for n in raw]

    # -- registration -------------------------------------------------------------------

    def register(self, tag: str, mode: str, now_ms: int, **fields: object) -> bool:
        """Make ``tag`` known; True when it was new. Existing state is kept."""
        k = self.tag(tag)

        def send() -> Any:
            # the state first, the tag set last: a drop repeated after a lost reply that
            # finds no state takes the tag out of the set (drop.lua), so a tag must not
            # be in the set before its state exists
            pipe = self.redis.pipeline(transaction=False)
            pipe.hsetnx(k.state, "mode", mode)
            pipe.hsetnx(k.state, "created_ms", now_ms)
            for name, value in fields.items():
                pipe.hset(k.state, name, str(value))
            pipe.sadd(self.keys.tags, tag)
            return pipe.execute()[-1]

        # the same values written again: repeated after a lost reply (and then "new"
        # may read False; the tag sync decides what is new from its own reads)
        with redis_errors(f"{tag}: register"):
            return bool(safely(send))

    def drop(self, tag: str, if_created_ms: str | None = None) -> bool:
        """Forget ``tag``: its keys go away (the ready IDs in it are a gap, never reused:
        a running refiller loses its lock and every write it tries is refused).

        With ``if_created_ms``, only while the tag's state still has that ``created_ms``
        (a tag dropped and registered again meanwhile is kept). True when dropped."""
        k = self.tag(tag)
        keys = [k.state, *(key for key in k.all() if key != k.state)]
        created = "*" if if_created_ms is None else if_created_ms

        def forget() -> None:
            pipe = self.redis.pipeline(transaction=False)
            pipe.srem(self.keys.tags, tag)
            pipe.srem(self.keys.wanted, tag)
            pipe.execute()

        with redis_errors(f"{tag}: drop"):  # drop.lua finds a repeated drop done
            if not safely(lambda: self._drop(keys=keys, args=[created])):
                return False
            # the global sets live in other slots of a Redis Cluster: a second round trip
            safely(forget)
        return True

    def tags(self) -> list[str]:
        with redis_errors("list tags"):
            return sorted(text(t) for t in safely(lambda: self.redis.smembers(self.keys.tags)))

    def tag_count(self) -> int:
        """How many tags the pool knows (``SCARD``: one reply, not the names)."""
        with redis_errors("count tags"):
            return int(safely(lambda: self.redis.scard(self.keys.tags)))

    def is_known(self, tag: str) -> bool:
        with redis_errors(f"{tag}: membership"):
            return bool(safely(lambda: self.redis.sismember(self.keys.tags, tag)))

    def mode(self, tag: str) -> str | None:
        with redis_errors(f"{tag}: mode"):
            raw = safely(lambda: self.redis.hget(self.tag(tag).state, "mode"))
        return text(raw) if raw else None

    def db_unreachable_ms(self, tag: str) -> int:
        """When the tag's refills found the database unreachable (ms, 0: they did not):
        the one state field the ``app`` role may read (``HGET``), for the empty-pool error
        (docs/design.md §3.8)."""
        with redis_errors(f"{tag}: db_unreachable_ms"):
            raw = safely(lambda: self.redis.hget(self.tag(tag).state, "db_unreachable_ms"))
        return int(raw) if raw and text(raw).isdigit() else 0

    # -- reads --------------------------------------------------------------------------

    def snapshot(self, tag: str) -> Snapshot:
        def read() -> Any:
            pipe = self.redis.pipeline(transaction=True)
            queue_snapshot(pipe, self.tag(tag))
            return pipe.execute()

        with redis_errors(f"{tag}: snapshot"):
            return snapshot_from(tag, safely(read))

    # -- state --------------------------------------------------------------------------

    def record(self, tag: str, counts: Mapping[str, int] | None = None,
               **fields: object) -> bool:
        """Set ``fields`` and add ``counts`` in the tag's state, only while the tag is
        registered (False, nothing written, once it was dropped)."""
        if not fields and not counts:
            return True
        args = record_args(fields, counts)
        if counts:  # HINCRBY: never repeated (a repeat counts twice)
            state = self.tag(tag).state
            reply = self._once(tag, state, [("EVALSHA", self._record.sha, 1, state, *args)],
                               "record", 0, self._record)[0]
        else:  # HSET alone: the same values again
            with redis_errors(f"{tag}: record"):
                reply = safely(lambda: self._record(keys=[self.tag(tag).state], args=args))
        return _recorded(tag, int(reply))

    def count(self, tag: str, name: str, by: int = 1) -> bool:
        return self.record(tag, counts={name: by})

    def want(self, tag: str) -> None:
        """Record an empty-pool hit and ask the sweep for a refill of ``tag``."""
        with redis_errors(f"{tag}: want"):
            safely(lambda: self.redis.sadd(self.keys.wanted, tag))
        try:  # a counter: never repeated; best effort (another app may have overflowed it)
            self._record_once(tag, {"empty_hits": 1})
        except LeafpoolError as exc:
            log.warning("%s: empty hit not counted: %s", tag, exc)

    def take_wanted(self) -> list[str]:
        """The tags clients found empty, taken from the set: read, then removed (both
        repeatable; ``SPOP`` was not: a lost reply lost the tags it took)."""
        with redis_errors("wanted"):
            raw = safely(lambda: self.redis.srandmember(self.keys.wanted, 10_000))
            if raw:
                safely(lambda: self.redis.srem(self.keys.wanted, *raw))
        return sorted(text(t) for t in raw or [])

    def mark_queued(self, tag: str, seconds: int) -> bool:
        """True when no refill of ``tag`` was marked queued in the last ``seconds`` (this
        call marked it; see :meth:`mark_queued_many`)."""
        return self.mark_queued_many([tag], seconds)[0]

    def note_dry(self, tag: str, now_ms: int) -> int:
        """Record whether ``tag``'s list is dry as it is now (``dry.lua``: 1 marked dry,
        -1 no longer dry, 0 unchanged; docs/design.md §3.8). Repeated after a lost reply:
        the first run changed the mark, a repeat changes nothing."""
        k = self.tag(tag)
        with redis_errors(f"{tag}: dry mark"):
            return int(safely(lambda: self._dry(keys=[k.ids, k.state], args=[now_ms])))

    def clear_queued(self, tag: str) -> None:
        with redis_errors(f"{tag}: clear queued"):
            safely(lambda: self.redis.delete(self.tag(tag).queued))

    # -- fenced writes ------------------------------------------------------------------

    def push(self, tag: str, token: bytes, head: Range, count: int, now_ms: int) -> int:
        """Push the first ``count`` IDs of the reserve ``head`` into the ready list.

        Returns the new list length; raises :class:`StaleWrite` (nothing written) when the
        lock, the head or the high-water mark says this chunk must not be pushed. The IDs
        are generated in Redis (``push_range.lua``) when the chunk's last ID is below 2^53
        (:data:`~leafpool.redis.push_run.RANGE_LIMIT`), else sent one by one
        (``push_ids.lua``); both fence alike.
        """
        k = self.tag(tag)
        script, args = self._push_call(token, head, count, now_ms)
        tries = _Tries(lambda: script(keys=[k.ids, k.reserve, k.state, k.lock], args=args))
        with redis_errors(f"{tag}: push"):
            result = int(safely(tries))
            new_head = head.after_taking(count)
            if result == scripts.HEAD_MOVED and tries.repeated and new_head and \
                    safely(lambda: self.redis.lindex(k.reserve, 0)) == new_head.encode():
                return self._landed(tag, "push", k.ids)  # the first try did it
        if result < 0:
            raise StaleWrite(f"{tag}: push of {count} IDs from {head.encode()} refused: "
                             f"{scripts.REFUSALS[result]}", code=result)
        return result

    def push_fresh(self, tag: str, token: bytes, ids: Sequence[int], now_ms: int) -> int:
        """Push freshly generated, strictly increasing IDs (snowflake mode)."""
        k = self.tag(tag)
        tries = _Tries(lambda: self._fresh(keys=[k.ids, k.state, k.lock],
                                           args=[token, now_ms, *map(str, ids)]))
        with redis_errors(f"{tag}: push"):
            result = int(safely(tries))
            if result == scripts.NOT_ABOVE_HWM and tries.repeated and \
                    safely(lambda: self.redis.hget(k.state, "hwm")) == str(ids[-1]).encode():
                return self._landed(tag, "push", k.ids)
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
        tries = _Tries(lambda: self._append(
            keys=[k.reserve, k.state, k.lock],
            args=[token, str(segment.start), str(segment.end), *pairs]))
        with redis_errors(f"{tag}: append reserve"):
            result = int(safely(tries))
            if result in (scripts.BELOW_RESERVE_TAIL, scripts.NOT_ABOVE_HWM) and \
                    tries.repeated and \
                    safely(lambda: self.redis.lindex(k.reserve, -1)) == segment.encode().encode():
                return self._landed(tag, "reserve append", k.reserve)
        if result < 0:
            raise StaleWrite(f"{tag}: reserve range {segment.encode()} refused: "
                             f"{scripts.REFUSALS[result]}", code=result)
        return result

    def trim_reserve(self, tag: str, token: bytes, below: int | None = None,
                     limit: int = 1000) -> int:
        """Drop the reserve's head ranges that start at or below the high-water mark, and
        with ``below`` those that end at or below it (``trim_reserve.lua``: a snowflake
        tag's reserve, docs/design.md §8.7); at most ``limit`` ranges. The number dropped
        (a gap, never handed out); :class:`StaleWrite` when the lock is lost."""
        k = self.tag(tag)
        with redis_errors(f"{tag}: trim reserve"):  # the same conditions: safe to repeat
            result = int(safely(lambda: self._trim(
                keys=[k.reserve, k.state, k.lock],
                args=[token, "" if below is None else str(below), str(limit)])))
        if result < 0:
            raise StaleWrite(f"{tag}: reserve trim refused: {scripts.REFUSALS[result]}",
                             code=result)
        return result

    # -- failovers (docs/design.md §7.1) ---------------------------------------------------

    def note_master(self, snap: Snapshot, now_ms: int) -> bool:
        """Record which master serves the tag and its replication ID; a new ID means a
        failover promoted a replica (or the master restarted without its data): counted
        in ``failovers``, logged, and the refill goes on from the promoted node's state
        (its high-water mark and reserve fence every write). True on a failover."""
        replid, where = safely(lambda: replicas.replication_id(self.redis, self.tag(snap.tag).ids))
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

    def reserve_head(self, tag: str) -> Range | None:
        with redis_errors(f"{tag}: reserve head"):
            raw = safely(lambda: self.redis.lindex(self.tag(tag).reserve, 0))
        return Range.decode(raw) if raw else None

    def _landed(self, tag: str, what: str, key: str) -> int:
        """A fenced write repeated after a lost reply was refused because its first try
        had landed: the write is done; the list's length now."""
        log.info("%s: %s repeated after a lost reply had landed the first time", tag, what)
        return int(safely(lambda: self.redis.llen(key)))


class _Tries:
    """A call that knows whether it was repeated (by :func:`safely`)."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self._call = call
        self.count = 0

    @property
    def repeated(self) -> bool:
        return self.count > 1

    def __call__(self) -> Any:
        self.count += 1
        return self._call()


def _recorded(tag: str, reply: int) -> bool:
    """record.lua's reply: 1 recorded, 0 the tag is not registered (nothing written)."""
    if reply < 0:
        raise StaleWrite(f"{tag}: record refused: {scripts.REFUSALS.get(reply, reply)}",
                         code=reply)
    return reply == 1
