"""The operators' pages (leafpool/http/pages.py): /cache from every tag's TagStatus (one
table builder, each mode's own columns), /db listing leaf_alloc on both segment stores
(and a 503 with the database down). The page in a real browser: tests/http/test_status_page.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import redis
from starlette.testclient import TestClient

from leafpool.core.config import Settings
from leafpool.http import create_app
from leafpool.http.pages import pools_table
from leafpool.redis.pool import Range, Snapshot
from leafpool.segment.store import SegmentStore
from leafpool.status import TagStatus, tag_status
from tests.support.http_helpers import fill_status_example
from tests.support.services import free_port


@pytest.fixture
def client(make_settings: Callable[..., Settings]) -> Iterator[TestClient]:
    with TestClient(create_app(make_settings())) as c:
        yield c


# -- /cache ----------------------------------------------------------------------------------

def test_cache_page_shows_every_tag_escaped(client: TestClient, r: redis.Redis) -> None:
    fill_status_example(r)
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
    assert client.get("/cache?refresh=%C2%B2").status_code == 400  # "²": isdigit, not int


def test_one_table_builder_gives_each_mode_its_columns_and_marks_low_pools() -> None:
    def status(tag: str, mode: str, length: int, **state: str) -> TagStatus:
        return tag_status(Snapshot(tag, length, [Range(10, 20)],
                                   {"mode": mode, "target": "100", "low_water": "50", **state}))

    segment = pools_table("segment", [status("a", "segment", 0), status("b", "segment", 49),
                                      status("c", "segment", 50, step="7")])
    assert segment.startswith('<table id="segment">')
    assert ('<tr data-tag="a" data-mode="segment" class="empty">' in segment
            and '<tr data-tag="b" data-mode="segment" class="low">' in segment
            and '<tr data-tag="c" data-mode="segment" class="ok">' in segment)
    assert '<td class="step">7</td>' in segment and "10:20" in segment
    flake = pools_table("snowflake", [status("s", "snowflake", 60, worker_ids="4")])
    assert '<tr data-tag="s" data-mode="snowflake" class="ok">' in flake
    assert '<td class="workers text">4</td>' in flake
    heads = {mode: [h.split("</th>")[0] for h in table.split("<th>")[1:]]
             for mode, table in (("segment", segment), ("snowflake", flake))}
    shared_lead = ["tag", "ready / target"]
    shared_tail = ["pops/s", "held at peak", "time left", "last refill", "last error",
                   "dry / empty hits", "gaps"]
    for mode, own in (("segment", ["low-water", "reserve", "step", "max_id"]),
                      ("snowflake", ["worker IDs", "lease", "last clock backwards"])):
        assert heads[mode] == [*shared_lead, *own, *shared_tail]


def test_cache_says_the_database_is_unreachable_and_which_tags_are_dry(
    client: TestClient, r: redis.Redis
) -> None:
    """docs/design.md §3.8: the banner above the tables, the tag's row marked dry with
    since when, the seconds held at the peak and left, the last error after the mark."""
    client.app.state.service.runtime.pool.register(  # type: ignore[attr-defined]
        "order", "segment", 0, rate="0", peak_rate="100", pushed_total=10,
        db_unreachable_ms=1_700_000_000_000, dry_since_ms=1_700_000_060_000,
        last_error="database: order: allocate failed: <refused>", last_error_ms=1)
    r.rpush("leafpool:{order}:reserve", "11:6011")
    body = client.get("/cache").text
    banner = body.split('<p class="banner notice">')[1].split("</p>")[0]
    assert banner.startswith("database unreachable since 2023-11-14")
    assert banner.endswith("allocations failing for 1 tag(s): order")
    assert '<p class="banner notice">order: dry since 2023-11-14' in body
    row = body.split('<tr data-tag="order" data-mode="segment" class="dry">')[1].split("</tr>")[0]
    assert '<strong class="db-down">database unreachable since <span title="2023-11-14' in row
    assert "allocate failed: &lt;refused&gt;" in row
    assert '<strong class="dry">dry since <span title="2023-11-14' in row
    assert '<td class="held">0s+60s<br>' in row and "at 100.0/s" in row  # 6,000 IDs at 100/s
    assert '<td class="left">-</td>' in row  # nothing popped lately: no rate to run out at


# -- /db -------------------------------------------------------------------------------------

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
