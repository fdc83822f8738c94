"""The HTTP service against a real Redis and real segment stores (SQLite and MariaDB):
every endpoint, the status codes of the expected failures, bad input, the batch cap,
token auth, Leaf's decode shape, health and metrics."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import tomllib
from collections.abc import Callable, Iterator

import pytest
import redis
from starlette.testclient import TestClient

import leafpool.http as http_service
from leafpool.config import Settings, parse_tokens
from leafpool.errors import ConfigurationError, InvalidArgument
from leafpool.http import as_http_error, create_app
from leafpool.pool import Pool
from leafpool.store import SegmentStore
from tests import services
from tests.services import free_port

# Leaf's own example (LeafMonitorController.decodeSnowflakeId's comment)
LEAF_EPOCH = 1288834974657
LEAF_TS, LEAF_WORKER, LEAF_SEQ = 1567733700834, 39, 3448
LEAF_ID = ((LEAF_TS - LEAF_EPOCH) << 22) | (LEAF_WORKER << 12) | LEAF_SEQ


def fill(r: redis.Redis, tag: str, ids: list[int], mode: str = "segment") -> None:
    Pool(r, "leafpool").register(tag, mode, 0)
    if ids:
        r.rpush(f"leafpool:{{{tag}}}:ids", *[str(i) for i in ids])


def llen(r: redis.Redis, tag: str) -> int:
    return int(r.llen(f"leafpool:{{{tag}}}:ids"))


@pytest.fixture
def settings(make_settings: Callable[..., Settings]) -> Settings:
    return make_settings(empty_wait_seconds=0.3, http_max_count=50)


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings)) as c:
        yield c


# -- IDs -----------------------------------------------------------------------------------

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
    assert r.hget("leafpool:{order}:state", "empty_hits") == b"1"
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


def test_redis_unreachable_is_503_everywhere_never_500(
    make_settings: Callable[..., Settings],
) -> None:
    dead = make_settings(redis_url=f"redis://127.0.0.1:{free_port()}/0")
    with TestClient(create_app(dead)) as c:
        resp = c.get("/api/segment/get/order")
        assert resp.status_code == 503
        assert resp.headers["retry-after"]
        assert resp.text.startswith("redis:")
        assert c.get("/api/segment/ids/order").json()["error"] == "backend_unavailable"
        health = c.get("/health")
        assert health.status_code == 503
        assert health.text.startswith("not ready: redis:")
        page = c.get("/cache")
        assert page.status_code == 503
        assert "Redis unreachable" in page.text
        assert c.get("/api/status").status_code == 503
        scrape = c.get("/metrics")
        assert scrape.status_code == 200
        assert "leafpool_up 0.0" in scrape.text


# -- decode ------------------------------------------------------------------------------

@pytest.fixture
def snowflake_module() -> object:
    return pytest.importorskip(
        "leafpool.snowflake", reason="leafpool.snowflake (the decoder) is not in this tree yet")


def test_leaf_decode_has_leafs_shape_and_values(
    client: TestClient, snowflake_module: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Leaf formats the date in the server's zone; its documented example ran at UTC+8
    monkeypatch.setenv("TZ", "CST-8")
    time.tzset()
    try:
        resp = client.get("/decodeSnowflakeId", params={"snowflakeId": str(LEAF_ID)})
    finally:
        monkeypatch.undo()
        time.tzset()
    assert resp.status_code == 200
    assert resp.json() == {
        "timestamp": "1567733700834(2019-09-06 09:35:00.834)",
        "sequenceId": "3448",
        "workerId": "39",
    }


def test_clean_decode_round_trips(client: TestClient, snowflake_module: object) -> None:
    resp = client.get(f"/api/snowflake/decode/{LEAF_ID}")
    assert resp.status_code == 200
    assert resp.json() == {
        "id": str(LEAF_ID), "timestamp_ms": LEAF_TS, "iso": "2019-09-06T01:35:00.834Z",
        "worker_id": LEAF_WORKER, "sequence": LEAF_SEQ, "epoch_ms": LEAF_EPOCH,
    }
    compose = snowflake_module.compose  # type: ignore[attr-defined]
    for ts, worker, seq in [(LEAF_EPOCH, 0, 0), (LEAF_TS, 1023, 4095), (LEAF_TS + 1, 7, 99)]:
        got = client.get(f"/api/snowflake/decode/{compose(ts, worker, seq)}").json()
        assert (got["timestamp_ms"], got["worker_id"], got["sequence"]) == (ts, worker, seq)


@pytest.mark.parametrize("bad", ["abc", "-5", str(2**63), "12.5", "0x10", " "])
def test_decode_refuses_bad_ids_with_400(
    client: TestClient, snowflake_module: object, bad: str
) -> None:
    leaf = client.get("/decodeSnowflakeId", params={"snowflakeId": bad})
    assert leaf.status_code == 400
    assert "errorMsg" in leaf.json()
    clean = client.get(f"/api/snowflake/decode/{bad}")
    assert clean.status_code == 400
    assert clean.json()["field"] == "id"


def test_leaf_decode_without_the_parameter_is_400(client: TestClient) -> None:
    resp = client.get("/decodeSnowflakeId")
    assert resp.status_code == 400
    assert resp.json() == {"errorMsg": "snowflakeId is required"}


# -- status, /cache, /db -------------------------------------------------------------------

def test_status_json_and_cache_page_show_every_tag_escaped(
    client: TestClient, r: redis.Redis
) -> None:
    fill(r, "order", list(range(1, 1235)))
    r.rpush("leafpool:{order}:reserve", "9223372036854770000:9223372036854775807")
    r.hset("leafpool:{order}:state", mapping={
        "target": 2000, "low_water": 1000, "step": 1000, "max_id": 2**63 - 1, "rate": 12.5,
        "empty_hits": 3, "last_error": "<script>alert(1)</script>", "last_error_ms": 1,
        "last_refill_ms": int(time.time() * 1000), "last_refill_result": "ok +1000"})
    fill(r, "sf", [LEAF_ID], mode="snowflake")
    r.hset("leafpool:{sf}:state", mapping={
        "worker_ids": "3,7", "lease_state": "held", "last_backwards_ms": 1,
        "last_backwards_offset_ms": 12, "backwards_events": 2})

    status = client.get("/api/status").json()
    by_tag = {t["tag"]: t for t in status["tags"]}
    assert by_tag["order"]["length"] == 1234 and by_tag["order"]["target"] == 2000
    assert by_tag["order"]["max_id"] == str(2**63 - 1)  # 64-bit values as strings
    assert by_tag["order"]["reserve"] == ["9223372036854770000:9223372036854775807"]
    assert by_tag["sf"]["snowflake"] == {
        "worker_ids": ["3", "7"], "lease_state": "held", "last_backwards_ms": 1,
        "last_backwards_offset_ms": 12, "backwards_events": 2}

    page = client.get("/cache")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    body = page.text
    assert '<meta http-equiv="refresh" content="5">' in body
    assert 'data-tag="order"' in body and 'data-tag="sf"' in body
    assert "<script>alert(1)</script>" not in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body
    for figure in ("1,234", "2,000", "9,223,372,036,854,775,807", "12.5", "ok +1000",
                   "3, 7", "held", "12 ms back"):
        assert figure in body, figure
    assert client.get("/cache", params={"refresh": "0"}).text.count('http-equiv="refresh"') == 0
    assert client.get("/cache", params={"refresh": "x"}).status_code == 400


def test_db_lists_leaf_alloc_escaped_on_both_stores(
    store: SegmentStore, make_settings: Callable[..., Settings], r: redis.Redis
) -> None:
    store.add_tag("order", step=1000, start=2**62, description="<b>orders</b>")
    store.add_tag("pay", step=50)
    url = store.engine.url.render_as_string(hide_password=False)
    with TestClient(create_app(make_settings(database_url=url))) as c:
        page = c.get("/db")
        assert page.status_code == 200
        assert "&lt;b&gt;orders&lt;/b&gt;" in page.text and "<b>orders" not in page.text
        assert 'data-tag="order"' in page.text and 'data-tag="pay"' in page.text
        rows = c.get("/db", params={"format": "json"}).json()["rows"]
    assert [(x["biz_tag"], x["max_id"], x["step"]) for x in rows] == [
        ("order", str(2**62), 1000), ("pay", "1", 50)]
    assert rows[0]["description"] == "<b>orders</b>" and rows[0]["update_time"]


def test_db_with_the_database_down_is_503(
    make_settings: Callable[..., Settings], r: redis.Redis
) -> None:
    url = f"mysql+pymysql://u:p@127.0.0.1:{free_port()}/leaf"
    with TestClient(create_app(make_settings(database_url=url))) as c:
        assert c.get("/db").status_code == 503
        body = c.get("/db", params={"format": "json"}).json()
    assert body["error"] == "backend_unavailable" and body["message"].startswith("database:")


# -- server faults are 5xx, the client's are 4xx --------------------------------------------

def test_a_misconfigured_server_answers_500_configuration_not_400(
    database_url: str, make_settings: Callable[..., Settings], r: redis.Redis,
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A database without leaf_alloc (wrong URL, or ``leafpool db init`` never run) is the
    operator's fault: 500 naming the variable, logged, no Retry-After (retrying is useless)."""
    # the log line is throttled per process: start this test with a fresh throttle
    monkeypatch.setattr(http_service, "_throttle", http_service._LogThrottle())
    with TestClient(create_app(make_settings(database_url=database_url))) as c:
        resp = c.get("/db", params={"format": "json"})
        page = c.get("/db")
    assert resp.status_code == 500
    body = resp.json()
    assert body["error"] == "configuration"
    assert body["field"] == "LEAFPOOL_DATABASE_URL"
    assert "leafpool db init" in body["message"] and "tell the operator" in body["message"]
    assert "retry-after" not in resp.headers
    assert page.status_code == 500 and "leafpool db init" in page.text
    assert any(rec.levelname == "ERROR" and "LEAFPOOL_DATABASE_URL" in rec.getMessage()
               for rec in caplog.records)


