"""The Leaf-compatible ID endpoints (leafpool/http/ids.py) against a real Redis: the bare
ID and batches as text, JSON IDs as strings, the mode check and its cache, the status
codes of unknown tags, bad input and an empty pool, and a request waiting for a refill."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import redis
from starlette.testclient import TestClient

from leafpool.core.config import Settings
from leafpool.http import create_app
from leafpool.http.ids import ModeCache
from leafpool.redis.connect import connect_async
from leafpool.redis.pool import Pool
from leafpool.redis.pool_async import AsyncPool
from tests.support.http_helpers import LEAF_ID, fill, llen


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings(empty_wait_seconds=0.3, http_max_count=50)


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as c:
        yield c


def test_segment_get_returns_the_bare_id_as_text(client: TestClient, r: redis.Redis) -> None:
    fill(r, "order", list(range(1, 11)))
    first = client.get("/api/segment/get/order")
    assert first.status_code == 200
    assert first.text == "1"
    assert first.headers["content-type"].startswith("text/plain")
    assert first.headers["cache-control"] == "no-store"  # a cached ID is a duplicate
    assert client.get("/api/segment/get/order").text == "2"
    assert client.post("/api/segment/get/order").text == "3"  # Leaf maps every method
    assert llen(r, "order") == 7


def test_batch_is_one_id_per_line_in_order(client: TestClient, r: redis.Redis) -> None:
    fill(r, "order", list(range(1, 101)))
    resp = client.get("/api/segment/get/order", params={"count": "5"})
    assert resp.status_code == 200
    assert resp.text == "1\n2\n3\n4\n5\n"
    resp = client.get("/api/segment/get/order", params={"count": "50"})  # the cap itself
    assert resp.text.splitlines() == [str(i) for i in range(6, 56)]


def test_json_ids_are_strings_exact_past_2_53(client: TestClient, r: redis.Redis) -> None:
    big = [2**53 - 1, 2**53, 2**53 + 1, 2**63 - 1]
    fill(r, "order", big)
    resp = client.get("/api/segment/ids/order", params={"count": "4"})
    assert resp.status_code == 200
    body = json.loads(resp.text)
    assert body == {"tag": "order", "mode": "segment", "ids": [str(i) for i in big]}
    assert all(isinstance(i, str) for i in body["ids"])
    fill(r, "order", [7])
    assert client.get("/api/segment/ids/order").json()["ids"] == ["7"]  # count defaults to 1


def test_snowflake_endpoints_serve_snowflake_tags_only(
    client: TestClient, r: redis.Redis
) -> None:
    fill(r, "sf", [LEAF_ID, LEAF_ID + 1], mode="snowflake")
    fill(r, "order", [1, 2])
    assert client.get("/api/snowflake/get/sf").text == str(LEAF_ID)
    assert client.get("/api/snowflake/ids/sf").json()["ids"] == [str(LEAF_ID + 1)]
    wrong = client.get("/api/segment/get/sf")
    assert wrong.status_code == 404
    assert "snowflake tag" in wrong.text and "/api/snowflake/get/sf" in wrong.text
    wrong = client.get("/api/snowflake/ids/order")
    assert wrong.status_code == 404
    assert wrong.json()["error"] == "wrong_mode"
    assert llen(r, "order") == 2  # nothing taken from the other mode's pool


def test_unknown_tag_is_404_never_a_sentinel(client: TestClient) -> None:
    for path in ("/api/segment/get/nope", "/api/snowflake/get/nope"):
        resp = client.get(path)
        assert resp.status_code == 404
        assert "nope: unknown tag" in resp.text
        assert not resp.text.strip().lstrip("-").isdigit()
    resp = client.get("/api/segment/ids/nope", params={"count": "3"})
    assert resp.status_code == 404
    assert resp.json() == {"error": "unknown_tag", "message": "nope: unknown tag", "tag": "nope"}


@pytest.mark.parametrize(
    ("path", "params", "field", "allowed"),
    [
        ("/api/segment/get/bad%20tag", {}, "tag", "allowed characters are A-Z a-z 0-9 _ . -"),
        ("/api/segment/get/bad%7Btag", {}, "tag", "allowed characters"),
        ("/api/segment/get/" + "x" * 129, {}, "tag", "at most 128"),
        ("/api/segment/get/", {}, "tag", "must not be empty"),
        ("/api/segment/get", {}, "tag", "must not be empty"),
        ("/api/segment/get/order", {"count": "0"}, "count", "from 1 to 50"),
        ("/api/segment/get/order", {"count": "51"}, "count", "LEAFPOOL_HTTP_MAX_COUNT"),
        ("/api/segment/get/order", {"count": "-1"}, "count", "from 1 to 50"),
        ("/api/segment/get/order", {"count": "ten"}, "count", "an integer"),
        ("/api/segment/get/order", {"count": "1e3"}, "count", "an integer"),
        ("/api/segment/get/order", {"count": ""}, "count", "an integer"),
        ("/api/snowflake/get/a:b", {}, "tag", "allowed characters"),
    ],
)
def test_bad_input_is_400_naming_the_field_and_takes_nothing(
    client: TestClient, r: redis.Redis, path: str, params: dict[str, str], field: str,
    allowed: str,
) -> None:
    fill(r, "order", list(range(1, 11)))
    resp = client.get(path, params=params)
    assert resp.status_code == 400, resp.text
    assert resp.text.startswith(f"{field}="), resp.text
    assert allowed in resp.text
    assert llen(r, "order") == 10
    json_path = path.replace("/get", "/ids")
    if json_path.endswith("/ids"):
        json_path += "/"
    body = client.get(json_path, params=params).json()
    assert body["error"] == "invalid_input" and body["field"] == field
    assert allowed in body["allowed"]
    assert llen(r, "order") == 10


def test_head_does_not_consume_an_id(client: TestClient, r: redis.Redis) -> None:
    fill(r, "order", [1, 2, 3])
    resp = client.head("/api/segment/get/order")
    assert resp.status_code == 405
    assert llen(r, "order") == 3


def test_empty_pool_is_503_with_retry_after_after_the_bounded_wait(
    client: TestClient, r: redis.Redis, settings: Settings
) -> None:
    fill(r, "order", [])
    started = time.monotonic()
    resp = client.get("/api/segment/get/order")
    waited = time.monotonic() - started
    assert resp.status_code == 503
    assert int(resp.headers["retry-after"]) >= 1
    assert "order: pool empty after waiting 0.300s" in resp.text
    assert waited >= settings.empty_wait_seconds
    assert r.hget("leafpool:{order}:hits", "empty_hits") == b"1"
    assert r.sismember("leafpool:wanted", "order")  # the sweep is asked for a refill
    body = client.get("/api/segment/ids/order", params={"count": "2"}).json()
    assert body["error"] == "pool_empty"


def test_a_waiting_request_gets_the_id_a_refill_pushes(
    make_settings: Callable[..., Settings], r: redis.Redis
) -> None:
    fill(r, "order", [])
    app = create_app(make_settings(empty_wait_seconds=10))

    def refill_when_blocked() -> None:
        # bounded polling: push only once the request is blocked in BLPOP, the state
        # this test is about (nothing else tells us when the handler got there)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if any(c.get("cmd") == "blpop" for c in r.client_list()):
                r.rpush("leafpool:{order}:ids", "41", "42")
                return
            time.sleep(0.01)

    pusher = threading.Thread(target=refill_when_blocked)
    with TestClient(app) as c:
        pusher.start()
        started = time.monotonic()
        resp = c.get("/api/segment/get/order", params={"count": "2"})
        pusher.join()
    assert resp.status_code == 200
    assert resp.text == "41\n42\n"
    assert time.monotonic() - started < 10


def test_the_mode_cache_reads_a_tag_once_per_interval(redis_url: str, r: redis.Redis) -> None:
    """A tag's mode is read from Redis at most once per interval; an unknown tag is not
    remembered, so a tag registered meanwhile is served at once (fake monotonic clock)."""
    now = [100.0]

    async def scenario() -> None:
        conn = connect_async(redis_url)
        try:
            cache = ModeCache(AsyncPool(conn, "leafpool").mode, seconds=5.0,
                              monotonic=lambda: now[0])
            assert await cache.get("order") is None
            Pool(r, "leafpool").register("order", "segment", 0)
            assert await cache.get("order") == "segment"
            r.hset("leafpool:{order}:state", "mode", "snowflake")
            now[0] = 104.9
            assert await cache.get("order") == "segment"  # within the interval: cached
            now[0] = 105.0
            assert await cache.get("order") == "snowflake"
            r.delete("leafpool:{order}:state")
            now[0] = 110.0
            assert await cache.get("order") is None
        finally:
            await conn.aclose()

    asyncio.run(scenario())


def test_concurrent_requests_share_one_read_of_an_expired_mode(redis_url: str,
                                                               r: redis.Redis) -> None:
    """Requests that find a tag's mode expired while its read is under way wait for that
    read instead of each sending an HGET (a herd of one read per connection every
    interval); the reads are counted by Redis itself (INFO commandstats)."""
    Pool(r, "leafpool").register("order", "segment", 0)

    def hgets() -> int:
        stats = r.info("commandstats").get("cmdstat_hget", {})
        return int(stats.get("calls", 0))

    async def scenario() -> list[str | None]:
        conn = connect_async(redis_url)
        try:
            cache = ModeCache(AsyncPool(conn, "leafpool").mode, seconds=5.0)
            return await asyncio.gather(*(cache.get("order") for _ in range(50)))
        finally:
            await conn.aclose()

    r.config_resetstat()
    assert asyncio.run(scenario()) == ["segment"] * 50
    assert hgets() == 1


def test_the_coalesced_pops_in_flight_follow_the_setting(
        make_settings: Callable[..., Settings]) -> None:
    from leafpool.http.service import Service

    for in_flight in (1, 4):
        service = Service(make_settings(http_coalesce_in_flight=in_flight))
        coalescer = service.client._coalescer
        assert coalescer is not None and coalescer.in_flight == in_flight
