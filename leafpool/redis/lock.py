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
  token it no longer matches; a value that names no replication ID (redis-py's ``Lock``,
  which builds before this form held the locks with) is another holder's, waited out
  (docs/reference/compatibility.md);
- a release repeated after a lost reply finds the lock free.

The beat lock also says who holds it and whether that holder is still there: a beat
subscribes to its own presence channel (``P:beat:lock:<nonce>``, :class:`Presence`) before
it takes the lock, and its value carries its identity (``<nonce>/<host>@<replid>``). Redis
drops the subscription with the connection, so when the process dies the next beat to try
(a restart of the same beat, or a standby elsewhere) takes the lock over at once instead
of waiting out its TTL; a live holder keeps its subscription and is never taken over.
"""

from __future__ import annotations

import logging
import re
import secrets
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any

import redis

from leafpool.redis import scripts
from leafpool.redis.connect import is_cluster, redis_errors
from leafpool.redis.retries import safely

log = logging.getLogger(__name__)

FREE, OURS, TAKEN_OVER, GONE = 1, 2, 3, 4


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
        self.took_over_from: str | None = None  # the former holder, on a takeover
        self.holder: str | None = None  # the holder's token, as a refused acquire saw it

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
        return self._acquire(secrets.token_hex(16), [])

    def _acquire(self, nonce: str, extra: list[Any]) -> bool:
        reply = self._run("lock_acquire", [nonce, self.ttl_ms, *extra], "acquire")
        code, value = int(reply[0]), _text(reply[1])
        self.held = code in (FREE, OURS, TAKEN_OVER, GONE)
        if not self.held:
            self.holder = value
            return False
        if code in (TAKEN_OVER, GONE):
            self.took_over_from = _text(reply[2])
            if code == TAKEN_OVER:
                log.warning("%s: taken over from a holder on a former master (a failover or "
                            "a restart changed the replication ID)", self.name)
            else:
                log.warning("%s: taken over from %s, which is gone (its connection to Redis "
                            "closed)", self.name, describe(self.took_over_from))
        self._token = value.encode()
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
    """The lock held by the one active Celery beat (``P:beat:lock``). With an
    ``identity`` (the host or pod name) the holder announces its presence (docs/design.md
    §3.1): a beat that finds the lock held by one that is gone takes it over at once. On
    a Redis Cluster (a channel's subscribers are counted per node) and when the ACL refuses
    the channel, the beat takes the lock without it, as an earlier release did: its lock
    is then waited out if it dies."""

    def __init__(self, client: redis.Redis, name: str, ttl_seconds: float,
                 identity: str | None = None) -> None:
        super().__init__(client, name, int(ttl_seconds * 1000))
        self.identity = clean_identity(identity) if identity is not None else None
        self._presence = (Presence(client) if identity is not None and not is_cluster(client)
                          else None)
        self._nonce = ""
        self.announced = False  # this holder's value names its presence channel

    def channel(self, nonce: str) -> str:
        """The presence channel of the holder whose nonce is ``nonce``."""
        return f"{self.name}:{nonce}"

    def acquire(self) -> bool:
        nonce = secrets.token_hex(16)
        extra: list[Any] = []
        if self._presence is not None and self._presence.announce(self.channel(nonce)):
            extra = [self.identity]
        held = self._acquire(nonce, extra)
        if held:
            self._nonce, self.announced = nonce, bool(extra)
        elif self._presence is not None:
            self._presence.close()  # a standby holds no connection between its tries
        return held

    def extend(self) -> bool:
        """Renew the TTL; a holder whose presence subscription went (its connection closed:
        Redis restarted or failed over, or dropped the connection) subscribes again first.
        A beat that took the lock over meanwhile holds another token: the renewal fails."""
        if self.held and self.announced and self._presence is not None \
                and not self._presence.alive():
            self._presence.announce(self.channel(self._nonce))
        return super().extend()

    def release(self) -> None:
        try:
            super().release()
        finally:
            if self._presence is not None:
                self._presence.close()


class Presence:
    """One connection subscribed to a lock holder's presence channel (docs/design.md
    §3.1): while it is open Redis counts one subscriber (``PUBSUB NUMSUB``, which
    ``lock_acquire.lua`` reads); when the holder's process dies the kernel closes it and
    the count falls to 0. A raw connection of the client's kind (Sentinel, TLS), RESP2."""

    def __init__(self, client: redis.Redis) -> None:
        cp = client.connection_pool
        self._kwargs = {**cp.connection_kwargs, "protocol": 2, "health_check_interval": 0}
        self._class = cp.connection_class
        self._conn: Any = None
        self._refused = False

    def announce(self, channel: str) -> bool:
        """Subscribe to ``channel`` on a new connection (the old one closed); False when
        Redis cannot be reached or refuses the channel (an ACL without it: said once)."""
        self.close()
        conn = self._class(**self._kwargs)
        try:
            conn.connect()
            conn.send_command("SUBSCRIBE", channel)
            reply = conn.read_response()
        except (redis.RedisError, OSError) as exc:
            conn.disconnect()
            if isinstance(exc, redis.exceptions.NoPermissionError) and not self._refused:
                self._refused = True
                log.error("%s: the Redis user may not subscribe to it (%s): the beat takes its "
                          "lock without announcing itself, and a beat that dies holding it is "
                          "waited out; give the worker role the channel (leafpool redis acl)",
                          channel, exc)
            return False
        if not (isinstance(reply, list) and reply and _text(reply[0]) == "subscribe"):
            conn.disconnect()
            return False
        self._conn = conn
        return True

    def alive(self) -> bool:
        """The subscription still stands (its connection has not been closed)."""
        if self._conn is None:
            return False
        try:
            while self._conn.can_read(timeout=0):
                self._conn.read_response()
        except (redis.RedisError, OSError):
            self.close()
            return False
        return True

    def close(self) -> None:
        if self._conn is not None:
            self._conn.disconnect()
            self._conn = None


