"""Per-process resources (Redis client, database engine), opened after the fork: a
connection inherited from the parent process is never shared."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from celery.signals import celeryd_init, worker_process_init, worker_process_shutdown, worker_ready

from leafpool.core.version import __version__
from leafpool.runtime import Runtime
from leafpool.snowflake.registry import process_identity

log = logging.getLogger(__name__)

_runtime: Runtime | None = None
_stop_claiming = threading.Event()
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


def start_line(node: str, queues: list[str], prefix: str) -> str:
    """What a worker says when it is ready: its release, and the queues it reads under which
    broker prefix (a rollout's mixed workers say which is which, docs/how-to/upgrades.md)."""
    return (f"leafpool {__version__}: worker {node} ready, reading "
            f"{', '.join(sorted(queues)) or 'no queue'} under the broker prefix {prefix!r}")


@worker_ready.connect
def _say_ready(sender: Any = None, **_: object) -> None:
    app = getattr(sender, "app", None)
    if app is None:
        return
    queues = list(app.amqp.queues.consume_from or app.amqp.queues)
    prefix = app.conf.broker_transport_options.get("global_keyprefix", "")
    # WARNING: Celery's default log level, so the line is there however the worker runs
    log.warning("%s", start_line(str(getattr(sender, "hostname", _node_name)), queues, prefix))


@worker_process_init.connect
def _open(**_: object) -> None:
    global _runtime
    _runtime = Runtime(identity=identity())
    if _runtime.settings.snowflake_claim_at_start:
        _claim_at_start(_runtime)


def _claim_at_start(rt: Runtime) -> threading.Thread:
    """LEAFPOOL_SNOWFLAKE_CLAIM_AT_START: claim the worker ID now, not at the first
    refill, so the readiness file (``leafpool probe snowflake``) says whether this
    process holds it; a refused claim (the lease still held by a predecessor) is tried
    again every LEAFPOOL_SNOWFLAKE_RENEW_SECONDS, and a lease lost later is claimed
    again once the source allows (docs/design.md §8.6)."""
    generator = rt.snowflake_refiller().generator
    thread = threading.Thread(target=generator.keep_claimed,
                              args=(_stop_claiming, rt.settings.snowflake_renew_seconds),
                              name="leafpool-snowflake-claim", daemon=True)
    thread.start()
    return thread


@worker_process_shutdown.connect
def _close(**_: object) -> None:
    _stop_claiming.set()
    if _runtime is not None:
        _runtime.close()
