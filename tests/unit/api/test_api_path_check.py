"""A NUL or another control character in a request path: 400 before any route runs."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from accelshare.api.limits import PathCheck
from accelshare.api.problems import install_problem_handlers

SEEN: list[str] = []


@pytest.fixture
def client() -> httpx.AsyncClient:
    SEEN.clear()
    app = FastAPI()
    install_problem_handlers(app)
    app.add_middleware(PathCheck)

    @app.get("/files/{path:path}")
    async def files(path: str) -> dict[str, str]:
        SEEN.append(path)
        return {"path": path}

    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test")


@pytest.mark.parametrize(
    ("sent", "char", "position"),
    [("/files/a%00b", "0000", 8), ("/files/%0A", "000A", 7), ("/files/x%7F", "007F", 8)],
)
async def test_control_characters_in_the_path_are_refused(
    client: httpx.AsyncClient, sent: str, char: str, position: int
) -> None:
    async with client:
        response = await client.get(sent)
    assert response.status_code == 400
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["field"] == "path"
    assert problem["detail"] == (
        f"The request path holds the control character U+{char} at position {position}:"
        " expected a path without NUL or control characters"
    )
    assert problem["received"].startswith("/files/")
    assert SEEN == []


async def test_ordinary_paths_pass(client: httpx.AsyncClient) -> None:
    async with client:
        assert (await client.get("/files/a%20b/%C3%A9")).json() == {"path": "a b/é"}
    assert SEEN == ["a b/é"]


async def test_a_websocket_path_with_nul_is_closed_before_the_app() -> None:
    called: list[str] = []
    sent: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        called.append(scope.get("path", scope["type"]))

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    async def send(message: Any) -> None:
        sent.append(message)

    check = PathCheck(app)
    await check({"type": "websocket", "path": "/session/x\x00/terminal"}, receive, send)
    assert called == []
    assert sent[0]["type"] == "websocket.close"
    assert sent[0]["code"] == 4400
    await check({"type": "websocket", "path": "/session/x/terminal"}, receive, send)
    await check({"type": "lifespan"}, receive, send)
    assert called == ["/session/x/terminal", "lifespan"]
