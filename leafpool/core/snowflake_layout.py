"""The snowflake ID layout (docs/design.md §8), shared by the generator and the
settings: the bit widths, the epoch and its check, the clock, and composing and
decoding an ID. Pure arithmetic; imports nothing of leafpool above the errors.

Layout of an ID (a non-negative signed 64-bit integer)::

    0 | 41 bits: ms since the epoch | 10 bits: worker ID | 12 bits: sequence

The epoch defaults to Leaf's (1288834974657, 2010-11-04T01:42:54.657Z), so IDs decode
the same way as Leaf's ``/decodeSnowflakeId``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from leafpool.core.errors import ConfigurationError, InvalidArgument

LEAF_EPOCH_MS = 1288834974657
TIMESTAMP_BITS = 41
WORKER_ID_BITS = 10
SEQUENCE_BITS = 12
MAX_TIMESTAMP = (1 << TIMESTAMP_BITS) - 1  # largest ms offset from the epoch that fits
MAX_WORKER_ID = (1 << WORKER_ID_BITS) - 1  # 1023
MAX_SEQUENCE = (1 << SEQUENCE_BITS) - 1  # 4095
IDS_PER_MS = MAX_SEQUENCE + 1
WORKER_SHIFT = SEQUENCE_BITS
TIMESTAMP_SHIFT = SEQUENCE_BITS + WORKER_ID_BITS
MAX_ID = (1 << 63) - 1
MS_PER_DAY = 86_400_000
MS_PER_YEAR = 365.25 * MS_PER_DAY

#: the largest clock step back a generator waits out: it sleeps twice the step while
#: holding its lock, stalling every thread that generates with this worker ID, so the
#: stall is capped at 2 s; a larger step is refused (ClockMovedBackwards) and the refill
#: retried later, which is what an operator wants to see for such a clock anyway
MAX_BACKWARDS_MS = 1_000

EPOCH_ENV = "LEAFPOOL_SNOWFLAKE_EPOCH"
_UNIX = datetime(1970, 1, 1, tzinfo=UTC)


def wall_clock_ms() -> int:
    """Milliseconds since the Unix epoch (the default clock)."""
    return time.time_ns() // 1_000_000


def iso_utc(ms: int) -> str:
    """ISO 8601 in UTC with milliseconds, e.g. ``2019-09-06T01:35:00.834Z``."""
    return (_UNIX + timedelta(milliseconds=ms)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def validate_worker_id(worker_id: object) -> int:
    if isinstance(worker_id, bool) or not isinstance(worker_id, int) or not (
        0 <= worker_id <= MAX_WORKER_ID
    ):
        raise InvalidArgument("worker_id", worker_id, f"an integer from 0 to {MAX_WORKER_ID}")
    return worker_id


def validate_epoch(epoch_ms: object, now_ms: int) -> int:
    """The epoch must be a past ms timestamp whose 41 time bits are not used up."""
    if isinstance(epoch_ms, bool) or not isinstance(epoch_ms, int) or epoch_ms < 0:
        raise ConfigurationError(EPOCH_ENV, epoch_ms, "a non-negative integer (ms since 1970)")
    if epoch_ms > now_ms:
        raise ConfigurationError(
            EPOCH_ENV, epoch_ms,
            f"is in the future ({iso_utc(epoch_ms)} > now {iso_utc(now_ms)}); IDs would be "
            "negative",
        )
    if now_ms - epoch_ms > MAX_TIMESTAMP:
        raise ConfigurationError(
            EPOCH_ENV, epoch_ms,
            f"the {TIMESTAMP_BITS} time bits ran out at {iso_utc(epoch_ms + MAX_TIMESTAMP)}; "
            "choose a later epoch (IDs would overflow into the sign bit)",
        )
    return epoch_ms


def compose(timestamp_ms: int, worker_id: int, sequence: int,
            epoch_ms: int = LEAF_EPOCH_MS) -> int:
    """Build one ID from its parts (the inverse of :func:`decode`)."""
    validate_worker_id(worker_id)
    offset = timestamp_ms - epoch_ms
    if not 0 <= offset <= MAX_TIMESTAMP:
        raise InvalidArgument(
            "timestamp_ms", timestamp_ms,
            f"between the epoch {epoch_ms} and epoch + 2**41 - 1 = {epoch_ms + MAX_TIMESTAMP}",
        )
    if isinstance(sequence, bool) or not 0 <= sequence <= MAX_SEQUENCE:
        raise InvalidArgument("sequence", sequence, f"an integer from 0 to {MAX_SEQUENCE}")
    return (offset << TIMESTAMP_SHIFT) | (worker_id << WORKER_SHIFT) | sequence


@dataclass(frozen=True)
class Decoded:
    """The parts of a snowflake ID (what Leaf's ``/decodeSnowflakeId`` returns)."""

    timestamp_ms: int
    iso: str
    worker_id: int
    sequence: int


def decode(snowflake_id: int | str, epoch_ms: int = LEAF_EPOCH_MS) -> Decoded:
    """Split an ID into timestamp (ms and ISO 8601 UTC), worker ID and sequence.

    Accepts an int or a decimal string; anything outside ``0 .. 2**63 - 1`` raises
    :class:`InvalidArgument`."""
    value: object = snowflake_id
    if isinstance(value, str):
        text = value.strip()
        if not text.isascii() or not text.isdigit():
            raise InvalidArgument("id", snowflake_id, "a decimal integer from 0 to 2**63 - 1")
        text = text.lstrip("0") or "0"  # int() refuses over 4,300 digits, zeros included
        if len(text) > len(str(MAX_ID)):
            raise InvalidArgument("id", snowflake_id, "an integer from 0 to 2**63 - 1")
        value = int(text)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ID:
        raise InvalidArgument("id", snowflake_id, "an integer from 0 to 2**63 - 1")
    timestamp_ms = (value >> TIMESTAMP_SHIFT) + epoch_ms
    return Decoded(
        timestamp_ms=timestamp_ms,
        iso=iso_utc(timestamp_ms),
        worker_id=(value >> WORKER_SHIFT) & MAX_WORKER_ID,
        sequence=value & MAX_SEQUENCE,
    )


#: every worker ID there is (Leaf's 10 bits), shared out equally among the DCs
WORKER_IDS = MAX_WORKER_ID + 1


@dataclass(frozen=True)
class DcRange:
    """The worker IDs DC ``dc_id`` of ``dc_count`` leases (docs/design.md §12.1):
    ``[dc_id x R, (dc_id + 1) x R)`` with ``R = 1024 / dc_count``. Leaf's 10-bit layout is
    unchanged, so the DC of an ID is ``worker_id // R``: it takes the count to say which
    (the ID itself does not carry it)."""

    dc_id: int
    dc_count: int

    @property
    def size(self) -> int:
        return WORKER_IDS // self.dc_count

    @property
    def first(self) -> int:
        return self.dc_id * self.size

    @property
    def last(self) -> int:
        return self.first + self.size - 1

    def __contains__(self, worker_id: object) -> bool:
        return isinstance(worker_id, int) and self.first <= worker_id <= self.last

    def ids(self) -> range:
        return range(self.first, self.last + 1)

    def describe(self) -> str:
        """``DC 1 of 2 (worker IDs 512..1023)``."""
        return f"DC {self.dc_id} of {self.dc_count} (worker IDs {self.first}..{self.last})"


def dc_range(dc_id: int, dc_count: int) -> DcRange:
    """The range of DC ``dc_id`` of ``dc_count`` (a power of two from 1 to 1024)."""
    if isinstance(dc_count, bool) or not isinstance(dc_count, int) or not (
        1 <= dc_count <= WORKER_IDS and WORKER_IDS % dc_count == 0
    ):
        raise InvalidArgument("dc_count", dc_count, f"a power of two from 1 to {WORKER_IDS}")
    if isinstance(dc_id, bool) or not isinstance(dc_id, int) or not 0 <= dc_id < dc_count:
        raise InvalidArgument("dc_id", dc_id, f"an integer from 0 to {dc_count - 1}")
    return DcRange(dc_id, dc_count)


def dc_of(worker_id: int, dc_count: int) -> int:
    """The DC whose range holds ``worker_id`` when the deployment has ``dc_count`` DCs."""
    validate_worker_id(worker_id)
    return worker_id // dc_range(0, dc_count).size
