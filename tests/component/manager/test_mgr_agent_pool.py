"""The manager's agent client never throttles the binder: as many RPCs as the binder
lets run at once (``MAX_CONCURRENT_AGENTS``) are in flight at once on real connections
(httpx's default pool of 100 would hold the rest back)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from accelshare.manager.agent_client import AgentClient
from accelshare.manager.scheduler.binding import MAX_CONCURRENT_AGENTS


@contextlib.asynccontextmanager
async def barrier_agent(expected: int) -> AsyncIterator[tuple[str, list[int]]]:
    """An agent whose ``GET /v1/kernels`` answers once ``expected`` requests are in
    flight together (or after 5 s); yields its URL and the most seen at once."""
    in_flight = 0
    most = [0]
    everyone = asyncio.Event()

    async def kernels(_: Request) -> JSONResponse:
        nonlocal in_flight
        in_flight += 1
        most[0] = max(most[0], in_flight)
        if in_flight >= expected:
            everyone.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(everyone.wait(), 5)
        in_flight -= 1
        return JSONResponse({"kernels": []})

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    app = Starlette(routes=[Route("/v1/kernels", kernels)])
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}", most
    finally:
        server.should_exit = True
        await task


async def test_every_rpc_the_binder_allows_is_in_flight_at_once() -> None:
    client = AgentClient("secret", timeout_s=30)
    try:
        async with barrier_agent(MAX_CONCURRENT_AGENTS) as (url, most):
            lists = await asyncio.gather(
                *(client.list_kernels(url) for _ in range(MAX_CONCURRENT_AGENTS))
            )
        assert all(listed.kernels == [] for listed in lists)
        assert most[0] == MAX_CONCURRENT_AGENTS
    finally:
        await client.close()
