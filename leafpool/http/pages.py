"""The operators' HTML pages: ``/cache`` (every tag's :class:`~leafpool.status.TagStatus`,
auto-refreshing; one table per mode, built by one table builder from the columns both
modes share and each mode's own), ``/db`` (``leaf_alloc`` as Leaf's /db shows it;
``?format=json`` for scripts) and the index. Not token-protected: bind the service to an
internal network."""

from __future__ import annotations

import html
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from leafpool.core.config import DATABASE_URL_ENV, hide_password
from leafpool.core.durations import fmt_ago, fmt_duration
from leafpool.core.errors import (
    BackendUnavailable,
    ConfigurationError,
    InvalidArgument,
    InvalidInput,
    LeafpoolError,
)
from leafpool.http.errors import NO_STORE, as_http_error, json_error, text_error
from leafpool.http.service import SEGMENT, SNOWFLAKE, Service, service
from leafpool.status import TagStatus, held, notices

DEFAULT_REFRESH_SECONDS = 5

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:0.5em 0 1.5em}
th,td{border:1px solid #ccc;padding:4px 8px;text-align:right;vertical-align:top}
th{background:#f3f3f3}th:first-child,td.tag,td.text{text-align:left}
td.err{color:#b00;text-align:left;max-width:28em;word-break:break-word}
tr.low td.ready{background:#fff3cd}tr.empty td.ready,tr.dry td.ready{background:#f8d7da}
.banner{padding:8px;background:#f8d7da;border:1px solid #b00}.meta{color:#666}
meter{width:8em}
"""


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def fmt_int(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def when(ms: int | None) -> str:
    """How long ago, with the local date and time on hover."""
    if ms is None:
        return "never"
    stamp = datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S")
    return f'<span title="{esc(stamp)}">{esc(fmt_ago(ms))}</span>'


def meta(text: str) -> str:
    return f'<span class="meta">{text}</span>'


def page(title: str, body: str, refresh: int = 0) -> str:
    refresh_tag = f'<meta http-equiv="refresh" content="{refresh}">' if refresh > 0 else ""
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<title>{esc(title)}</title>{refresh_tag}<style>{_STYLE}</style></head><body>"
        f"<h1>{esc(title)}</h1><p class=\"meta\"><a href=\"/cache\">pools</a> · "
        "<a href=\"/db\">leaf_alloc</a> · <a href=\"/api/status\">status JSON</a> · "
        "<a href=\"/metrics\">metrics</a> · <a href=\"/health\">health</a></p>"
        f"{body}</body></html>\n"
    )


def table(table_id: str, heads: Sequence[str], rows: Sequence[str]) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in heads)
    return (f'<table id="{esc(table_id)}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


# -- /cache: one table builder, columns per mode --------------------------------------------

@dataclass(frozen=True)
class Column:
    """One column of the pools table: its heading, its cells' class, and the cell's HTML
    (escaped) for a tag."""

    head: str
    css: str
    cell: Callable[[TagStatus], str]


def _ready(st: TagStatus) -> str:
    target = max(st.target, 1)
    return (f'<span class="length">{fmt_int(st.length)}</span> / '
            f'<span class="target">{fmt_int(st.target)}</span><br>'
            f'<meter min="0" max="{target}" low="{st.low_water}" optimum="{target}" '
            f'value="{min(st.length, target)}"></meter>')


def _reserve(st: TagStatus) -> str:
    ranges = "<br>".join(esc(r) for r in st.reserve) or "-"
    return f"{ranges}<br>{meta(f'{fmt_int(st.reserve_size)} IDs')}"


def _backwards(st: TagStatus) -> str:
    back = "none"
    if st.last_backwards_ms is not None:
        offset = "?" if st.last_backwards_offset_ms is None else st.last_backwards_offset_ms
        back = f"{esc(offset)} ms back, {when(st.last_backwards_ms)}"
    return f"{back}<br>{meta(f'{fmt_int(st.backwards_events)} events')}"


def _last_error(st: TagStatus) -> str:
    """The last error whole (CounterBehind's fix SQL), after "database unreachable since"
    while the tag's allocations fail (docs/design.md §3.8)."""
    text = f"{esc(st.last_error)}<br>{meta(when(st.last_error_ms))}" if st.last_error else ""
    if st.db_unreachable_ms is not None:
        return (f'<strong class="db-down">database unreachable since '
                f"{when(st.db_unreachable_ms)}</strong><br>{text}")
    return text


def _empty(st: TagStatus) -> str:
    """Empty hits leafpool's clients counted; since when the list is dry (plain LPOPs of
    an empty list are seen by nothing, so not counted)."""
    hits = fmt_int(st.empty_hits)
    if st.dry_since_ms is None:
        return hits
    return f'<strong class="dry">dry since {when(st.dry_since_ms)}</strong><br>{meta(hits)}'


LEAD = (Column("tag", "tag", lambda st: esc(st.tag)),
        Column("ready / target", "ready", _ready))
MODE_COLUMNS: dict[str, tuple[Column, ...]] = {
    SEGMENT: (
        Column("low-water", "low-water", lambda st: fmt_int(st.low_water)),
        Column("reserve", "reserve text", _reserve),
        Column("step", "step", lambda st: fmt_int(st.step)),
        Column("max_id", "max-id", lambda st: fmt_int(st.max_id)),
    ),
    SNOWFLAKE: (
        Column("worker IDs", "workers text",
               lambda st: ", ".join(esc(w) for w in st.worker_ids) or "-"),
        Column("lease", "lease text", lambda st: esc(st.lease_state or "-")),
        Column("last clock backwards", "backwards text", _backwards),
    ),
}
TAIL = (
    Column("pops/s", "rate", lambda st: f"{st.rate:,.1f}"),
    Column("held at peak", "held",
           lambda st: f"{esc(held(st))}<br>{meta(f'list+reserve at {st.peak_rate:,.1f}/s')}"),
    Column("time left", "left", lambda st: esc(fmt_duration(st.seconds_left))),
    Column("last refill", "last-refill text",
           lambda st: f"{when(st.last_refill_ms)}<br>{meta(esc(st.last_refill_result))}"),
    Column("last error", "err", _last_error),
    Column("dry / empty hits", "empty-hits", _empty),
    Column("gaps", "gaps", lambda st: fmt_int(st.gaps)),
)


def _row_class(st: TagStatus) -> str:
    if st.dry_since_ms is not None:
        return "dry"
    if st.length == 0:
        return "empty"
    if st.low_water and st.length < st.low_water:
        return "low"
    return "ok"


def pools_table(mode: str, statuses: Sequence[TagStatus]) -> str:
    """The table of ``mode``'s tags (``id`` and every row's ``data-mode``: the mode)."""
    columns = (*LEAD, *MODE_COLUMNS[mode], *TAIL)
    rows = [f'<tr data-tag="{esc(st.tag)}" data-mode="{mode}" class="{_row_class(st)}">'
            + "".join(f'<td class="{c.css}">{c.cell(st)}</td>' for c in columns) + "</tr>"
            for st in statuses]
    return table(mode, [c.head for c in columns], rows)


def _refresh(request: Request) -> int:
    raw = request.query_params.get("refresh")
    if raw is None:
        return DEFAULT_REFRESH_SECONDS
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 4 or int(raw) > 3600:  # not "²"
        raise InvalidArgument("refresh", raw, "seconds from 0 (off) to 3600")
    return int(raw)


async def cache_page(request: Request) -> Response:
    """The pools at a glance (Leaf's /cache, and what it lacks)."""
    svc = service(request)
    try:
        refresh = _refresh(request)
    except InvalidInput as exc:
        return text_error(as_http_error(exc, svc.retry_after))
    now = datetime.now().strftime("%Y-%m-%d %H:%M:%S")
    if refresh:
        head = (f'<p class="meta">{esc(now)} · refreshes every {refresh}s '
                f'(<a href="?refresh=0">stop</a>) · prefix {esc(svc.settings.key_prefix)}</p>')
    else:
        head = f'<p class="meta">{esc(now)} · <a href="?refresh=5">auto-refresh</a></p>'
    try:
        statuses = await svc.statuses()
    except LeafpoolError as exc:
        body = f'{head}<p class="banner" id="error">Redis unreachable: {esc(exc)}</p>'
        return HTMLResponse(page("leafpool pools", body, refresh), 503, headers=NO_STORE)
    by_mode = {SEGMENT: [st for st in statuses if st.mode != SNOWFLAKE],
               SNOWFLAKE: [st for st in statuses if st.mode == SNOWFLAKE]}
    body = head + "".join(f'<p class="banner notice">{esc(line)}</p>'
                          for line in notices(statuses))
    body += (f'<p id="summary">{len(statuses)} tags: {len(by_mode[SEGMENT])} segment, '
             f'{len(by_mode[SNOWFLAKE])} snowflake</p>')
    for mode, tags in by_mode.items():
        body += (f"<h2>{mode.capitalize()} tags</h2>"
                 + (pools_table(mode, tags) if tags else "<p>none</p>"))
    return HTMLResponse(page("leafpool pools", body, refresh), headers=NO_STORE)


# -- /db -----------------------------------------------------------------------------------

def leaf_alloc_rows(svc: Service) -> list[dict[str, object]]:
    """``leaf_alloc`` as JSON-ready rows (max_id as a string; run in a worker thread). A
    database without the table is the operator's fault: :class:`ConfigurationError`
    naming ``LEAFPOOL_DATABASE_URL``."""
    store = svc.runtime.store
    try:
        rows = store.leaf_alloc_rows()
    except BackendUnavailable as exc:
        if store.leaf_alloc_missing():
            raise ConfigurationError(
                DATABASE_URL_ENV, hide_password(svc.settings.database_url),
                "a database holding the leaf_alloc table; this one has none: run "
                "`leafpool db init` against it, or point the URL at the right database",
            ) from exc
        raise
    return [{"biz_tag": row.tag, "max_id": str(row.max_id), "step": row.step,
             "description": row.description,
             "update_time": updated.isoformat(sep=" ") if updated else None}
            for row, updated in rows]


async def db_page(request: Request) -> Response:
    """``leaf_alloc`` as Leaf's /db shows it; ``?format=json`` for scripts."""
    svc = service(request)
    as_json = request.query_params.get("format") == "json"
    try:
        rows = await run_in_threadpool(leaf_alloc_rows, svc)
    except LeafpoolError as exc:
        err = as_http_error(exc, svc.retry_after)
        if as_json:
            return json_error(err)
        body = f'<p class="banner" id="error">{esc(err.message)}</p>'
        return HTMLResponse(page("leaf_alloc", body), err.status, headers=err.headers)
    if as_json:
        return JSONResponse({"rows": rows}, headers=NO_STORE)
    cells = (("biz_tag", "tag"), ("max_id", "max-id"), ("step", "step"),
             ("description", "text"), ("update_time", "text"))
    body_rows = [f'<tr data-tag="{esc(r["biz_tag"])}">'
                 + "".join(f'<td class="{css}">{esc("" if r[key] is None else r[key])}</td>'
                           for key, css in cells)
                 + "</tr>" for r in rows]
    body = table("leaf_alloc", ["tag", "max_id", "step", "description", "update"], body_rows)
    return HTMLResponse(page("leaf_alloc", body), headers=NO_STORE)


async def index(request: Request) -> Response:
    body = ("<ul><li><a href=\"/cache\">/cache</a>: pools</li>"
            "<li><a href=\"/db\">/db</a>: leaf_alloc</li>"
            "<li>/api/segment/get/{tag}, /api/snowflake/get/{tag} [?count=N]</li>"
            "<li>/api/segment/ids/{tag}?count=N (JSON, IDs as strings)</li>"
            "<li>/decodeSnowflakeId?snowflakeId=N, /api/snowflake/decode/{id}</li></ul>")
    return HTMLResponse(page("leafpool", body))


def routes() -> Iterator[Route]:
    yield Route("/cache", cache_page)
    yield Route("/db", db_page)
    yield Route("/", index)

