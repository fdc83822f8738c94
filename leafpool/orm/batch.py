"""IDs for ORM inserts, taken in batches (docs/design.md §1.3).

An ORM asks for a key one row at a time; :meth:`IdBatches.take` hands out the IDs of a
whole statement at once: ``take(tag, n)`` is one ``LPOP tag n`` (through
:meth:`leafpool.client.Client.next_ids`), not ``n`` of them.

The bound, said once: beyond what a call needs, a process takes at most ``prefetch``
IDs ahead per tag (``LEAFPOOL_ORM_PREFETCH``, default 0) and holds at most that many
unused. With 0 a call takes exactly its rows' IDs and nothing is held, so IDs keep the
per-tag order across every client (G2); with a prefetch, a process's IDs are increasing
among themselves, and IDs held when it exits are a gap, never handed out again.

- **Increasing within a process**: a tag's takes are serialized by its lock, held IDs
  (older) are handed out before fresh ones, and every pop is increasing.
- **Thread-safe**: one lock per tag (one :class:`asyncio.Lock` per tag for
  :class:`AsyncIdBatches`).
- **Fork-safe**: in a child of ``os.fork`` (gunicorn, Celery prefork, multiprocessing)
  every batcher forgets the IDs it held and its client, so a batch taken before the fork
  is used by the parent alone; the child pops its own.
- **The empty-pool policy** is the client's: fewer IDs than the call needs raise
  :class:`~leafpool.core.errors.PoolEmpty` after the policy's wait. IDs the failed call
  did get are kept for the next call, up to the prefetch bound; the rest are a gap.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import weakref
from collections import deque
from collections.abc import Callable

from leafpool.client import MAX_BATCH, AsyncClient, Client
from leafpool.core.config import get_settings
from leafpool.core.errors import InvalidArgument, PoolEmpty
from leafpool.core.tags import validate_tag

log = logging.getLogger(__name__)

_live: weakref.WeakSet[IdBatches | AsyncIdBatches] = weakref.WeakSet()


def _forget_in_child() -> None:
    """In a forked child: every batcher forgets what its parent held, and the default
    batcher's guard is a new lock."""
    global _default_guard
    _default_guard = threading.Lock()
    for batches in list(_live):
        batches._forget()


os.register_at_fork(after_in_child=_forget_in_child)


