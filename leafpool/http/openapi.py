"""The HTTP service's OpenAPI 3.1 description, served at ``GET /openapi.json``
(unauthenticated, like ``/health``) and kept as docs/reference/openapi.json.

It is built here, beside the handlers, from the code's own constants (a tag's rules, an
ID's range, the status view's fields, the error kinds: :mod:`~leafpool.http.openapi_schemas`)
and from the running server's settings: ``count``'s maximum is its
``LEAFPOOL_HTTP_MAX_COUNT``, and the ``/api/*`` operations require a token (and may answer
401 and 403) only when ``LEAFPOOL_HTTP_TOKENS`` is set. tests/http/test_openapi.py checks
that every route is described and every described path is a route; a schemathesis run
against a real ``leafpool serve`` checks the answers against it."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from leafpool.client import MAX_BATCH
from leafpool.core.config import Settings
from leafpool.core.version import __version__
from leafpool.http.auth import TOKEN_HEADER
from leafpool.http.openapi_schemas import Schema, count_schema, ref, schemas, snowflake_id_schema
from leafpool.http.ops import VERSION_HEADER
from leafpool.http.service import MODES, service

NO_STORE_HEADER: Schema = {"description": "no-store: a cached ID is a duplicate ID",
                           "required": True, "schema": {"const": "no-store"}}
RETRY_AFTER: Schema = {"description": "seconds to wait before retrying", "required": True,
                       "schema": {"type": "string", "pattern": "^[0-9]+$"}}
TEXT = "text/plain"
HTML = "text/html"
JSON = "application/json"
NOT_FOUND = "Not Found: no route for the path (a tag holding '/', or '.' and '..', which " \
            "clients resolve away)"
SECURITY: list[Schema] = [{"token": []}, {"tokenHeader": []}]


def _body(media: str, schema: Schema) -> Schema:
    return {media: {"schema": schema}}


def _response(description: str, content: Schema | None = None, **headers: Schema) -> Schema:
    out: Schema = {"description": description}
    if content:
        out["content"] = content
    if headers:
        out["headers"] = headers
    return out


def _text(description: str, **headers: Schema) -> Schema:
    return _response(description, _body(TEXT, {"type": "string"}), **headers)


def _errors(as_json: bool, tokens: bool, codes: str,
            not_found: tuple[str, ...] = ("UnknownTag", "WrongMode")) -> Schema:
    """The error responses of an ID or decode endpoint: ``codes`` of 400 401 403 404 500
    503 (401 and 403 only with tokens), as JSON bodies (``as_json``) or their message as
    text."""
    def body(*names: str) -> Schema:
        if not as_json:
            return _body(TEXT, {"type": "string"})
        return _body(JSON, ref(names[0]) if len(names) == 1 else
                     {"oneOf": [ref(n) for n in names]})

    store = {"Cache-Control": NO_STORE_HEADER}
    out: Schema = {}
    if "400" in codes:
        out["400"] = _response("bad input: the message names the field, the value and what "
                               "is allowed", body("InvalidInput"), **store)
    if tokens and "401" in codes:
        out["401"] = _response("no token, or an unknown one", body("AuthError"), **store)
    if tokens and "403" in codes:
        out["403"] = _response("the token may not take IDs of this tag", body("AuthError"),
                               **store)
    if "404" in codes:
        content = body(*not_found)
        content.setdefault(TEXT, {"schema": {"type": "string"}})  # Starlette's Not Found
        out["404"] = _response(f"an unknown tag, or a tag of the other mode; or {NOT_FOUND}",
                               content)
    if "500" in codes:
        out["500"] = _response("the server is misconfigured (the operator's fault, logged; "
                               "the message names the variable)", body("Configuration"),
                               **store)
    if "503" in codes:
        out["503"] = _response("the pool was still empty after LEAFPOOL_EMPTY_WAIT_SECONDS "
                               "(IDs a batch took before it ran dry are a gap), or Redis "
                               "did not answer", body("PoolEmpty", "Unavailable"),
                               **store, **{"Retry-After": RETRY_AFTER})
    return out


def _tag_param(mode: str) -> Schema:
    example = "order" if mode == "segment" else "orderno"
    return {"name": "tag", "in": "path", "required": True, "schema": ref("Tag"),
            "example": example}


def _count_param(max_count: int, what: str) -> Schema:
    return {"name": "count", "in": "query", "required": False,
            "schema": count_schema(max_count), "description": what}


def _head() -> Schema:
    allow = {"required": True, "schema": {"const": "GET, POST"}}
    refused = _response("use GET", _body(TEXT, {"const": "use GET\n"}), Allow=allow,
                        **{"Cache-Control": NO_STORE_HEADER})
    return {"summary": "refused: a HEAD must not consume an ID", "responses": {"405": refused}}


def _methods(operation: Schema, op_id: str, *, post: bool = True, head: bool = False,
             path_params: tuple[Schema, ...] = ()) -> Schema:
    """The path item: ``operation`` under GET (and POST: Leaf maps every method), and
    the HEAD refusal; ``path_params`` shared by them."""
    item: Schema = {"parameters": list(path_params)} if path_params else {}
    item["get"] = {**operation, "operationId": op_id}
    if post:
        item["post"] = {**operation, "operationId": f"{op_id}_post"}
    if head:
        item["head"] = {**_head(), "operationId": f"{op_id}_head"}
    return item


def _secured(operation: Schema, tokens: bool) -> Schema:
    return {**operation, "security": SECURITY} if tokens else operation


def id_paths(mode: str, max_count: int, tokens: bool) -> Iterator[tuple[str, Schema]]:
    """``/api/{mode}/get/{tag}``, ``/api/{mode}/ids/{tag}`` and their tagless forms."""
    store = {"Cache-Control": NO_STORE_HEADER}
    get = _secured({
        "tags": ["IDs"], "summary": f"IDs of a {mode} tag as text (Leaf's answer)",
        "description": "The bare ID as text/plain, as Leaf's server answers; with count, "
                       "count IDs, one per line. An empty pool is waited for up to "
                       "LEAFPOOL_EMPTY_WAIT_SECONDS; never a sentinel ID.",
        "parameters": [_count_param(max_count, "IDs, one per line")],
        "responses": {"200": _response("the ID, or count IDs one per line",
                                       _body(TEXT, ref("IdText")), **store),
                      **_errors(False, tokens, "400 401 403 404 500 503")},
    }, tokens)
    tag = (_tag_param(mode),)
    yield f"/api/{mode}/get/{{tag}}", _methods(get, f"{mode}_get", head=True, path_params=tag)
    tagless = _secured({
        "tags": ["IDs"], "summary": "no tag: 400 (the tag must not be empty)",
        "responses": _errors(False, tokens, "400 401"),
    }, tokens)
    yield f"/api/{mode}/get/", _methods(tagless, f"{mode}_get_slash", head=True)
    yield f"/api/{mode}/get", _methods(tagless, f"{mode}_get_bare", head=True)
    ids = _secured({
        "tags": ["IDs"], "summary": f"IDs of a {mode} tag as JSON (IDs as strings)",
        "description": "JSON with the IDs as strings: a 64-bit ID does not survive a "
                       "JavaScript number (exact only to 2**53). An empty pool is waited "
                       "for up to LEAFPOOL_EMPTY_WAIT_SECONDS.",
        "parameters": [_count_param(max_count, "how many IDs (default 1)")],
        "responses": {"200": _response("count IDs (one without count)", _body(JSON, ref("Ids")),
                                       **store),
                      **_errors(True, tokens, "400 401 403 404 500 503")},
    }, tokens)
    yield f"/api/{mode}/ids/{{tag}}", _methods(ids, f"{mode}_ids", head=True, path_params=tag)
    tagless_ids = _secured({
        "tags": ["IDs"], "summary": "no tag: 400 (the tag must not be empty)",
        "responses": _errors(True, tokens, "400 401"),
    }, tokens)
    yield f"/api/{mode}/ids/", _methods(tagless_ids, f"{mode}_ids_slash", head=True)


def decode_paths(tokens: bool) -> Iterator[tuple[str, Schema]]:
    decode = _secured({
        "tags": ["Decode"], "summary": "a snowflake ID's parts as JSON",
        "parameters": [{"name": "id", "in": "path", "required": True,
                        "schema": snowflake_id_schema()}],
        "responses": {"200": _response("the parts", _body(JSON, ref("Decoded"))),
                      **_errors(True, tokens, "400 401", not_found=())},
    }, tokens)
    yield "/api/snowflake/decode/{id}", _methods(decode, "snowflake_decode", post=False)
    leaf = {
        "tags": ["Decode"], "summary": "a snowflake ID's parts, Leaf's JSON (not token-protected)",
        "parameters": [{"name": "snowflakeId", "in": "query", "required": True,
                        "schema": snowflake_id_schema()}],
        "responses": {
            "200": _response("Leaf's keys and string values", _body(JSON, ref("LeafDecoded"))),
            "400": _response("no snowflakeId, or not one", _body(JSON, ref("LeafDecodeError"))),
        },
    }
    yield "/decodeSnowflakeId", _methods(leaf, "leaf_decode")


def operator_paths(tokens: bool) -> Iterator[tuple[str, Schema]]:
    html = _body(HTML, {"type": "string"})
    store = {"Cache-Control": NO_STORE_HEADER}
    status = _secured({
        "tags": ["Operators"], "summary": "every tag's status (a restricted token: its tags)",
        "responses": {"200": _response("the tags by name", _body(JSON, ref("Status")), **store),
                      **_errors(True, tokens, "401"),
                      "503": _response("Redis did not answer", _body(JSON, ref("Unavailable")),
                                       **store, **{"Retry-After": RETRY_AFTER})},
    }, tokens)
    yield "/api/status", _methods(status, "status", post=False)
    plain = {"tags": ["Operators"]}
    yield "/metrics", _methods({**plain, "summary": "Prometheus metrics (text format)",
                                "responses": {"200": _text("every family; leafpool_up 0 when "
                                                           "Redis does not answer")}},
                               "metrics", post=False)
    version = {VERSION_HEADER: {"description": "the release serving (leafpool --version)",
                                "schema": {"type": "string"}, "required": True}}
    yield "/health", _methods({**plain, "summary": "readiness, with the database",
                               "description": "Redis answers PING and, if a segment tag "
                                              "exists, the database answers SELECT 1.",
                               "responses": {"200": _text("ready", **version),
                                             "503": _text("not ready: <what failed>",
                                                          **version)}},
                              "health", post=False)
    yield "/healthz", _methods({**plain, "summary": "liveness: no backend is asked",
                                "responses": {"200": _text("alive")}}, "healthz", post=False)
    yield "/readyz", _methods({**plain, "summary": "readiness: settings loaded, Redis PONG "
                               "within 2 s (the database left out on purpose)",
                               "responses": {"200": _text("ready, and what was checked"),
                                             "503": _text("not ready: redis: <why> (passwords "
                                                          "masked)")}}, "readyz", post=False)
    refresh = {"name": "refresh", "in": "query", "required": False,
               "schema": {"type": "integer", "minimum": 0, "maximum": 3600, "default": 5},
               "description": "seconds between reloads; 0: off"}
    yield "/cache", _methods({**plain, "summary": "the pools as HTML", "parameters": [refresh],
                              "responses": {"200": _response("the page", html, **store),
                                            "400": _text("refresh outside 0 to 3600", **store),
                                            "503": _response("Redis unreachable (the page "
                                                             "says so)", html, **store)}},
                             "cache", post=False)
    fmt = {"name": "format", "in": "query", "required": False, "schema": {"type": "string"},
           "description": "json: the rows as JSON; anything else, or none: HTML"}
    both = {**_body(JSON, ref("LeafAlloc")), **html}
    yield "/db", _methods({**plain, "summary": "leaf_alloc (Leaf's /db)", "parameters": [fmt],
                           "responses": {
                               "200": _response("the rows", both),
                               "500": _response("no leaf_alloc table (the message names "
                                                "LEAFPOOL_DATABASE_URL)",
                                                {**_body(JSON, ref("Configuration")), **html}),
                               "503": _response("the database did not answer",
                                                {**_body(JSON, ref("Unavailable")), **html},
                                                **{"Retry-After": RETRY_AFTER})}},
                          "db", post=False)
    yield "/", _methods({**plain, "summary": "the index page",
                         "responses": {"200": _response("links", html)}}, "index", post=False)
    yield "/openapi.json", _methods({**plain, "summary": "this description",
                                     "responses": {"200": _response(
                                         "OpenAPI 3.1", _body(JSON, {"type": "object"}))}},
                                    "openapi", post=False)


@functools.cache
def describe(max_count: int, tokens: bool, version: str) -> str:
    """The description as JSON text, for a server whose ``count`` may be 1 to
    ``max_count`` and which requires a token on ``/api/*`` (``tokens``)."""
    paths: Schema = {}
    for mode in MODES:
        paths.update(id_paths(mode, max_count, tokens))
    paths.update(decode_paths(tokens))
    paths.update(operator_paths(tokens))
    document: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {
            "title": "leafpool HTTP service",
            "version": version,
            "summary": "Leaf-compatible IDs from pre-generated Redis pools",
            "description": "Error statuses: 400 bad input (the message names the field, "
                           "the value and what is allowed), 401/403 token refused, 404 "
                           "unknown tag or a tag of the other mode, 503 pool still empty "
                           "after the wait or a backend unreachable (with Retry-After), 500 "
                           "configuration. The operator pages are not token-protected: "
                           "bind the service to an internal network.",
            "license": {"name": "Apache-2.0", "identifier": "Apache-2.0"},
        },
        "tags": [{"name": "IDs"}, {"name": "Decode"}, {"name": "Operators"}],
        "paths": paths,
        "components": {
            "schemas": schemas(max_count),
            "securitySchemes": {
                "token": {"type": "apiKey", "in": "query", "name": "token",
                          "description": "LEAFPOOL_HTTP_TOKENS (when set: every /api/* "
                                         "request)"},
                "tokenHeader": {"type": "apiKey", "in": "header", "name": TOKEN_HEADER,
                                "description": "the same token, as a header"},
            },
        },
    }
    return json.dumps(document, indent=2) + "\n"


async def openapi_json(request: Request) -> Response:
    svc = service(request)
    text = describe(svc.max_count, svc.auth.policy.enabled, __version__)
    return Response(text, media_type=JSON)


def routes() -> Iterator[Route]:
    yield Route("/openapi.json", openapi_json)


#: the copy in the documentation: the default LEAFPOOL_HTTP_MAX_COUNT, tokens set
DOCS_MAX_COUNT = min(int(Settings.model_fields["http_max_count"].default), MAX_BATCH)


def docs_copy() -> str:
    """docs/reference/openapi.json's text."""
    return describe(DOCS_MAX_COUNT, True, __version__)
