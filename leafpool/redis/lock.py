"""The per-tag refill lock: redis-py's :class:`redis.lock.Lock` (SET NX PX with a random
token, extended and released by compare-and-set scripts). Its token is also the fencing
token every refill write passes to its Lua script, so a refiller whose lock expired can
no longer write anything."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from types import TracebackType

import redis
from redis.exceptions import LockError

from leafpool.redis.connect import redis_errors


class RefillLock:
    def __init__(
        self,
        client: redis.Redis,
        name: str,
        ttl_ms: int,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lock = client.lock(name, timeout=ttl_ms / 1000, blocking=False, thread_local=False)
        self._ttl = ttl_ms / 1000
        self._monotonic = monotonic
        self._extended_at = 0.0
        self._token: bytes | None = None
        self.held = False

    @property
    def token(self) -> bytes:
        """The token of the last acquire (kept after release: writes with it are refused)."""
        assert self._token is not None, "token read before acquire"
        return self._token

    def acquire(self) -> bool:
        with redis_errors(f"{self._lock.name}: acquire"):
            self.held = bool(self._lock.acquire(blocking=False))
        if self.held:
            self._token = bytes(self._lock.local.token)
        self._extended_at = self._monotonic()
        return self.held

    def keep(self) -> None:
        """Extend the TTL when a third of it has passed (a long refill keeps its lock)."""
        if self._monotonic() - self._extended_at < self._ttl / 3:
            return
        with redis_errors(f"{self._lock.name}: extend"):
            try:
                self._lock.extend(self._ttl, replace_ttl=True)
            except LockError:
                self.held = False  # writes will be refused by the token check
                return
        self._extended_at = self._monotonic()

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        with redis_errors(f"{self._lock.name}: release"), contextlib.suppress(LockError):
            self._lock.release()  # LockError: expired or taken over, nothing of ours

    def __enter__(self) -> RefillLock:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


class BeatLock:
    """The lock held by the one active Celery beat (``P:beat:lock``): redis-py's
    :class:`~redis.lock.Lock`, taken without blocking and extended while the beat runs."""

    def __init__(self, client: redis.Redis, name: str, ttl_seconds: float) -> None:
        self.name = name
        self._ttl = ttl_seconds
        self._lock = client.lock(name, timeout=ttl_seconds, blocking=False, thread_local=False)

    def acquire(self) -> bool:
        """True when this beat now holds the lock."""
        with redis_errors(f"{self.name}: acquire"):
            return bool(self._lock.acquire(blocking=False))

    def extend(self) -> bool:
        """Renew the TTL; False when the lock expired or another beat took it."""
        with redis_errors(f"{self.name}: extend"):
            try:
                self._lock.extend(self._ttl, replace_ttl=True)
            except LockError:
                return False
        return True

    def release(self) -> None:
        with redis_errors(f"{self.name}: release"), contextlib.suppress(LockError):
            self._lock.release()  # LockError: expired or taken over, nothing of ours
