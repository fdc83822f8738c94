"""Coalesced single-ID pops (asyncio): concurrent takes of one tag share one
``LPOP tag n`` (docs/design.md §1.1).

A take that finds no pop of its tag in flight pops at once, for itself alone. Takes that
arrive while a pop is in flight queue up; when it completes, the next pop takes as many
IDs as takes are queued (at most ``max_batch``) and hands them out in arrival order.
So every take gets its ID from a pop issued after it arrived, and a take that starts
after another take's result has arrived gets a larger ID (G2 across every client),
exactly as with one pop per take. Nothing is kept for later takes: surplus IDs popped
now and handed to a take that arrives later would break that order.

A take gets ``None`` when its pop came up short (the pool ran dry): its caller then
follows the empty-pool policy as an uncoalesced pop would. An error of a pop is raised
in every take of its batch. A take cancelled before its pop is issued takes no ID; one
cancelled while its pop is in flight leaves its ID unused (a gap), never given to
another take.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable

log = logging.getLogger(__name__)

PopMany = Callable[[str, int], Awaitable[list[int]]]


class _TagQueue:
    """One tag's takes waiting for the next pop, and whether a pop is in flight."""

    __slots__ = ("busy", "waiters")

    def __init__(self) -> None:
        self.busy = False
        self.waiters: deque[asyncio.Future[int | None]] = deque()


class Coalescer:
    """Shares ``pop_many(tag, n)`` among the concurrent :meth:`take` calls of one tag."""

    def __init__(self, pop_many: PopMany, max_batch: int) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, not {max_batch}")
        self._pop_many = pop_many
        self.max_batch = max_batch
        self._tags: dict[str, _TagQueue] = {}
        self._drivers: set[asyncio.Task[None]] = set()  # referenced while they run

    async def take(self, tag: str) -> int | None:
        """One ID of ``tag`` from a pop issued after this call, or None when that pop
        came up short."""
        q = self._tags.get(tag)
        if q is None:
            q = self._tags[tag] = _TagQueue()
        if not q.busy:  # nothing in flight: pop now, for this take alone
            q.busy = True
            try:
                got = await self._pop_many(tag, 1)
            finally:  # also when cancelled: the queued takes must not be stranded
                self._next(tag, q)
            return got[0] if got else None
        waiter: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        q.waiters.append(waiter)
        return await waiter

    def _next(self, tag: str, q: _TagQueue) -> None:
        """After a pop: serve the queued takes in a task of their own, or go idle."""
        if not q.waiters:
            q.busy = False
            return
        task = asyncio.get_running_loop().create_task(self._drive(tag, q))
        self._drivers.add(task)
        task.add_done_callback(self._drivers.discard)

    async def _drive(self, tag: str, q: _TagQueue) -> None:
        """Pop for the queued takes, batch after batch, until none is left."""
        try:
            while q.waiters:
                batch: list[asyncio.Future[int | None]] = []
                while q.waiters and len(batch) < self.max_batch:
                    waiter = q.waiters.popleft()
                    if not waiter.done():  # cancelled before its pop: takes nothing
                        batch.append(waiter)
                if not batch:
                    continue
                try:
                    got = await self._pop_many(tag, len(batch))
                except Exception as exc:  # every take of the batch raises it
                    for waiter in batch:
                        if not waiter.done():
                            waiter.set_exception(exc)
                    continue
                except BaseException:  # the driver cancelled (the loop is closing)
                    for waiter in batch:
                        waiter.cancel()
                    raise
                for i, waiter in enumerate(batch):
                    if not waiter.done():  # else cancelled meanwhile: its ID is a gap
                        waiter.set_result(got[i] if i < len(got) else None)
        finally:
            q.busy = False
            for waiter in q.waiters:  # only when the driver itself was cancelled
                if not waiter.done():
                    waiter.cancel()
            q.waiters.clear()