def test_configuration_faults_map_to_500_and_bad_input_to_400() -> None:
    fault = as_http_error(ConfigurationError("LEAFPOOL_SNOWFLAKE_EPOCH", 1, "in the past"), 1)
    assert (fault.status, fault.kind) == (500, "configuration")
    assert fault.extra["field"] == "LEAFPOOL_SNOWFLAKE_EPOCH"
    bad = as_http_error(InvalidArgument("count", "0", "1 to 50"), 1)
    assert (bad.status, bad.kind) == (400, "invalid_input")


# -- health --------------------------------------------------------------------------------

def test_health_is_ready_when_redis_and_the_database_answer(
    store: SegmentStore, make_settings: Callable[..., Settings], r: redis.Redis
) -> None:
    fill(r, "order", [1])
    url = store.engine.url.render_as_string(hide_password=False)
    with TestClient(create_app(make_settings(database_url=url))) as c:
        resp = c.get("/health")
    assert resp.status_code == 200
    assert resp.text == "ready\n"


def test_health_needs_the_database_only_when_a_segment_tag_exists(
    make_settings: Callable[..., Settings], r: redis.Redis
) -> None:
    url = f"mysql+pymysql://u:p@127.0.0.1:{free_port()}/leaf"
    with TestClient(create_app(make_settings(database_url=url))) as c:
        fill(r, "sf", [LEAF_ID], mode="snowflake")
        assert c.get("/health").status_code == 200
        fill(r, "order", [1])
        resp = c.get("/health")
    assert resp.status_code == 503
    assert resp.text.startswith("not ready: database:")


