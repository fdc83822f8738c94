"""Durations as people read them: the one formatter of the CLI's ``status``, the status
page and anything else that shows how long something lasts or how long ago it was."""

from __future__ import annotations

import time
from collections.abc import Callable

MINUTE = 60
HOUR = 3600
DAY = 86400


def fmt_duration(seconds: float | None) -> str:
    """``42s`` below 2 minutes, ``17m`` below 2 hours, ``5.5h`` below 2 days, then
    ``3.2d``; ``-`` for None (nothing to show, e.g. no pops yet, so no time left)."""
    if seconds is None:
        return "-"
    if seconds < 2 * MINUTE:
        return f"{seconds:.0f}s"
    if seconds < 2 * HOUR:
        return f"{seconds / MINUTE:.0f}m"
    if seconds < 2 * DAY:
        return f"{seconds / HOUR:.1f}h"
    return f"{seconds / DAY:.1f}d"


def fmt_ago(ms: int | None, clock: Callable[[], float] = time.time) -> str:
    """How long ago the wall-clock time ``ms`` (milliseconds since the epoch) was, as
    :func:`fmt_duration` writes it plus `` ago``; ``never`` for None. A time ahead of
    ``clock`` (another host's clock) reads ``0s ago``."""
    if ms is None:
        return "never"
    return f"{fmt_duration(max(0.0, clock() - ms / 1000))} ago"
