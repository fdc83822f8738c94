"""Token auth (leafpool/http/auth.py, the policy parsed by leafpool/core/config.py): 401
without a known token, 403 for a tag the token may not use, a restricted token's status
view, and a malformed LEAFPOOL_HTTP_TOKENS refused naming the variable, never the secret."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import redis
from starlette.testclient import TestClient

from leafpool.core.config import Settings, parse_tokens
from leafpool.core.errors import ConfigurationError
from leafpool.http import create_app
from tests.support.http_helpers import LEAF_ID, fill, llen


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