def _check_take(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InvalidArgument("n", n, "an integer >= 1 (the rows that need an ID)")
    return n


def _prefetch(prefetch: int | None) -> int:
    """The bound a batcher keeps: ``prefetch``, or ``LEAFPOOL_ORM_PREFETCH`` when None;
    checked, and logged when it is not 0."""
    if prefetch is None:
        prefetch = get_settings().orm_prefetch
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or not (
            0 <= prefetch <= MAX_BATCH):
        raise InvalidArgument("prefetch", prefetch, f"an integer from 0 to {MAX_BATCH:,}")
    if prefetch:
        log.info("orm: up to %d IDs of each tag are taken ahead and held by process %d "
                 "(LEAFPOOL_ORM_PREFETCH); those held at exit are a gap", prefetch,
                 os.getpid())
    return prefetch


def batches_source(batches: IdBatches | Callable[[], IdBatches] | None,
                   default: Callable[[], IdBatches]) -> Callable[[], IdBatches]:
    """Where an ORM default or field takes IDs from: a given :class:`IdBatches`, a
    callable returning one, or ``default`` (called at each take: it may change)."""
    if isinstance(batches, IdBatches):
        fixed = batches
        return lambda: fixed
    return batches or default


class _Plan:
    """What is left to pop for one call: ``want`` more IDs, ``prefetch`` beyond them on
    the last pop. Shared by the sync and async batchers (no I/O here)."""

    def __init__(self, held: deque[int], n: int, prefetch: int) -> None:
        self.out = [held.popleft() for _ in range(min(n, len(held)))]
        self.n = n
        self.prefetch = prefetch

    @property
    def want(self) -> int:
        return self.n - len(self.out)

    def pop_args(self) -> tuple[int, int]:
        """(at_most, at_least) for the next pop: a pop takes at most MAX_BATCH."""
        at_most = min(self.want + self.prefetch, MAX_BATCH)
        return at_most, min(self.want, at_most)

    def finish(self, held: deque[int]) -> list[int]:
        held.extend(self.out[self.n:])
        return self.out[: self.n]

    def failed(self, tag: str, held: deque[int], exc: PoolEmpty) -> None:
        """Keep what this call got for the next call, up to the prefetch bound."""
        got = self.out + list(exc.partial)
        kept = got[: self.prefetch]
        held.extend(kept)
        if len(got) > len(kept):
            log.warning("%s: pool empty; %d IDs this insert got are dropped (a gap)",
                        tag, len(got) - len(kept))


class IdBatches:
    """A process's source of IDs for inserts, one :class:`~leafpool.client.Client`.

    ``client`` builds the client on first use (default: ``Client()`` from the
    settings), and again in a forked child."""

    def __init__(self, client: Callable[[], Client] = Client, *,
                 prefetch: int | None = None) -> None:
        self._make_client = client
        self.prefetch = _prefetch(prefetch)
        self._guard = threading.Lock()
        self._client: Client | None = None
        self._locks: dict[str, threading.Lock] = {}
        self._held: dict[str, deque[int]] = {}
        _live.add(self)

    @property
    def client(self) -> Client:
        with self._guard:
            if self._client is None:
                self._client = self._make_client()
            return self._client

    def held(self, tag: str) -> int:
        """How many unused IDs of ``tag`` this process holds (at most ``prefetch``)."""
        return len(self._held.get(tag, ()))

    def take(self, tag: str, n: int = 1) -> list[int]:
        """``n`` IDs of ``tag``, increasing, and above every ID this process took
        before: held ones first, then one pop (one per 100,000 IDs)."""
        lock, held = self._tag(tag, _check_take(n))
        with lock:
            plan = _Plan(held, n, self.prefetch)
            try:
                while plan.want > 0:
                    at_most, at_least = plan.pop_args()
                    plan.out += self.client.next_ids(tag, at_most, at_least=at_least)
            except PoolEmpty as exc:
                plan.failed(tag, held, exc)
                raise
            return plan.finish(held)

    def close(self) -> None:
        with self._guard:
            client, self._client = self._client, None
        if client is not None:
            client.close()

    def _tag(self, tag: str, n: int) -> tuple[threading.Lock, deque[int]]:
        lock = self._locks.get(tag)
        if lock is None:
            validate_tag(tag)
            with self._guard:
                lock = self._locks.setdefault(tag, threading.Lock())
                self._held.setdefault(tag, deque())
        return lock, self._held[tag]

    def _forget(self) -> None:
        """In a forked child: the parent's held IDs and connections are not ours."""
        self._guard = threading.Lock()
        self._client = None
        self._locks = {}
        self._held = {}


class AsyncIdBatches:
    """:class:`IdBatches` for asyncio, one :class:`~leafpool.client.AsyncClient`. Bound
    to the event loop it is first used on (its connections are)."""

    def __init__(self, client: Callable[[], AsyncClient] = AsyncClient, *,
                 prefetch: int | None = None) -> None:
        self._make_client = client
        self.prefetch = _prefetch(prefetch)
        self._client: AsyncClient | None = None
        self._locks: dict[str, asyncio.Lock] = {}
        self._held: dict[str, deque[int]] = {}
        _live.add(self)

    @property
    def client(self) -> AsyncClient:
        if self._client is None:
            self._client = self._make_client()
        return self._client

    def held(self, tag: str) -> int:
        return len(self._held.get(tag, ()))

    async def take(self, tag: str, n: int = 1) -> list[int]:
        """As :meth:`IdBatches.take`."""
        _check_take(n)
        lock = self._locks.get(tag)
        if lock is None:
            validate_tag(tag)
            lock = self._locks.setdefault(tag, asyncio.Lock())
            self._held.setdefault(tag, deque())
        held = self._held[tag]
        async with lock:
            plan = _Plan(held, n, self.prefetch)
            try:
                while plan.want > 0:
                    at_most, at_least = plan.pop_args()
                    plan.out += await self.client.next_ids(tag, at_most, at_least=at_least)
            except PoolEmpty as exc:
                plan.failed(tag, held, exc)
                raise
            return plan.finish(held)

    async def aclose(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    def _forget(self) -> None:
        self._client = None
        self._locks = {}
        self._held = {}


_default: IdBatches | None = None
_default_guard = threading.Lock()


def default_batches() -> IdBatches:
    """The process-wide :class:`IdBatches` the ORM integrations use unless given one."""
    global _default
    with _default_guard:
        if _default is None:
            _default = IdBatches()
        return _default
