"""The lean path (leafpool/http/fast.py) against a real Redis: it answers the bare
single-ID request with the very bytes Starlette's route answers (status, every header,
body), for an ID and for each error; and it takes only the requests it can answer so,
leaving every other one to the router."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import httpx
import pytest
import redis
from starlette.testclient import TestClient

from leafpool.core.config import Settings
from leafpool.http import create_app
from leafpool.http.app import ServiceApp
from tests.support.http_helpers import LEAF_ID, fill


def _router_only(app: ServiceApp) -> ServiceApp:
    app.lean = None  # the app as before the lean path
    return app


@pytest.fixture
def clients(make_settings: Callable[..., Settings]) -> Iterator[tuple[TestClient, TestClient]]:
    settings = make_settings(empty_wait_seconds=0.05)
    with (
        TestClient(create_app(settings)) as lean,
        TestClient(_router_only(create_app(settings))) as router,
    ):
        yield lean, router


def _same(a: httpx.Response, b: httpx.Response) -> None:
    assert a.status_code == b.status_code
    drop = {"date"}  # the server's clock
    assert [(k, v) for k, v in a.headers.multi_items() if k not in drop] == [
        (k, v) for k, v in b.headers.multi_items() if k not in drop
    ]


@pytest.mark.parametrize(
    "path",
    [
        "/api/segment/get/order",
        "/api/snowflake/get/sf",
        "/api/segment/get/nope",  # unknown tag: 404
        "/api/segment/get/sf",  # the other mode's tag: 404 naming the right endpoint
        "/api/snowflake/get/order",
        "/api/segment/get/bad%20tag",  # 400 naming the field
        "/api/segment/get/" + "x" * 129,
        "/api/segment/get/empty",  # 503 with Retry-After once the wait is over
    ],
)
def test_the_lean_path_answers_what_the_route_answers(
    clients: tuple[TestClient, TestClient], r: redis.Redis, path: str
) -> None:
    lean, router = clients
    fill(r, "order", [1, 2])
    fill(r, "sf", [LEAF_ID, LEAF_ID + 1], mode="snowflake")
    fill(r, "empty", [])
    a, b = lean.get(path), router.get(path)
    _same(a, b)
    if a.status_code == 200:
        assert int(b.text) == int(a.text) + 1  # each took the next ID of the pool
    else:
        assert a.text == b.text
    post_a, post_b = lean.post(path), router.post(path)  # Leaf maps every method
    _same(post_a, post_b)


def test_only_the_bare_single_id_request_takes_the_lean_path(
    make_settings: Callable[..., Settings],
) -> None:
    svc_app = create_app(make_settings())
    fast = svc_app.lean
    assert fast is not None

    def scope(path: str, method: str = "GET", query: bytes = b"", **extra: object) -> dict:
        return {"type": "http", "path": path, "method": method, "query_string": query, **extra}

    assert fast.match(scope("/api/segment/get/order")) == ("segment", "order")
    assert fast.match(scope("/api/snowflake/get/sf", "POST")) == ("snowflake", "sf")
    assert fast.match(scope("/api/segment/get/a b")) == ("segment", "a b")  # its 400
    for left in (
        scope("/api/segment/get/order", query=b"count=3"),  # ?count=: the route
        scope("/api/segment/get/order", "HEAD"),  # 405, takes nothing
        scope("/api/segment/get/"),  # empty tag: the route's 400
        scope("/api/segment/get"),
        scope("/api/segment/get/order/"),  # the router's redirect
        scope("/api/segment/get/a/b"),  # no such route: 404
        scope("/api/segment/ids/order"),  # JSON
        scope("/api/other/get/order"),
        scope("/cache"),
        scope("/api/segment/get/order", root_path="/ids"),
        {"type": "lifespan"},
    ):
        assert fast.match(left) is None, left


def test_with_tokens_every_request_takes_the_route(
    make_settings: Callable[..., Settings], r: redis.Redis
) -> None:
    app = create_app(make_settings(http_tokens="tok=order"))
    fast = app.lean
    assert fast is not None
    assert (
        fast.match(
            {"type": "http", "path": "/api/segment/get/order", "method": "GET", "query_string": b""}
        )
        is None
    )
    fill(r, "order", [1])
    with TestClient(app) as c:
        assert c.get("/api/segment/get/order").status_code == 401
        ok = c.get("/api/segment/get/order", headers={"X-Leafpool-Token": "tok"})
        assert (ok.status_code, ok.text) == (200, "1")
