"""The one exception tree of leafpool.

Every error the library raises on purpose is a :class:`LeafpoolError`. Driver errors
(redis-py, SQLAlchemy, kazoo) are wrapped at the boundary with ``raise ... from exc`` so
callers only ever catch leafpool types.
"""

from __future__ import annotations

import datetime
from typing import Any


class LeafpoolError(Exception):
    """Root of every error leafpool raises on purpose.

    Every one pickles to the same class, message (``args``) and fields, whatever its
    constructor takes: Celery's worker pool sends a task's exception to its parent by
    pickle, and puts one it cannot pickle back together in its place as the nearest base
    class that it can (the log and Flower would show a bare ``LeafpoolError``)."""

    def __reduce__(self) -> tuple[Any, ...]:
        # BaseException's own reduce rebuilds with ``type(self)(*self.args)``: that calls
        # a subclass's constructor with the message in place of its arguments (a
        # TypeError, or a message written twice). The copy is made without the
        # constructor instead: ``args`` as they are (a message rewritten after
        # construction included), then the attributes (fields, ``__notes__``).
        return _unpickle, (type(self), self.args), self.__dict__


def _unpickle(cls: type[LeafpoolError], args: tuple[Any, ...]) -> LeafpoolError:
    """An exception of ``cls`` with ``args``, made without its constructor (pickle then
    sets its attributes)."""
    return cls.__new__(cls, *args)


class ConfigurationError(LeafpoolError):
    """A setting (environment variable) is malformed or does not fit the deployment.

    An operator's fault, not the caller's: it is never an :class:`InvalidInput` (the HTTP
    service answers it 500 ``configuration``, the CLI exits 2). ``field`` is the variable,
    ``value`` its value (secrets hidden), ``allowed`` what it may be."""

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field}={value!r} is not valid: {allowed}")


class InvalidInput(LeafpoolError):
    """Bad input. The message names the field, the value, and what is allowed; nothing
    was written."""

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field}={value!r} is not valid: {allowed}")


class InvalidTag(InvalidInput):
    """A tag name that is empty, too long or uses characters outside the allowed set."""


class InvalidArgument(InvalidInput):
    """An argument (step, start, count, ID, worker ID) is outside what is allowed."""


class UnknownTag(LeafpoolError):
    """The tag is not known to the pool (nor to the segment store)."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        super().__init__(f"{tag}: unknown tag")


class TagExists(LeafpoolError):
    """A tag with this name is already registered."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        super().__init__(f"{tag}: tag already exists")


class PoolEmpty(LeafpoolError):
    """The pool of a known tag had no ID (after the configured wait, if any).

    ``partial`` holds the IDs a batch request did obtain before the pool ran dry; they
    are the caller's (never handed out again)."""

    def __init__(self, tag: str, waited: float = 0.0, partial: list[int] | None = None) -> None:
        self.tag = tag
        self.waited = waited
        self.partial = partial or []
        suffix = f" after waiting {waited:.3f}s" if waited else ""
        super().__init__(f"{tag}: pool empty{suffix}")


class BackendUnavailable(LeafpoolError):
    """Redis, the database or ZooKeeper did not answer."""


class ReplyLost(BackendUnavailable):
    """A command reached Redis and its reply did not come back (the connection was reset
    or timed out, or the request was cancelled while it waited): Redis may have run it.
    leafpool never repeats such a command when a repeat could take other IDs (a pop);
    the IDs it may have taken are a gap, counted in the tag's ``gaps``."""


class SegmentExhausted(LeafpoolError):
    """Advancing max_id by the step would pass 2**63 - 1."""

    def __init__(self, tag: str, max_id: int, step: int) -> None:
        self.tag = tag
        super().__init__(
            f"{tag}: max_id={max_id} + step={step} would pass 2**63 - 1; "
            "the tag has no IDs left in the signed 64-bit range"
        )


class StaleWrite(LeafpoolError):
    """A refill write was refused: lost lock, stale reserve head, or IDs not above the
    tag's high-water mark. Nothing was written. ``code`` is the script's refusal code."""

    def __init__(self, message: str, code: int = 0) -> None:
        self.code = code
        super().__init__(message)


class ClockMovedBackwards(LeafpoolError):
    """The clock moved backwards beyond what a snowflake generator may wait out."""

    def __init__(self, worker_id: int, offset_ms: int) -> None:
        self.worker_id = worker_id
        self.offset_ms = offset_ms
        super().__init__(f"worker {worker_id}: clock moved backwards by {offset_ms} ms")


class WorkerIdUnavailable(LeafpoolError):
    """No snowflake worker ID could be leased (all taken, registry down, or fenced)."""


