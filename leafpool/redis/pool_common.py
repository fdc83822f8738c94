"""What :class:`leafpool.redis.pool.Pool` and its asyncio twin
:class:`leafpool.redis.pool_async.AsyncPool` share: the shapes of a tag's keys (a reserve
:class:`Range`, a :class:`Snapshot`), the scripts, and the recipes of the commands both
issue (queued on a sync or asyncio pipeline), so the two stay one layer."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from leafpool.core.keys import TagKeys
from leafpool.redis import scripts
from leafpool.redis.lock import written_here

SCRIPTS = ("push_ids", "push_range", "append_reserve", "take_reserve", "push_fresh", "record",
           "drop", "dry", "trim_reserve")


@dataclass(frozen=True)
class Range:
    """A half-open range ``[start, end)`` of IDs, stored in the reserve as ``start:end``."""

    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start

    def encode(self) -> str:
        return f"{self.start}:{self.end}"

    def after_taking(self, count: int) -> str:
        """The encoded head once its first ``count`` IDs are gone ("" when used up)."""
        return "" if count == self.size else Range(self.start + count, self.end).encode()

    def take_args(self, count: int) -> list[str | int]:
        """ARGV of take_reserve.lua for the first ``count`` IDs of this head."""
        return [self.encode(), self.after_taking(count), str(self.start),
                str(self.start + count - 1), count]

    @classmethod
    def decode(cls, raw: bytes | str) -> Range:
        text = raw.decode() if isinstance(raw, bytes) else raw
        start, _, end = text.partition(":")
        return cls(int(start), int(end))


@dataclass
class Snapshot:
    """One consistent read of a tag's keys (taken in a MULTI)."""

    tag: str
    length: int
    reserve: list[Range]
    state: dict[str, str] = field(default_factory=dict)
    locked: bool = False
    hits: dict[str, str] = field(default_factory=dict)  # what clients count (``hits`` key)

    @property
    def known(self) -> bool:
        """Registered: the state has a mode (a stray counter alone does not make a tag)."""
        return "mode" in self.state

    @property
    def reserve_size(self) -> int:
        return sum(r.size for r in self.reserve)

    @property
    def floor(self) -> int:
        """The first ID the pool may still take from the database: above everything it
        allocated (``max_id``, the reserve) and handed out (``hwm``)."""
        hwm = self.state.get("hwm")
        ends = [self.int("max_id"), int(hwm) + 1 if hwm else 0]
        return max([*ends, *(r.end for r in self.reserve)])

    def int(self, name: str, default: int = 0) -> int:
        value = self.state.get(name)
        return int(value) if value not in (None, "") else default

    def float(self, name: str, default: float = 0.0) -> float:
        value = self.state.get(name)
        return float(value) if value not in (None, "") else default


def record_args(fields: Mapping[str, object],
                counts: Mapping[str, int] | None = None) -> list[str | int]:
    """``record.lua``'s ARGV: the number of fields, the field/value pairs, then the
    counter/increment pairs."""
    args: list[str | int] = [len(fields)]
    for name, value in fields.items():
        args += [name, str(value)]
    for name, by in (counts or {}).items():
        args += [name, by]
    return args


def ids_from(raw: Sequence[bytes] | None) -> list[int]:
    """The IDs of one ``LPOP key count`` reply, as ints, in order.

    A pop takes a run from the head of a list that is strictly increasing (every push is
    above the high-water mark, docs/design.md §5), and a segment pool's list is made of
    contiguous runs (``push_ids`` pushes a contiguous run from the reserve head, checked
    at its two ends). So when the ends of the reply are ``len - 1`` apart the reply is
    exactly ``range(first, last + 1)`` and is read from its two ends: parsing 100
    decimal strings costs more than the pop's own client-side work. Otherwise (snowflake
    IDs, a pop across two segments) every string is parsed."""
    if not raw:
        return []
    first, last = int(raw[0]), int(raw[-1])
    if last - first == len(raw) - 1:
        return list(range(first, last + 1))
    return list(map(int, raw))


def text(raw: object) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _decode_map(raw: Mapping[bytes, bytes]) -> dict[str, str]:
    try:  # bytes: a client without decode_responses (the common case, decoded at once)
        decode = bytes.decode
        return dict(zip(map(decode, raw.keys()), map(decode, raw.values()), strict=True))
    except TypeError:
        return {text(k): text(v) for k, v in raw.items()}


SNAPSHOT_REPLIES = 5


def queue_snapshot(pipe: Any, k: TagKeys) -> None:
    """Queue the commands of one snapshot on a pipeline (sync or asyncio)."""
    pipe.llen(k.ids)
    pipe.lrange(k.reserve, 0, -1)
    pipe.hgetall(k.state)
    pipe.exists(k.lock)
    pipe.hgetall(k.hits)


