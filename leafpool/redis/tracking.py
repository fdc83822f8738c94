"""The drop watcher's two connections (docs/design.md §3.7): a reader whose reads Redis
tracks (client-side caching, ``CLIENT TRACKING on REDIRECT``, default mode, RESP2) and a
subscriber on ``__redis__:invalidate`` that receives the invalidations.

Redis sends one invalidation per key per read: the next write of a key read on the
reader (a pop, a push, a lock taken or released) sends one message naming it, and the
key is tracked again only when it is read again. The reads themselves are the pool's
(:meth:`~leafpool.redis.pool_many.ManyTags.tracked_levels` and its siblings, given
:attr:`Tracking.reader`); this module owns the connections, the messages and the
heartbeat. What to do with the keys named is :mod:`leafpool.housekeeping.watch`'s.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import redis

from leafpool.core.errors import BackendUnavailable
from leafpool.redis.errors import wrap

INVALIDATE = "__redis__:invalidate"


class Tracking:
    """A subscriber and a tracked reader on the node ``client`` talks to. Any error is
    raised as :class:`BackendUnavailable` (the watcher reconnects and reads every tag
    again: tracking does not survive a new connection)."""

    def __init__(self, client: redis.Redis) -> None:
        cp = client.connection_pool
        kwargs = {**cp.connection_kwargs, "protocol": 2, "health_check_interval": 0}
        # raw redis-py connections (typed Any: their methods carry no annotations)
        self._sub: Any = cp.connection_class(**kwargs)
        self.reader: Any = cp.connection_class(**kwargs)
        self.pong = True

    def open(self) -> Tracking:
        try:
            sub, reader = self._sub, self.reader
            sub.connect()
            sub.send_command("CLIENT", "ID")
            sub_id = int(sub.read_response())
            sub.send_command("SUBSCRIBE", INVALIDATE)
            sub.read_response()
            reader.connect()
            reader.send_command("CLIENT", "TRACKING", "on", "REDIRECT", sub_id)
            reader.read_response()
        except BaseException as exc:
            self.close()
            if isinstance(exc, redis.RedisError | OSError):
                raise wrap(exc, "tracking") from exc
            raise
        return self

    def close(self) -> None:
        self._sub.disconnect()
        self.reader.disconnect()

    def wait(self, timeout: float) -> bool:
        """True when a message is there to read within ``timeout`` seconds."""
        try:
            return bool(self._sub.can_read(timeout=timeout))
        except (redis.RedisError, OSError) as exc:
            raise wrap(exc, "tracking") from exc

    def messages(self) -> Iterator[list[str] | None]:
        """The keys each waiting invalidation names (None: a flush, every key of the
        node); other messages (a PONG) are consumed and yield nothing."""
        try:
            while True:
                keys = self._message(self._sub.read_response())
                if keys is None or keys:
                    yield keys
                if not self._sub.can_read(timeout=0):
                    return
        except (redis.RedisError, OSError) as exc:
            raise wrap(exc, "tracking") from exc

    def _message(self, msg: object) -> list[str] | None:
        if isinstance(msg, list) and msg and msg[0] == b"pong":
            self.pong = True
        if not isinstance(msg, list) or len(msg) < 3 or msg[0] != b"message":
            return []
        keys = msg[2]
        if keys is None:
            return None
        return [k.decode() if isinstance(k, bytes) else str(k) for k in keys]

    def heartbeat(self) -> None:
        """PING the subscriber (its reply comes back as a message) and check that the
        node is still the master: after a failover that left it running as a replica the
        watcher must reconnect (the pool's connection asks Sentinel anew). A PING still
        unanswered a heartbeat later means a dead connection."""
        if not self.pong:
            raise BackendUnavailable("redis: tracking: the subscriber did not answer PING")
        self.pong = False
        try:
            self._sub.send_command("PING")
            self.reader.send_command("ROLE")
            role = self.reader.read_response()
        except (redis.RedisError, OSError) as exc:
            raise wrap(exc, "tracking") from exc
        if isinstance(role, list) and role and role[0] not in (b"master", "master"):
            raise BackendUnavailable("redis: tracking: the watched node is no longer the master")