def test_health_is_503_when_redis_does_not_answer_in_time(
    make_settings: Callable[..., Settings],
) -> None:
    """A Redis that accepts connections but never answers (SIGSTOP) makes the check time
    out: 503 naming it, not a 500 from an uncaught timeout (Python 3.10's
    asyncio.TimeoutError was not the builtin TimeoutError the handler catches)."""
    server = services.redis_server()
    assert server.proc is not None
    try:
        settings = make_settings(redis_url=server.extra["url"])
        with TestClient(create_app(settings), raise_server_exceptions=False) as c:
            up = c.get("/health")
            assert (up.status_code, up.text) == (200, "ready\n")
            os.kill(server.proc.pid, signal.SIGSTOP)
            try:
                paused = c.get("/health")  # bounded by the check's own timeout
            finally:
                os.kill(server.proc.pid, signal.SIGCONT)
            assert paused.status_code == 503
            assert paused.text == (
                f"not ready: redis: no answer within {http_service.HEALTH_TIMEOUT_SECONDS}s\n")
            assert paused.headers["cache-control"] == "no-store"
            # Redis answers again: so must the check (a new connection, bounded polling)
            services.wait_until(lambda: c.get("/health").status_code == 200, 30,
                                "health after SIGCONT")
    finally:
        server.stop()


