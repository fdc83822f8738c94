"""The lean path of the hot request: ``GET`` (or ``POST``) ``/api/{mode}/get/{tag}`` without
a query string, answered in front of Starlette (the app's ``__call__`` asks
:meth:`FastIds.match` first: no middleware stack, no router) with the same bytes the
route answers: the bare ID as ``text/plain``, ``Cache-Control:
no-store``, and for an error the very response the route builds
(:meth:`IdEndpoints.error_response`). Everything else (a query string, a token policy,
another path or method, a path the route would refuse) goes on to Starlette unchanged.

Why: a single-ID request does one small pop; Starlette's router, its request object and
its response class cost more than the pop itself, and its middleware stack (the error
middleware wraps every ``send``) a tenth of the request again (docs/design.md §1.1). An
exception other than leafpool's reaches the server, which answers 500 as Starlette's
error middleware would."""

from __future__ import annotations

from time import perf_counter
from typing import TYPE_CHECKING

from starlette.types import Receive, Scope, Send

from leafpool.core.errors import LeafpoolError
from leafpool.http.disconnect import client_gone
from leafpool.http.errors import HttpError
from leafpool.http.service import MODES

if TYPE_CHECKING:
    from leafpool.http.ids import IdEndpoints

_PREFIXES = {f"/api/{mode}/get/": mode for mode in MODES}
_PREFIX_LEN = {mode: len(p) for p, mode in _PREFIXES.items()}
_TEXT = b"text/plain; charset=utf-8"
_GET = {mode: f"/api/{mode}/get" for mode in MODES}  # the metrics' endpoint label
#: the ``http.response.start`` message by the body's length, built once (a server reads a
#: message, it does not change it: uvicorn and granian copy the headers out)
_STARTS: dict[int, dict[str, object]] = {}


class FastIds:
    """The single-ID text endpoints without Starlette: :meth:`match` says whether a
    request is one of them, :meth:`answer` answers it."""

    def __init__(self, endpoints: IdEndpoints) -> None:
        self.endpoints = endpoints
        self.enabled = not endpoints.svc.auth.policy.enabled  # tokens: the full path
        self._observe = endpoints.svc.http.observe

    def match(self, scope: Scope) -> tuple[str, str] | None:
        """(mode, tag) when the request is one this path answers."""
        if (
            scope["type"] != "http"
            or scope["query_string"]
            or not self.enabled
            or scope["method"] not in ("GET", "POST")
            or scope.get("root_path")
        ):
            return None
        path: str = scope["path"]
        if not path.startswith("/api/"):
            return None
        slash = path.find("/get/", 5)
        mode = _PREFIXES.get(path[: slash + 5]) if slash > 0 else None
        if mode is None:
            return None
        tag = path[_PREFIX_LEN[mode] :]
        if not tag or "/" in tag:  # the route's 400 (empty tag) or 404 (no such path)
            return None
        return mode, tag

    async def answer(self, mode: str, tag: str, scope: Scope, receive: Receive,
                     send: Send) -> None:
        """Answer the request :meth:`match` matched as ``(mode, tag)``."""
        started = perf_counter()
        endpoints = self.endpoints
        try:
            endpoints.check_tag(tag)
            value = await endpoints.take_one(tag, mode)
        except (HttpError, LeafpoolError) as exc:
            response = endpoints.error_response(exc, as_json=False)
            await response(scope, receive, send)
            endpoints.observe(mode, False, response.status_code, started)
            return
        if client_gone(receive):  # the ID would be lost in a send the server drops
            endpoints.gone(tag, 1, mode, False, started)
            return
        body = str(value).encode()
        start = _STARTS.get(len(body))
        if start is None:
            start = _STARTS[len(body)] = _start(len(body))
        await send(start)
        await send({"type": "http.response.body", "body": body})
        self._observe(_GET[mode], 200, perf_counter() - started)


def _start(length: int) -> dict[str, object]:
    """The ``http.response.start`` message of an ID of ``length`` digits."""
    return {"type": "http.response.start", "status": 200,
            "headers": [(b"cache-control", b"no-store"),
                        (b"content-length", str(length).encode()),
                        (b"content-type", _TEXT)]}
