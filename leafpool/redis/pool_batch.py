"""The refill protocol's Redis steps for many tags at once, one pipeline a step: the
batched first fill of new tags (:mod:`leafpool.segment.first_fill`, docs/design.md §4).

Each tag's commands are the one-tag path's (:class:`~leafpool.redis.pool.Pool`,
:class:`~leafpool.redis.lock.RefillLock`): the same scripts with the same keys and
arguments, so every fence holds per tag as it does for one refill (the lock's token,
the reserve head, the high-water mark). Only the round trips are shared, and with them
Redis's ``appendfsync always`` flush: one per pipeline, not one per command.

Repeated after a lost reply as the one-tag path repeats them: the lock acquire and
release, the snapshots and the dry marks (:func:`~leafpool.redis.retries.safely`); the
fenced writes and the records (counters) are sent once (:func:`send_writes`), and a lost
reply fails the tags of that pipeline (a fenced write that landed is a reserve the next
refill finds; one that did not is a gap in the counter, never a repeat).

On one node (or a Sentinel's master) only: a Cluster's tags live on many nodes, and its
first fills go by the one-tag path.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis

from leafpool.core.errors import LeafpoolError
from leafpool.redis import scripts
from leafpool.redis.connect import is_cluster, redis_errors
from leafpool.redis.lock import RefillLock, replid_of
from leafpool.redis.packed import pack
from leafpool.redis.pool import Pool, Range, Snapshot
from leafpool.redis.pool_common import (
    SNAPSHOT_REPLIES,
    as_map,
    record_args,
    snapshot_commands,
    snapshot_from,
)
from leafpool.redis.push_run import push_script
from leafpool.redis.retries import read_all, safely, send_once

#: the scripts a batched first fill sends (loaded once per batch when missing)
SCRIPTS = ("lock_acquire", "lock_release", "record", "append_reserve", "push_ids",
           "push_range", "dry")


def batchable(pool: Pool) -> bool:
    """Whether ``pool``'s tags can be written in shared pipelines (not a Cluster)."""
    return not is_cluster(pool.redis)


class Shas:
    """The SHA1 of each script of :data:`SCRIPTS`, loaded into the script cache when it
    is not there (one round trip when all are; ``found``: the reply of a ``SCRIPT
    EXISTS`` of them all the caller sent, in the order of :data:`SCRIPTS`)."""

    def __init__(self, pool: Pool, found: Sequence[Any] | None = None) -> None:
        client = pool.redis
        self._sha = {name: scripts.sha1(name) for name in SCRIPTS}
        with redis_errors("batch: scripts"):
            if found is None:
                found = safely(lambda: client.script_exists(*self._sha.values()))
            self.loaded = [name for name, there in zip(self._sha, found, strict=True)
                           if not int(there)]
            for name in self.loaded:
                src = scripts.source(name)
                safely(lambda src=src: client.script_load(src))  # type: ignore[misc]

    def __getitem__(self, name: str) -> str:
        return self._sha[name]


def _exists_command() -> tuple[Any, ...]:
    """``SCRIPT EXISTS`` of every script of :data:`SCRIPTS`, in their order."""
    return ("SCRIPT", "EXISTS", *(scripts.sha1(name) for name in SCRIPTS))


def _repeatable(pool: Pool, commands: Sequence[tuple[Any, ...]], what: str) -> list[Any]:
    """``commands`` in one pipeline, repeated whole after a lost reply (only commands that
    are safe to repeat); an error reply is returned in its place."""
    def send() -> list[Any]:
        pipe = pool.redis.pipeline(transaction=False)
        for command in commands:
            pipe.execute_command(*command)
        return list(pipe.execute(raise_on_error=False))

    if not commands:
        return []
    with redis_errors(what):
        return safely(send)


def send_writes(pool: Pool, commands: Sequence[tuple[Any, ...]], what: str) -> list[Any]:
    """``commands`` in one pipeline, sent once, never repeated: the fenced writes and the
    records with counters. An error reply is returned in its place; a lost reply raises
    :class:`~leafpool.core.errors.ReplyLost` (some may have run),
    :class:`~leafpool.core.errors.BackendUnavailable` when nothing was sent."""
    if not commands:
        return []
    return send_once(pool.redis, commands, what)


