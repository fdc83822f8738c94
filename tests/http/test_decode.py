"""Snowflake ID decoding over HTTP (leafpool/http/decode.py): Leaf's
``/decodeSnowflakeId`` shape and values, the clean JSON form, and bad IDs refused."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
from starlette.testclient import TestClient

from leafpool.core import snowflake_layout
from leafpool.core.config import Settings
from leafpool.http import create_app
from tests.support.http_helpers import LEAF_EPOCH, LEAF_ID, LEAF_SEQ, LEAF_TS, LEAF_WORKER


@pytest.fixture
def client(make_settings: Callable[..., Settings]) -> Iterator[TestClient]:
    with TestClient(create_app(make_settings())) as c:
        yield c


def test_leaf_decode_has_leafs_shape_and_values(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
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


def test_clean_decode_round_trips(client: TestClient) -> None:
    resp = client.get(f"/api/snowflake/decode/{LEAF_ID}")
    assert resp.status_code == 200
    assert resp.json() == {
        "id": str(LEAF_ID), "timestamp_ms": LEAF_TS, "iso": "2019-09-06T01:35:00.834Z",
        "worker_id": LEAF_WORKER, "dc": 0, "dc_count": 1, "sequence": LEAF_SEQ,
        "epoch_ms": LEAF_EPOCH,
    }
    compose = snowflake_layout.compose
    for ts, worker, seq in [(LEAF_EPOCH, 0, 0), (LEAF_TS, 1023, 4095), (LEAF_TS + 1, 7, 99)]:
        got = client.get(f"/api/snowflake/decode/{compose(ts, worker, seq)}").json()
        assert (got["timestamp_ms"], got["worker_id"], got["sequence"]) == (ts, worker, seq)


@pytest.mark.parametrize("bad", ["abc", "-5", str(2**63), "12.5", "0x10", " "])
def test_decode_refuses_bad_ids_with_400(
    client: TestClient, bad: str
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


def test_clean_decode_names_the_dc_under_this_server_s_dc_count(
    make_settings: Callable[..., Settings]
) -> None:
    """The DC is the worker ID's range under the server's LEAFPOOL_DC_COUNT (the ID does
    not carry the count): with 4 DCs worker 39 is DC 0's, worker 700 DC 2's (512..767);
    Leaf's shape gains nothing."""
    compose = snowflake_layout.compose
    with TestClient(create_app(make_settings(dc_count=4, dc_id=1))) as four:
        for worker, dc in [(39, 0), (255, 0), (256, 1), (700, 2), (1023, 3)]:
            got = four.get(f"/api/snowflake/decode/{compose(LEAF_TS, worker, 5)}").json()
            assert (got["worker_id"], got["dc"], got["dc_count"]) == (worker, dc, 4)
        leaf = four.get("/decodeSnowflakeId", params={"snowflakeId": str(LEAF_ID)}).json()
        assert sorted(leaf) == ["sequenceId", "timestamp", "workerId"]
