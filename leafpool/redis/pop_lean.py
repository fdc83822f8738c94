"""The single-key pop of the asyncio pool, sent lean (issue 30; docs/design.md §1.1).

redis-py's asyncio round trip cost five times a bare one on the same connection (the
pool's lock and observability records on each get and release, the command packed per
call, a ``wait_for`` task around each write). :class:`LeanPop` sends ``LPOP key n`` with
none of that and the same send-once rules as :func:`leafpool.redis.retries.send_once_async`
(docs/design.md §7.2)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio as aioredis

from leafpool.core.errors import BackendUnavailable, ReplyLost
from leafpool.redis.connect import wrap
from leafpool.redis.pops import SEND_ATTEMPTS, settle

#: connections kept between pops (each counts against the client pool's
#: max_connections); a pop beyond them takes one from the pool and gives it back
LEAN_IDLE = 4


class LeanPop:
    """``LPOP key n`` of one plain client; ``lost(tag, n)`` counts what a pop whose reply
    was lost (or whose caller was cancelled once it was sent) may have taken."""

    def __init__(self, client: aioredis.Redis, lost: Callable[[str, int], None]) -> None:
        self._client = client
        self._lost = lost
        self.idle: list[Any] = []  # connections between pops
        self._heads: dict[str, bytes] = {}  # each key's packed LPOP up to its count

    async def pop(self, tag: str, key: str, count: int) -> Any:
        """``LPOP key count`` sent once, as :meth:`AsyncPool._once
        <leafpool.redis.pool_async.AsyncPool._once>` sends it through
        :func:`~leafpool.redis.retries.send_once_async` (docs/design.md §7.2), without
        the costs that are not the pop's (issue 30: redis-py's round trip cost five times
        a bare one): the connection is one of up to :data:`LEAN_IDLE` kept between pops,
        taken from the client's pool once (no pool lock, no observability records per
        pop); the command is packed once per key and count; it is written without a task
        around the write (redis-py's ``wait_for``), waiting under the socket timeout only
        when the transport holds it back.

        The same guarantees: nothing sent, nothing counted (a failed connect or health
        check); once the write has begun, a lost reply or a cancellation counts the
        ``count`` IDs the pop may have taken as a gap, drops the connection and raises
        ReplyLost (or lets the cancellation go on); an error reply is raised as
        :func:`~leafpool.redis.pops.settle` raises it."""
        idle = self.idle
        if idle:
            conn = idle.pop()
        else:
            pool: Any = self._client.connection_pool
            try:
                conn = await pool.get_connection()
            except (redis.RedisError, OSError) as exc:
                raise wrap(exc, f"{tag}: LPOP") from exc
        sent = False
        try:
            try:
                if not conn.is_connected:  # dropped after an error, or by the pool's close
                    await conn.connect()
                await conn.check_health()  # its PING before the command leaves
            except (redis.RedisError, OSError) as exc:
                await conn.disconnect(nowait=True)
                raise wrap(exc, f"{tag}: LPOP") from exc
            head = self._heads.get(key)
            if head is None:
                name = conn.encoder.encode(key)
                head = self._heads[key] = b"*3\r\n$4\r\nLPOP\r\n$%d\r\n%b\r\n" % (
                    len(name), name)
            n = b"%d" % count
            sent = True
            writer = conn._writer
            writer.write(b"%b$%d\r\n%b\r\n" % (head, len(n), n))
            if writer.transport.get_write_buffer_size():  # held back: wait as redis-py does
                await asyncio.wait_for(writer.drain(), conn.socket_timeout)
            try:
                reply = await conn.read_response()
            except redis.ResponseError as exc:  # Redis refused it: nothing taken
                reply = exc
        except BaseException as exc:
            if isinstance(exc, BackendUnavailable):
                raise
            await conn.disconnect(nowait=True)
            if sent:
                self._lost(tag, count)
            if isinstance(exc, redis.RedisError | OSError):
                raise ReplyLost(f"redis: {tag}: LPOP: reply lost: {exc}") from exc
            raise
        finally:
            if len(idle) < LEAN_IDLE:
                idle.append(conn)
            else:  # more pops at once than kept: back to the client's pool
                await self._client.connection_pool.release(conn)
        settle([reply], SEND_ATTEMPTS - 1, None, f"{tag}: LPOP")  # an error reply raised
        return reply