class _PipelinedLock(RefillLock):
    """A refill lock whose acquire ran in a pipeline of many: :meth:`adopt` reads its
    reply exactly as :meth:`RefillLock.acquire` reads its own."""

    _reply: Any = None

    def adopt(self, nonce: str, reply: Any) -> bool:
        self._reply = reply
        try:
            held = self._acquire(nonce, [])
        finally:
            self._reply = None
        self._extended_at = self._monotonic()
        return held

    def _run(self, name: str, args: list[Any], what: str) -> Any:
        if name == "lock_acquire" and self._reply is not None:
            if isinstance(self._reply, Exception):
                raise self._reply
            return self._reply
        return super()._run(name, args, what)


@dataclass
class Taken:
    """What :func:`take_and_read` found: the scripts' SHA1s, each tag's lock (None: held
    by another refiller), the snapshot of each tag whose lock was taken (read after it),
    and the master's (replication ID, address as this connection sees it)."""

    shas: Shas
    locks: dict[str, RefillLock | None]
    snapshots: dict[str, Snapshot]
    master: tuple[str, str]


def take_and_read(pool: Pool, tags: Sequence[str], ttl_ms: int,
                  monotonic: Callable[[], float] = time.monotonic) -> Taken:
    """The batch's first steps in ONE round trip: which scripts Redis has (``SCRIPT
    EXISTS``), each tag's refill lock taken (``lock_acquire.lua``, as
    :meth:`RefillLock.acquire`), then each tag's snapshot (the commands of
    :meth:`Pool.snapshots`) and the master's replication ID and address (as
    :func:`replicas.replication_id`): Redis runs a pipeline's commands in order, so every
    snapshot is read after its tag's lock was taken, as the one-tag refill reads it.
    Repeated whole after a lost reply (an acquire repeated with its nonce finds its own
    lock: code 2; the rest are reads). When Redis lacks ``lock_acquire.lua`` (a restart
    emptied its script cache) every acquire was refused NOSCRIPT and nothing was taken: the
    scripts are loaded and the pipeline sent once more. Raises after releasing the locks
    it took when a reply is an error (a tag's lock, snapshot, or the master's ID)."""
    nonces = [secrets.token_hex(16) for _ in tags]
    keys = [pool.tag(tag).lock for tag in tags]
    commands: list[tuple[Any, ...]] = [_exists_command()]
    commands += [("EVALSHA", scripts.sha1("lock_acquire"), 1, key, nonce, ttl_ms)
                 for key, nonce in zip(keys, nonces, strict=True)]
    for tag in tags:
        commands += snapshot_commands(pool.tag(tag))
    commands += [("INFO", "replication"), ("CLIENT", "INFO")]
    packed = pack(commands)

    def send() -> list[Any]:
        conn = pool.redis.connection_pool.get_connection()
        try:
            conn.send_packed_command([packed])
            return read_all(conn, len(commands))
        except BaseException:
            conn.disconnect()  # a reply may be left unread on it
            raise
        finally:
            pool.redis.connection_pool.release(conn)

    with redis_errors("batch: locks and snapshots"):
        replies = safely(send)
        shas = Shas(pool, replies[0])
        if "lock_acquire" in shas.loaded:
            replies = safely(send)
    n = len(tags)
    out: dict[str, RefillLock | None] = {}
    try:
        for tag, key, nonce, reply in zip(tags, keys, nonces, replies[1:1 + n], strict=True):
            lock = _PipelinedLock(pool.redis, key, ttl_ms, monotonic)
            out[tag] = None
            with redis_errors(f"{key}: acquire"):
                out[tag] = lock if lock.adopt(nonce, reply) else None
        with redis_errors("batch: snapshots and the master's replication ID"):
            for reply in replies[1 + n:]:
                if isinstance(reply, Exception):
                    raise reply
    except BaseException:
        with contextlib.suppress(LeafpoolError):  # else their TTL ends them
            release_locks(pool, shas, [lock for lock in out.values() if lock is not None])
        raise
    info, me = replies[-2:]
    laddr = re.search(r"laddr=(\S+)", me.decode() if isinstance(me, bytes) else str(me))
    raw = replies[1 + n:-2]
    snaps: dict[str, Snapshot] = {}
    for i, tag in enumerate(tags):
        if out[tag] is not None:
            length, reserve, state, locked, hits = \
                raw[i * SNAPSHOT_REPLIES:(i + 1) * SNAPSHOT_REPLIES]
            snaps[tag] = snapshot_from(tag, (length, reserve, as_map(state), locked, hits))
    return Taken(shas, out, snaps, (replid_of(info), laddr.group(1) if laddr else "?"))


