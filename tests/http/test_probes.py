"""/healthz and /readyz (issue 20, item 2): liveness touches no backend (a listener
standing in for Redis sees no connection), readiness answers 200 with a live Redis and
503 naming Redis when it is down, a password refused or nothing answers in time, with no
password in the body."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator

import pytest
from starlette.testclient import TestClient

from leafpool.core.config import Settings
from leafpool.http import create_app
from leafpool.http.probes import mask
from tests.support.services import free_port

SECRET = "Pw4Readyz7Kq"


@pytest.fixture
def silent_redis() -> Iterator[socket.socket]:
    """A listener that accepts TCP connections and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    sock.setblocking(False)
    yield sock
    sock.close()


def _accepted(sock: socket.socket) -> int:
    n = 0
    while True:
        try:
            conn, _ = sock.accept()
        except BlockingIOError:
            return n
        conn.close()
        n += 1


def test_healthz_answers_without_touching_redis(
    make_settings: Callable[..., Settings], silent_redis: socket.socket,
) -> None:
    port = silent_redis.getsockname()[1]
    settings = make_settings(redis_url=f"redis://u:{SECRET}@127.0.0.1:{port}/0")
    with TestClient(create_app(settings)) as c:
        _accepted(silent_redis)  # whatever the lifespan's start did
        for _ in range(3):
            resp = c.get("/healthz")
            assert (resp.status_code, resp.text) == (200, "alive\n")
            assert resp.headers["cache-control"] == "no-store"
        assert _accepted(silent_redis) == 0


def test_readyz_is_200_with_redis_answering(
    make_settings: Callable[..., Settings], redis_url: str,
) -> None:
    with TestClient(create_app(make_settings(redis_url=redis_url))) as c:
        resp = c.get("/readyz")
    assert resp.status_code == 200
    lines = resp.text.splitlines()
    assert lines[0] == "ready" and "redis: PONG" in lines
    assert any(line.startswith("settings: loaded") for line in lines)


def test_readyz_is_503_naming_redis_when_nothing_listens(
    make_settings: Callable[..., Settings],
) -> None:
    url = f"redis://leafpool-http:{SECRET}@127.0.0.1:{free_port()}/0"
    with TestClient(create_app(make_settings(redis_url=url))) as c:
        resp = c.get("/readyz")
        alive = c.get("/healthz")
    assert resp.status_code == 503 and resp.text.startswith("not ready: redis:")
    assert SECRET not in resp.text
    assert alive.status_code == 200  # not ready is not dead: no restart for a Redis outage


def test_readyz_is_503_when_redis_refuses_the_password(
    make_settings: Callable[..., Settings], redis_url: str,
) -> None:
    url = redis_url.replace("redis://", f"redis://leafpool-http:{SECRET}@")
    with TestClient(create_app(make_settings(redis_url=url))) as c:
        resp = c.get("/readyz")
    assert resp.status_code == 503 and resp.text.startswith("not ready: redis:")
    assert SECRET not in resp.text


def test_readyz_is_503_when_redis_does_not_answer_in_time(
    make_settings: Callable[..., Settings], silent_redis: socket.socket,
) -> None:
    port = silent_redis.getsockname()[1]
    settings = make_settings(redis_url=f"redis://u:{SECRET}@127.0.0.1:{port}/0")
    with TestClient(create_app(settings)) as c:
        resp = c.get("/readyz")
    assert resp.status_code == 503 and resp.text.startswith("not ready: redis:")
    assert SECRET not in resp.text


def test_mask_hides_urls_and_their_passwords(make_settings: Callable[..., Settings]) -> None:
    settings = make_settings(redis_url=f"redis://u:{SECRET}@127.0.0.1:1/0")
    text = f"failed: {settings.redis_url} (password {SECRET})"
    masked = mask(text, settings)
    assert SECRET not in masked and "redis://u:***@127.0.0.1:1/0" in masked
