"""Errors as status codes (leafpool/http/errors.py): a server fault is 5xx, the client's
4xx; Redis unreachable is 503 everywhere, never 500; a database without leaf_alloc is the
operator's fault, 500 ``configuration`` naming the variable."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis
from starlette.testclient import TestClient

from leafpool.core.config import Settings
from leafpool.core.errors import ConfigurationError, InvalidArgument
from leafpool.http import as_http_error, create_app
from leafpool.http import errors as http_errors
from tests.support.services import free_port


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


def test_a_misconfigured_server_answers_500_configuration_not_400(
    database_url: str, make_settings: Callable[..., Settings], r: redis.Redis,
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A database without leaf_alloc (wrong URL, or ``leafpool db init`` never run) is the
    operator's fault: 500 naming the variable, logged, no Retry-After (retrying is useless)."""
    # the log line is throttled per process: start this test with a fresh throttle
    monkeypatch.setattr(http_errors, "_throttle", http_errors.LogThrottle())
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
