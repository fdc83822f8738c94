"""Coalesced single-ID pops (asyncio): concurrent takes of one tag share one
``LPOP tag n`` (docs/design.md §1.1).

A take that finds fewer than ``in_flight`` pops of its tag under way (and none queued)
pops at once, for itself alone. Takes that arrive while that many pops are in flight
queue up; when one completes, the next pop takes as many IDs as takes are queued (at
most ``max_batch``) and hands them out in arrival order.
So every take gets its ID from a pop issued after it arrived, and a take that starts
after another take's result has arrived gets a larger ID (G2 across every client),
exactly as with one pop per take. Nothing is kept for later takes: surplus IDs popped
now and handed to a take that arrives later would break that order.

A take gets ``None`` when its pop came up short (the pool ran dry): its caller then
follows the empty-pool policy as an uncoalesced pop would. An error of a pop is raised
in every take of its batch. A take cancelled before its pop is issued takes no ID; one
cancelled while its pop is in flight leaves its ID unused (a gap, counted through
``count_gap``: exactly the IDs popped for cancelled takes), never given to another take.
A take that pops for itself and is cancelled once its pop was sent counts the ID its pop
may have taken (the pool's rule for a lost reply, :mod:`leafpool.redis.pops`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable

from leafpool.core.errors import InvalidArgument

IN_FLIGHT = 4  # pops of one tag under way at once, by default
PopMany = Callable[[str, int], Awaitable[list[int]]]
CountGap = Callable[[str, int], object]


class _TagQueue:
    """One tag's takes waiting for a pop, and how many of its pops are in flight."""

    __slots__ = ("in_flight", "waiters")

    def __init__(self) -> None:
        self.in_flight = 0
        self.waiters: deque[asyncio.Future[int | None]] = deque()


class Coalescer:
    """Shares ``pop_many(tag, n)`` among the concurrent :meth:`take` calls of one tag:
    at most ``in_flight`` pops of a tag at a time (a take arriving while fewer are in
    flight and none is queued pops at once, so a lightly loaded service waits for no
    one), each for at most ``max_batch`` takes."""

    def __init__(self, pop_many: PopMany, max_batch: int, in_flight: int = IN_FLIGHT,
                 count_gap: CountGap | None = None) -> None:
        for name, value in (("max_batch", max_batch), ("in_flight", in_flight)):
            if value < 1:
                raise InvalidArgument(name, value, "an integer >= 1")
        self._pop_many = pop_many
        self._count_gap = count_gap
        self.max_batch = max_batch
        self.in_flight = in_flight
        self._tags: dict[str, _TagQueue] = {}
        self._drivers: set[asyncio.Task[None]] = set()  # referenced while they run

    async def take(self, tag: str) -> int | None:
        """One ID of ``tag`` from a pop issued after this call, or None when that pop
        came up short."""
        q = self._tags.get(tag)
        if q is None:
            q = self._tags[tag] = _TagQueue()
        if q.in_flight < self.in_flight and not q.waiters:  # pop now, for this take alone
            q.in_flight += 1
            try:
                got = await self._pop_many(tag, 1)
            finally:  # also when cancelled: the queued takes must not be stranded
                q.in_flight -= 1
                self._serve(tag, q)
            return got[0] if got else None
        waiter: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
        q.waiters.append(waiter)
        return await waiter

    def _serve(self, tag: str, q: _TagQueue) -> None:
        """After a pop: pop for the queued takes in tasks of their own (while fewer than
        ``in_flight`` pops are under way); forget the tag once idle."""
        if not q.waiters:
            if q.in_flight == 0 and self._tags.get(tag) is q:
                del self._tags[tag]
            return
        loop = asyncio.get_running_loop()
        while q.waiters and q.in_flight < self.in_flight:
            q.in_flight += 1
            task = loop.create_task(self._drive(tag, q))
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
                unused = 0
                for i, waiter in enumerate(batch):
                    if not waiter.done():
                        waiter.set_result(got[i] if i < len(got) else None)
                    elif i < len(got):  # cancelled meanwhile: its ID is a gap
                        unused += 1
                if unused and self._count_gap is not None:
                    self._count_gap(tag, unused)
        finally:
            q.in_flight -= 1
            if q.in_flight == 0:  # waiters left only when the driver was cancelled
                for waiter in q.waiters:
                    if not waiter.done():
                        waiter.cancel()
                q.waiters.clear()
            self._serve(tag, q)
