"""Errors as responses: :class:`HttpError` (an expected failure and its status code),
the mapping of the library's error tree to status codes, and the log throttle that keeps
an outage under load from flooding the log.

The client's fault is 4xx, a server fault 5xx, never a sentinel ID: 400 bad input (the
message names the field, the value and what is allowed), 401/403 token refused, 404
unknown tag or a tag of the other mode, 503 pool still empty after the bounded wait or
Redis/database unreachable (with ``Retry-After``), 500 ``configuration`` when the server
is misconfigured (the message names the variable)."""

from __future__ import annotations

import logging
import math
import time

from starlette.responses import JSONResponse, PlainTextResponse, Response

from leafpool.core.errors import (
    BackendUnavailable,
    ConfigurationError,
    InvalidInput,
    LeafpoolError,
    PoolEmpty,
    UnknownTag,
)

log = logging.getLogger(__name__)

NO_STORE = {"Cache-Control": "no-store"}  # a cached ID is a duplicate ID


class HttpError(Exception):
    """An expected failure with its status code (raised inside the handlers)."""

    def __init__(self, status: int, kind: str, message: str,
                 headers: dict[str, str] | None = None, **extra: object) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message
        self.headers = headers or {}
        self.extra = extra


class LogThrottle:
    """At most one log line per key and interval (an outage under load must not flood)."""

    def __init__(self, interval: float = 10.0) -> None:
        self.interval = interval
        self._last: dict[str, float] = {}

    def ready(self, key: str) -> bool:
        now = time.monotonic()
        if now - self._last.get(key, -math.inf) < self.interval:
            return False
        self._last[key] = now
        return True


_throttle = LogThrottle()  # per process


def may_log(key: str) -> bool:
    """Whether a log line about ``key`` may be written now (see :class:`LogThrottle`)."""
    return _throttle.ready(key)


def as_http_error(exc: LeafpoolError, retry_after: int) -> HttpError:
    """Map the library's error tree to status codes. A misconfigured server is 500
    ``configuration`` (not 503: retrying does not help until an operator fixes the
    setting), logged for the operator; the body names the variable and what it may be,
    so whoever reads the client's log can pass it on."""
    retry = {"Retry-After": str(retry_after)}
    if isinstance(exc, ConfigurationError):
        if may_log(f"configuration:{exc.field}"):
            log.error("%s: server misconfigured, answering 500 until it is fixed: %s",
                      exc.field, exc)
        return HttpError(500, "configuration",
                         f"server misconfigured (not the request's fault; tell the "
                         f"operator): {exc}", field=exc.field, allowed=exc.allowed)
    if isinstance(exc, InvalidInput):
        return HttpError(400, "invalid_input", str(exc), field=exc.field,
                         value=str(exc.value), allowed=exc.allowed)
    if isinstance(exc, UnknownTag):
        return HttpError(404, "unknown_tag", str(exc), tag=exc.tag)
    if isinstance(exc, PoolEmpty):
        message = f"{exc}; retry later"
        if exc.partial:
            message += (f" ({len(exc.partial)} IDs taken before the pool ran dry were "
                        "discarded: a gap, never handed out again)")
        if may_log(f"empty:{exc.tag}"):
            log.warning("%s", message)
        return HttpError(503, "pool_empty", message, retry, tag=exc.tag)
    if isinstance(exc, BackendUnavailable):
        if may_log("backend"):
            log.warning("backend unavailable: %s", exc)
        return HttpError(503, "backend_unavailable", str(exc), retry)
    log.warning("request failed: %s: %s", type(exc).__name__, exc)
    return HttpError(503, type(exc).__name__, str(exc), retry)


def http_error(exc: HttpError | LeafpoolError, retry_after: int) -> HttpError:
    """``exc`` as an :class:`HttpError` (one ``except`` clause for both kinds)."""
    return exc if isinstance(exc, HttpError) else as_http_error(exc, retry_after)


def text_error(err: HttpError) -> Response:
    return PlainTextResponse(err.message + "\n", err.status, headers={**NO_STORE, **err.headers})


def json_error(err: HttpError) -> Response:
    body: dict[str, object] = {"error": err.kind, "message": err.message, **err.extra}
    return JSONResponse(body, err.status, headers={**NO_STORE, **err.headers})
