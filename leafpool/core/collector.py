"""Python's cyclic garbage collector paused while many objects without cycles are made
(a status or a scrape of 100,000 tags)."""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

_paused_lock = threading.Lock()
_paused_depth = 0
_paused_was_enabled = False


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector held off while many tags' statuses are read and
    written: the million objects of 100,000 tags' replies set off its collections again
    and again (4 of a /metrics scrape's 13 s of CPU); the replies hold no cycles. Nested
    and concurrent pauses (scrapes in threads) end with the last, which puts the
    collector back as the first found it."""
    global _paused_depth, _paused_was_enabled
    with _paused_lock:
        if _paused_depth == 0:
            _paused_was_enabled = gc.isenabled()
            gc.disable()
        _paused_depth += 1
    try:
        yield
    finally:
        with _paused_lock:
            _paused_depth -= 1
            if _paused_depth == 0 and _paused_was_enabled:
                gc.enable()
