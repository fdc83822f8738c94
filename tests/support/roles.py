"""Processes for the crash and concurrency tests: ``python -m tests.support.roles ROLE ...``.

- ``refiller TAG``: refill TAG in a loop (settings from the environment). With
  ``CRASH_AT=allocate|push`` it refills normally until that step has just been done for
  the ``CRASH_AFTER``-th time, prints ``AT <step>`` and blocks, so the test can SIGKILL
  it exactly there.
- ``popper TAG OUT COUNT``: pops up to COUNT IDs with LPOP (batches of ``BATCH``),
  appending each acknowledged batch to OUT; Redis errors are retried (a restart).
- ``client TAG OUT COUNT``: takes up to COUNT IDs with leafpool's Client (settings from
  the environment: Sentinel, replica-acknowledged pops), ``BATCH`` at a time, appending
  each batch handed out to OUT with the time it was handed out; errors are retried, and
  each change of error is written to ``OUT.errors`` with its time (a test's timeline).
"""

from __future__ import annotations

import os
import sys
import threading
import time

import redis

from leafpool.core.errors import LeafpoolError
from leafpool.runtime import Runtime


def _crash_hook(rt: Runtime) -> None:
    at = os.environ.get("CRASH_AT")
    if not at:
        return
    remaining = [int(os.environ.get("CRASH_AFTER", "1"))]

    def hit() -> None:
        remaining[0] -= 1
        if remaining[0] == 0:
            print(f"AT {at}", flush=True)
            threading.Event().wait()  # until SIGKILL

    if at == "allocate":
        original_alloc = rt.store.allocate

        def allocate(*args, **kwargs):  # type: ignore[no-untyped-def]
            seg = original_alloc(*args, **kwargs)
            hit()
            return seg

        rt.store.allocate = allocate  # type: ignore[method-assign]
    elif at == "push":
        original_push = rt.pool.push

        def push(*args, **kwargs):  # type: ignore[no-untyped-def]
            n = original_push(*args, **kwargs)
            hit()
            return n

        rt.pool.push = push  # type: ignore[method-assign]
        original_run = rt.pool.push_run  # the segment refill's pushes, a run at a time

        def push_run(*args, **kwargs):  # type: ignore[no-untyped-def]
            run = original_run(*args, **kwargs)
            hit()
            return run

        rt.pool.push_run = push_run  # type: ignore[method-assign]


def refiller(tag: str) -> None:
    rt = Runtime()
    _crash_hook(rt)
    print("READY", flush=True)
    while True:
        try:
            rt.refiller.refill(tag, force=True)
        except LeafpoolError:
            time.sleep(0.01)  # Redis restarting or lock lost: try again
        time.sleep(0.002)


def popper(tag: str, out: str, count: int) -> None:
    client = redis.Redis.from_url(os.environ["LEAFPOOL_REDIS_URL"], socket_timeout=2,
                                  socket_connect_timeout=1)
    key = f"leafpool:{{{tag}}}:ids"
    batch = int(os.environ.get("BATCH", "50"))
    got = 0
    with open(out, "a") as fh:
        print("READY", flush=True)
        while got < count:
            try:
                raw = client.lpop(key, batch)
            except (redis.ConnectionError, redis.TimeoutError):
                time.sleep(0.01)
                continue
            if not raw:
                time.sleep(0.001)
                continue
            fh.write("".join(f"{int(x)}\n" for x in raw))
            fh.flush()
            got += len(raw)


def client(tag: str, out: str, count: int) -> None:
    from leafpool.client import Client

    batch = int(os.environ.get("BATCH", "10"))
    leaf = Client()
    got = 0
    last = ""
    with open(out, "a") as fh, open(f"{out}.errors", "a") as errors:
        print("READY", flush=True)
        while got < count:
            try:
                ids = leaf.next_ids(tag, batch)
            except LeafpoolError as exc:  # failover under way, or pops dropped for want of replicas
                seen = f"{type(exc).__name__}: {exc}"
                if seen != last:
                    errors.write(f"{time.time():.3f} {seen}\n")
                    errors.flush()
                    last = seen
                continue
            if last:
                errors.write(f"{time.time():.3f} ok\n")
                errors.flush()
                last = ""
            fh.write("".join(f"{i} {time.time():.3f}\n" for i in ids))
            fh.flush()
            got += len(ids)


if __name__ == "__main__":
    role, *args = sys.argv[1:]
    if role == "refiller":
        refiller(args[0])
    elif role == "popper":
        popper(args[0], args[1], int(args[2]))
    elif role == "client":
        client(args[0], args[1], int(args[2]))
    else:
        raise SystemExit(f"unknown role {role}")
