"""The Lua scripts of leafpool, one ``.lua`` file each under ``leafpool/lua/``.

Each file opens with its KEYS/ARGV/return contract. They are registered with redis-py's
:class:`~redis.commands.core.Script`, which runs EVALSHA and falls back to EVAL after a
Redis restart (NOSCRIPT).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

# Return codes shared by the scripts (see each file's header).
LOCK_LOST = -1
HEAD_MOVED = -2
NOT_ABOVE_HWM = -3
LIST_NOT_EMPTY = -4
BELOW_RESERVE_TAIL = -5
OUTSIDE_HEAD = -6

REFUSALS = {
    LOCK_LOST: "the refill lock is not held with this token",
    HEAD_MOVED: "the reserve head moved",
    NOT_ABOVE_HWM: "the IDs are not above the tag's high-water mark",
    LIST_NOT_EMPTY: "the ids list is not empty",
    BELOW_RESERVE_TAIL: "the range starts below the end of the reserve",
    OUTSIDE_HEAD: "the IDs do not lie in the reserve head range (or are not increasing)",
}


@cache
def source(name: str) -> str:
    """The text of ``leafpool/lua/<name>.lua``."""
    return (Path(__file__).parent / "lua" / f"{name}.lua").read_text()
