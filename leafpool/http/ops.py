"""The operators' machine-readable endpoints: ``/health`` (readiness), ``/metrics``
(Prometheus) and ``/api/status`` (every tag's :class:`~leafpool.status.TagStatus` as
JSON, 64-bit values as strings; a restricted token sees only its tags)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from leafpool import metrics
from leafpool.core.errors import LeafpoolError
from leafpool.core.version import __version__
from leafpool.http.errors import NO_STORE, HttpError, http_error, json_error, may_log
from leafpool.http.service import SEGMENT, SNOWFLAKE, Service, service
from leafpool.status import TagStatus

log = logging.getLogger(__name__)

HEALTH_TIMEOUT_SECONDS = 2.0
SNOWFLAKE_FIELDS = ("worker_ids", "lease_state", "last_backwards_ms",
                    "last_backwards_offset_ms", "backwards_events")


# -- /api/status -------------------------------------------------------------------------

def status_dict(st: TagStatus) -> dict[str, object]:
    """One tag's status as JSON: 64-bit values (max_id, hwm, reserve ranges) as strings;
    a snowflake tag's own fields under ``snowflake``."""
    out = st.as_dict()
    out["max_id"] = None if st.max_id is None else str(st.max_id)
    snowflake = {name: out.pop(name) for name in SNOWFLAKE_FIELDS}
    if st.mode == SNOWFLAKE:
        out["snowflake"] = snowflake
    return out


async def status_json(request: Request) -> Response:
    svc = service(request)
    try:
        statuses = await svc.statuses(svc.auth.allowed_tags(request))
    except (HttpError, LeafpoolError) as exc:
        return json_error(http_error(exc, svc.retry_after))
    return JSONResponse({"generated_ms": int(time.time() * 1000),
                         "tags": [status_dict(st) for st in statuses]}, headers=NO_STORE)


# -- /metrics ------------------------------------------------------------------------------

async def metrics_endpoint(request: Request) -> Response:
    svc = service(request)
    payload = await run_in_threadpool(metrics.render, svc.registry)
    return Response(payload, media_type=CONTENT_TYPE_LATEST)


# -- /health -------------------------------------------------------------------------------

#: the release serving, on every /health answer (docs/reference/compatibility.md)
VERSION_HEADER = "Leafpool-Version"

async def _redis_check(svc: Service) -> bool:
    """PING, then whether any segment tag exists (so the database must answer too)."""
    await svc.pool.ping()
    modes = await svc.pool.modes(await svc.pool.tags())
    return SEGMENT in modes.values()


async def health(request: Request) -> Response:
    """200 ``ready`` when Redis answers PING and, if any segment tag exists, the database
    answers ``SELECT 1``; else 503 naming what failed."""
    svc = service(request)
    problems: list[str] = []
    check_db = True
    try:
        check_db = await asyncio.wait_for(_redis_check(svc), HEALTH_TIMEOUT_SECONDS)
    except TimeoutError:  # asyncio.wait_for's; the builtin one since Python 3.11 (required)
        problems.append(f"redis: no answer within {HEALTH_TIMEOUT_SECONDS}s")
    except (LeafpoolError, OSError) as exc:
        problems.append(f"redis: {exc}")
    if check_db:
        try:
            await run_in_threadpool(svc.runtime.store.ping)
        except LeafpoolError as exc:
            problems.append(str(exc))
    if problems:
        if may_log("health"):
            log.warning("not ready: %s", "; ".join(problems))
        return PlainTextResponse("not ready: " + "; ".join(problems) + "\n", 503,
                                 headers={**NO_STORE, VERSION_HEADER: __version__})
    return PlainTextResponse("ready\n", headers={**NO_STORE, VERSION_HEADER: __version__})


def routes() -> Iterator[Route]:
    yield Route("/api/status", status_json)
    yield Route("/metrics", metrics_endpoint)
    yield Route("/health", health)
