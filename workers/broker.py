"""The broker connection Celery opens: kombu's, with one fix (docs/design.md §3.9).

A worker whose broker connection breaks while a task is unacknowledged (``acks_late``:
every running refill) exited with ``Unrecoverable error: AttributeError("'NoneType' object
has no attribute 'hostname'")`` right after "Connection to broker lost" (Celery 5.7, kombu
5.7, the Redis and Sentinel transports). Celery's consumer first calls
``Connection.collect()``: closing the default channel fails midway (its BRPOP's socket is
dead, so the channel is never marked closed), and collect then detaches the transport
(``transport.client = None``) while keeping ``_default_channel``. Celery then closes the
connection, which closes that channel again; the channel restores its unacknowledged
message through a new connection pool built from ``transport.client``, now None. The
AttributeError is not a connection error, so nothing ignores it and the worker stops.

:class:`BrokerConnection` forgets the default channel when it is collected: the channel
belongs to the transport collect dropped, and a later close has nothing left to do with
it. The message stays in the broker's unacked set: the task's own acknowledgement removes
it when it finishes (the channel keeps its client), otherwise it is delivered again after
the visibility timeout, as for a worker that was killed.

It also reconnects sooner: kombu waits 2 s, then 4, 6, ... up to 30 s between attempts,
so a worker came back 6 s after a failover that took 2.3 s (and 12 s after one of 6.6 s),
and no refill task reached it meanwhile. Here the waits are 0.5 s growing to 2 s; the
application retries for as long as the broker is away (``broker_connection_max_retries``
None), rather than exiting after a hundred attempts.
"""

from __future__ import annotations

from typing import Any

from celery.app.amqp import AMQP
from kombu import Connection

#: seconds between attempts to reach the broker again: the first, the growth, the most
RETRY_FIRST_SECONDS = 0.5
RETRY_STEP_SECONDS = 0.5
RETRY_MAX_SECONDS = 2.0


class BrokerConnection(Connection):  # type: ignore[misc]
    def _ensure_connection(  # kombu's signature; only the intervals' defaults differ
        self,
        errback: Any = None,
        max_retries: int | None = None,
        interval_start: float = RETRY_FIRST_SECONDS,
        interval_step: float = RETRY_STEP_SECONDS,
        interval_max: float = RETRY_MAX_SECONDS,
        callback: Any = None,
        reraise_as_library_errors: bool = True,
        timeout: float | None = None,
    ) -> Any:
        return super()._ensure_connection(
            errback, max_retries, interval_start, interval_step, interval_max, callback,
            reraise_as_library_errors, timeout)

    def collect(self, socket_timeout: float | None = None) -> None:
        try:
            super().collect(socket_timeout)
        finally:
            self._default_channel: Any = None


class BrokerAMQP(AMQP):  # type: ignore[misc]
    """Celery's AMQP helper with :class:`BrokerConnection` (``Celery(amqp=...)``)."""

    Connection = BrokerConnection
    BrokerConnection = BrokerConnection
