"""A snowflake generator posing as a StatefulSet pod, for the mode-k8s tests:
``python -m tests.support.pod OUT`` with the settings in the environment
(``LEAFPOOL_SNOWFLAKE_MODE=k8s``, ``HOSTNAME=leafpool-snowflake-N``, ...).

It claims its worker ID (refused while another session holds the lease: it prints
``WAITING <why>`` once and tries again every 50 ms), prints ``CLAIMED <worker ID>``,
then generates ``BATCH`` IDs every ``PAUSE_MS`` and appends each batch to OUT (8-byte
integers) only once ``next_batch`` returned it, until ``COUNT`` IDs (then it releases the
worker ID and prints ``DONE``) or SIGTERM; a call that could not renew a lease past its
deadline (ZooKeeper not answering) is tried again. A lost lease prints ``FENCED <why>``: it
generates nothing more and waits to be killed. A refused clock prints ``REFUSED <why>``
and exits 3.

The clock is injected: ``POD_CLOCK_OFFSET_MS`` is added to the wall clock (a pod
restarted with its clock set back). ``POD_UNSAFE=1`` removes the lease check (the
replacement takes the lease node over, the holder never checks it): the safety tests
must fail under it.
"""

from __future__ import annotations

import os
import signal
import sys
from array import array
from typing import Any

from kazoo.client import KazooClient

from leafpool.core.config import load_settings
from leafpool.core.errors import BackendUnavailable, ClockMovedBackwards, WorkerIdUnavailable
from leafpool.core.snowflake_layout import wall_clock_ms
from leafpool.snowflake.registry import LeasedGenerator, open_registry, process_identity
from leafpool.snowflake.registry.k8s import K8sRegistry
from tests.support.stop_signals import stop_event


def _unsafe() -> None:
    def take_over(self: K8sRegistry, client: KazooClient, worker_id: int) -> None:
        path = self.lease_path(worker_id)
        if client.exists(path):
            client.delete(path)
        client.create(path, b"{}", ephemeral=True)

    def no_check(self: Any, who: str) -> None:
        return None

    write_mark = K8sRegistry._write_mark

    def unchecked_mark(self: K8sRegistry, lease: Any, ms: int) -> None:
        try:  # a write the lease or the session refuses is ignored
            write_mark(self, lease, ms)
        except Exception as exc:
            print(f"UNSAFE mark write failed, ignored: {exc!r}", flush=True)

    K8sRegistry._take_lease = take_over  # type: ignore[method-assign]
    K8sRegistry._write_mark = unchecked_mark  # type: ignore[method-assign,assignment]
    K8sRegistry._check_live = no_check  # type: ignore[method-assign]
    K8sRegistry._fence = lambda self, reason: None  # type: ignore[method-assign]


def main(out: str) -> int:
    if os.environ.get("POD_UNSAFE") == "1":
        _unsafe()
    offset = int(os.environ.get("POD_CLOCK_OFFSET_MS", "0"))
    count = int(os.environ.get("COUNT", "0"))
    batch = int(os.environ.get("BATCH", "50"))
    pause = int(os.environ.get("PAUSE_MS", "5")) / 1000

    def clock() -> int:
        return wall_clock_ms() + offset

    settings = load_settings()
    host = os.environ["HOSTNAME"]
    identity = process_identity(f"snowflake@{host}", 1, host=host)
    registry = open_registry(settings, identity, clock=clock,
                             start_wait_ms=settings.snowflake_start_wait_ms)
    gen = LeasedGenerator(registry, settings, clock=clock)
    stop = stop_event(signal.SIGTERM)
    waiting = False
    while not stop.is_set():
        try:
            lease = gen.start()
            break
        except ClockMovedBackwards as exc:
            print(f"REFUSED {exc}", flush=True)
            return 3
        except WorkerIdUnavailable as exc:
            if not waiting:
                print(f"WAITING {exc}", flush=True)
                waiting = True
            stop.wait(0.05)
    else:
        return 0
    print(f"CLAIMED {lease.worker_id}", flush=True)
    made = 0
    with open(out, "ab", buffering=0) as fh:
        while not stop.is_set() and (not count or made < count):
            try:
                ids = gen.next_batch(batch if not count else min(batch, count - made))
            except WorkerIdUnavailable as exc:
                print(f"FENCED {exc}", flush=True)
                stop.wait()
                return 4
            except BackendUnavailable:  # past its deadline the call tried a renew, and
                stop.wait(pause)  # ZooKeeper did not answer: nothing generated, try again
                continue
            fh.write(array("q", ids).tobytes())
            made += len(ids)
            stop.wait(pause)
    gen.close()
    print(f"DONE {made}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
