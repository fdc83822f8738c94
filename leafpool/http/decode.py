"""Snowflake ID decoding: ``GET /decodeSnowflakeId?snowflakeId=N`` answers Leaf's JSON
shape (``timestamp`` "ms(yyyy-MM-dd HH:mm:ss.SSS)" in the server's local time,
``workerId``, ``sequenceId``, all strings, nothing added); ``GET /api/snowflake/decode/{id}``
answers clean JSON (token-protected like every ``/api/*`` path), with the worker ID's DC
under this process's ``LEAFPOOL_DC_COUNT`` (``dc``, ``dc_count``: the ID does not carry the
count; docs/design.md §12.1)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from leafpool.core import snowflake_layout
from leafpool.core.errors import InvalidInput
from leafpool.http.errors import HttpError, http_error, json_error
from leafpool.http.service import service


def leaf_date(ms: int) -> str:
    """Leaf's ``yyyy-MM-dd HH:mm:ss.SSS`` in the server's local time zone."""
    return datetime.fromtimestamp(ms // 1000).strftime("%Y-%m-%d %H:%M:%S") + f".{ms % 1000:03d}"


async def decode_leaf(request: Request) -> Response:
    """Leaf's ``/decodeSnowflakeId?snowflakeId=N``: the same JSON keys and string values.
    Bad input is a 400 with Leaf's ``errorMsg`` key (Leaf answered 200)."""
    svc = service(request)
    raw = request.query_params.get("snowflakeId")
    if raw is None:
        return JSONResponse({"errorMsg": "snowflakeId is required"}, 400)
    try:
        d = snowflake_layout.decode(raw, svc.settings.snowflake_epoch)
    except InvalidInput as exc:
        return JSONResponse({"errorMsg": str(exc), "field": "snowflakeId",
                             "allowed": exc.allowed}, 400)
    return JSONResponse({
        "timestamp": f"{d.timestamp_ms}({leaf_date(d.timestamp_ms)})",
        "workerId": str(d.worker_id),
        "sequenceId": str(d.sequence),
    })


async def decode_json(request: Request) -> Response:
    svc = service(request)
    raw = request.path_params["id"]
    try:
        svc.auth.allowed_tags(request)
        d = snowflake_layout.decode(raw, svc.settings.snowflake_epoch)
    except (HttpError, InvalidInput) as exc:
        return json_error(http_error(exc, svc.retry_after))
    canonical = raw.strip().lstrip("0") or "0"  # str(int(raw)); int() refuses 4,300 digits
    dc_count = svc.settings.dc_count
    return JSONResponse({"id": canonical, "timestamp_ms": d.timestamp_ms, "iso": d.iso,
                         "worker_id": d.worker_id,
                         "dc": snowflake_layout.dc_of(d.worker_id, dc_count),
                         "dc_count": dc_count, "sequence": d.sequence,
                         "epoch_ms": svc.settings.snowflake_epoch})


def routes() -> Iterator[Route]:
    yield Route("/api/snowflake/decode/{id}", decode_json)
    yield Route("/decodeSnowflakeId", decode_leaf, methods=["GET", "POST"])