def test_declared_python_versions_are_the_tested_ones() -> None:
    """pyproject declares only what is tested: the oldest declared Python is the one the
    suite runs on (``./dev test`` and CI use Debian's python3, 3.11; PyPI has no
    interpreters), and ruff and mypy target it too."""
    project = tomllib.loads((services.ROOT / "pyproject.toml").read_text())
    declared = project["project"]["requires-python"]
    assert declared.startswith(">="), declared
    oldest = declared.removeprefix(">=")
    running = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert running == oldest, (
        f"the suite runs on Python {running} but pyproject allows >= {oldest}: test "
        f"{oldest} too, or declare >= {running}")
    assert project["tool"]["ruff"]["target-version"] == "py" + oldest.replace(".", "")
    assert project["tool"]["mypy"]["python_version"] == oldest


# -- metrics -------------------------------------------------------------------------------

def test_metrics_endpoint_serves_pool_and_request_metrics(
    client: TestClient, r: redis.Redis
) -> None:
    fill(r, "order", list(range(1, 11)))
    client.get("/api/segment/get/order")
    client.get("/api/segment/get/nope")
    resp = client.get("/metrics")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain; version=")
    text = resp.text
    assert 'leafpool_pool_ids{mode="segment",tag="order"} 9.0' in text
    assert "leafpool_up 1.0" in text
    assert 'leafpool_http_requests_total{code="200",endpoint="/api/segment/get"} 1.0' in text
    assert 'leafpool_http_requests_total{code="404",endpoint="/api/segment/get"} 1.0' in text


# -- token auth ----------------------------------------------------------------------------

@pytest.fixture
def secured(make_settings: Callable[..., Settings]) -> Iterator[TestClient]:
    settings = make_settings(http_tokens="tokenA-1234=order,pay; tokenB-5678=*",
                             empty_wait_seconds=0.1)
    with TestClient(create_app(settings)) as c:
        yield c


def test_tokens_gate_the_api(secured: TestClient, r: redis.Redis) -> None:
    fill(r, "order", list(range(1, 11)))
    fill(r, "other", list(range(1, 11)))
    missing = secured.get("/api/segment/get/order")
    assert missing.status_code == 401 and "token is required" in missing.text
    assert secured.get("/api/segment/get/order", params={"token": "nope"}).status_code == 401
    assert secured.get("/api/segment/get/order?token=tokenA-1234").text == "1"
    by_header = secured.get("/api/segment/get/order", headers={"X-Leafpool-Token": "tokenA-1234"})
    assert by_header.text == "2"
    denied = secured.get("/api/segment/get/other", params={"token": "tokenA-1234"})
    assert denied.status_code == 403 and "'other'" in denied.text
    assert llen(r, "other") == 10
    assert secured.get("/api/segment/get/other", params={"token": "tokenB-5678"}).text == "1"
    assert secured.get("/api/segment/ids/order").json()["error"] == "unauthorized"
    # status shows a restricted token only its tags
    tags = [t["tag"] for t in secured.get("/api/status?token=tokenA-1234").json()["tags"]]
    assert tags == ["order"]
    assert secured.get("/api/status").status_code == 401
    assert secured.get(f"/api/snowflake/decode/{LEAF_ID}").status_code == 401
    # the operator pages are not behind tokens (bind the service to an internal network)
    assert secured.get("/health").status_code == 200


@pytest.mark.parametrize(
    ("value", "complaint"),
    [
        ("secret-token", "entries look like"),
        ("=order", "entries look like"),
        ("secret-token=", "comma-separated list of tags"),
        ("secret-token=order,,pay", "comma-separated list of tags"),
        ("secret-token=bad tag", "allowed characters"),
        ("secret-token=a;secret-token=b", "each token may appear once"),
        ("secret token=a", "printable ASCII"),
    ],
)
def test_malformed_tokens_setting_names_the_variable_not_the_secret(
    value: str, complaint: str, make_settings: Callable[..., Settings]
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        parse_tokens(value)
    message = str(caught.value)
    assert "LEAFPOOL_HTTP_TOKENS" in message and complaint in message
    assert "secret-token" not in message and "secret token" not in message
    with pytest.raises(ConfigurationError):  # refused when the settings load
        make_settings(http_tokens=value)


def test_empty_tokens_setting_turns_auth_off() -> None:
    assert not parse_tokens("").enabled
    assert not parse_tokens(" ; ").enabled
    policy = parse_tokens("a=x,y;b=*")
    assert policy.lookup("a") == (True, frozenset({"x", "y"}))
    assert policy.lookup("b") == (True, None)
    assert policy.lookup("c")[0] is False
