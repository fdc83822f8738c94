"""A stop event set by signals, for the helper processes the tests start
(``tests.support.pod``, ``tests.support.nemesis_client``).

The handler must not call ``Event.set`` itself: Python runs a signal handler in the main
thread between two bytecodes, which may be inside that same event's ``wait`` while it
holds the event's (non-reentrant) lock, and ``set`` then waits for that lock forever. A
stopped pod hung so after SIGTERM. The handler hands the ``set`` to a short thread of its
own, which takes the lock once the main thread lets go of it.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType


def stop_event(*signums: int) -> threading.Event:
    """An event set soon after any of ``signums`` arrives (the handlers installed)."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        threading.Thread(target=stop.set, name="stop-signal", daemon=True).start()

    for signum in signums:
        signal.signal(signum, on_signal)
    return stop
