"""Per-process resources (Redis client, database engine), opened after the fork: a
connection inherited from the parent process is never shared."""

from __future__ import annotations

import os
from typing import Any

from celery.signals import celeryd_init, worker_process_init, worker_process_shutdown

from leafpool.runtime import Runtime
from leafpool.snowflake.registry import process_identity

_runtime: Runtime | None = None
_node_name = "celery"


def identity() -> str:
    """``host:node-name:process-index`` of this worker process (snowflake worker ID)."""
    from billiard.process import current_process

    index = getattr(current_process(), "index", None) or 0
    return process_identity(_node_name, int(index))


def runtime() -> Runtime:
    global _runtime
    if _runtime is None or _runtime.pid != os.getpid():
        _runtime = Runtime(identity=identity())
    return _runtime


@celeryd_init.connect
def _remember_node_name(sender: Any = None, **_: object) -> None:
    global _node_name
    if sender:
        _node_name = str(sender)


@worker_process_init.connect
def _open(**_: object) -> None:
    global _runtime
    _runtime = Runtime(identity=identity())


@worker_process_shutdown.connect
def _close(**_: object) -> None:
    if _runtime is not None:
        _runtime.close()
