"""The HTTP service (``leafpool serve``): an ASGI app for clients that cannot reach Redis,
plus the operator's pages.

IDs (Leaf-compatible; one ``LPOP`` per request on the hot path):

- ``GET /api/segment/get/{tag}``, ``GET /api/snowflake/get/{tag}``: the bare ID as
  ``text/plain``, as Leaf's server answers, so a Leaf client switches by host name.
  ``?count=N`` (1 to ``LEAFPOOL_HTTP_MAX_COUNT``) returns N IDs, one per line.
- ``GET /api/segment/ids/{tag}?count=N`` (and ``/api/snowflake/ids/{tag}``): JSON
  ``{"tag", "mode", "ids": ["..."]}`` with the IDs as **strings**: a 64-bit ID does not
  survive a JavaScript number (exact only to 2**53).

Unlike Leaf (HTTP 500 for everything), expected conditions have their own codes and
never a sentinel ID: 400 bad input (the message names the field, the value and what is
allowed), 401/403 token refused, 404 unknown tag or a tag of the other mode, 503 pool
still empty after ``LEAFPOOL_EMPTY_WAIT_SECONDS`` or Redis unreachable (with
``Retry-After``), 500 ``configuration`` when the server is misconfigured (the operator's
fault, never the client's: the message names the variable). ID responses carry
``Cache-Control: no-store``: a cached ID is a duplicate ID.

Decode: ``GET /decodeSnowflakeId?snowflakeId=N`` answers Leaf's JSON shape
(``timestamp`` "ms(yyyy-MM-dd HH:mm:ss.SSS)" in the server's local time, ``workerId``,
``sequenceId``, all strings); ``GET /api/snowflake/decode/{id}`` answers clean JSON.

Operators: ``/cache`` (status page, auto-refreshing), ``/api/status`` (the same as JSON),
``/db`` (leaf_alloc rows, ``?format=json``), ``/metrics`` (Prometheus), ``/health``.

Token auth (optional, tinyid style): ``LEAFPOOL_HTTP_TOKENS="tokenA=order,pay;tokenB=*"``
maps each token to the tags it may take IDs of. When set, every ``/api/*`` request needs
``?token=`` or the header ``X-Leafpool-Token``: 401 without a known token, 403 for a
tag the token may not use. The operator pages are not token-protected: bind the service
to an internal network.
"""

from __future__ import annotations

import asyncio
import html
import logging
import math
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from datetime import datetime
from typing import TYPE_CHECKING

import redis
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import inspect, select, text
from sqlalchemy.exc import SQLAlchemyError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from leafpool import metrics
from leafpool.client import MAX_BATCH, AsyncClient
from leafpool.config import DATABASE_URL_ENV, Settings, TokenPolicy, get_settings, hide_password
from leafpool.db import leaf_alloc
from leafpool.errors import (
    BackendUnavailable,
    ConfigurationError,
    InvalidArgument,
    InvalidInput,
    LeafpoolError,
    PoolEmpty,
    UnknownTag,
)
from leafpool.pool import Snapshot
from leafpool.redis_conn import redis_errors
from leafpool.runtime import Runtime
from leafpool.status import TagStatus, age, tag_status
from leafpool.tags import validate_tag

if TYPE_CHECKING:
    from leafpool.snowflake import Decoded

log = logging.getLogger(__name__)

SEGMENT = "segment"
SNOWFLAKE = "snowflake"
MODES = (SEGMENT, SNOWFLAKE)
TOKEN_HEADER = "X-Leafpool-Token"
MODE_CACHE_SECONDS = 5.0  # a tag's mode is read from Redis at most this often
HEALTH_TIMEOUT_SECONDS = 2.0
DEFAULT_REFRESH_SECONDS = 5
NO_STORE = {"Cache-Control": "no-store"}
_COUNT_RE = re.compile(r"[0-9]{1,9}")


# -- errors as responses -----------------------------------------------------------------

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


class _LogThrottle:
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


_throttle = _LogThrottle()


