"""RFC 9457 problem+json for every kind of error the API produces."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI
from pydantic import BaseModel, Field

from accelshare.api.problems import (
    BadRequest,
    Conflict,
    Forbidden,
    NotFound,
    Problem,
    QuotaExceeded,
    ServiceUnavailable,
)
from accelshare.common import ResourceSlot

from .test_api_auth import assert_problem


class Resources(BaseModel):
    cpu: int = Field(ge=1)


class CreateBody(BaseModel):
    image: str
    priority: int = Field(default=10, ge=0, le=100)
    config: Resources


PROBLEMS: dict[str, Problem] = {
    "bad": BadRequest("Bad thing", field="image", expected="a name", received=""),
    "forbidden": Forbidden("Not yours"),
    "missing": NotFound("No session 'x'", field="session", received="x"),
    "conflict": Conflict("Name taken", field="name", received="s1"),
    "quota": QuotaExceeded("Over quota", field="cpu", expected="<= 4", received="8"),
    "down": ServiceUnavailable("Later"),
}


@pytest.fixture
def problem_app(app: FastAPI) -> FastAPI:
    @app.post("/test/create")
    async def create(body: CreateBody) -> dict[str, str]:
        return {"image": body.image}

    @app.get("/test/items/{item_id}")
    async def item(item_id: int, limit: int = 10) -> dict[str, int]:
        return {"item_id": item_id, "limit": limit}

    @app.get("/test/raise/{kind}")
    async def raise_problem(kind: str) -> None:
        raise PROBLEMS[kind]

    @app.get("/test/slot")
    async def bad_slot() -> None:
        ResourceSlot.from_user_input({"cpu": "-1"}, {"cpu": "count"})

    @app.get("/test/crash")
    async def crash() -> None:
        raise RuntimeError("secret database password in here")

    return app


@pytest.fixture
async def lenient_client(problem_app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=problem_app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as c:
        yield c


async def test_validation_error_names_field_and_value(
    problem_app: FastAPI, client: httpx.AsyncClient
) -> None:
    response = await client.post(
        "/test/create", json={"image": "python", "priority": 500, "config": {"cpu": 1}}
    )
    body = assert_problem(response, 400)
    assert body["type"] == "/problems/invalid-api-params"
    assert body["field"] == "priority"
    assert body["received"] == 500
    assert "less than or equal to 100" in body["expected"]
    assert "'priority'" in body["detail"]
    assert "500" in body["detail"]
    assert body["msg"] == body["detail"]
    assert body["data"] == {"priority": body["expected"]}
    assert body["instance"] == "/test/create"


async def test_validation_error_nested_and_missing(
    problem_app: FastAPI, client: httpx.AsyncClient
) -> None:
    response = await client.post("/test/create", json={"config": {"cpu": "lots"}})
    body = assert_problem(response, 400)
    fields = {e["field"]: e for e in body["errors"]}
    assert set(fields) == {"image", "config.cpu"}
    assert fields["config.cpu"]["received"] == "lots"
    assert fields["image"]["location"] == "body"
    assert "1 more" in body["detail"]


async def test_validation_error_in_path_and_query(
    problem_app: FastAPI, client: httpx.AsyncClient
) -> None:
    body = assert_problem(await client.get("/test/items/abc"), 400)
    assert (body["field"], body["received"]) == ("item_id", "abc")
    assert body["errors"][0]["location"] == "path"
    body = assert_problem(await client.get("/test/items/1?limit=x"), 400)
    assert (body["field"], body["errors"][0]["location"]) == ("limit", "query")


async def test_malformed_json_body(problem_app: FastAPI, client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/test/create", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    body = assert_problem(response, 400)
    assert body["field"] == "body"
    assert "not valid JSON" in body["detail"]


@pytest.mark.parametrize(
    ("kind", "status", "slug"),
    [
        ("bad", 400, "bad-request"),
        ("forbidden", 403, "forbidden"),
        ("missing", 404, "not-found"),
        ("conflict", 409, "conflict"),
        ("quota", 412, "quota-exceeded"),
        ("down", 503, "service-unavailable"),
    ],
)
async def test_raised_problems(
    problem_app: FastAPI, client: httpx.AsyncClient, kind: str, status: int, slug: str
) -> None:
    body = assert_problem(await client.get(f"/test/raise/{kind}"), status)
    assert body["type"] == f"/problems/{slug}"
    expected = PROBLEMS[kind]
    assert body["detail"] == expected.detail
    for key in ("field", "expected", "received"):
        if key in expected.extra:
            assert body[key] == expected.extra[key]


async def test_common_value_error_becomes_400(
    problem_app: FastAPI, client: httpx.AsyncClient
) -> None:
    body = assert_problem(await client.get("/test/slot"), 400)
    assert body["field"] == "cpu"
    assert body["received"] == "-1"
    assert "negative" in body["detail"]


async def test_unknown_route_and_method(problem_app: FastAPI, client: httpx.AsyncClient) -> None:
    body = assert_problem(await client.get("/no/such/route"), 404)
    assert body["type"] == "/problems/not-found"
    body = assert_problem(await client.delete("/whoami"), 405)
    assert body["type"] == "/problems/method-not-allowed"


async def test_unexpected_errors_hide_their_details(lenient_client: httpx.AsyncClient) -> None:
    body = assert_problem(await lenient_client.get("/test/crash"), 500)
    assert "secret" not in body["detail"]
    assert body["type"] == "/problems/internal-server-error"


async def test_public_routes(client: httpx.AsyncClient) -> None:
    root = await client.get("/")
    assert root.json()["version"] == "v8.20240915"
    health = await client.get("/health")
    assert health.json() == {"status": "ok", "database": "none"}
    openapi = await client.get("/openapi.json")
    assert "/whoami" in openapi.json()["paths"]
