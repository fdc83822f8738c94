"""Per-process resources (Redis client, database engine), opened after the fork: a
connection inherited from the parent process is never shared."""

from __future__ import annotations

import os

from celery.signals import worker_process_init, worker_process_shutdown

from leafpool.runtime import Runtime

_runtime: Runtime | None = None


def runtime() -> Runtime:
    global _runtime
    if _runtime is None or _runtime.pid != os.getpid():
        _runtime = Runtime()
    return _runtime


@worker_process_init.connect
def _open(**_: object) -> None:
    global _runtime
    _runtime = Runtime()


@worker_process_shutdown.connect
def _close(**_: object) -> None:
    if _runtime is not None:
        _runtime.close()
