"""The operators' endpoints (leafpool/http/ops.py) against a real Redis and real segment
stores: /api/status, /health (database checked only when a segment tag exists, a Redis
that stops answering), /metrics."""

from __future__ import annotations

import os
import signal
import sys
import tomllib
from collections.abc import Callable, Iterator

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

import leafpool
from leafpool.core.config import Settings
from leafpool.core.version import __version__
from leafpool.http import create_app
from leafpool.http.ops import HEALTH_TIMEOUT_SECONDS
from leafpool.segment.store import SegmentStore
from tests.support import services
from tests.support.http_helpers import LEAF_ID, fill, fill_status_example
from tests.support.services import free_port


@pytest.fixture
def client(make_settings: Callable[..., Settings]) -> Iterator[TestClient]:
    with TestClient(create_app(make_settings(empty_wait_seconds=0.3))) as c:
        yield c


# -- /api/status -----------------------------------------------------------------------------

def test_status_json_shows_every_tag_with_64_bit_values_as_strings(
    client: TestClient, r: redis.Redis
) -> None:
    fill_status_example(r)
    status = client.get("/api/status").json()
    by_tag = {t["tag"]: t for t in status["tags"]}
    assert by_tag["order"]["length"] == 1234 and by_tag["order"]["target"] == 2000
    assert by_tag["order"]["max_id"] == str(2**63 - 1)  # 64-bit values as strings
    assert by_tag["order"]["reserve"] == ["9223372036854770000:9223372036854775807"]
    assert by_tag["sf"]["snowflake"] == {
        "worker_ids": ["3", "7"], "lease_state": "held", "last_backwards_ms": 1,
        "last_backwards_offset_ms": 12, "backwards_events": 2}
    assert "snowflake" not in by_tag["order"] and "worker_ids" not in by_tag["order"]


# -- /health -------------------------------------------------------------------------------

def test_health_is_ready_when_redis_and_the_database_answer(
    store: SegmentStore, make_settings: Callable[..., Settings], r: redis.Redis
) -> None:
    fill(r, "order", [1])
    url = store.engine.url.render_as_string(hide_password=False)
    with TestClient(create_app(make_settings(database_url=url))) as c:
        resp = c.get("/health")
    assert resp.status_code == 200
    assert resp.text == "ready\n"
    assert resp.headers["Leafpool-Version"] == __version__ == leafpool.__version__


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
    assert resp.headers["Leafpool-Version"] == __version__


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
                f"not ready: redis: no answer within {HEALTH_TIMEOUT_SECONDS}s\n")
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


# -- /metrics ------------------------------------------------------------------------------

def test_metrics_endpoint_serves_pool_and_request_metrics(
    client: TestClient, r: redis.Redis
) -> None:
    fill(r, "order", list(range(1, 11)))
    client.get("/api/segment/get/order")
    client.get("/api/segment/get/nope")
    resp = client.get("/metrics")
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain; version=")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(resp.text)
               for s in family.samples}  # label order is the writer's choice
    assert samples[("leafpool_pool_ids", (("mode", "segment"), ("tag", "order")))] == 9.0
    assert samples[("leafpool_up", ())] == 1.0
    requests = "leafpool_http_requests_total"
    get = ("endpoint", "/api/segment/get")
    assert samples[(requests, (("code", "200"), get))] == 1.0
    assert samples[(requests, (("code", "404"), get))] == 1.0
