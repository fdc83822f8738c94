"""The Leaf-compatible ID endpoints (single-ID requests share pops, docs/design.md §1.1;
the bare single-ID request takes the lean path, :mod:`leafpool.http.fast`):

- ``GET /api/segment/get/{tag}``, ``GET /api/snowflake/get/{tag}``: the bare ID as
  ``text/plain``, as Leaf's server answers, so a Leaf client switches by host name.
  ``?count=N`` (1 to ``LEAFPOOL_HTTP_MAX_COUNT``) returns N IDs, one per line.
- ``GET /api/segment/ids/{tag}?count=N`` (and ``/api/snowflake/ids/{tag}``): JSON
  ``{"tag", "mode", "ids": ["..."]}`` with the IDs as **strings**: a 64-bit ID does not
  survive a JavaScript number (exact only to 2**53).

An empty pool is waited for up to ``LEAFPOOL_EMPTY_WAIT_SECONDS`` (the client's ``wait``
policy). A tag's mode is read through :class:`ModeCache`, so a tag of the other mode is a
404 naming the right endpoint. Responses carry ``Cache-Control: no-store``."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable, Iterator

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from leafpool.core.errors import InvalidArgument, LeafpoolError, UnknownTag
from leafpool.core.tags import validate_tag
from leafpool.http.disconnect import client_gone
from leafpool.http.errors import NO_STORE, HttpError, http_error, json_error, text_error
from leafpool.http.service import MODES, Service

MODE_CACHE_SECONDS = 5.0  # a tag's mode is read from Redis at most this often
_COUNT_RE = re.compile(r"[0-9]{1,9}")
#: the status a request whose client left after its pop is counted with (nginx's "client
#: closed request"); nothing is sent
CLIENT_GONE = 499

Handler = Callable[[Request], Awaitable[Response]]
#: the metrics' endpoint label of each ID handler: (mode, JSON) -> /api/{mode}/get or /ids
_ENDPOINTS = {(mode, as_json): f"/api/{mode}/{'ids' if as_json else 'get'}"
              for mode in MODES for as_json in (False, True)}


class ModeCache:
    """Each tag's mode, read (by ``read``) at most once per ``seconds``; an unknown tag
    is not remembered, so a tag registered meanwhile is served at once. Requests that
    find the entry expired while its read is under way share that read (one ``HGET``
    per tag, not one per concurrent request)."""

    def __init__(self, read: Callable[[str], Awaitable[str | None]],
                 seconds: float = MODE_CACHE_SECONDS,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._read = read
        self.seconds = seconds
        self._monotonic = monotonic
        self._modes: dict[str, tuple[str, float]] = {}
        self._reading: dict[str, asyncio.Future[str | None]] = {}

    def fresh(self, tag: str) -> str | None:
        """The tag's mode when a read of it is recent enough, without waiting."""
        cached = self._modes.get(tag)
        if cached is not None and cached[1] > self._monotonic():
            return cached[0]
        return None

    async def get(self, tag: str) -> str | None:
        mode = self.fresh(tag)
        if mode is not None:
            return mode
        reading = self._reading.get(tag)
        if reading is not None:  # shield: a cancelled waiter must not cancel the others' read
            return await asyncio.shield(reading)
        now = self._monotonic()
        reading = self._reading[tag] = asyncio.ensure_future(self._read(tag))
        # its error is retrieved even when every waiter was cancelled meanwhile
        reading.add_done_callback(lambda f: f.cancelled() or f.exception())
        try:
            mode = await asyncio.shield(reading)
        finally:
            if self._reading.get(tag) is reading:
                del self._reading[tag]
        if mode is None:
            self._modes.pop(tag, None)
        else:
            self._modes[tag] = (mode, now + self.seconds)
        return mode


def parse_count(request: Request, max_count: int) -> int | None:
    """``?count=``: None when absent, else 1 to ``max_count`` (else 400 naming it)."""
    raw = request.query_params.get("count")
    if raw is None:
        return None
    allowed = f"an integer from 1 to {max_count} (LEAFPOOL_HTTP_MAX_COUNT)"
    if not _COUNT_RE.fullmatch(raw) or not 1 <= int(raw) <= max_count:
        raise InvalidArgument("count", raw, allowed)
    return int(raw)


