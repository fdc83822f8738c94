"""The OpenAPI description (leafpool/http/openapi.py): served at /openapi.json without a
token, valid OpenAPI 3.1, describing every route of the app and no other path, with the
running server's bounds and token policy; docs/reference/openapi.json is its copy. The
answers are checked against it by schemathesis: tests/http/test_openapi_fuzz.py."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import redis
from schemathesis.specs.openapi.definitions import OPENAPI_31
from starlette.routing import Route
from starlette.testclient import TestClient

import leafpool
from leafpool.core.config import Settings
from leafpool.http import create_app
from leafpool.http.openapi import DOCS_MAX_COUNT, docs_copy
from tests.support.http_helpers import LEAF_ID, fill

DOCS_COPY = Path(__file__).parents[2] / "docs" / "reference" / "openapi.json"
DOCS_PAGE = DOCS_COPY.with_name("http-api.md")
REGENERATE = ('.venv/bin/python -c "from leafpool.http.openapi import docs_copy; '
              "print(docs_copy(), end='')\" > docs/reference/openapi.json")
METHODS = ("get", "post", "head", "put", "delete", "patch", "options", "trace")


@pytest.fixture
def make_client(make_settings: Callable[..., Settings]) -> Iterator[Callable[..., TestClient]]:
    clients: list[TestClient] = []

    def make(**overrides: object) -> TestClient:
        client = TestClient(create_app(make_settings(**overrides)))
        clients.append(client.__enter__())
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


def described(client: TestClient) -> dict[str, Any]:
    response = client.get("/openapi.json")
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    document: dict[str, Any] = response.json()
    return document


def operations(document: dict[str, Any]) -> set[tuple[str, str]]:
    return {(path, method.upper()) for path, item in document["paths"].items()
            for method in item if method in METHODS}


def test_every_route_is_described_and_every_described_path_is_a_route(
    make_client: Callable[..., TestClient],
) -> None:
    """Each route's methods are described (HEAD, which Starlette adds to every GET route,
    only where the handler answers it on its own: the ID endpoints' 405), and nothing
    else is."""
    client = make_client()
    routed: set[tuple[str, str]] = set()
    for route in client.app.routes:  # type: ignore[attr-defined]
        assert isinstance(route, Route)
        methods = set(route.methods or ())
        if not route.path.startswith(("/api/segment/", "/api/snowflake/get", "/api/snowflake/ids")):
            methods.discard("HEAD")
        routed |= {(route.path, method) for method in methods}
    assert operations(described(client)) == routed


def test_the_description_is_valid_openapi_3_1(make_client: Callable[..., TestClient]) -> None:
    """Against the OpenAPI 3.1 schema (the specification's own, as schemathesis ships it),
    and every schema in it against JSON Schema 2020-12, the dialect 3.1 uses."""
    for client in (make_client(), make_client(http_tokens="a=order;b=*")):
        document = described(client)
        jsonschema.Draft202012Validator(OPENAPI_31).validate(document)
        for schema in document["components"]["schemas"].values():
            jsonschema.Draft202012Validator.check_schema(schema)
        ids = {op["operationId"] for item in document["paths"].values()
               for method, op in item.items() if method in METHODS}
        assert len(ids) == len(operations(document))  # unique operation IDs


def test_it_is_served_without_a_token_and_says_the_server_s_bounds_and_tokens(
    make_client: Callable[..., TestClient],
) -> None:
    open_client = make_client(http_max_count=7)
    document = described(open_client)
    assert document["info"]["version"] == leafpool.__version__
    count = document["paths"]["/api/segment/ids/{tag}"]["get"]["parameters"][0]
    assert count["name"] == "count" and count["schema"]["maximum"] == 7
    assert document["components"]["schemas"]["Ids"]["properties"]["ids"]["maxItems"] == 7
    get = document["paths"]["/api/segment/get/{tag}"]["get"]
    assert "security" not in get and "401" not in get["responses"]

    secured = make_client(http_tokens="a=order;b=*")
    assert secured.get("/api/status").status_code == 401
    document = described(secured)  # no token asked for the description itself
    get = document["paths"]["/api/segment/get/{tag}"]["get"]
    assert get["security"] == [{"token": []}, {"tokenHeader": []}]
    assert {"401", "403"} <= set(get["responses"])
    assert "security" not in document["paths"]["/health"]["get"]
    assert "security" not in document["paths"]["/decodeSnowflakeId"]["get"]


def test_the_documentation_s_copy_is_the_description() -> None:
    """docs/reference/openapi.json: the default LEAFPOOL_HTTP_MAX_COUNT, tokens set."""
    assert DOCS_MAX_COUNT == 1_000
    assert DOCS_COPY.read_text() == docs_copy(), f"regenerate it: {REGENERATE}"
    assert json.loads(DOCS_COPY.read_text())["info"]["version"] == leafpool.__version__


def test_the_reference_page_names_every_path_and_error_kind() -> None:
    """docs/reference/http-api.md: each described path (``{mode}`` for either mode) and
    each error kind of the description's schemas."""
    page = DOCS_PAGE.read_text()
    document = json.loads(docs_copy())
    for path in document["paths"]:
        generic = re.sub(r"^/api/(segment|snowflake)/(get|ids)", r"/api/{mode}/\2", path)
        assert re.search(f"[` ]{re.escape(generic)}`", page), path  # `PATH` or `GET PATH`
    for schema in document["components"]["schemas"].values():
        kind = schema.get("properties", {}).get("error", {})
        for name in [kind.get("const"), *kind.get("enum", [])]:
            assert name is None or f"`{name}`" in page, name
    assert "[The description as of this release](openapi.json)" in page


def test_the_described_bodies_are_the_answers(make_client: Callable[..., TestClient],
                                             r: redis.Redis) -> None:
    """A few answers validated by hand against their schemas (the fuzz does it at scale):
    an ID batch, both errors of the other mode and of a missing tag, the status view of
    both modes, both decodes."""
    client = make_client(http_tokens="tok=*")
    document = described(client)
    fill(r, "order", list(range(1, 11)))
    fill(r, "orderno", [LEAF_ID], mode="snowflake")

    def check(path: str, method: str, status: int, **params: str) -> None:
        url = path.format(**params)
        response = client.request(method, url, headers={"X-Leafpool-Token": "tok"})
        assert response.status_code == status, response.text
        described_response = document["paths"][path][method]["responses"][str(status)]
        media = response.headers["content-type"].split(";")[0]
        schema = described_response["content"][media]["schema"]
        body = response.json() if media == "application/json" else response.text
        resolver = {**schema, "components": document["components"]}
        jsonschema.Draft202012Validator(resolver).validate(body)

    check("/api/segment/ids/{tag}", "get", 200, tag="order")
    check("/api/segment/get/{tag}", "get", 200, tag="order")
    check("/api/segment/ids/{tag}", "get", 404, tag="orderno")  # wrong_mode
    check("/api/snowflake/ids/{tag}", "get", 404, tag="nosuch")  # unknown_tag
    check("/api/segment/ids/", "get", 400)
    check("/api/status", "get", 200)
    check("/api/snowflake/decode/{id}", "get", 200, id=str(LEAF_ID))
    check("/api/snowflake/decode/{id}", "get", 400, id="-1")
    assert {t["tag"]: "snowflake" in t for t in client.get(
        "/api/status?token=tok").json()["tags"]} == {"order": False, "orderno": True}


def test_an_id_of_thousands_of_digits_is_a_400_not_a_500(
    make_client: Callable[..., TestClient],
) -> None:
    """Regression: past 4,300 digits Python's int() raises ValueError, which both decode
    endpoints answered 500 (found while describing the ID's bounds); leading zeros are
    still read as Leaf's Long.parseLong reads them."""
    client = make_client()
    huge = "9" * 5000
    leaf = client.get("/decodeSnowflakeId", params={"snowflakeId": huge})
    assert leaf.status_code == 400 and leaf.json()["field"] == "snowflakeId"
    clean = client.get(f"/api/snowflake/decode/{huge}")
    assert clean.status_code == 400 and clean.json()["field"] == "id"
    padded = "0" * 5000 + str(LEAF_ID)
    assert client.get(f"/api/snowflake/decode/{padded}").json()["id"] == str(LEAF_ID)
    assert client.get("/decodeSnowflakeId", params={"snowflakeId": padded}).json()[
        "workerId"] == "39"
    assert client.get("/api/snowflake/decode/000").json()["id"] == "0"
