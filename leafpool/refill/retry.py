"""When a failed refill is tried again (docs/design.md §3.8).

A refill whose allocation the database did not answer (:class:`SourceUnavailable`) while
its tag is below its low-water mark is retried on a short bounded backoff:
:data:`FAST_FIRST_SECONDS` doubling to :data:`FAST_MAX_SECONDS`, for as long as both
hold, so the pool is refilled within about a second of the database coming back, for
every client (a plain ``LPOP`` of an empty list writes nothing: no drop watcher or sweep
would hear of it for up to ``LEAFPOOL_WATCH_SWEEP_SECONDS``). Every other failure
(Redis down, a tag above its low-water mark whose reserve top-up failed) keeps Celery's
growing backoff (1 s doubling to ``LEAFPOOL_REFILL_RETRY_BACKOFF_MAX``, with jitter).

What a database that is down gets: at most one allocation attempt per tag per backoff
step (a second after the first three), and only from tags below their low-water mark.
One retry chain per tag: the tag's refill lock lets one refill run at a time, its
``queued`` marker (set by the failure record, for longer than the step) holds the drop
watcher and the sweep off between attempts, and a failed attempt retries only when its
failure record marked the tag queued itself (:attr:`SourceUnavailable.requeued`): when
another refill of the tag was queued meanwhile, that one carries on and this chain ends.

The decision is here; the Celery task (``workers/tasks.py``) schedules it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from leafpool.core.errors import BackendUnavailable, LeafpoolError
from leafpool.redis.pool import Level, Pool
from leafpool.refill.base import SourceUnavailable

FAST_FIRST_SECONDS = 0.25
FAST_MAX_SECONDS = 1.0
#: a database across a WAN (docs/design.md §12.2): the pool must be refilled within 2 s
#: of the link's return, and the first allocation after it opens a new connection, which
#: costs about twice a measured allocation (the handshakes: 1.2 s against 0.65 s at
#: 100 ms a round trip). The fast step is kept to RECOVERY_SECONDS less that, less a
#: half-second margin, never below FAST_FIRST_SECONDS: a local database (a few ms) keeps
#: the 1 s step
RECOVERY_SECONDS = 2.0
NEW_CONNECTION_FACTOR = 2.0
RECOVERY_MARGIN_SECONDS = 0.5


@dataclass(frozen=True)
class Retry:
    """Try the refill again in ``seconds``; ``fast``: the short bounded backoff (retried
    for as long as the tag stays below its low-water mark and the database down)."""

    seconds: float
    fast: bool


def fast_step_max(latency: float) -> float:
    """The fast backoff's longest step for a measured allocation ``latency`` (seconds):
    1 s, or less across a WAN so that the step and a new connection's allocation fit in
    :data:`RECOVERY_SECONDS` with the margin."""
    room = RECOVERY_SECONDS - RECOVERY_MARGIN_SECONDS - NEW_CONNECTION_FACTOR * max(latency, 0.0)
    return max(FAST_FIRST_SECONDS, min(FAST_MAX_SECONDS, room))


def fast_backoff(attempt: int, latency: float = 0.0) -> float:
    """0.25, 0.5, 1, 1, ... seconds for attempts 0, 1, 2, 3, ..., at most
    :func:`fast_step_max` of the allocation ``latency``."""
    step = FAST_FIRST_SECONDS * 2.0 ** min(max(attempt, 0), 16)
    return min(fast_step_max(latency), step)


def slow_backoff(attempt: int, cap: float, rand: Callable[[], float] = random.random) -> float:
    """Celery's ``retry_backoff=1`` with ``retry_jitter``: a random share of
    ``min(cap, 2**attempt)`` seconds. Written out, not Celery's own: the library never
    imports Celery, and the task picks this or :func:`fast_backoff` per failure, which
    Celery's ``autoretry_for`` backoff cannot."""
    return float(rand()) * min(cap, 2.0 ** min(max(attempt, 0), 30))


def next_retry(exc: LeafpoolError, level: Level | None, attempt: int, cap: float,
               rand: Callable[[], float] = random.random) -> Retry | None:
    """The retry of a refill that failed with ``exc`` (``attempt``: retries so far), the
    tag's level read after it; None: no retry from this chain (another refill of the
    tag was queued meanwhile and carries on)."""
    if isinstance(exc, SourceUnavailable):
        if not exc.requeued:
            return None
        if level is not None and level.known and level.below_low_water():
            return Retry(fast_backoff(attempt, exc.latency), True)
    return Retry(slow_backoff(attempt, cap, rand), False)


def after_failure(pool: Pool, tag: str, exc: LeafpoolError, attempt: int,
                  cap: float) -> Retry | None:
    """:func:`next_retry`, with the tag's level read from Redis (one round trip; Redis
    down: the slow backoff)."""
    level = None
    if isinstance(exc, SourceUnavailable) and exc.requeued:
        try:
            level = pool.levels([tag])[0]
        except BackendUnavailable:
            level = None
    return next_retry(exc, level, attempt, cap)
