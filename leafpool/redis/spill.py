"""The drop watcher's move of reserve IDs into a tag's ready list (``spill_reserve.lua``,
docs/design.md §3.7): when a pop takes a segment tag below its low-water mark and no
refill holds the tag, the watcher moves IDs already allocated (the reserve's head ranges)
into the list at once, instead of leaving the list to drain while the refill task is
queued, picked up by a worker and started.

The write is fenced as a refill's push is (the reserve head read, the high-water mark)
and refused while the tag's refill lock exists, whoever holds it: the watcher holds no
token, so it never writes beside a refill. A chunk whose last ID is below 2^53 goes by
``spill_range.lua`` (its two ends sent, the IDs generated in Redis, as a refill's
``push_range.lua``), any other by ``spill_reserve.lua`` (every ID sent). How much to move
is the watcher's decision; this module only does it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from leafpool.core.errors import InvalidArgument
from leafpool.redis import scripts
from leafpool.redis.connect import redis_errors
from leafpool.redis.pool import Pool
from leafpool.redis.pool_common import Range
from leafpool.redis.push_run import by_range
from leafpool.redis.retries import safely

#: reserve ranges read to plan one move (a range is a whole segment: one or two suffice)
HEAD_RANGES = 8


@dataclass(frozen=True)
class Spilled:
    """What one move did: ``moved`` IDs pushed (0: nothing), ``length`` the list's length
    after the last chunk that went through (-1: none did), and the refusal that ended it
    (0: none; a code of :mod:`leafpool.redis.scripts`, e.g. ``LOCK_HELD``)."""

    moved: int = 0
    length: int = -1
    refused: int = 0


class ReserveSpill:
    """Moves up to ``count`` IDs from the head of a tag's reserve into its list, in
    chunks of ``chunk`` IDs, all sent in one round trip (one script call per chunk: each
    chunk's fence names the head the chunk before leaves, so a refusal refuses every
    later chunk too)."""

    def __init__(self, pool: Pool, chunk: int = 1000) -> None:
        if chunk < 1:
            raise InvalidArgument("chunk", chunk, "at least 1 ID per chunk")
        self.pool = pool
        self.chunk = chunk
        self._script = pool.redis.register_script(scripts.source("spill_reserve"))
        self._range = pool.redis.register_script(scripts.source("spill_range"))

    def plan(self, reserve: list[Range], count: int) -> list[tuple[Range, int]]:
        """The chunks that move the first ``count`` IDs of ``reserve``: (head, IDs)."""
        out: list[tuple[Range, int]] = []
        left = count
        for rng in reserve:
            head = rng
            while left > 0 and head.size > 0:
                n = min(self.chunk, left, head.size)
                out.append((head, n))
                left -= n
                head = Range(head.start + n, head.end)
            if left <= 0:
                break
        return out

    def move(self, tag: str, count: int, below: int, now_ms: int) -> Spilled:
        """Move up to ``count`` IDs of ``tag``'s reserve into its list while the list
        holds fewer than ``below`` IDs (plus what this move pushed before each chunk) and
        no refill lock exists. Repeated after a lost reply: a chunk that went through
        is refused (head moved) and the rest follow from the head as it is."""
        if count <= 0:
            return Spilled()
        k = self.pool.tag(tag)
        with redis_errors(f"{tag}: reserve head"):
            raw = safely(lambda: self.pool.redis.lrange(k.reserve, 0, HEAD_RANGES - 1))
        chunks = self.plan([Range.decode(r) for r in raw], count)
        if not chunks:
            return Spilled()

        def send() -> list[Any]:
            pipe = self.pool.redis.pipeline(transaction=False)
            bound = below
            keys = [k.ids, k.reserve, k.state, k.lock]
            for head, n in chunks:
                base = [head.encode(), head.after_taking(n), now_ms, bound]
                last = head.start + n - 1
                if by_range(head, n):
                    self._range(keys=keys, args=[*base, head.start, last], client=pipe)
                else:
                    ids = [str(i) for i in range(head.start, last + 1)]
                    self._script(keys=keys, args=[*base, *ids], client=pipe)
                bound += n
            return pipe.execute()  # type: ignore[no-any-return]

        with redis_errors(f"{tag}: spill reserve"):
            replies = [int(x) for x in safely(send)]
        moved, length = 0, -1
        for (_, n), reply in zip(chunks, replies, strict=True):
            if reply < 0:
                return Spilled(moved, length, reply)
            moved += n
            length = reply
        return Spilled(moved, length)
