"""The stop event's handler returns even when the signal lands while the main thread holds
the event's own lock (inside ``Event.wait``): a handler calling ``set`` directly never
returns there (a pod hung so after SIGTERM)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator

import pytest

from tests.support.stop_signals import stop_event


@pytest.fixture
def restore_usr2() -> Iterator[None]:
    before = signal.getsignal(signal.SIGUSR2)
    yield
    signal.signal(signal.SIGUSR2, before)


def test_a_signal_inside_the_events_own_wait_still_sets_it(restore_usr2: None) -> None:
    stop = stop_event(signal.SIGUSR2)
    handler = signal.getsignal(signal.SIGUSR2)
    assert callable(handler)
    returned = threading.Event()

    def inside_wait() -> None:  # where Event.wait holds the lock, the handler runs
        with stop._cond:  # type: ignore[attr-defined]
            handler(signal.SIGUSR2, None)
        returned.set()

    threading.Thread(target=inside_wait, daemon=True).start()
    assert returned.wait(10), "the handler never returned: it waits for the lock its thread holds"
    assert stop.wait(10), "the event was never set"


def test_a_real_signal_sets_it(restore_usr2: None) -> None:
    stop = stop_event(signal.SIGUSR2)
    signal.raise_signal(signal.SIGUSR2)
    assert stop.wait(10)
