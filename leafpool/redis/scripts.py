"""The Lua scripts of leafpool, one ``.lua`` file each under ``leafpool/redis/lua/``.

Each file opens with its KEYS/ARGV/return contract. Helpers shared by several scripts are
written once under ``leafpool/redis/lua/lib/`` and put in place of a ``-- @include NAME`` line
when the script is loaded. The scripts are registered with redis-py's
:class:`~redis.commands.core.Script`, which runs EVALSHA and falls back to EVAL after a
Redis restart (NOSCRIPT).

Every value a script writes is checked against the values it follows from: a script
refuses a call whose arguments are not canonical decimals (:data:`NOT_DECIMAL`) or do not
agree with each other (:data:`INCONSISTENT`: the new reserve head against the last ID
handed out, a count against the first and last ID, a recorded ``max_id``/``step`` against
the range) and writes nothing. Only the IDs between the first and last of a
``push_ids`` chunk are trusted unchecked (see its header); ``push_range`` generates them
from the first and last, below 2^53 (:data:`BEYOND_DOUBLES` above).

Retrying after a lost reply (the script may or may not have run):

- ``push_ids``, ``push_range``: safe; a repeat of a chunk that went through finds the head
  moved (-2).
- ``append_reserve``: safe; a repeat of a range that went through is refused (-5, or -3
  once the range was pushed).
- ``push_fresh``: safe; a repeat of IDs that went through is refused (-3).
- ``take_reserve``: NOT safe blindly; a repeat of a take that went through is refused (-2)
  and the first run's IDs are a gap the caller must count (never hand out again).
- ``record``: fields are safe (HSET writes the same values), counters are not (HINCRBY
  counts twice).
- ``drop``: safe; a repeat finds no state and returns 1 again.
- ``trim_reserve``: safe; a repeat drops only head ranges that still meet its conditions.
- ``spill_reserve``, ``spill_range``: safe; a repeat of a chunk that went through finds
  the head moved (-2).
"""

from __future__ import annotations

import hashlib
import re
from functools import cache
from pathlib import Path

# Return codes shared by the scripts (see each file's header).
LOCK_LOST = -1
HEAD_MOVED = -2
NOT_ABOVE_HWM = -3
LIST_NOT_EMPTY = -4
BELOW_RESERVE_TAIL = -5
OUTSIDE_HEAD = -6
NOT_DECIMAL = -7
INCONSISTENT = -8
LOCK_HELD = -9  # spill_reserve: a refill lock exists
LIST_FILLED = -10  # spill_reserve: the list holds as many IDs as the caller's bound
BEYOND_DOUBLES = -11  # push_range, spill_range: the last ID is 2^53 or above (push_ids,
# spill_reserve send those)

REFUSALS = {
    LOCK_LOST: "the refill lock is not held with this token",
    HEAD_MOVED: "the reserve head moved",
    NOT_ABOVE_HWM: "the IDs are not above the tag's high-water mark",
    LIST_NOT_EMPTY: "the ids list is not empty",
    BELOW_RESERVE_TAIL: "the range starts below the end of the reserve",
    OUTSIDE_HEAD: "the IDs do not lie in the reserve head range (or are not increasing)",
    NOT_DECIMAL: "a value is not a canonical non-negative decimal",
    INCONSISTENT: "the arguments are inconsistent: a value the script writes does not "
                  "follow from the IDs or range it hands out or adds",
    LOCK_HELD: "the tag's refill lock exists (a refill fills the list)",
    LIST_FILLED: "the list holds as many IDs as the bound given (filled meanwhile)",
    BEYOND_DOUBLES: "the last ID is 2^53 or above: Lua cannot generate it exactly "
                    "(push_ids sends such IDs)",
}

# Refusals a client taking from the reserve may retry: the state it read has moved on.
RETRYABLE_TAKE = frozenset({HEAD_MOVED, LIST_NOT_EMPTY})

LUA_DIR = Path(__file__).parent / "lua"
_INCLUDE = re.compile(r"^-- @include (\w+)$", re.MULTILINE)


@cache
def source(name: str) -> str:
    """The text of ``leafpool/redis/lua/<name>.lua``, its ``-- @include`` lines replaced by
    the helpers of ``leafpool/redis/lua/lib/``."""
    return expand((LUA_DIR / f"{name}.lua").read_text())


def sha1(name: str) -> str:
    """The SHA-1 Redis knows the script ``name`` by (EVALSHA)."""
    return hashlib.sha1(source(name).encode()).hexdigest()


def expand(text: str) -> str:
    """``text`` with each ``-- @include NAME`` line replaced by ``lua/lib/NAME.lua``."""
    return _INCLUDE.sub(lambda m: (LUA_DIR / "lib" / f"{m.group(1)}.lua").read_text(), text)