def as_http_error(exc: LeafpoolError, retry_after: int) -> HttpError:
    """Map the library's error tree to status codes: the client's fault is 4xx, a server
    fault 5xx. A misconfigured server is 500 ``configuration`` (not 503: retrying does not
    help until an operator fixes the setting), logged for the operator; the body names the
    variable and what it may be, so whoever reads the client's log can pass it on."""
    retry = {"Retry-After": str(retry_after)}
    if isinstance(exc, ConfigurationError):
        if _throttle.ready(f"configuration:{exc.field}"):
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
        if _throttle.ready(f"empty:{exc.tag}"):
            log.warning("%s", message)
        return HttpError(503, "pool_empty", message, retry, tag=exc.tag)
    if isinstance(exc, BackendUnavailable):
        if _throttle.ready("backend"):
            log.warning("backend unavailable: %s", exc)
        return HttpError(503, "backend_unavailable", str(exc), retry)
    log.warning("request failed: %s: %s", type(exc).__name__, exc)
    return HttpError(503, type(exc).__name__, str(exc), retry)


def text_error(err: HttpError) -> Response:
    return PlainTextResponse(err.message + "\n", err.status, headers={**NO_STORE, **err.headers})


def json_error(err: HttpError) -> Response:
    body: dict[str, object] = {"error": err.kind, "message": err.message, **err.extra}
    return JSONResponse(body, err.status, headers={**NO_STORE, **err.headers})


# -- the service ---------------------------------------------------------------------------

class Service:
    """What the handlers share: the async client for IDs, a synchronous runtime (pool,
    store) used from worker threads for the operator pages, the metrics registry."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.tokens: TokenPolicy = settings.token_policy  # parsed with the settings
        self.max_count = min(settings.http_max_count, MAX_BATCH)
        self.retry_after = max(1, math.ceil(settings.sweep_seconds))
        self.runtime = Runtime(settings)
        self.registry = metrics.make_registry(self.runtime.pool)
        self.http = metrics.http_metrics(self.registry)
        self._client: AsyncClient | None = None
        self._modes: dict[str, tuple[str, float]] = {}

    @property
    def client(self) -> AsyncClient:
        if self._client is None:
            self._client = AsyncClient(settings=self.settings, policy="wait",
                                       wait_seconds=self.settings.empty_wait_seconds)
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        await run_in_threadpool(self.runtime.close)

    # -- auth --------------------------------------------------------------------------

    @staticmethod
    def authorize(tag: str, allowed: frozenset[str] | None) -> None:
        """403 unless ``allowed`` (from :meth:`allowed_tags`) includes ``tag``."""
        if allowed is not None and tag not in allowed:
            raise HttpError(403, "forbidden", f"this token may not take IDs of tag {tag!r}")

    def allowed_tags(self, request: Request) -> frozenset[str] | None:
        """The tags the request's token may see (None: all). Raises 401."""
        if not self.tokens.enabled:
            return None
        token = request.query_params.get("token") or request.headers.get(TOKEN_HEADER)
        if not token:
            raise HttpError(401, "unauthorized",
                            f"a token is required: ?token=... or the {TOKEN_HEADER} header")
        known, tags = self.tokens.lookup(token)
        if not known:
            raise HttpError(401, "unauthorized", "unknown token")
        return tags

    # -- IDs ---------------------------------------------------------------------------

    def count(self, request: Request) -> int | None:
        raw = request.query_params.get("count")
        if raw is None:
            return None
        allowed = f"an integer from 1 to {self.max_count} (LEAFPOOL_HTTP_MAX_COUNT)"
        if not _COUNT_RE.fullmatch(raw):
            raise InvalidArgument("count", raw, allowed)
        value = int(raw)
        if not 1 <= value <= self.max_count:
            raise InvalidArgument("count", raw, allowed)
        return value

    async def mode(self, tag: str) -> str | None:
        cached = self._modes.get(tag)
        now = time.monotonic()
        if cached is not None and cached[1] > now:
            return cached[0]
        key = self.client.keys.tag(tag).state
        with redis_errors(f"{tag}: mode"):
            raw = await self.client.redis.hget(key, "mode")
        if raw is None:
            self._modes.pop(tag, None)
            return None
        mode = raw.decode() if isinstance(raw, bytes) else str(raw)
        self._modes[tag] = (mode, now + MODE_CACHE_SECONDS)
        return mode

    async def take(self, tag: str, want_mode: str, count: int) -> list[int]:
        """``count`` IDs of ``tag`` (policy ``wait``), checking the tag's mode."""
        mode = await self.mode(tag)
        if mode is None:
            raise UnknownTag(tag)
        if mode != want_mode:
            raise HttpError(404, "wrong_mode",
                            f"{tag}: a {mode} tag; ask /api/{mode}/get/{tag}", tag=tag, mode=mode)
        if count == 1:
            return [await self.client.next_id(tag)]
        return await self.client.next_ids(tag, count)

    # -- operator views (run in worker threads: synchronous Redis and SQLAlchemy) ------------

    def snapshots(self, allowed: frozenset[str] | None = None) -> list[Snapshot]:
        pool = self.runtime.pool
        names = pool.tags()
        if allowed is not None:
            names = [n for n in names if n in allowed]
        return pool.snapshots(names)

    def leaf_alloc_rows(self) -> list[dict[str, object]]:
        store = self.runtime.store
        query = select(leaf_alloc.c.biz_tag, leaf_alloc.c.max_id, leaf_alloc.c.step,
                       leaf_alloc.c.description, leaf_alloc.c.update_time
                       ).order_by(leaf_alloc.c.biz_tag)
        try:
            with store.engine.connect() as conn:
                rows = conn.execute(query).all()
        except SQLAlchemyError as exc:
            if self._leaf_alloc_missing():
                raise ConfigurationError(
                    DATABASE_URL_ENV, hide_password(self.settings.database_url),
                    "a database holding the leaf_alloc table; this one has none: run "
                    "`leafpool db init` against it, or point the URL at the right database",
                ) from exc
            raise BackendUnavailable(f"database: reading leaf_alloc failed: "
                                     f"{_first_line(exc)}") from exc
        return [{"biz_tag": r.biz_tag, "max_id": str(r.max_id), "step": int(r.step),
                 "description": r.description,
                 "update_time": r.update_time.isoformat(sep=" ") if r.update_time else None}
                for r in rows]

    def _leaf_alloc_missing(self) -> bool:
        """True when the database answers and has no leaf_alloc table (an operator's
        fault: wrong URL, or ``leafpool db init`` never run), False if it does not answer."""
        try:
            with self.runtime.store.engine.connect() as conn:
                return not inspect(conn).has_table(leaf_alloc.name)
        except SQLAlchemyError:
            return False

    def database_ping(self) -> None:
        try:
            with self.runtime.store.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except SQLAlchemyError as exc:
            raise BackendUnavailable(f"database: {_first_line(exc)}") from exc

    async def segment_tags_exist(self) -> bool:
        r = self.client.redis
        with redis_errors("health: tags"):
            tags = [t.decode() if isinstance(t, bytes) else str(t)
                    for t in await r.smembers(self.client.keys.tags)]
            if not tags:
                return False
            pipe = r.pipeline(transaction=False)
            for tag in tags:
                pipe.hget(self.client.keys.tag(tag).state, "mode")
            modes = await pipe.execute()
        return any(m in (b"segment", "segment") for m in modes)


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _service(request: Request) -> Service:
    svc: Service = request.app.state.service
    return svc