class IdEndpoints:
    """The ID handlers of one app, sharing its mode cache (and the lean path in front of
    them, :class:`~leafpool.http.fast.FastIds`)."""

    def __init__(self, svc: Service) -> None:
        self.svc = svc
        self.modes = ModeCache(lambda tag: svc.pool.mode(tag))
        self._valid: set[str] = set()  # tags validated once (the client keeps the same)

    def check_tag(self, tag: str) -> None:
        """400 (InvalidTag) unless ``tag`` is a valid name; remembered once valid."""
        if tag not in self._valid:
            validate_tag(tag)
            self._valid.add(tag)

    async def take(self, tag: str, want_mode: str, count: int) -> list[int]:
        """``count`` IDs of ``tag`` (policy ``wait``), checking the tag's mode."""
        if count == 1:
            return [await self.take_one(tag, want_mode)]
        await self._check_mode(tag, want_mode)
        return await self.svc.client.next_ids(tag, count)

    def take_one(self, tag: str, want_mode: str) -> Awaitable[int]:
        """One ID, its pop shared with concurrent requests of the tag (docs/design.md
        §1.1). The client's coroutine itself when the cached mode answers (one frame
        fewer to pass through at each wake-up of the request)."""
        if self.modes.fresh(tag) == want_mode:
            return self.svc.client.next_id_coalesced(tag)
        return self._take_one(tag, want_mode)

    async def _take_one(self, tag: str, want_mode: str) -> int:
        await self._check_mode(tag, want_mode)
        return await self.svc.client.next_id_coalesced(tag)

    async def _check_mode(self, tag: str, want_mode: str) -> None:
        mode = await self.modes.get(tag)
        if mode is None:
            raise UnknownTag(tag)
        if mode != want_mode:
            raise HttpError(404, "wrong_mode",
                            f"{tag}: a {mode} tag; ask /api/{mode}/get/{tag}", tag=tag, mode=mode)

    def error_response(self, exc: HttpError | LeafpoolError, as_json: bool) -> Response:
        err = http_error(exc, self.svc.retry_after)
        return json_error(err) if as_json else text_error(err)

    def gone(self, tag: str, ids: int, mode: str, as_json: bool, started: float) -> None:
        """The client left after its pop: its IDs are a gap, counted (and the request
        counted with status 499, nginx's "client closed request")."""
        self.svc.pool.count_gap(tag, ids)
        self.observe(mode, as_json, CLIENT_GONE, started)

    def observe(self, mode: str, as_json: bool, status: int, started: float) -> None:
        """Count the request and its latency."""
        self.svc.http.observe(_ENDPOINTS[mode, as_json], status, time.perf_counter() - started)

    def handler(self, mode: str, as_json: bool) -> Handler:
        async def handle(request: Request) -> Response:
            started = time.perf_counter()
            if request.method == "HEAD":  # a HEAD must not consume an ID
                response: Response = PlainTextResponse(
                    "use GET\n", 405, headers={"Allow": "GET, POST", **NO_STORE})
            else:
                response = await self.respond(request, mode, as_json)
            self.observe(mode, as_json, response.status_code, started)
            return response

        handle.__name__ = f"{mode}_{'ids' if as_json else 'get'}"
        return handle

    async def respond(self, request: Request, mode: str, as_json: bool) -> Response:
        svc = self.svc
        tag = request.path_params.get("tag", "")
        try:
            allowed = svc.auth.allowed_tags(request)
            self.check_tag(tag)
            svc.auth.authorize(tag, allowed)
            count = parse_count(request, svc.max_count)
            ids = await self.take(tag, mode, count or 1)
        except (HttpError, LeafpoolError) as exc:
            return self.error_response(exc, as_json)
        if client_gone(request.receive):
            self.svc.pool.count_gap(tag, len(ids))
            return Response(status_code=CLIENT_GONE)  # never sent: the server drops it
        if as_json:
            return JSONResponse({"tag": tag, "mode": mode, "ids": [str(i) for i in ids]},
                                headers=NO_STORE)
        if count is None:
            return PlainTextResponse(str(ids[0]), headers=NO_STORE)
        return PlainTextResponse("".join(f"{i}\n" for i in ids), headers=NO_STORE)


def routes(endpoints: IdEndpoints) -> Iterator[Route]:
    methods = ["GET", "POST"]  # Leaf maps every method
    for mode in MODES:
        get = endpoints.handler(mode, as_json=False)
        ids = endpoints.handler(mode, as_json=True)
        yield Route(f"/api/{mode}/get/{{tag}}", get, methods=methods)
        yield Route(f"/api/{mode}/get/", get, methods=methods)  # empty tag: 400, not 404
        yield Route(f"/api/{mode}/get", get, methods=methods)
        yield Route(f"/api/{mode}/ids/{{tag}}", ids, methods=methods)
        yield Route(f"/api/{mode}/ids/", ids, methods=methods)