def release_locks(pool: Pool, shas: Shas, locks: Sequence[RefillLock]) -> None:
    """Release the held ``locks`` in one pipeline (``lock_release.lua``, as
    :meth:`RefillLock.release`: a lock taken over meanwhile is left to its holder)."""
    held = [lock for lock in locks if lock.held]
    for lock in held:
        lock.held = False
    _repeatable(pool, [release_command(shas, lock) for lock in held], "batch: lock release")


def release_command(shas: Shas, lock: RefillLock) -> tuple[Any, ...]:
    """:meth:`RefillLock.release`'s ``lock_release.lua`` call, as a command."""
    return ("EVALSHA", shas["lock_release"], 1, lock.name, lock.token)


def clear_queued_command(pool: Pool, tag: str) -> tuple[Any, ...]:
    """:meth:`Pool.clear_queued` for ``tag``, as a command."""
    return ("DEL", pool.tag(tag).queued)


def dry_command(pool: Pool, shas: Shas, tag: str, now_ms: int) -> tuple[Any, ...]:
    """:meth:`Pool.note_dry`'s ``dry.lua`` call for ``tag``, as a command."""
    return ("EVALSHA", shas["dry"], 2, pool.tag(tag).ids, pool.tag(tag).state, now_ms)


def clear_queued(pool: Pool, tags: Sequence[str]) -> None:
    """Each tag's ``queued`` marker deleted, in one pipeline (:meth:`Pool.clear_queued`)."""
    _repeatable(pool, [clear_queued_command(pool, tag) for tag in tags], "batch: clear queued")


def record_command(pool: Pool, shas: Shas, tag: str, fields: Mapping[str, object],
                   counts: Mapping[str, int]) -> tuple[Any, ...]:
    """:meth:`Pool.record`'s ``record.lua`` call for ``tag``, as a command of a pipeline."""
    return ("EVALSHA", shas["record"], 1, pool.tag(tag).state, *record_args(fields, counts))


def append_command(pool: Pool, shas: Shas, tag: str, token: bytes, segment: Range,
                   fields: Mapping[str, object]) -> tuple[Any, ...]:
    """:meth:`Pool.append_reserve`'s ``append_reserve.lua`` call, as a command."""
    k = pool.tag(tag)
    pairs: list[str] = []
    for name, value in fields.items():
        pairs += [name, str(value)]
    return ("EVALSHA", shas["append_reserve"], 3, k.reserve, k.state, k.lock, token,
            str(segment.start), str(segment.end), *pairs)


def push_command(pool: Pool, shas: Shas, tag: str, token: bytes, head: Range, count: int,
                 now_ms: int) -> tuple[Any, ...]:
    """:meth:`Pool.push`'s script call (the first ``count`` IDs of the reserve ``head``
    into the ready list: ``push_range.lua`` below 2^53, else ``push_ids.lua``), as a
    command."""
    k = pool.tag(tag)
    name, argv = push_script(token, head, count, now_ms)
    return ("EVALSHA", shas[name], 4, k.ids, k.reserve, k.state, k.lock, *argv)


def note_dry(pool: Pool, shas: Shas, tags: Sequence[str], now_ms: int) -> None:
    """:meth:`Pool.note_dry` for each tag, in one pipeline (``dry.lua``: repeatable)."""
    _repeatable(pool, [dry_command(pool, shas, tag, now_ms) for tag in tags],
                "batch: dry marks")


@dataclass(frozen=True)
class Refused:
    """A write's reply that is not its success: a script's refusal code, or an error."""

    code: int  # the script's code (scripts.REFUSALS), 0 for an error reply
    error: str = ""


def refusal(reply: Any) -> Refused | None:
    """None when ``reply`` is a script's success (0 or more), else what refused it."""
    if isinstance(reply, redis.RedisError | Exception):
        return Refused(0, f"{type(reply).__name__}: {reply}")
    value = int(reply)
    return Refused(value) if value < 0 else None