def snapshot_commands(k: TagKeys) -> list[tuple[Any, ...]]:
    """:func:`queue_snapshot`'s commands as raw commands (many tags in one send)."""
    return [("LLEN", k.ids), ("LRANGE", k.reserve, 0, -1), ("HGETALL", k.state),
            ("EXISTS", k.lock), ("HGETALL", k.hits)]


def as_map(reply: Any) -> Mapping[Any, Any]:
    """A raw ``HGETALL`` reply as a mapping: a dict under RESP3, a flat list under RESP2."""
    if isinstance(reply, list):
        return dict(zip(reply[::2], reply[1::2], strict=True))
    return reply  # type: ignore[no-any-return]


def snapshot_from(tag: str, replies: Sequence[Any]) -> Snapshot:
    """The :class:`Snapshot` read by :func:`queue_snapshot`'s commands."""
    length, reserve, state, locked, hits = replies
    return Snapshot(tag, int(length), [Range.decode(r) for r in reserve], _decode_map(state),
                    bool(locked), _decode_map(as_map(hits)))


def register_scripts(client: Any) -> dict[str, Any]:
    """The scripts registered on ``client`` (sync or asyncio), by name."""
    return {name: client.register_script(scripts.source(name)) for name in SCRIPTS}


def take_result(head: Range, count: int, code: int) -> list[int] | int:
    """The IDs a take_reserve call gave (code 1), or its refusal code."""
    return list(range(head.start, head.start + count)) if code == 1 else code


# -- levels: what the sweep and the drop watcher read of a tag (docs/design.md §3.7) -------

#: state fields a level reads (HMGET): whether the tag is registered, its low-water mark,
#: whether its last refill left the reserve short, what was pushed (consumption), and
#: whether the list is marked dry (docs/design.md §3.8)
LEVEL_FIELDS = ("mode", "low_water", "reserve_due", "pushed_total", "target", "dry_since_ms")


@dataclass(slots=True)
class Level:
    """A tag's fill level: the few fields that say whether it is due a refill. Not
    frozen: the sweep builds 10,000 of them, and a frozen dataclass's constructor sets
    each field through ``object.__setattr__`` (11 ms of a 10,000-tag sweep)."""

    tag: str
    length: int
    mode: str | None
    low_water: int  # -1: never refilled
    reserve_due: bool
    pushed_total: int
    locked: bool = False
    target: int = 0
    dry: bool = False  # marked dry (dry_since_ms set)

    @property
    def known(self) -> bool:
        return self.mode is not None

    def dry_mark_stale(self) -> bool:
        """The dry mark disagrees with the list: empty after pushes and not marked, or
        marked and holding IDs again (``dry.lua`` then records what the list is)."""
        if self.length == 0:
            return self.known and self.pushed_total > 0 and not self.dry
        return self.dry

    @property
    def consumed(self) -> int:
        """IDs taken by clients so far (``pushed_total - LLEN``)."""
        return self.pushed_total - self.length

    def below_low_water(self) -> bool:
        """Below its low-water mark, or never refilled."""
        return self.length < self.low_water or self.low_water < 0

    def due(self) -> bool:
        """Below its low-water mark, never refilled, or (segment) its reserve short."""
        return self.below_low_water() or (self.reserve_due and self.mode == "segment")


def level_commands(k: TagKeys, with_lock: bool = False) -> list[tuple[str, ...]]:
    """The reads of one :class:`Level`, as raw commands (packed by the sweep, sent on
    the drop watcher's tracked connection). ``with_lock``: the lock's value too (where it
    was written: :func:`~leafpool.redis.lock.written_here`)."""
    out = [("LLEN", k.ids), ("HMGET", k.state, *LEVEL_FIELDS)]
    if with_lock:
        out.append(("GET", k.lock))
    return out


def level_from(tag: str, replies: Sequence[Any], replid: str = "") -> Level:
    """A :class:`Level` from its commands' raw replies (numbers parsed from the bytes
    as they come: ``int`` takes bytes, so only the mode is decoded). With the lock's
    value, ``locked`` says whether it holds on the master whose replication ID is
    ``replid``."""
    mode, low_water, reserve_due, pushed, target, dry = replies[1]
    return Level(tag, int(replies[0]), None if mode is None else text(mode),
                 int(low_water) if low_water else -1, reserve_due in (b"1", "1"),
                 int(pushed) if pushed else 0,
                 written_here(replies[2], replid) if len(replies) > 2 else False,
                 int(target) if target else 0, bool(dry))