# -- ID endpoints --------------------------------------------------------------------------

Handler = Callable[[Request], Awaitable[Response]]


def _id_endpoint(mode: str, as_json: bool) -> Handler:
    endpoint = f"/api/{mode}/{'ids' if as_json else 'get'}"
    fail = json_error if as_json else text_error

    async def handler(request: Request) -> Response:
        svc = _service(request)
        started = time.perf_counter()
        if request.method == "HEAD":  # a HEAD must not consume an ID
            response: Response = PlainTextResponse(
                "use GET\n", 405, headers={"Allow": "GET, POST", **NO_STORE})
        else:
            response = await _ids_response(svc, request, mode, as_json, fail)
        svc.http.requests.labels(endpoint, str(response.status_code)).inc()
        svc.http.latency.labels(endpoint).observe(time.perf_counter() - started)
        return response

    handler.__name__ = f"{mode}_{'ids' if as_json else 'get'}"
    return handler


async def _ids_response(svc: Service, request: Request, mode: str, as_json: bool,
                        fail: Callable[[HttpError], Response]) -> Response:
    tag = request.path_params.get("tag", "")
    try:
        allowed = svc.allowed_tags(request)
        validate_tag(tag)
        svc.authorize(tag, allowed)
        count = svc.count(request)
        ids = await svc.take(tag, mode, count or 1)
    except HttpError as err:
        return fail(err)
    except LeafpoolError as exc:
        return fail(as_http_error(exc, svc.retry_after))
    if as_json:
        return JSONResponse({"tag": tag, "mode": mode, "ids": [str(i) for i in ids]},
                            headers=NO_STORE)
    if count is None:
        return PlainTextResponse(str(ids[0]), headers=NO_STORE)
    return PlainTextResponse("".join(f"{i}\n" for i in ids), headers=NO_STORE)