class CounterBehind(LeafpoolError):
    """A tag's ``leaf_alloc.max_id`` is below the first ID it may hand out (the tag's
    high-water mark, a retired tag's mark, the tag's guard, or 1): allocating from it would
    repeat IDs. Nothing was allocated. Raised with ``LEAFPOOL_COUNTER_BEHIND=refuse`` (an
    operator moves the counter up); the default heals it instead (docs/design.md
    §7.3)."""

    def __init__(self, tag: str, max_id: int, floor: int, why: str) -> None:
        self.tag = tag
        self.max_id = max_id
        self.floor = floor
        super().__init__(
            f"{tag}: leaf_alloc.max_id={max_id} is below {floor}, the first ID this tag may "
            f"still hand out ({why}); nothing allocated. Move it up with: UPDATE leaf_alloc "
            f"SET max_id = {floor} WHERE biz_tag = '{tag}'"
        )


class GuardFailed(LeafpoolError):
    """A tag's guard (the application's column holding the IDs it stored) could not be
    read: the table or column is missing, the database user may not read it, or it does
    not hold integers. Nothing was allocated: without the guard the allocation cannot know
    which IDs the application stored (docs/design.md §7.3)."""

    def __init__(self, tag: str, guard: str, reason: str) -> None:
        self.tag = tag
        self.guard = guard
        self.reason = reason
        super().__init__(
            f"{tag}: the guard {guard} could not be read ({reason}); nothing allocated. "
            f"Grant the worker's database user SELECT on its table, or change it with "
            f"`leafpool tag guard {tag} TABLE.COLUMN`, or clear it with "
            f"`leafpool tag guard {tag} --clear`")


class ReplicasBehind(BackendUnavailable):
    """Fewer replicas than ``LEAFPOOL_POP_REPLICAS`` acknowledged a pop within
    ``LEAFPOOL_POP_WAIT_MS``: the IDs it took are never handed out (a gap, counted in the
    tag's ``unacked_ids``), since a failover could hand them out again."""

    def __init__(self, tag: str, discarded: int, acked: int, required: int) -> None:
        self.tag = tag
        self.discarded = discarded
        self.acked = acked
        self.required = required
        if discarded:
            said = (f"{tag}: {acked} of {required} replicas acknowledged the pop in time; "
                    f"its {discarded} ID(s) are dropped, never handed out")
        else:
            said = (f"{tag}: {acked} of {required} replicas acknowledged this connection's "
                    "writes in time; nothing was popped")
        super().__init__(said)


class OutsideDcSlot(LeafpoolError):
    """Mode ``own`` (``LEAFPOOL_DC_SEGMENTS=own``, docs/design.md §12.3): an allocation
    would hand out IDs outside this DC's slot of the ID space, ``[slot_start, slot_end)``:
    the step would pass the slot's end, or the tag's counter (``leaf_alloc.max_id``) is in
    another DC's slot (the database is that DC's, or is shared with it by mistake).
    Nothing was allocated: an ID outside the slot may be another DC's."""

    def __init__(self, tag: str, dc_id: int, slot_start: int, slot_end: int, max_id: int,
                 reason: str) -> None:
        self.tag = tag
        self.dc_id = dc_id
        self.slot_start = slot_start
        self.slot_end = slot_end
        self.max_id = max_id
        self.reason = reason
        super().__init__(
            f"{tag}: DC {dc_id}'s slot is [{slot_start}, {slot_end}) and leaf_alloc.max_id="
            f"{max_id}: {reason}; nothing allocated")


class PoolEmptyDatabaseUnreachable(PoolEmpty):
    """A :class:`PoolEmpty` whose tag's refills have found the database unreachable
    since ``db_unreachable_ms`` (ms since the epoch, the tag's state): the pool served
    its list and reserve through the outage and has run dry (docs/design.md §3.8,
    §12.2). It comes back within seconds of the database's return."""

    def __init__(self, tag: str, db_unreachable_ms: int, now_ms: int, waited: float = 0.0,
                 partial: list[int] | None = None) -> None:
        super().__init__(tag, waited, partial)
        self.db_unreachable_ms = db_unreachable_ms
        since = datetime.datetime.fromtimestamp(db_unreachable_ms / 1000, datetime.UTC)
        ago = max(0.0, (now_ms - db_unreachable_ms) / 1000)
        self.args = (
            f"{self.args[0]}: the database has been unreachable since "
            f"{since.strftime('%Y-%m-%dT%H:%M:%S')}Z ({ago:.0f} s ago); the pool served its "
            "list and reserve and is now empty until the database answers again",)
