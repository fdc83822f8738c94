"""What happens to a command whose reply is lost (docs/design.md §7.2).

A reply can be lost after Redis ran the command: a reset connection, a timeout, a
failover, a cancelled request. redis-py repeats every command up to three times on such
an error by default; a repeat is safe only when running the command twice changes
nothing more than running it once. So no client leafpool opens repeats anything by itself
(:data:`ONCE`, given to every connection by :mod:`leafpool.redis.connect`), and the Redis
layer decides per command:

==========================================  ======  ==========================================
command                                     repeat  why
==========================================  ======  ==========================================
reads (LLEN, LRANGE, HGETALL, HMGET,        yes     they change nothing
SMEMBERS, SISMEMBER, LINDEX, EXISTS, INFO,
CLIENT INFO, ROLE, PING)
register (SADD, HSETNX, HSET), clear        yes     the same value written twice
queued (DEL), record without counters
the refill lock (acquire, extend, release)  yes     its scripts recognise the caller's own
                                                        token (docs/design.md §3.1)
queued marker (SET NX GET with a token)     yes     a repeat finds the caller's own token
push_ids, push_fresh, append_reserve        yes     fenced: a repeat of a write that landed
                                                        is refused and writes nothing; the
                                                        caller then checks whether it was its
                                                        own (:mod:`leafpool.redis.pool`)
drop                                        yes     a repeat finds the keys gone
trim_reserve                                yes     a repeat drops only head ranges that
                                                        still meet its conditions
wanted set: SMEMBERS, then SREM of those    yes     idempotent (SPOP was not)
LPOP, LPOP n, BLPOP, take_reserve,          no      the reply carried the IDs: a repeat takes
[LPOP, WAIT]                                            others; the lost ones are a gap,
                                                        counted in ``gaps``
record with counters (HINCRBY), want        no      a repeat counts twice; a lost one may
(empty_hits)                                            count once or not at all
==========================================  ======  ==========================================

:func:`safely` (and :func:`safely_async`) repeat the safe commands with redis-py's own
:class:`~redis.retry.Retry`; :func:`send_once` (and :func:`send_once_async`) send the others
on one connection and tell a command that never left (connecting or writing failed:
:class:`~leafpool.core.errors.BackendUnavailable`, nothing ran) from one whose reply was
lost (:class:`~leafpool.core.errors.ReplyLost`, it may have run).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import redis
import redis.asyncio.retry as async_retry
from redis.backoff import ExponentialWithJitterBackoff, NoBackoff
from redis.exceptions import AuthenticationError
from redis.retry import Retry

from leafpool.core.errors import BackendUnavailable, ReplyLost
from leafpool.redis.errors import wrap

T = TypeVar("T")

#: every connection leafpool opens: redis-py itself repeats nothing
ONCE = Retry(NoBackoff(), 0)
ONCE_ASYNC = async_retry.Retry(NoBackoff(), 0)

#: the safe commands: three more tries, 10 ms, 20 ms, 40 ms apart (with jitter, at most
#: 0.5 s): a reset connection is replaced at once; a longer outage is the caller's to
#: handle (a refill fails and Celery retries it)
SAFE_RETRIES = 3
_ERRORS = (redis.ConnectionError, redis.TimeoutError, OSError)


def _retryable(exc: Exception) -> bool:
    return not isinstance(exc, AuthenticationError)  # a wrong password stays wrong


def _safe() -> Retry:
    return Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.5), SAFE_RETRIES, _ERRORS)


def safely(call: Callable[[], T]) -> T:
    """``call()``, repeated after a lost reply (only for the commands the table above
    marks safe)."""
    return _safe().call_with_retry(call, _ignore, is_retryable=_retryable)


async def safely_async(call: Callable[[], Awaitable[T]]) -> T:
    """The asyncio twin of :func:`safely`."""
    retry = async_retry.Retry(ExponentialWithJitterBackoff(base=0.01, cap=0.5), SAFE_RETRIES,
                              (redis.ConnectionError, redis.TimeoutError))
    return await retry.call_with_retry(call, _ignore_async, is_retryable=_retryable)


def _ignore(_: Exception) -> None:
    """redis-py disconnects the failed connection itself; the next try takes another."""


async def _ignore_async(_: Exception) -> None:
    return None


def read_all(conn: Any, count: int) -> list[Any]:
    """``count`` replies; an error reply is returned as its exception, in its place."""
    out: list[Any] = []
    for _ in range(count):
        try:
            out.append(conn.read_response())
        except redis.ResponseError as exc:
            out.append(exc)
    return out


def send_once(client: Any, commands: Sequence[Sequence[Any]], what: str,
              on_lost: Callable[[], object] | None = None) -> list[Any]:
    """Send ``commands`` (pipelined, one round trip) on one connection of ``client`` (one
    node: a Cluster caller passes the node holding the key) and read their raw replies;
    an error reply is returned as a :class:`redis.ResponseError` in its place. Nothing is
    repeated. Raises :class:`BackendUnavailable` when the commands never left (nothing
    ran); when they left and a reply did not come back, calls ``on_lost()`` and raises
    :class:`ReplyLost`."""
    pool = client.connection_pool
    try:
        conn = pool.get_connection()  # connects (nothing sent yet)
    except (redis.RedisError, OSError) as exc:
        raise wrap(exc, what) from exc
    try:
        try:
            conn.check_health()  # its PING before the commands leave, not among them
            conn.send_packed_command(conn.pack_commands(commands), check_health=False)
        except (redis.RedisError, OSError) as exc:
            conn.disconnect()
            raise wrap(exc, what) from exc
        try:
            return read_all(conn, len(commands))
        except BaseException as exc:
            conn.disconnect()
            if on_lost is not None:
                on_lost()
            if isinstance(exc, redis.RedisError | OSError):
                raise ReplyLost(f"redis: {what}: reply lost: {exc}") from exc
            raise
    finally:
        pool.release(conn)


async def send_once_async(client: Any, commands: Sequence[Sequence[Any]], what: str,
                          on_lost: Callable[[], object] | None = None) -> list[Any]:
    """The asyncio twin of :func:`send_once`. A cancellation once the write has begun
    counts as a lost reply (the bytes may already be on their way, and Redis runs what it
    received): ``on_lost()`` is called, the connection dropped, and the cancellation goes
    on (never swallowed)."""
    pool = client.connection_pool
    try:
        conn = await pool.get_connection()  # connects (nothing sent yet)
    except (redis.RedisError, OSError) as exc:
        raise wrap(exc, what) from exc
    sent = False
    try:
        try:
            await conn.check_health()  # its PING before the commands leave
            sent = True
            await conn.send_packed_command(conn.pack_commands(commands), check_health=False)
        except (redis.RedisError, OSError) as exc:
            await conn.disconnect(nowait=True)
            raise wrap(exc, what) from exc
        out: list[Any] = []
        for _ in commands:
            try:
                out.append(await conn.read_response())
            except redis.ResponseError as exc:
                out.append(exc)
        return out
    except BaseException as exc:
        if isinstance(exc, BackendUnavailable):
            raise
        await conn.disconnect(nowait=True)
        if sent and on_lost is not None:
            on_lost()
        if isinstance(exc, redis.RedisError | OSError):
            raise ReplyLost(f"redis: {what}: reply lost: {exc}") from exc
        raise
    finally:
        await pool.release(conn)
