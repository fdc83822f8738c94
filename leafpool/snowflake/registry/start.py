"""What a claim finds (:class:`Lease`, :class:`Start`) and how a start is checked against
the recorded mark: :func:`clock_check` (every claim) and :func:`cached_start` (the source
unreachable: the cache file stands in). docs/design.md §8.1."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from leafpool.core.errors import ClockMovedBackwards, WorkerIdUnavailable
from leafpool.core.snowflake_layout import DcRange, iso_utc, validate_worker_id
from leafpool.snowflake.registry.cache import CacheFile, CacheRecord
from leafpool.snowflake.registry.layout import outside
from leafpool.snowflake.registry.timing import LeaseDeadline

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Lease:
    """A claimed worker ID. ``last_timestamp_ms`` is the recorded high-water mark the
    generator must stay above; ``source`` says where the ID came from (``zookeeper``,
    ``mysql``, ``local-map``, ``local-host`` or ``cache``)."""

    worker_id: int
    last_timestamp_ms: int
    source: str
    identity: str
    mode: str


class Start(NamedTuple):
    """What ``_acquire`` found: the worker ID, the recorded mark, the mark written at
    the claim (``max(now, recorded)``) and where the ID came from; ``durable``: the mark
    the source surely holds when the claim wrote none (a start from the cache file),
    None when it is ``mark``."""

    worker_id: int
    recorded: int
    mark: int
    source: str
    durable: int | None = None


class Claimant(Protocol):
    """What a start reads and sets of its registry (a :class:`BaseRegistry`)."""

    identity: str
    cache: CacheFile
    clock: Callable[[], int]
    sleep: Callable[[float], None]
    monotonic: Callable[[], float]
    start_wait_ms: int
    deadline: LeaseDeadline
    token: str
    degraded: bool
    dc: DcRange

    @property
    def mode(self) -> str: ...

    @property
    def leased(self) -> bool: ...

    def ahead_ms(self) -> int: ...


def clock_check(reg: Claimant, worker_id: int, recorded: int, where: str,
                cached: CacheRecord | None, source: str) -> Start:
    """The claim's clock check: the recorded mark is the larger of the source's
    (``recorded``, kept in ``where``) and the cache file's. A clock behind it is refused,
    unless it passes it within ``start_wait_ms``, which is waited out.

    In the leasing modes the source's mark may be ahead of every clock by up to
    :meth:`ahead_ms` (a holder records it ahead, covering its lease: docs/design.md §8.1):
    a start behind it by no more than that, and not behind this identity's own cache file,
    is a holder's window still running, not a clock moved back: it is refused as
    :class:`WorkerIdUnavailable` (claim again once it passed), and counts as no clock
    event.

    Every claim comes here, from the source or the cache file: a worker ID outside this
    DC's range (docs/design.md §12.1) is refused whatever the mode did (a cache file
    from before the DC settings changed)."""
    if worker_id not in reg.dc:
        raise outside(reg.identity, reg.dc, worker_id, where)
    own = cached.last_timestamp if cached is not None else 0
    if own > recorded:
        recorded, where = own, f"the cache file {reg.cache.path}"
    now = reg.clock()
    if 0 < recorded - now <= reg.start_wait_ms:
        log.warning(
            "%s: worker %d: clock is %d ms behind the timestamp recorded in %s; "
            "waiting for it to pass",
            reg.identity,
            worker_id,
            recorded - now,
            where,
        )
        deadline = reg.monotonic() + 2 * reg.start_wait_ms / 1000 + 1
        while now < recorded and reg.monotonic() <= deadline:
            reg.sleep((recorded - now) / 1000)
            now = reg.clock()
    if now < recorded and reg.leased and own <= now and recorded - now <= reg.ahead_ms():
        raise WorkerIdUnavailable(
            f"{reg.identity}: worker {worker_id}: the mark recorded in {where} is "
            f"{recorded - now} ms ahead of this clock ({iso_utc(recorded)}): in mode "
            f"{reg.mode} a holder records it up to {reg.ahead_ms()} ms ahead, covering its "
            "lease, so a start soon after its holder stopped without releasing waits for "
            "it to pass; claim again then")
    if now < recorded:
        exc = ClockMovedBackwards(worker_id, recorded - now)
        exc.args = (
            f"worker {worker_id}: clock moved backwards by {recorded - now} ms: the local "
            f"clock {now} ({iso_utc(now)}) is behind the timestamp {recorded} "
            f"({iso_utc(recorded)}) recorded in {where}; refusing to start (fix the "
            "clock, or wait until it passes)",
        )
        log.error("%s: %s", reg.identity, exc)
        raise exc
    return Start(worker_id, recorded, max(now, recorded), source)


def cached_start(reg: Claimant, reason: str, cause: BaseException,
                 cached: CacheRecord | None) -> Start:
    """The source is unreachable: start from the cache file, with the clock check
    (leasing modes: only while the cached lease surely runs, which it then does, and on
    the mark the last run confirmed in the source: records up to it need no source)."""
    if cached is None:
        raise WorkerIdUnavailable(
            f"{reg.identity}: {reason}, and there is no cache file {reg.cache.path} "
            "to start from"
        ) from cause
    validate_worker_id(cached.worker_id)
    if reg.leased:
        now = reg.clock()
        if now >= cached.lease_until:
            raise WorkerIdUnavailable(
                f"{reg.identity}: {reason}; the cached lease of worker "
                f"{cached.worker_id} is not held any more (lease_until "
                f"{cached.lease_until}, now {now}): in mode {reg.mode} another "
                "process may own it now, so the cache cannot be used"
            ) from cause
        reg.deadline.resume(cached.lease_until, now)
    where = f"the cache file {reg.cache.path}"
    start = clock_check(reg, cached.worker_id, cached.last_timestamp, where, cached, "cache")
    reg.token = cached.token or reg.token
    reg.degraded = True
    log.warning("%s: %s; starting from the cache file", reg.identity, reason)
    if reg.leased:
        return start._replace(durable=cached.source_mark)
    return start  # the claim logs the worker ID and the last timestamp
