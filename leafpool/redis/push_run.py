"""The pushes of a segment refill's chunks, several in one round trip (docs/design.md §5):
:class:`leafpool.redis.pool.Pool` is built on this class.

A chunk whose last ID is below 2^53 goes by ``push_range.lua`` (two numbers sent, the IDs
generated in Redis), any other by ``push_ids.lua`` (every ID sent); both fence alike
(``lib/chunk.lua``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import redis

from leafpool.core.keys import TagKeys
from leafpool.redis.connect import redis_errors
from leafpool.redis.pool_common import Range
from leafpool.redis.retries import safely

#: push_range.lua generates IDs below 2^53 (Lua's numbers are doubles), at most this many
#: a call; other chunks go by push_ids.lua
RANGE_LIMIT = 2**53
RANGE_MAX_IDS = 100_000


@dataclass
class PushRun:
    """What :meth:`Pool.push_run` did: ``landed`` chunks in order (``pushed`` IDs, with
    ``extra``: chunks after a refusal that the fence let through), the list's length after
    the last (-1: none landed), and the first refusal's code (0: none)."""

    landed: int = 0
    pushed: int = 0
    length: int = -1
    code: int = 0
    extra: int = 0


class RunPushes:
    """``push_run`` and the choice of script for a chunk; the pool gives the client, the
    registered scripts and the keys."""

    redis: Any
    _push: Any
    _push_range: Any

    def tag(self, tag: str) -> TagKeys:
        raise NotImplementedError

    def _landed(self, tag: str, what: str, key: str) -> int:
        raise NotImplementedError

    def push_run(self, tag: str, token: bytes, chunks: Sequence[tuple[Range, int]],
                 now_ms: int) -> PushRun:
        """Push several chunks of one refill in one round trip: the first ``count`` IDs of
        each reserve ``head``, in order, each head the one the chunks before it leave.

        Each chunk is its own fenced script call (as :meth:`push`), all sent in one
        pipeline: Redis runs them in one pass of its event loop and, under
        ``appendfsync always``, waits for one fsync instead of one a chunk. A refused chunk
        moves no head, so the chunks after it find the head they expect missing and are
        refused too (-2; -1 when the lock is lost): the run reports the chunks that landed
        and the first refusal. After a lost reply (or a script cache emptied by a restart)
        the chunks whose last ID is at or below the tag's high-water mark are taken as
        done and the rest sent again, each still fenced.
        """
        k = self.tag(tag)
        keys = [k.ids, k.reserve, k.state, k.lock]
        calls = [self._push_call(token, head, count, now_ms) for head, count in chunks]
        lasts = [head.start + count - 1 for head, count in chunks]
        run = PushRun()
        sent = 0  # pipelines sent since the last resync

        def done() -> int:
            """The chunks at or below the high-water mark: landed (ours, or taken)."""
            hwm = self.redis.hget(k.state, "hwm")
            return sum(1 for last in lasts if hwm is not None and last <= int(hwm))

        def send() -> tuple[int, list[Any]]:
            nonlocal sent
            sent += 1
            if sent > 1:  # a lost reply: the chunks its pipeline may have landed
                run.landed = max(run.landed, done())
            pipe = self.redis.pipeline(transaction=False)
            for script, args in calls[run.landed:]:
                pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
            return run.landed, list(pipe.execute(raise_on_error=False))

        resynced = False
        with redis_errors(f"{tag}: push"):
            while run.landed < len(calls):
                start, replies = safely(send)
                resynced = resynced or sent > 1
                reload = None
                for i, reply in enumerate(replies, start):
                    if isinstance(reply, redis.exceptions.NoScriptError):
                        reload = i  # nothing ran from here on that the fence let through
                        break
                    if isinstance(reply, Exception):
                        raise reply
                    code = int(reply)
                    if code >= 0 and not run.code:
                        run.landed, run.length = i + 1, code
                    elif code >= 0:  # after a refusal only when a client's take moved the
                        run.length = code  # head exactly to this chunk's: fenced all the same
                        run.extra += chunks[i][1]
                    elif not run.code:
                        run.code = code
                if reload is None or run.code:
                    break
                for source in {c[0].script for c in calls[reload:]}:
                    safely(partial(self.redis.script_load, source))
                sent, resynced = 0, True  # a restart emptied the cache: resend the rest
                run.landed = max(run.landed, int(safely(done)))
            if resynced and run.landed:
                run.length = self._landed(tag, "push", k.ids)
        run.pushed = sum(count for _, count in chunks[:run.landed]) + run.extra
        return run

    def _push_call(self, token: bytes, head: Range, count: int,
                   now_ms: int) -> tuple[Any, list[Any]]:
        """The script that pushes the first ``count`` IDs of ``head``, and its ARGV."""
        name, argv = push_script(token, head, count, now_ms)
        return (self._push_range if name == "push_range" else self._push), argv


def by_range(head: Range, count: int) -> bool:
    """Whether the first ``count`` IDs of ``head`` go by a script that generates them in
    Redis from the two ends (``push_range``, ``spill_range``: below 2^53, at most
    :data:`RANGE_MAX_IDS`), not by one that is sent every ID (``push_ids``,
    ``spill_reserve``)."""
    return 0 < count <= RANGE_MAX_IDS and head.start + count - 1 < RANGE_LIMIT


def push_script(token: bytes, head: Range, count: int, now_ms: int) -> tuple[str, list[Any]]:
    """The script that pushes the first ``count`` IDs of the reserve ``head`` ("push_range"
    below 2^53, else "push_ids"), and its ARGV (the keys are ids, reserve, state, lock)."""
    last = head.start + count - 1
    base: list[Any] = [token, head.encode(), head.after_taking(count), now_ms]
    if by_range(head, count):
        return "push_range", [*base, head.start, last]
    return "push_ids", [*base, *(str(i) for i in range(head.start, last + 1))]
