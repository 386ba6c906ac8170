"""The agent RPC's request body limit (``[agent] rpc-max-body-bytes``, docs/reliability.md).

Over real HTTP (uvicorn on loopback, as the daemon serves it): a declared oversized
body is refused before it is read and before the cluster secret is checked.  Through
the ASGI app: a chunked body (no Content-Length) is counted as it is read.  In both
cases the 413 problem names the limit and the size received, and the agent's state
(kernels, alloc maps) is unchanged.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import uvicorn

from accelshare.agent.rpc import create_rpc_app
from accelshare.body_limit import BodySizeLimit

AgentFactory = Callable[..., Any]  # the fixtures of conftest.py
AgentTomlFactory = Callable[..., Any]

PROBLEM = "application/problem+json"
DEFAULT_LIMIT = 4 * 1024 * 1024


def _kernel_body(kernel_id: str, padding: int = 0) -> dict[str, Any]:
    return {
        "kernel_id": kernel_id,
        "session_id": f"s-{kernel_id}",
        "image": "shell",
        "requested_slots": {"cpu": "1", "mem": "1g"},
        "labels": {"pad": "x" * padding} if padding else {},
    }


async def _raw_exchange(port: int, head: bytes) -> bytes:
    """Send a request head only (no body) on a fresh connection; the whole answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), timeout=30)
    finally:
        writer.close()


def _split(answer: bytes) -> tuple[bytes, dict[str, Any]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return head, json.loads(body)


async def test_a_declared_oversized_body_is_refused_unread_and_unauthenticated(
    agent_toml: AgentTomlFactory, start_agent: AgentFactory
) -> None:
    agent = await start_agent(agent_toml())
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    port = sock.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(
            create_rpc_app(agent.service, secret="s" * 32),
            log_config=None,
            access_log=False,
            lifespan="off",
        )
    )
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            assert not serving.done()
            await asyncio.sleep(0.01)
        # 64 MiB declared, no secret header, not a byte of body sent: the answer comes
        # (and the connection closes) without waiting for the body
        answer = await _raw_exchange(
            port,
            b"POST /v1/kernels HTTP/1.1\r\nHost: agent\r\nContent-Type: application/json\r\n"
            b"Content-Length: 67108864\r\n\r\n",
        )
        head, problem = _split(answer)
        assert head.startswith(b"HTTP/1.1 413 "), answer[:300]
        assert PROBLEM.encode() in head
        assert b"connection: close" in head.lower()
        assert problem["status"] == 413
        assert problem["type"] == "/problems/content-too-large"
        assert (problem["limit_bytes"], problem["received_bytes"]) == (DEFAULT_LIMIT, 67108864)
        assert problem["detail"] == (
            f"request body too large: the limit is {DEFAULT_LIMIT} bytes, "
            "received 67108864 bytes (declared Content-Length)"
        )
        assert problem["instance"] == "/v1/kernels"
        # the server still answers, and the secret is still checked
        answer = await _raw_exchange(
            port,
            b"GET /v1/health HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n",
        )
        assert answer.startswith(b"HTTP/1.1 401 "), answer[:300]
    finally:
        server.should_exit = True
        await serving
        sock.close()
    assert agent.service.list_kernels().kernels == []


async def _chunks(total: int, piece: int = 16 * 1024) -> AsyncIterator[bytes]:
    # valid JSON if it were read whole: the limit, not the parser, must refuse it
    body = json.dumps(_kernel_body("k-big", padding=total)).encode()
    for start in range(0, len(body), piece):
        yield body[start : start + piece]


@pytest.mark.parametrize("limit", ["64k", 1024 * 1024])
async def test_a_chunked_body_over_the_configured_limit_is_refused(
    agent_toml: AgentTomlFactory, start_agent: AgentFactory, limit: str | int
) -> None:
    agent = await start_agent(agent_toml(agent={"rpc-max-body-bytes": limit}))
    limit_bytes = 64 * 1024 if limit == "64k" else int(limit)
    maps_before = await agent.alloc_map()
    response = await agent.client.post(
        "/v1/kernels",
        content=_chunks(2 * limit_bytes),
        headers={"Content-Type": "application/json"},
    )
    assert "content-length" not in response.request.headers  # really chunked
    assert response.status_code == 413, response.text[:300]
    assert response.headers["content-type"] == PROBLEM
    problem = response.json()
    assert problem["limit_bytes"] == limit_bytes
    assert limit_bytes < problem["received_bytes"] <= limit_bytes + 16 * 1024
    assert f"the limit is {limit_bytes} bytes" in problem["detail"]
    assert f"received at least {problem['received_bytes']} bytes" in problem["detail"]
    # nothing created, nothing allocated
    assert agent.service.list_kernels().kernels == []
    assert await agent.alloc_map() == maps_before
    # a body under the limit still creates a kernel
    small = await agent.client.post(
        "/v1/kernels", json=_kernel_body("k-small", padding=limit_bytes // 2)
    )
    assert small.status_code == 200, small.text[:300]
    assert small.json()["status"] == "RUNNING"
    await agent.destroy("k-small")


def test_the_limit_must_be_positive() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        pass

    for bad in (0, -1):
        with pytest.raises(ValueError, match="max_bytes: expected a byte count > 0"):
            BodySizeLimit(app, max_bytes=bad, problem=lambda exc, path: {})