def clean_identity(identity: str) -> str:
    """``identity`` as a lock value may carry it: [A-Za-z0-9._-], at most 255 characters
    (a host or pod name already is)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "-", identity)[:255]
    return cleaned or "beat"


def describe(token: str | None) -> str:
    """Who holds a lock, from its value: ``the beat on <identity>`` for a holder that
    announced itself, else a holder that did not (an earlier release's beat, a Cluster)."""
    nonce = (token or "").split("@", 1)[0]
    if "/" in nonce:
        return f"the beat on {nonce.split('/', 1)[1]}"
    return "a beat that announces no presence (an earlier release, or on a Redis Cluster)"


def written_here(value: object, replid: str) -> bool:
    """Whether a lock whose value is ``value`` (None: no lock) holds on the master whose
    replication ID is ``replid``: it exists and was written on this master. A lock written
    on a former master (a failover promoted this node, or the master restarted) does not:
    ``lock_acquire.lua`` takes it over at once (code 3), so a sweep that waited for its
    release would wait out its TTL for nothing. A value without a replication ID (no
    ``@`` followed by 40 hex digits: redis-py's ``Lock``, which builds before this form held
    the locks with, or anything unrecognised) is taken as held, as ``lock_acquire.lua``
    does, and so is every lock when ``replid`` is unknown (empty)."""
    if value is None:
        return False
    held = _text(value)
    at = held.find("@")
    named = held[at + 1:] if at >= 0 else ""
    return not replid or named == replid or not _REPLID.fullmatch(named)


_REPLID = re.compile(r"[0-9a-f]{40}")


def replid_of(info: object) -> str:
    """``master_replid`` from a raw reply of ``INFO replication`` (its text: bytes, or a
    string), "" when it has none."""
    found = re.search(r"master_replid:(\w+)", _text(info))
    return found.group(1) if found else ""


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
