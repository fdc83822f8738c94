"""The HTTP service's operator pages print no password (issue 18, secrets): with a Redis or
database URL carrying a password the test knows, and that backend failing (nothing
listening, a password refused, a file that cannot be opened), /health answers 503 naming
the backend, and neither it nor /cache, /db, /api/status or /metrics holds the password."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from starlette.testclient import TestClient

from leafpool.core.config import Settings
from leafpool.http import create_app
from tests.support.http_helpers import fill
from tests.support.services import free_port

SECRET = "Pw4Health9Xq"
PAGES = ["/health", "/cache", "/db", "/db?format=json", "/api/status", "/metrics"]


def _pages(settings: Settings) -> dict[str, tuple[int, str]]:
    with TestClient(create_app(settings)) as c:
        return {page: (resp.status_code, resp.text)
                for page in PAGES for resp in [c.get(page)]}


def _no_secret(pages: dict[str, tuple[int, str]]) -> None:
    leaks = [page for page, (_, body) in pages.items() if SECRET in body]
    assert leaks == [], {page: pages[page][1][:300] for page in leaks}


def test_a_redis_url_with_a_password_that_nothing_answers(
    make_settings: Callable[..., Settings],
) -> None:
    url = f"redis://leafpool-http:{SECRET}@127.0.0.1:{free_port()}/0"
    pages = _pages(make_settings(redis_url=url))
    status, body = pages["/health"]
    assert status == 503 and body.startswith("not ready: redis:")
    _no_secret(pages)


def test_a_redis_that_refuses_the_password(
    make_settings: Callable[..., Settings], redis_url: str,
) -> None:
    # the session's redis-server has no user of that name: AUTH is refused
    url = redis_url.replace("redis://", f"redis://leafpool-http:{SECRET}@")
    pages = _pages(make_settings(redis_url=url))
    status, body = pages["/health"]
    assert status == 503 and body.startswith("not ready: redis:")
    _no_secret(pages)


@pytest.mark.parametrize("database", ["mysql", "sqlite"])
def test_a_database_url_with_a_password_that_fails(
    database: str, make_settings: Callable[..., Settings], r: redis.Redis, tmp_path: Path,
) -> None:
    fill(r, "order", [1])  # a segment tag: /health asks the database too
    url = (f"mysql+pymysql://leaf:{SECRET}@127.0.0.1:{free_port()}/leaf"
           if database == "mysql" else f"sqlite://leaf:{SECRET}@//{tmp_path}/missing/x.db")
    pages = _pages(make_settings(database_url=url))
    status, body = pages["/health"]
    assert status == 503 and body.startswith("not ready: database"), body
    assert pages["/cache"][0] == 200  # Redis answers: the pools are shown
    _no_secret(pages)
