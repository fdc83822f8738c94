"""Locks with a fencing token: a tag's refill lock and the beat lock (docs/design.md §3.1).

A lock is one key holding ``<nonce>@<replid>``: a random nonce of this acquire and the
replication ID of the master it was taken on. The whole value is the holder's token; every
refill write passes it to its Lua script, so a refiller whose lock expired or was taken
over can write nothing. The three scripts (``lua/lock_acquire.lua``, ``lock_extend.lua``,
``lock_release.lua``) are safe to repeat after a lost reply, and are repeated
(:func:`~leafpool.redis.retries.safely`):

- an acquire whose reply was lost is repeated and finds its own nonce: held (redis-py's
  ``Lock.acquire``, a ``SET NX``, found its own value on the repeat and reported the lock
  taken by another: the tag paused for the whole TTL);
- a lock written on a former master (its replication ID is not this master's: a
  failover promoted a replica, or the master restarted) is taken over at once: its
  holder's connection went with that master, and the holder's writes are fenced by the
  token it no longer matches;
- a release repeated after a lost reply finds the lock free.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

import redis

from leafpool.redis import scripts
from leafpool.redis.connect import redis_errors
from leafpool.redis.retries import safely

log = logging.getLogger(__name__)

FREE, OURS, TAKEN_OVER = 1, 2, 3


class TokenLock:
    """One lock key: :meth:`acquire` (without blocking), :meth:`extend`, :meth:`release`.
    ``token`` is the fencing token of the last acquire (kept after a release: writes with
    it are refused)."""

    def __init__(self, client: redis.Redis, name: str, ttl_ms: int) -> None:
        self.name = name
        self.ttl_ms = ttl_ms
        self._client = client
        self._token: bytes | None = None
        self.held = False
        self.took_over_from: str | None = None  # the former master's holder, on a takeover

    @property
    def token(self) -> bytes:
        assert self._token is not None, "token read before acquire"
        return self._token

    def _run(self, name: str, args: list[Any], what: str) -> Any:
        script = self._client.register_script(scripts.source(name))
        with redis_errors(f"{self.name}: {what}"):
            return safely(lambda: script(keys=[self.name], args=args))

    def acquire(self) -> bool:
        """True when this caller now holds the lock (it was free, this is a repeat of our
        own acquire, or its holder was on a former master)."""
        reply = self._run("lock_acquire", [secrets.token_hex(16), self.ttl_ms], "acquire")
        code, value = int(reply[0]), reply[1]
        self.held = code in (FREE, OURS, TAKEN_OVER)
        if not self.held:
            return False
        if code == TAKEN_OVER:
            former = reply[2]
            self.took_over_from = former.decode() if isinstance(former, bytes) else str(former)
            log.warning("%s: taken over from a holder on a former master (a failover or a "
                        "restart changed the replication ID)", self.name)
        self._token = bytes(value) if isinstance(value, bytes) else str(value).encode()
        return True

    def extend(self) -> bool:
        """Renew the TTL; False (and no longer held) when the lock expired or was taken."""
        if self._token is None:
            return False
        self.held = int(self._run("lock_extend", [self._token, self.ttl_ms], "extend")) == 1
        return self.held

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        self._run("lock_release", [self.token], "release")  # 0: taken over, nothing of ours


class RefillLock(TokenLock):
    """A tag's refill lock: extended at a third of its TTL while the refill runs."""

    def __init__(
        self,
        client: redis.Redis,
        name: str,
        ttl_ms: int,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(client, name, ttl_ms)
        self._monotonic = monotonic
        self._extended_at = 0.0

    def acquire(self) -> bool:
        held = super().acquire()
        self._extended_at = self._monotonic()
        return held

    def keep(self) -> None:
        """Extend the TTL when a third of it has passed (a long refill keeps its lock);
        a lock lost meanwhile is not held any more, and the writes' token check refuses
        what this refill would still try."""
        if self._monotonic() - self._extended_at < self.ttl_ms / 3000:
            return
        self.extend()
        self._extended_at = self._monotonic()

    def __enter__(self) -> RefillLock:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class BeatLock(TokenLock):
    """The lock held by the one active Celery beat (``P:beat:lock``)."""

    def __init__(self, client: redis.Redis, name: str, ttl_seconds: float) -> None:
        super().__init__(client, name, int(ttl_seconds * 1000))