# -- decode ----------------------------------------------------------------------------------

def _decode(raw: str, epoch_ms: int) -> Decoded:
    try:
        from leafpool import snowflake
    except ImportError as exc:  # pragma: no cover - the module ships with leafpool
        raise HttpError(503, "unavailable", f"snowflake decoding unavailable: {exc}") from exc
    return snowflake.decode(raw, epoch_ms)


def leaf_date(ms: int) -> str:
    """Leaf's ``yyyy-MM-dd HH:mm:ss.SSS`` in the server's local time zone."""
    return datetime.fromtimestamp(ms // 1000).strftime("%Y-%m-%d %H:%M:%S") + f".{ms % 1000:03d}"


async def decode_leaf(request: Request) -> Response:
    """Leaf's ``/decodeSnowflakeId?snowflakeId=N``: the same JSON keys and string values.
    Bad input is a 400 with Leaf's ``errorMsg`` key (Leaf answered 200)."""
    svc = _service(request)
    raw = request.query_params.get("snowflakeId")
    if raw is None:
        return JSONResponse({"errorMsg": "snowflakeId is required"}, 400)
    try:
        d = _decode(raw, svc.settings.snowflake_epoch)
    except InvalidInput as exc:
        return JSONResponse({"errorMsg": str(exc), "field": "snowflakeId",
                             "allowed": exc.allowed}, 400)
    except HttpError as err:
        return JSONResponse({"errorMsg": err.message}, err.status)
    return JSONResponse({
        "timestamp": f"{d.timestamp_ms}({leaf_date(d.timestamp_ms)})",
        "workerId": str(d.worker_id),
        "sequenceId": str(d.sequence),
    })


async def decode_json(request: Request) -> Response:
    svc = _service(request)
    raw = request.path_params["id"]
    try:
        svc.allowed_tags(request)
        d = _decode(raw, svc.settings.snowflake_epoch)
    except HttpError as err:
        return json_error(err)
    except InvalidInput as exc:
        return json_error(as_http_error(exc, svc.retry_after))
    return JSONResponse({"id": str(int(raw)), "timestamp_ms": d.timestamp_ms, "iso": d.iso,
                         "worker_id": d.worker_id, "sequence": d.sequence,
                         "epoch_ms": svc.settings.snowflake_epoch})


# -- status ----------------------------------------------------------------------------------

SNOWFLAKE_FIELDS = ("worker_ids", "lease_state", "last_backwards_ms",
                    "last_backwards_offset_ms", "backwards_events")


def status_dict(snap: Snapshot) -> dict[str, object]:
    """One tag's status as JSON: 64-bit values (max_id, hwm, reserve ranges) as strings."""
    st = tag_status(snap).as_dict()
    st["max_id"] = None if st["max_id"] is None else str(st["max_id"])
    st["last_alloc_ms"] = snap.float("last_alloc_ms") if "last_alloc_ms" in snap.state else None
    snowflake = {name: st.pop(name) for name in SNOWFLAKE_FIELDS}
    if st["mode"] == SNOWFLAKE:
        st["snowflake"] = snowflake
    return st


async def status_json(request: Request) -> Response:
    svc = _service(request)
    try:
        allowed = svc.allowed_tags(request)
        snaps = await run_in_threadpool(svc.snapshots, allowed)
    except HttpError as err:
        return json_error(err)
    except LeafpoolError as exc:
        return json_error(as_http_error(exc, svc.retry_after))
    return JSONResponse({"generated_ms": int(time.time() * 1000),
                         "tags": [status_dict(s) for s in snaps]}, headers=NO_STORE)


# -- HTML ------------------------------------------------------------------------------------

def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def fmt_int(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def fmt_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    if seconds < 172800:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def _when(ms: int | None) -> str:
    if ms is None:
        return "never"
    stamp = datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S")
    return f'<span title="{esc(stamp)}">{esc(age(ms))}</span>'


_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:0.5em 0 1.5em}
th,td{border:1px solid #ccc;padding:4px 8px;text-align:right;vertical-align:top}
th{background:#f3f3f3}th:first-child,td.tag,td.text{text-align:left}
td.err{color:#b00;text-align:left;max-width:28em;word-break:break-word}
tr.low td.ready{background:#fff3cd}tr.empty td.ready{background:#f8d7da}
.banner{padding:8px;background:#f8d7da;border:1px solid #b00}.meta{color:#666}
meter{width:8em}
"""


def page(title: str, body: str, refresh: int = 0) -> str:
    meta = f'<meta http-equiv="refresh" content="{refresh}">' if refresh > 0 else ""
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{esc(title)}</title>{meta}<style>{_STYLE}</style></head><body>"
        f"<h1>{esc(title)}</h1><p class=\"meta\"><a href=\"/cache\">pools</a> · "
        "<a href=\"/db\">leaf_alloc</a> · <a href=\"/api/status\">status JSON</a> · "
        "<a href=\"/metrics\">metrics</a> · <a href=\"/health\">health</a></p>"
        f"{body}</body></html>\n"
    )


def _row_class(st: TagStatus) -> str:
    if st.length == 0:
        return "empty"
    if st.low_water and st.length < st.low_water:
        return "low"
    return "ok"


def _ready_cell(st: TagStatus) -> str:
    target = max(st.target, 1)
    return (f'<td class="ready"><span class="length">{fmt_int(st.length)}</span> / '
            f'<span class="target">{fmt_int(st.target)}</span><br>'
            f'<meter min="0" max="{target}" low="{st.low_water}" optimum="{target}" '
            f'value="{min(st.length, target)}"></meter></td>')


def _common_cells(st: TagStatus) -> str:
    error = ""
    if st.last_error:
        error = f"{esc(st.last_error)}<br><span class=\"meta\">{_when(st.last_error_ms)}</span>"
    return (
        f'<td class="rate">{st.rate:,.1f}</td>'
        f'<td class="left">{esc(fmt_duration(st.seconds_left))}</td>'
        f'<td class="last-refill text">{_when(st.last_refill_ms)}<br>'
        f'<span class="meta">{esc(st.last_refill_result)}</span></td>'
        f'<td class="err">{error}</td>'
        f'<td class="empty-hits">{fmt_int(st.empty_hits)}</td>'
    )


def segment_table(snaps: list[Snapshot]) -> str:
    head = ("<tr><th>tag</th><th>ready / target</th><th>low-water</th><th>reserve</th>"
            "<th>step</th><th>max_id</th><th>pops/s</th><th>time left</th>"
            "<th>last refill</th><th>last error</th><th>empty hits</th></tr>")
    rows = []
    for snap in snaps:
        st = tag_status(snap)
        reserve = "<br>".join(esc(r) for r in st.reserve) or "-"
        rows.append(
            f'<tr data-tag="{esc(st.tag)}" data-mode="segment" class="{_row_class(st)}">'
            f'<td class="tag">{esc(st.tag)}</td>{_ready_cell(st)}'
            f'<td class="low-water">{fmt_int(st.low_water)}</td>'
            f'<td class="reserve text">{reserve}<br><span class="meta">'
            f'{fmt_int(st.reserve_size)} IDs</span></td>'
            f'<td class="step">{fmt_int(st.step)}</td>'
            f'<td class="max-id">{fmt_int(st.max_id)}</td>{_common_cells(st)}</tr>')
    return f'<table id="segment"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>'


def snowflake_table(snaps: list[Snapshot]) -> str:
    head = ("<tr><th>tag</th><th>ready / target</th><th>worker IDs</th><th>lease</th>"
            "<th>last clock backwards</th><th>pops/s</th><th>time left</th>"
            "<th>last refill</th><th>last error</th><th>empty hits</th></tr>")
    rows = []
    for snap in snaps:
        st = tag_status(snap)
        workers = ", ".join(esc(w) for w in st.worker_ids) or "-"
        back = "none"
        if st.last_backwards_ms is not None:
            offset = "?" if st.last_backwards_offset_ms is None else st.last_backwards_offset_ms
            back = f"{esc(offset)} ms back, {_when(st.last_backwards_ms)}"
        back += f'<br><span class="meta">{fmt_int(st.backwards_events)} events</span>'
        rows.append(
            f'<tr data-tag="{esc(st.tag)}" data-mode="snowflake" class="{_row_class(st)}">'
            f'<td class="tag">{esc(st.tag)}</td>{_ready_cell(st)}'
            f'<td class="workers text">{workers}</td>'
            f'<td class="lease text">{esc(st.lease_state or "-")}</td>'
            f'<td class="backwards text">{back}</td>{_common_cells(st)}</tr>')
    return (f'<table id="snowflake"><thead>{head}</thead><tbody>{"".join(rows)}</tbody>'
            "</table>")


def _refresh(request: Request) -> int:
    raw = request.query_params.get("refresh")
    if raw is None:
        return DEFAULT_REFRESH_SECONDS
    if not raw.isdigit() or int(raw) > 3600:
        raise InvalidArgument("refresh", raw, "seconds from 0 (off) to 3600")
    return int(raw)


async def cache_page(request: Request) -> Response:
    """The pools at a glance (Leaf's /cache, and what it lacks)."""
    svc = _service(request)
    try:
        refresh = _refresh(request)
    except InvalidInput as exc:
        return text_error(as_http_error(exc, svc.retry_after))
    now = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    if refresh:
        meta = (f'<p class="meta">{esc(now)} · refreshes every {refresh}s '
                f'(<a href="?refresh=0">stop</a>) · prefix {esc(svc.settings.key_prefix)}</p>')
    else:
        meta = f'<p class="meta">{esc(now)} · <a href="?refresh=5">auto-refresh</a></p>'

    try:
        snaps = await run_in_threadpool(svc.snapshots)
    except LeafpoolError as exc:
        body = f'{meta}<p class="banner" id="error">Redis unreachable: {esc(exc)}</p>'
        return HTMLResponse(page("leafpool pools", body, refresh), 503, headers=NO_STORE)
    seg = [s for s in snaps if s.state.get("mode") != SNOWFLAKE]
    sf = [s for s in snaps if s.state.get("mode") == SNOWFLAKE]
    body = meta + f'<p id="summary">{len(snaps)} tags: {len(seg)} segment, {len(sf)} snowflake</p>'
    body += "<h2>Segment tags</h2>" + (segment_table(seg) if seg else "<p>none</p>")
    body += "<h2>Snowflake tags</h2>" + (snowflake_table(sf) if sf else "<p>none</p>")
    return HTMLResponse(page("leafpool pools", body, refresh), headers=NO_STORE)


async def db_page(request: Request) -> Response:
    """``leaf_alloc`` as Leaf's /db shows it; ``?format=json`` for scripts."""
    svc = _service(request)
    as_json = request.query_params.get("format") == "json"
    try:
        rows = await run_in_threadpool(svc.leaf_alloc_rows)
    except LeafpoolError as exc:
        err = as_http_error(exc, svc.retry_after)
        if as_json:
            return json_error(err)
        body = f'<p class="banner" id="error">{esc(err.message)}</p>'
        return HTMLResponse(page("leaf_alloc", body), err.status, headers=err.headers)
    if as_json:
        return JSONResponse({"rows": rows}, headers=NO_STORE)
    head = "<tr><th>tag</th><th>max_id</th><th>step</th><th>description</th><th>update</th></tr>"
    body_rows = "".join(
        f'<tr data-tag="{esc(r["biz_tag"])}"><td class="tag">{esc(r["biz_tag"])}</td>'
        f'<td class="max-id">{esc(r["max_id"])}</td><td class="step">{esc(r["step"])}</td>'
        f'<td class="text">{esc(r["description"] or "")}</td>'
        f'<td class="text">{esc(r["update_time"] or "")}</td></tr>' for r in rows)
    body = f'<table id="leaf_alloc"><thead>{head}</thead><tbody>{body_rows}</tbody></table>'
    return HTMLResponse(page("leaf_alloc", body), headers=NO_STORE)


async def metrics_endpoint(request: Request) -> Response:
    svc = _service(request)
    payload = await run_in_threadpool(metrics.render, svc.registry)
    return Response(payload, media_type=CONTENT_TYPE_LATEST)


async def _redis_check(svc: Service) -> bool:
    """PING, then whether any segment tag exists (so the database must answer too)."""
    with redis_errors("PING"):
        await svc.client.redis.ping()
    return await svc.segment_tags_exist()


async def health(request: Request) -> Response:
    """200 ``ready`` when Redis answers PING and, if any segment tag exists, the database
    answers ``SELECT 1``; else 503 naming what failed."""
    svc = _service(request)
    problems: list[str] = []
    check_db = True
    try:
        check_db = await asyncio.wait_for(_redis_check(svc), HEALTH_TIMEOUT_SECONDS)
    except TimeoutError:  # asyncio.wait_for's; the builtin one since Python 3.11 (required)
        problems.append(f"redis: no answer within {HEALTH_TIMEOUT_SECONDS}s")
    except (LeafpoolError, redis.RedisError, OSError) as exc:
        problems.append(f"redis: {exc}")
    if check_db:
        try:
            await run_in_threadpool(svc.database_ping)
        except LeafpoolError as exc:
            problems.append(str(exc))
    if problems:
        if _throttle.ready("health"):
            log.warning("not ready: %s", "; ".join(problems))
        return PlainTextResponse("not ready: " + "; ".join(problems) + "\n", 503,
                                 headers=NO_STORE)
    return PlainTextResponse("ready\n", headers=NO_STORE)


async def index(request: Request) -> Response:
    body = ("<ul><li><a href=\"/cache\">/cache</a>: pools</li>"
            "<li><a href=\"/db\">/db</a>: leaf_alloc</li>"
            "<li>/api/segment/get/{tag}, /api/snowflake/get/{tag} [?count=N]</li>"
            "<li>/api/segment/ids/{tag}?count=N (JSON, IDs as strings)</li>"
            "<li>/decodeSnowflakeId?snowflakeId=N, /api/snowflake/decode/{id}</li></ul>")
    return HTMLResponse(page("leafpool", body))


# -- the app -----------------------------------------------------------------------------------

def _routes() -> Iterable[Route]:
    for mode in MODES:
        get = _id_endpoint(mode, as_json=False)
        ids = _id_endpoint(mode, as_json=True)
        methods = ["GET", "POST"]
        yield Route(f"/api/{mode}/get/{{tag}}", get, methods=methods)
        yield Route(f"/api/{mode}/get/", get, methods=methods)  # empty tag: 400, not 404
        yield Route(f"/api/{mode}/get", get, methods=methods)
        yield Route(f"/api/{mode}/ids/{{tag}}", ids, methods=methods)
        yield Route(f"/api/{mode}/ids/", ids, methods=methods)
    yield Route("/api/snowflake/decode/{id}", decode_json)
    yield Route("/decodeSnowflakeId", decode_leaf, methods=["GET", "POST"])
    yield Route("/api/status", status_json)
    yield Route("/cache", cache_page)
    yield Route("/db", db_page)
    yield Route("/metrics", metrics_endpoint)
    yield Route("/health", health)
    yield Route("/", index)


def create_app(settings: Settings | None = None) -> Starlette:
    """The ASGI app. The settings were validated when they were loaded (a malformed
    ``LEAFPOOL_HTTP_TOKENS`` stops the program before anything is served)."""
    service = Service(settings or get_settings())

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await service.aclose()

    app = Starlette(routes=list(_routes()), lifespan=lifespan)
    app.state.service = service
    return app


def app_from_env() -> Starlette:
    """Factory for several worker processes:
    ``uvicorn --factory leafpool.http:app_from_env --workers 4``."""
    return create_app(get_settings())


def serve(settings: Settings | None = None, workers: int = 1) -> None:
    """Run the HTTP service until interrupted, on ``settings``' host and port: in this
    process (``workers=1``), or in ``workers`` uvicorn worker processes (uvicorn's
    ``--workers``), each building its app with :func:`app_from_env`; they read their
    settings from the environment, where this writes the host and port first."""
    import os

    import uvicorn

    settings = settings or get_settings()
    log.info("leafpool HTTP on http://%s:%d, %d worker process(es) (/cache, /metrics, /health)",
             settings.http_host, settings.http_port, workers)
    if workers == 1:
        uvicorn.run(create_app(settings), host=settings.http_host, port=settings.http_port,
                    access_log=False, server_header=False, log_level="info")
        return
    os.environ["LEAFPOOL_HTTP_HOST"] = settings.http_host
    os.environ["LEAFPOOL_HTTP_PORT"] = str(settings.http_port)
    uvicorn.run("leafpool.http:app_from_env", factory=True, workers=workers,
                host=settings.http_host, port=settings.http_port,
                access_log=False, server_header=False, log_level="info")
